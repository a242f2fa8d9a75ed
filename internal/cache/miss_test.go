package cache

import (
	"testing"

	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// TestMissRange: what a miss fetches, by whether a tier caches the line and how far it reaches (a
// sequential stream reads ahead to the line's end, a prefetch takes the whole line).
func TestMissRange(t *testing.T) {
	const line = 64 << 10
	const short = 10000 // the device's last line, not a whole number of blocks
	for _, tc := range []struct {
		name   string
		s      seg
		cached bool
		r      reach
		lo, hi int64
	}{
		{"not cached: the bytes asked", seg{n: line, lo: 100, hi: 700}, false, reachBlocks, 100, 700},
		{"not cached, sequential: still the bytes asked", seg{n: line, lo: 100, hi: 700}, false, reachAhead, 100, 700},
		{"cached: the touched blocks", seg{n: line, lo: 100, hi: 700}, true, reachBlocks, 0, 4096},
		{"cached: blocks across a boundary", seg{n: line, lo: 4000, hi: 4200}, true, reachBlocks, 0, 8192},
		{"cached: an aligned 4 KiB read is itself", seg{n: line, lo: 8192, hi: 12288}, true, reachBlocks, 8192, 12288},
		{"cached, sequential: on to the line's end", seg{n: line, lo: 8192, hi: 12288}, true, reachAhead, 8192, line},
		{"cached, sequential, unaligned", seg{n: line, lo: 9000, hi: 9100}, true, reachAhead, 8192, line},
		{"cached, prefetch: the whole line", seg{n: line, lo: 8192, hi: 12288}, true, reachLine, 0, line},
		{"a whole line asked is the line", seg{n: line, lo: 0, hi: line}, true, reachBlocks, 0, line},
		{"short last line: the touched block, cut at the end", seg{n: short, lo: 9000, hi: 9500}, true, reachBlocks, 8192, short},
		{"short last line, sequential", seg{n: short, lo: 100, hi: 200}, true, reachAhead, 0, short},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := missRange(tc.s, tc.cached, tc.r)
			if lo != tc.lo || hi != tc.hi {
				t.Fatalf("missRange(%+v, cached %v, reach %d) = [%d, %d), want [%d, %d)", tc.s, tc.cached, tc.r, lo, hi, tc.lo, tc.hi)
			}
		})
	}
}

// TestStreams: a miss that starts where an earlier one ended continues its stream, the end moves
// to what the miss fetched, and streams beyond the slots are forgotten oldest first.
func TestStreams(t *testing.T) {
	var s streams
	end := func(e int64) func(bool) int64 { return func(bool) int64 { return e } }
	steps := []struct {
		off, end int64
		seq      bool
	}{
		{0, 4096, false},        // at the device's start: never a continuation
		{4096, 65536, true},     // continues; fetched the rest of the line
		{65536, 131072, true},   // the next line
		{200000, 204096, false}, // another reader
		{131072, 196608, true},  // the first reader again
		{204096, 208192, true},  // and the second
		{4096, 8192, false},     // an end that moved on no longer matches
	}
	for i, st := range steps {
		if got := s.follow(st.off, end(st.end)); got != st.seq {
			t.Fatalf("step %d: follow(%d) = %v, want %v", i, st.off, got, st.seq)
		}
	}
	for i := range streamSlots {
		s.follow(int64(1<<30+i*8192), end(int64(1<<30+i*8192+4096)))
	}
	if s.follow(196608, end(200000)) {
		t.Fatal("a stream survived more new streams than there are slots")
	}
}

// TestMissCounters runs a known workload and checks the read amplification and admission counters:
// scattered 4 KiB reads fetch their own bytes; a sequential reader fetches its first block, then
// the rest of the line; with nhit:2 a line is turned away on its first miss and taken on its second.
func TestMissCounters(t *testing.T) {
	const line = 64 << 10
	c, err := New(mem.New(64*line), Config{LineSize: line, BackendID: "test",
		RAM: TierConfig{Size: 16 * line, Admission: "nhit:2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	read := func(off int64) {
		t.Helper()
		if _, err := c.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 { // one block in each of 8 lines: each turned away, fetched as asked
		read(int64(i)*line + 8192)
	}
	for i := range 8 { // another block of the same lines: each taken, its block fetched
		read(int64(i)*line + 3*8192)
	}
	s := c.Stats()
	if s.ReadBytes != 16*4096 || s.FetchedBytes != 16*4096 {
		t.Fatalf("scattered reads: %d bytes asked, %d fetched; want %d each", s.ReadBytes, s.FetchedBytes, 16*4096)
	}
	if r := s.Tiers[0]; r.Rejected != 8 || r.Admitted != 8 || r.Lines != 8 {
		t.Fatalf("scattered reads: %d rejected, %d admitted, %d lines; want 8 each", r.Rejected, r.Admitted, r.Lines)
	}
	// A sequential reader over line 20: its first read is turned away and fetched as asked, its
	// second continues it, is taken and fetches the rest of the line; the other 14 reads hit.
	for off := int64(20 * line); off < 21*line; off += 4096 {
		read(off)
	}
	s = c.Stats()
	if want := uint64(16*4096 + line); s.FetchedBytes != want {
		t.Fatalf("after a sequential line: %d bytes fetched, want %d", s.FetchedBytes, want)
	}
	if h := s.Tiers[0].Hits; h != 14 {
		t.Fatalf("after a sequential line: %d hits, want 14", h)
	}
}
