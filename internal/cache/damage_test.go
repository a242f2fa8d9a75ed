package cache

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
)

// A damage is what may happen to an SSD tier's device behind the cache's back.
type damage struct {
	name string
	do   func(d *crashDev)
}

var damages = []damage{
	// Bit rot, or another program writing the device: a byte flipped every 16, so that every
	// unit of a packed tier, even one compressed to a few dozen bytes, is hit.
	{"flipped", func(d *crashDev) {
		d.change(func(b []byte) {
			for i := 7; i < len(b); i += 16 {
				b[i] ^= 0x5a
			}
		})
	}},
	// Misdirected writes: every 4 KiB of the device holds the 4 KiB that were after it.
	{"misplaced", func(d *crashDev) {
		d.change(func(b []byte) {
			first := bytes.Clone(b[:blockSize])
			copy(b, b[blockSize:])
			copy(b[len(b)-blockSize:], first)
		})
	}},
}

// change applies fn to the device's bytes: what reads see and what survives power loss alike.
func (d *crashDev) change(fn func([]byte)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn(d.cur)
	fn(d.durable)
}

// TestDamagedTier damages the SSD tier's device (while tierblk is stopped, and while it runs),
// with every reduction, in write-through and write-back, and reads every block: no wrong byte is
// ever served. Clean blocks come from the backend; dirty ones read as lost, are never written
// back (the backend keeps its older data), count in the stats, and stay lost across a restart
// until a write of the range clears them. Write-back in address order, where dirty data stays
// dirty until the watermarks call for it, and a lost block leaves the tier while the rest goes
// back (in FLUSH order a lost block halts the write back: TestOrderLostBlock).
func TestDamagedTier(t *testing.T) {
	const line = 16 << 10
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		for _, r := range []Reduction{ReductionOff, ReductionZero, ReductionCompress, ReductionDedupe} {
			for _, dmg := range damages {
				for _, running := range []bool{false, true} {
					when := "stopped"
					if running {
						when = "running"
					}
					l := withReduction(layout{line: line, ssd: 32, mode: mode, order: OrderAddress}, r)
					t.Run(fmt.Sprintf("%s-%s-%s-%s", mode, r, dmg.name, when), func(t *testing.T) {
						t.Parallel()
						damagedTier(t, l, dmg, running)
					})
				}
			}
		}
	}
}

func damagedTier(t *testing.T, l layout, dmg damage, running bool) {
	const lines = 16
	devSize := lines * l.line
	blocks := int(devSize / blockSize)
	back, ssd, store := newCrashDev(devSize), newCrashDev(l.ssd*l.line), meta.NewMem()
	old := make([]byte, devSize)
	stamp(old[:devSize/2], 0, 2) // compresses
	stamp(old[devSize/2:], int(devSize/2/sector), 1)
	_, err := back.WriteAt(old, 0)
	require.NoError(t, err)
	start := func() *Cache {
		g := &gate{}
		return newCache(t, gatedDev{g, back}, l, gatedStore{g, store}, gatedDev{g, ssd})
	}
	c := start()
	all := make([]byte, devSize)
	for range 2 { // admitted by the first read at the latest
		_, err := c.ReadAt(all, 0)
		require.NoError(t, err)
	}
	want := bytes.Clone(old)
	dirty := make([]bool, blocks)
	if l.mode == WriteBack {
		// New data over a block in two and over a whole line: dirty; the rest stays clean.
		for b := 0; b < blocks; b++ {
			if b%2 == 0 || b < int(l.line/blockSize) {
				off := int64(b) * blockSize
				p := make([]byte, blockSize)
				stamp(p, int(off/sector), int64(3+b%2))
				_, err := c.WriteAt(p, off)
				require.NoError(t, err)
				copy(want[off:], p)
				dirty[b] = true
			}
		}
	}
	require.NoError(t, c.Flush())
	for ln := range uint64(lines) {
		require.True(t, c.ssd.holds(ln, linebits.Range(0, int(l.line/blockSize))), "line %d is not on the SSD tier", ln)
	}
	if running {
		dmg.do(ssd)
	} else {
		require.NoError(t, c.Close())
		dmg.do(ssd)
		c = start()
	}
	defer func() { c.Close() }()

	// What each block reads; lost, for a dirty one; never wrong bytes.
	check := func(stage string) {
		t.Helper()
		for b := range blocks {
			off := int64(b) * blockSize
			got := make([]byte, blockSize)
			_, err := c.ReadAt(got, off)
			if dirty[b] {
				require.ErrorIs(t, err, ErrLost, "%s: block %d, dirty when damaged", stage, b)
				continue
			}
			require.NoError(t, err, "%s: block %d", stage, b)
			require.True(t, bytes.Equal(want[off:off+blockSize], got), "%s: block %d reads wrong bytes", stage, b)
		}
	}
	check("after the damage")
	s := c.Stats()
	nDirty := 0
	for _, d := range dirty {
		if d {
			nDirty++
		}
	}
	require.NotZero(t, s.Tiers[0].ChecksumErrors, "no checksum error counted")
	require.EqualValues(t, nDirty*blockSize, s.Lost.Bytes)
	require.EqualValues(t, nDirty, s.Lost.Blocks)
	check("read again")
	require.EqualValues(t, s.Tiers[0].ChecksumErrors, c.Stats().Tiers[0].ChecksumErrors,
		"blocks found damaged were found again: they should have left the tier")

	// Nothing damaged reaches the backend: a lost block keeps the backend's older data.
	require.NoError(t, c.FlushAll(context.Background(), nil))
	onBackend := make([]byte, devSize)
	_, err = back.ReadAt(onBackend, 0)
	require.NoError(t, err)
	for b := range blocks {
		off := int64(b) * blockSize
		w := want[off : off+blockSize]
		if dirty[b] {
			w = old[off : off+blockSize]
		}
		require.True(t, bytes.Equal(w, onBackend[off:off+blockSize]), "block %d on the backend is neither what was written nor lost", b)
	}

	// Lost ranges outlive a restart; a write clears what it covers.
	require.NoError(t, c.Close())
	c = start()
	check("after a restart")
	for b := range blocks {
		if dirty[b] && b%4 == 0 {
			off := int64(b) * blockSize
			p := make([]byte, blockSize)
			stamp(p, int(off/sector), 7)
			_, err := c.WriteAt(p, off)
			require.NoError(t, err)
			copy(want[off:], p)
			dirty[b] = false
		}
	}
	check("after writes over lost blocks")
}

