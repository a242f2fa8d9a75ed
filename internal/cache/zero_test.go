package cache

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
)

// unwritten fills what the SSD holds before a test: a zero block read from the slot, rather than
// made of its zero bit, reads as this, not as zeros.
const unwritten = 0xee

// zeroRig is a cache of 16 KiB lines (4 blocks) over a machine whose SSD holds only unwritten bytes
// and whose backend holds pattern, with a gate to crash it.
type zeroRig struct {
	t *testing.T
	m *machine
	l layout
	g *gate
	c *Cache
}

func pattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i/blockSize*13 + i%251 + 1)
	}
	return p
}

func newZeroRig(t *testing.T, mode Mode, r Reduction) *zeroRig {
	m := newMachine(256<<10, 8*(16<<10))
	copy(m.back.cur, pattern(len(m.back.cur)))
	copy(m.back.durable, m.back.cur)
	for _, d := range [][]byte{m.ssd.cur, m.ssd.durable} {
		for i := range d {
			d[i] = unwritten
		}
	}
	z := &zeroRig{t: t, m: m, l: layout{line: 16 << 10, ssd: 8, mode: mode, reduction: r}}
	m.withRunLog(t.TempDir(), &z.l)
	z.start()
	return z
}

// start starts an engine on the machine, as a restart does.
func (z *zeroRig) start() {
	z.g = &gate{}
	z.m.keepRunLog(z.g, kill9Logged)
	z.m.restoreRunLog(z.t)
	z.c = newCache(z.t, gatedDev{z.g, z.m.back}, z.l, gatedStore{z.g, z.m.store}, gatedDev{z.g, z.m.ssd})
	z.t.Cleanup(func() { z.c.Close() })
}

// zeroBits returns line's zero bits on the SSD tier, and where its slot is on the SSD.
func (z *zeroRig) zeroBits(line uint64) (lineBits, int64) {
	g := z.c.ssd.pin(line)
	require.True(z.t, g.ok, "line %d is not on the SSD tier", line)
	z.c.ssd.unpin(g.slot)
	return g.zero, int64(g.slot) * z.l.line
}

func (z *zeroRig) read(off int64, n int) []byte {
	p := make([]byte, n)
	_, err := z.c.ReadAt(p, off)
	require.NoError(z.t, err)
	return p
}

// TestZeroBlocks writes a line of data and zero blocks, overwrites part of a zero block, restarts
// (cleanly, or after a kill with the run log) and checks what reads back and what the SSD holds:
// with reduction zero the zero blocks are bits, never written to the SSD (it still holds what it
// held there); with reduction off they are written as data.
func TestZeroBlocks(t *testing.T) {
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		for _, r := range []Reduction{ReductionOff, ReductionZero} {
			for _, end := range []string{"close", "kill9"} {
				t.Run(mode.String()+"-"+r.String()+"-"+end, func(t *testing.T) {
					z := newZeroRig(t, mode, r)
					const line = 2
					off := int64(line) * z.l.line
					want := pattern(int(z.l.line))
					clear(want[blockSize : 2*blockSize]) // blocks 1 and 3: zeros
					clear(want[3*blockSize:])
					_, err := z.c.WriteAt(want, off)
					require.NoError(t, err)
					if mode == WriteBack {
						// Part of zero block 3: its other bytes are zeros, not what the slot held.
						copy(want[3*blockSize+1000:], "written into a zero block")
						_, err = z.c.WriteAt(want[3*blockSize+1000:3*blockSize+1025], off+3*blockSize+1000)
						require.NoError(t, err)
					}
					require.Equal(t, want, z.read(off, len(want)))

					switch end {
					case "close":
						require.NoError(t, z.c.Close())
					case "kill9":
						z.g.crash()
						z.c.Close()
					}
					z.start()
					if end == "kill9" {
						require.NoError(t, z.c.Recovered())
					}
					require.Equal(t, want, z.read(off, len(want)), "after the restart")

					zero, at := z.zeroBits(line)
					slot := z.m.ssd.cur[at : at+z.l.line]
					wantZero := lineBits{}
					if r == ReductionZero {
						wantZero = linebits.Range(1, 2)
						if mode == WriteThrough {
							wantZero = wantZero.Or(linebits.Range(3, 4))
						}
						require.Equal(t, bytes.Repeat([]byte{unwritten}, blockSize), slot[blockSize:2*blockSize],
							"a zero block is not written to the SSD")
					} else {
						require.Equal(t, want, slot)
					}
					require.Equal(t, wantZero, zero)
					if mode == WriteBack {
						require.NoError(t, z.c.FlushAll(context.Background(), nil))
						require.Equal(t, want, z.m.back.cur[off:off+z.l.line], "written back")
					}
				})
			}
		}
	}
}

