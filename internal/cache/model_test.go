package cache

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"

	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// TestModel runs random single-client request sequences, with byte-granular offsets, on caches of
// random shape and checks every read against a plain byte slice, and the tiers' occupancy against
// their capacity after every request.
func TestModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const size = 96 << 10
		line := int64(4<<10) << rapid.IntRange(0, 4).Draw(rt, "line shift")
		lines := int64(size) / line
		l := layout{
			line:   line,
			ram:    rapid.Int64Range(0, 3).Draw(rt, "ram lines"),
			ssd:    rapid.Int64Range(0, min(4, lines)).Draw(rt, "ssd lines"),
			mode:   Mode(rapid.IntRange(0, 3).Draw(rt, "mode")),
			policy: rapid.SampledFrom([]string{"lru", "s3fifo", "arc", "clock", "lirs"}).Draw(rt, "policy"),
		}
		if l.ssd == 1 || (l.ssd == 0 && l.mode == WriteBack) {
			l.ssd = 2 // the SSD tier needs two lines, and write-back an SSD tier
		}
		c := newCache(t, mem.New(size), l, nil, nil) // rapid.T is no testing.TB; a failure to build is no case to shrink
		defer c.Close()
		model := make([]byte, size)
		for i := range rapid.IntRange(1, 80).Draw(rt, "ops") {
			off := rapid.Int64Range(0, size-1).Draw(rt, "off")
			n := rapid.Int64Range(1, min(size-off, 3*line)).Draw(rt, "len")
			switch op := rapid.IntRange(0, 5).Draw(rt, "op"); op {
			case 0, 1:
				got := make([]byte, n)
				if _, err := c.ReadAt(got, off); err != nil {
					rt.Fatalf("op %d: read %d@%d: %v", i, n, off, err)
				}
				if !bytes.Equal(got, model[off:off+n]) {
					rt.Fatalf("op %d: read %d@%d returned other data than was written", i, n, off)
				}
			case 2, 3:
				p := make([]byte, n)
				for k := range p {
					p[k] = byte(i*7 + k + 1)
				}
				var err error
				if op == 2 {
					_, err = c.WriteAt(p, off)
				} else {
					_, err = c.WriteAtFUA(p, off)
				}
				if err != nil {
					rt.Fatalf("op %d: write %d@%d: %v", i, n, off, err)
				}
				copy(model[off:], p)
			case 4:
				if err := c.WriteZeroes(off, n, i%2 == 0); err != nil {
					rt.Fatalf("op %d: write-zeroes %d@%d: %v", i, n, off, err)
				}
				clear(model[off : off+n])
			case 5:
				if err := c.Flush(); err != nil {
					rt.Fatalf("op %d: flush: %v", i, err)
				}
			}
			for _, tr := range c.Stats().Tiers {
				if tr.Lines > tr.Capacity || tr.Failed || tr.LineBytes != tr.Lines*uint64(line) {
					rt.Fatalf("op %d: tier %s: %+v", i, tr.Name, tr)
				}
			}
		}
	})
}