// TestDamageRepairedFromRAM damages dirty blocks the RAM tier holds too: they are written to the
// SSD tier again from RAM, not lost, and the backend gets the data that was written. Fewer lines
// than the errors that bypass a tier (maxTierErrors), all in RAM.
func TestDamageRepairedFromRAM(t *testing.T) {
	const line, lines = 16 << 10, maxTierErrors - 2
	for _, r := range []Reduction{ReductionOff, ReductionCompress} {
		t.Run(r.String(), func(t *testing.T) {
			l := withReduction(layout{line: line, ram: 8, ssd: 32, mode: WriteBack}, r)
			devSize := int64(lines * line)
			back, ssd := newCrashDev(devSize), newCrashDev(l.ssd*l.line)
			g := &gate{}
			c := newCache(t, gatedDev{g, back}, l, gatedStore{g, meta.NewMem()}, gatedDev{g, ssd})
			defer c.Close()
			want := make([]byte, devSize)
			// One block in each line: the write goes to RAM too (a whole line would not).
			for ln := range int64(lines) {
				off := ln*line + blockSize
				stamp(want[off:off+blockSize], int(off/sector), 5)
				_, err := c.WriteAt(want[off:off+blockSize], off)
				require.NoError(t, err)
				require.True(t, c.ram.holds(uint64(ln), linebits.Range(1, 2)), "line %d: the write is not in RAM", ln)
			}
			damages[0].do(ssd)
			require.NoError(t, c.FlushAll(context.Background(), nil)) // reads every dirty block from the SSD
			onBackend := make([]byte, devSize)
			_, err := back.ReadAt(onBackend, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, onBackend), "the backend does not hold what was written")
			s := c.Stats()
			require.Zero(t, s.Lost.Bytes)
			require.EqualValues(t, lines, s.Lost.Repaired)
			got := make([]byte, devSize)
			_, err = c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got))
		})
	}
}

