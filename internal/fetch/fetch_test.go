package fetch

import "testing"

// TestRange: what a miss fetches, by whether a tier caches the line and how far it reaches (a
// sequential stream reads ahead to the line's end, a prefetch takes the whole line).
func TestRange(t *testing.T) {
	const line = 64 << 10
	const short = 10000 // the device's last line, not a whole number of blocks
	for _, tc := range []struct {
		name           string
		from, to, n    int64
		cached         bool
		r              Reach
		wantLo, wantHi int64
	}{
		{"not cached: the bytes asked", 100, 700, line, false, Blocks, 100, 700},
		{"not cached, sequential: still the bytes asked", 100, 700, line, false, Ahead, 100, 700},
		{"cached: the touched blocks", 100, 700, line, true, Blocks, 0, 4096},
		{"cached: blocks across a boundary", 4000, 4200, line, true, Blocks, 0, 8192},
		{"cached: an aligned 4 KiB read is itself", 8192, 12288, line, true, Blocks, 8192, 12288},
		{"cached, sequential: on to the line's end", 8192, 12288, line, true, Ahead, 8192, line},
		{"cached, sequential, unaligned", 9000, 9100, line, true, Ahead, 8192, line},
		{"cached, prefetch: the whole line", 8192, 12288, line, true, Line, 0, line},
		{"a whole line asked is the line", 0, line, line, true, Blocks, 0, line},
		{"short last line: the touched block, cut at the end", 9000, 9500, short, true, Blocks, 8192, short},
		{"short last line, sequential", 100, 200, short, true, Ahead, 0, short},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := Range(tc.from, tc.to, tc.n, tc.cached, tc.r)
			if lo != tc.wantLo || hi != tc.wantHi {
				t.Fatalf("Range(%d, %d, %d, cached %v, reach %d) = [%d, %d), want [%d, %d)",
					tc.from, tc.to, tc.n, tc.cached, tc.r, lo, hi, tc.wantLo, tc.wantHi)
			}
		})
	}
}

// TestStreams: a miss that starts where an earlier one ended continues its stream, the end moves
// to what the miss fetched, and streams beyond the slots are forgotten oldest first.
func TestStreams(t *testing.T) {
	var s Streams
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
		if got := s.Follow(st.off, end(st.end)); got != st.seq {
			t.Fatalf("step %d: Follow(%d) = %v, want %v", i, st.off, got, st.seq)
		}
	}
	for i := range streamSlots {
		s.Follow(int64(1<<30+i*8192), end(int64(1<<30+i*8192+4096)))
	}
	if s.Follow(196608, end(200000)) {
		t.Fatal("a stream survived more new streams than there are slots")
	}
}