// TestZeroFill reads lines whose blocks are partly zero on the backend: with reduction zero the
// fill writes none of the zero blocks to the SSD, and the hits that follow read them as zeros.
func TestZeroFill(t *testing.T) {
	for _, r := range []Reduction{ReductionOff, ReductionZero} {
		t.Run(r.String(), func(t *testing.T) {
			z := newZeroRig(t, WriteThrough, r)
			off := 5 * z.l.line
			clear(z.m.back.cur[off+blockSize : off+3*blockSize])
			want := z.m.back.cur[off : off+z.l.line]
			require.Equal(t, want, z.read(off, int(z.l.line)), "the miss")
			fetched := z.c.Stats().Backend.ReadBytes
			for _, n := range []int{blockSize, int(z.l.line)} { // a zero block alone, and the line
				require.Equal(t, want[blockSize:blockSize+n/4], z.read(off+blockSize, n/4))
				require.Equal(t, want[:n], z.read(off, n))
			}
			require.Equal(t, fetched, z.c.Stats().Backend.ReadBytes, "hits, not misses")
			zero, at := z.zeroBits(5)
			if r == ReductionZero {
				require.Equal(t, linebits.Range(1, 3), zero)
				require.Equal(t, bytes.Repeat([]byte{unwritten}, 2*blockSize), z.m.ssd.cur[at+blockSize:at+3*blockSize])
			} else {
				require.True(t, zero.IsZero())
				require.Equal(t, want, z.m.ssd.cur[at:at+z.l.line])
			}
		})
	}
}

// TestWriteZeroesMarksZero zeroes blocks of a line the SSD tier holds: in write-through the backend
// zeroes them and the tier marks them zero; in write-back the tier takes them as dirty zero blocks,
// and the destager sends them as a WRITE_ZEROES, or as zeros to a backend that turns that down.
func TestWriteZeroesMarksZero(t *testing.T) {
	tests := []struct {
		name    string
		mode    Mode
		refuses bool // the backend answers WRITE_ZEROES with ErrNotSupported
	}{
		{"writethrough", WriteThrough, false},
		{"writeback", WriteBack, false},
		{"writeback-backend-refuses", WriteBack, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := newZeroRig(t, tt.mode, ReductionZero)
			var back backend.Backend = gatedDev{z.g, z.m.back}
			if tt.refuses {
				back = struct{ backend.Backend }{back} // no WriteZeroes of its own
			}
			fb := fault.New(back, fault.Options{})
			z.c.Close()
			z.c = newCache(t, fb, z.l, gatedStore{z.g, z.m.store}, gatedDev{z.g, z.m.ssd})
			off := 3 * z.l.line
			want := z.read(off, int(z.l.line)) // the line comes in
			require.NoError(t, z.c.WriteZeroes(off+blockSize-100, 2*blockSize+200, false))
			clear(want[blockSize-100 : 3*blockSize+100])
			reads := z.c.Stats().Backend.Reads
			require.Equal(t, want[blockSize:3*blockSize], z.read(off+blockSize, 2*blockSize))
			require.Equal(t, reads, z.c.Stats().Backend.Reads, "a hit")
			require.Equal(t, want, z.read(off, int(z.l.line)))
			zero, _ := z.zeroBits(3)
			require.Equal(t, linebits.Range(1, 3), zero, "the whole blocks zeroed")
			require.NoError(t, z.c.FlushAll(context.Background(), nil))
			require.Equal(t, want, z.m.back.cur[off:off+z.l.line])
			require.Equal(t, int64(1), fb.Counts()[fault.Zero], "one WRITE_ZEROES (refused or not)")
		})
	}
}