// TestRecordsWithoutChecksums starts on an SSD tier whose records have no checksums, as a tierblk
// from before them wrote: its dirty blocks are read once for their sums and keep their data; its
// clean blocks are dropped and read from the backend; nothing reads wrong, and damage found after
// that is caught.
func TestRecordsWithoutChecksums(t *testing.T) {
	const line = 16 << 10
	for _, r := range []Reduction{ReductionOff, ReductionCompress} {
		t.Run(r.String(), func(t *testing.T) {
			l := withReduction(layout{line: line, ssd: 32, mode: WriteBack}, r)
			devSize := int64(8 * line)
			back, ssd, store := newCrashDev(devSize), newCrashDev(l.ssd*l.line), meta.NewMem()
			want := make([]byte, devSize)
			stamp(want, 0, 1)
			_, err := back.WriteAt(want, 0)
			require.NoError(t, err)
			start := func() *Cache {
				g := &gate{}
				return newCache(t, gatedDev{g, back}, l, gatedStore{g, store}, gatedDev{g, ssd})
			}
			c := start()
			for range 2 { // clean lines
				_, err := c.ReadAt(make([]byte, devSize), 0)
				require.NoError(t, err)
			}
			for ln := int64(0); ln < 8; ln += 2 { // dirty blocks in every other line
				off := ln*line + blockSize
				stamp(want[off:off+blockSize], int(off/sector), 3)
				_, err := c.WriteAt(want[off:off+blockSize], off)
				require.NoError(t, err)
			}
			require.NoError(t, c.Close())

			var ops []meta.Op
			require.NoError(t, store.Lines(func(r meta.Line) error {
				require.NotNil(t, r.Sum, "line %d was stored without checksums", r.Line)
				r.Sum = nil
				ops = append(ops, meta.Op{Rec: r})
				return nil
			}))
			require.NoError(t, store.Commit(ops, true))

			c = start()
			defer c.Close()
			for ln := range uint64(8) {
				_, dirty := c.ssd.bits(ln)
				if ln%2 == 0 {
					require.Equal(t, linebits.Range(1, 2), dirty, "line %d keeps its dirty block", ln)
				} else {
					require.False(t, c.ssd.holds(ln, linebits.Range(0, 1)), "line %d, clean, was kept without checksums", ln)
				}
			}
			got := make([]byte, devSize)
			_, err = c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "the data read after the start differs")
			damages[0].do(ssd)
			_, err = c.ReadAt(got[:blockSize], blockSize) // line 0's dirty block
			require.ErrorIs(t, err, ErrLost, "a dirty block damaged after the start")
		})
	}
}

// TestScrub damages chosen blocks of a tier of slots, clean and dirty, and scrubs it: the scrub
// finds every one, reports the dirty ones as lost ranges, and a read of a clean one is right. In
// address order, where the dirty ones stay dirty until the watermarks call for them, and leave
// the tier once lost (FLUSH order: TestOrderLostBlock).
func TestScrub(t *testing.T) {
	const line = 16 << 10
	l := layout{line: line, ssd: 16, mode: WriteBack, order: OrderAddress}
	devSize := int64(8 * line)
	back, ssd := newCrashDev(devSize), newCrashDev(l.ssd*l.line)
	want := make([]byte, devSize)
	stamp(want, 0, 1)
	_, err := back.WriteAt(want, 0)
	require.NoError(t, err)
	g := &gate{}
	c := newCache(t, gatedDev{g, back}, l, gatedStore{g, meta.NewMem()}, gatedDev{g, ssd})
	defer c.Close()
	for range 2 {
		_, err := c.ReadAt(make([]byte, devSize), 0)
		require.NoError(t, err)
	}
	dirtyAt := []int64{2*line + blockSize, 5 * line}
	for _, off := range dirtyAt {
		stamp(want[off:off+blockSize], int(off/sector), 3)
		_, err := c.WriteAt(want[off:off+blockSize], off)
		require.NoError(t, err)
	}
	damageAt := append([]int64{0, 3*line + 2*blockSize, 7*line + 3*blockSize}, dirtyAt...)
	for _, off := range damageAt {
		slot, ok := c.ssd.slotOf(uint64(off / line))
		require.True(t, ok)
		at := int64(slot)*line + off%line + 100
		ssd.change(func(b []byte) { b[at] ^= 1 })
	}
	s, err := c.Scrub(context.Background(), 0)
	require.NoError(t, err)
	require.EqualValues(t, 8, s.Lines)
	require.EqualValues(t, 8, s.Done)
	require.EqualValues(t, devSize, s.Bytes)
	require.EqualValues(t, len(damageAt), s.Damaged)
	require.EqualValues(t, len(dirtyAt), s.Lost)
	var lost []meta.Range
	for _, off := range dirtyAt {
		lost = append(lost, meta.Range{Off: off, Len: blockSize})
	}
	require.Equal(t, lost, c.LostRanges())
	require.False(t, c.Stats().Scrub.Running)
	got := make([]byte, blockSize)
	for _, off := range damageAt {
		_, err := c.ReadAt(got, off)
		if slices.Contains(dirtyAt, off) {
			require.ErrorIs(t, err, ErrLost)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, want[off:off+blockSize], got)
	}
	s, err = c.Scrub(context.Background(), 0) // nothing damaged is left on the tier
	require.NoError(t, err)
	require.Zero(t, s.Damaged)
}
