package cache

import (
	"testing"

	"github.com/tierblk/tierblk/pkg/backend/mem"
)

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