// TestReductionStats checks the SSD tier's logical and physical bytes and their ratio as lines
// come in, change and leave, and after a restart, which counts them again from the records.
func TestReductionStats(t *testing.T) {
	const kib = 1 << 10
	tests := []struct {
		r         Reduction
		physical  []uint64 // after each step below
		ratioHalf float64  // the ratio after the first step
	}{
		{ReductionOff, []uint64{64 * kib, 48 * kib, 48 * kib, 48 * kib, 0}, 1},
		{ReductionZero, []uint64{32 * kib, 28 * kib, 32 * kib, 32 * kib, 0}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.r.String(), func(t *testing.T) {
			z := newZeroRig(t, WriteThrough, tt.r)
			ssd := func() TierStats { return z.c.Stats().Tiers[0] }
			require.Equal(t, TierStats{Name: "ssd", ReductionRatio: 1, Reduction: tt.r.String()},
				TierStats{Name: ssd().Name, LogicalBytes: ssd().LogicalBytes, PhysicalBytes: ssd().PhysicalBytes,
					ReductionRatio: ssd().ReductionRatio, Reduction: ssd().Reduction}, "empty")
			for _, line := range []int64{0, 1, 2, 3} { // half of each line's blocks zero on the backend
				clear(z.m.back.cur[line*z.l.line+2*blockSize : (line+1)*z.l.line])
			}
			steps := []struct {
				name    string
				do      func()
				logical uint64
			}{
				{"four lines read", func() { z.read(0, int(4*z.l.line)) }, 64 * kib},
				{"a data block and three zero blocks invalidated", func() {
					require.NoError(t, z.c.Trim(blockSize, 3*blockSize)) // blocks 1, 2 and 3 of line 0
					require.NoError(t, z.c.Trim(z.l.line+3*blockSize, blockSize))
				}, 48 * kib},
				{"a data block written over a zero block", func() {
					_, err := z.c.WriteAt(pattern(blockSize), z.l.line+2*blockSize)
					require.NoError(t, err)
				}, 48 * kib},
				{"restart", func() {
					require.NoError(t, z.c.Close())
					z.start()
				}, 48 * kib},
				{"everything trimmed", func() { require.NoError(t, z.c.Trim(0, 4*z.l.line)) }, 0},
			}
			for i, st := range steps {
				st.do()
				got := ssd()
				require.Equal(t, st.logical, got.LogicalBytes, st.name)
				require.Equal(t, tt.physical[i], got.PhysicalBytes, st.name)
				if i == 0 {
					require.Equal(t, tt.ratioHalf, got.ReductionRatio, st.name)
				}
			}
		})
	}
}

// TestZeroBlocksDetected checks which blocks zeroBlocks finds: only those wholly in the range,
// with every byte zero; a line's last block may be short.
func TestZeroBlocksDetected(t *testing.T) {
	data := func(n int, set ...int) []byte {
		p := make([]byte, n)
		for _, i := range set {
			p[i] = 1
		}
		return p
	}
	tests := []struct {
		name   string
		p      []byte
		off, n int64
		want   lineBits
	}{
		{"all zero", data(4 * blockSize), 0, 16 * blockSize, linebits.Range(0, 4)},
		{"a byte at each end", data(4*blockSize, 0, 4*blockSize-1), 0, 16 * blockSize, linebits.Range(1, 3)},
		{"from block 2", data(2 * blockSize), 2 * blockSize, 16 * blockSize, linebits.Range(2, 4)},
		{"partial blocks at both ends", data(3 * blockSize), blockSize / 2, 16 * blockSize, linebits.Range(1, 3)},
		{"short last block of the line", data(blockSize + 512), 0, blockSize + 512, linebits.Range(0, 2)},
		{"short last block, not reached", data(blockSize + 511), 0, blockSize + 512, linebits.Range(0, 1)},
		{"nothing whole", data(blockSize - 1), 1, 16 * blockSize, lineBits{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, zeroBlocks(tt.p, tt.off, tt.n))
		})
	}
}

// BenchmarkIsZero is what zero detection costs a stored 4 KiB block: data that is not zero is
// found out at its first word; a zero block (or one whose only other byte is its last) is read
// whole.
func BenchmarkIsZero(b *testing.B) {
	for _, bc := range []struct {
		name string
		set  int // the one byte that is not zero; -1: none
	}{{"data", 0}, {"zero", -1}, {"last-byte", blockSize - 1}} {
		p := make([]byte, blockSize)
		if bc.set >= 0 {
			p[bc.set] = 1
		}
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(blockSize)
			for b.Loop() {
				if isZero(p) != (bc.set < 0) {
					b.Fatal("wrong answer")
				}
			}
		})
	}
}
