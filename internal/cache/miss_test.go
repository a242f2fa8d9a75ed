package cache

import (
	"testing"

	"github.com/tierblk/tierblk/internal/meta"
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

// TestSSDAdmissionAuto runs the default admission (policy.Auto) of an SSD tier through a cold random
// workload and then a reused set, and checks its counters: the first epoch of misses is admitted
// (a cache starts out paying), the rest of the cold misses are turned away, and lines missed a
// second time are admitted and then hit.
func TestSSDAdmissionAuto(t *testing.T) {
	const line, lines = 4 << 10, 16384
	c, err := New(mem.New(lines*line), Config{LineSize: line, BackendID: "test",
		SSD:       TierConfig{Size: 64 * line},
		SSDDevice: mem.New(64 * line), Meta: meta.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, line)
	read := func(l int) {
		t.Helper()
		if _, err := c.ReadAt(buf, int64(l)*line); err != nil {
			t.Fatal(err)
		}
	}
	const epoch, cold = 4096, 3 * 4096
	scatter := func(i int) int { return i * 7919 % lines } // distinct lines, none next to the last
	for i := range cold {
		read(scatter(i))
	}
	ssd := c.Stats().Tiers[0]
	if ssd.Admission != DefaultAdmission {
		t.Fatalf("SSD admission %q, want the default %q", ssd.Admission, DefaultAdmission)
	}
	if ssd.Admitted != epoch || ssd.Rejected != cold-epoch {
		t.Fatalf("cold reads: SSD admitted %d and rejected %d; want %d and %d", ssd.Admitted, ssd.Rejected, epoch, cold-epoch)
	}
	// A few of the lines turned away, read again: a second miss each, admitted; then hits.
	const reused = 4
	for i := range reused {
		read(scatter(cold - 1 - i))
	}
	if ssd = c.Stats().Tiers[0]; ssd.Admitted != epoch+reused {
		t.Fatalf("second misses: SSD admitted %d, want %d", ssd.Admitted, epoch+reused)
	}
	for i := range reused {
		read(scatter(cold - 1 - i))
	}
	if ssd = c.Stats().Tiers[0]; ssd.Hits != reused {
		t.Fatalf("third reads: %d SSD hits, want %d", ssd.Hits, reused)
	}
}
