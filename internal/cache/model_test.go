package cache

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// TestModel runs random single-client request sequences, with byte-granular offsets, on caches of
// random shape and checks every read against a plain byte slice, and the tiers' occupancy against
// their capacity after every request. Some sequences damage the SSD tier's device (a byte flipped,
// maxDamages at most): then a read may fail as lost, but only where the cache says data was lost
// (LostRanges), which nothing else may make; until written again, such a range fails every read.
// Write-back runs in either order, but FLUSH order without damage: there a lost dirty block halts
// the write back, and writes that need the backend fail (TestOrderLostBlock, TestOrderFlushModel).
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
			order:  rapid.SampledFrom([]string{OrderAddress, OrderFlush}).Draw(rt, "order"),
		}
		if l.ssd == 1 || (l.ssd == 0 && l.mode == WriteBack) {
			l.ssd = 2 // the SSD tier needs two lines, and write-back an SSD tier
		}
		var ssd *mem.Mem
		if l.ssd > 0 {
			ssd = mem.New(l.ssd * l.line)
		}
		c := newCache(t, mem.New(size), l, nil, ssd) // rapid.T is no testing.TB; a failure to build is no case to shrink
		defer c.Close()
		model := make([]byte, size)
		lost := make([]bool, size) // by byte: in a lost range
		damages := 0
		isLost := func(off, n int64) bool { return slices.Contains(lost[off:off+n], true) }
		for i := range rapid.IntRange(1, 80).Draw(rt, "ops") {
			off := rapid.Int64Range(0, size-1).Draw(rt, "off")
			n := rapid.Int64Range(1, min(size-off, 3*line)).Draw(rt, "len")
			switch op := rapid.IntRange(0, 6).Draw(rt, "op"); op {
			case 0, 1:
				got := make([]byte, n)
				_, err := c.ReadAt(got, off)
				if errors.Is(err, ErrLost) && damages > 0 && !isLost(off, n) {
					for _, r := range c.LostRanges() { // found lost by this read
						for k := r.Off; k < r.Off+r.Len; k++ {
							lost[k] = true
						}
					}
				}
				switch {
				case isLost(off, n):
					if !errors.Is(err, ErrLost) {
						rt.Fatalf("op %d: read %d@%d of a lost range: %v, want ErrLost", i, n, off, err)
					}
				case err != nil:
					rt.Fatalf("op %d: read %d@%d: %v", i, n, off, err)
				case !bytes.Equal(got, model[off:off+n]):
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
				clear(lost[off : off+n])
			case 4:
				if err := c.WriteZeroes(off, n, i%2 == 0); err != nil {
					rt.Fatalf("op %d: write-zeroes %d@%d: %v", i, n, off, err)
				}
				clear(model[off : off+n])
				clear(lost[off : off+n])
			case 5:
				if err := c.Flush(); err != nil {
					rt.Fatalf("op %d: flush: %v", i, err)
				}
			case 6:
				if ssd == nil || damages == maxDamages || l.mode == WriteBack && l.order == OrderFlush {
					continue
				}
				damages++
				at := rapid.Int64Range(0, ssd.Size()-1).Draw(rt, "damage at")
				var b [1]byte
				if _, err := ssd.ReadAt(b[:], at); err != nil {
					rt.Fatal(err)
				}
				b[0] ^= 1 << rapid.IntRange(0, 7).Draw(rt, "damage bit")
				if _, err := ssd.WriteAt(b[:], at); err != nil {
					rt.Fatal(err)
				}
			}
			if damages == 0 && len(c.LostRanges()) > 0 {
				rt.Fatalf("op %d: lost ranges %v without damage", i, c.LostRanges())
			}
			for _, tr := range c.Stats().Tiers {
				if tr.Lines > tr.Capacity || tr.Failed || tr.LineBytes != tr.Lines*uint64(line) {
					rt.Fatalf("op %d: tier %s: %+v", i, tr.Name, tr)
				}
			}
		}
	})
}

// maxDamages is how many bytes of the SSD tier TestModel flips at most in a sequence: fewer than
// the errors that bypass a tier (maxTierErrors), which the test takes for an engine error.
const maxDamages = maxTierErrors / 2
