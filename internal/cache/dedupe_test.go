package cache

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// weakHash is a content hash with four values: nearly every block a dedupe tier stores finds a
// candidate with other bytes, which the byte compare must turn down.
func weakHash(b []byte) uint64 { return uint64(b[0] & 3) }

// blockPool returns n distinct 4 KiB blocks that compress as text does, seeded.
func blockPool(n int, seed uint64) [][]byte {
	pool := make([][]byte, n)
	for i := range pool {
		pool[i] = textLike(blockSize, seed+uint64(i))
		copy(pool[i], fmt.Sprintf("block %d of the pool ", i)) // no two alike
	}
	return pool
}

// TestDedupeShares writes the same line's worth of blocks to many lines, in each mode: the SSD tier
// stores them once, every line reads back its own bytes, and so it stays after a restart (the
// references are counted again from the records) and as lines are written over one by one.
func TestDedupeShares(t *testing.T) {
	const line = 16 << 10
	const copies = 10
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			b, store, ssd := newCrashDev(32*line), gatedStore{&gate{}, meta.NewMem()}, newCrashDev(16*line)
			l := layout{line: line, ssd: 16, mode: mode, reduction: ReductionDedupe}
			one := textLike(line, 7)
			model := make([]byte, copies*line)
			for i := range copies {
				copy(model[i*line:], one)
			}
			c := newCache(t, b, l, store, ssd)
			_, err := c.WriteAt(model, 0)
			require.NoError(t, err)
			check := func(what string) TierStats {
				t.Helper()
				got := make([]byte, len(model))
				_, err := c.ReadAt(got, 0)
				require.NoError(t, err)
				require.True(t, bytes.Equal(model, got), what)
				return c.Stats().Tiers[0]
			}
			s := check("read back at once")
			require.Equal(t, uint64(len(model)), s.LogicalBytes)
			require.LessOrEqual(t, s.PhysicalBytes, uint64(line), "%d copies of a line stored once", copies)
			require.Equal(t, uint64((copies-1)*line/blockSize), s.DedupeHits)
			require.NoError(t, c.Close())

			c = newCache(t, b, l, store, ssd)
			hits := c.Stats().Tiers[0].Hits
			after := check("read back after a restart")
			require.Greater(t, after.Hits, hits, "from the SSD tier")
			require.Equal(t, s.PhysicalBytes, after.PhysicalBytes, "the same units after the restart")

			// Writing over the copies one at a time takes references away; the last copy keeps
			// the units, and what replaced the others is stored once too.
			other := textLike(line, 8)
			for i := range copies - 1 {
				copy(model[i*line:], other)
				_, err := c.WriteAt(other, int64(i)*line)
				require.NoError(t, err)
				check(fmt.Sprintf("after writing over copy %d", i))
			}
			require.NoError(t, c.Close())
			c = newCache(t, b, l, store, ssd)
			s = check("after a second restart")
			require.LessOrEqual(t, s.PhysicalBytes, uint64(2*line), "two lines' worth of units")
			require.NoError(t, c.Close())
		})
	}
}

// TestDedupeForcedCollision makes every block's hash the same (a test hook): each block written
// finds a candidate with other bytes, which the byte compare turns down, so every block reads back
// as written, and the tier counts the collisions. Blocks that are alike still share.
func TestDedupeForcedCollision(t *testing.T) {
	const line = 16 << 10
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			l := layout{line: line, ssd: 16, mode: mode, reduction: ReductionDedupe,
				dedupeHash: func([]byte) uint64 { return 42 }}
			c := newCache(t, mem.New(32*line), l, nil, nil)
			defer c.Close()
			pool := blockPool(8, 11)
			var model []byte
			for _, p := range pool {
				model = append(model, p...)
			}
			model = append(model, model...) // the second half: the first one's blocks again
			for i := 0; i < len(model); i += blockSize {
				_, err := c.WriteAt(model[i:i+blockSize], int64(i))
				require.NoError(t, err)
			}
			got := make([]byte, len(model))
			_, err := c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(model, got), "no block reads as another")
			s := c.Stats().Tiers[0]
			require.Positive(t, s.DedupeCollisions, "the byte compare caught the hash's collisions")
			// The table holds one unit for the one hash: of the second half, the block it names
			// (the last stored) is shared; the others collide.
			require.Positive(t, s.DedupeHits)
		})
	}
}

// TestDedupeReclaim writes and reads blocks drawn from a small pool over several times more lines
// than the SSD tier has room for, with random blocks among them, so that units are shared by many
// lines, reclaim copies shared units and drops lines that share them, and the tier restarts now
// and then; every byte is checked against a model.
func TestDedupeReclaim(t *testing.T) {
	const line = 16 << 10
	const lines = 96
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			b, store, ssd := newCrashDev(lines*line), gatedStore{&gate{}, meta.NewMem()}, newCrashDev(8*line)
			l := layout{line: line, ssd: 8, mode: mode, reduction: ReductionDedupe}
			pool := append(blockPool(24, 20), make([]byte, blockSize)) // and a zero block
			model := textLike(lines*line, 3)
			_, err := b.WriteAt(model, 0)
			require.NoError(t, err)
			c := newCache(t, b, l, store, ssd)
			defer func() { c.Close() }()
			r := rand.New(rand.NewPCG(5, 5))
			buf := make([]byte, line)
			var evictions, shared uint64 // of the runs before a restart
			for op := range 4000 {
				if op%1000 == 999 {
					s := c.Stats().Tiers[0]
					evictions, shared = evictions+s.Evictions, shared+s.DedupeHits
					require.NoError(t, c.Close())
					c = newCache(t, b, l, store, ssd)
				}
				off := int64(r.IntN(lines*line/blockSize-3)) * blockSize
				n := blockSize * (1 + r.IntN(3))
				if r.IntN(2) == 0 {
					for k := 0; k < n; k += blockSize {
						if r.IntN(3) == 0 { // a block of its own, random bytes: room runs short
							for i := k; i < k+blockSize; i++ {
								buf[i] = byte(r.Uint32())
							}
						} else {
							copy(buf[k:], pool[r.IntN(len(pool))])
						}
					}
					copy(model[off:], buf[:n])
					_, err := c.WriteAt(buf[:n], off)
					require.NoError(t, err)
					continue
				}
				_, err := c.ReadAt(buf[:n], off)
				require.NoError(t, err)
				require.True(t, bytes.Equal(model[off:off+int64(n)], buf[:n]), "op %d: bytes at %d", op, off)
			}
			s := c.Stats().Tiers[0]
			require.Positive(t, evictions+s.Evictions, "reclaim dropped lines")
			require.Positive(t, shared+s.DedupeHits, "blocks shared units")
			require.LessOrEqual(t, s.PhysicalBytes, uint64(8*line))
			require.Zero(t, s.Errors)
			got := make([]byte, len(model))
			_, err = c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(model, got), "all of it, at the end")
		})
	}
}

// TestDedupeCrash writes shared blocks in write-back, flushes, and crashes (every device and the
// store cut at once, with and without the run log), over and over: after each restart every block
// reads as the model has it, from the cache and, once flushed to the backend, from the backend.
func TestDedupeCrash(t *testing.T) {
	const line = 8 << 10
	const lines = 48
	for _, logged := range []bool{false, true} {
		t.Run(map[bool]string{false: "kill9", true: "kill9-runlog"}[logged], func(t *testing.T) {
			m := newMachine(lines*line, 12*line)
			l := layout{line: line, ssd: 12, mode: WriteBack, reduction: ReductionDedupe}
			if logged {
				m.withRunLog(t.TempDir(), &l)
			}
			pool := blockPool(6, 30)
			model := make([]byte, lines*line)
			r := rand.New(rand.NewPCG(6, 6))
			for cycle := range 8 {
				g := &gate{}
				m.keepRunLog(g, kill9)
				m.restoreRunLog(t)
				c := newCache(t, gatedDev{g, m.back}, l, gatedStore{g, m.store}, gatedDev{g, m.ssd})
				got := make([]byte, len(model))
				_, err := c.ReadAt(got, 0)
				require.NoError(t, err)
				require.True(t, bytes.Equal(model, got), "cycle %d: after the restart", cycle)
				if cycle%2 == 1 {
					require.NoError(t, c.FlushAll(context.Background(), nil))
					require.True(t, bytes.Equal(model, m.back.cur), "cycle %d: the backend, written back", cycle)
				}
				for range 60 {
					off := int64(r.IntN(lines*line/blockSize)) * blockSize
					p := pool[r.IntN(len(pool))]
					_, err := c.WriteAt(p, off)
					require.NoError(t, err)
					copy(model[off:], p)
				}
				require.NoError(t, c.Flush())
				g.crash()
				c.Close()
			}
		})
	}
}

// maxDedupeBytesPerEntry is the RAM per entry of the dedupe table that docs/architecture.md states.
const maxDedupeBytesPerEntry = 96

// TestDedupeTableBytesPerEntry measures the RAM the dedupe table takes per unit it remembers.
func TestDedupeTableBytesPerEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a large table")
	}
	const n = 1 << 20
	before := heapInUse()
	d := newDedupe(n)
	for i := range uint64(n) {
		d.Remember(i*0x9e3779b97f4a7c15, pack.Loc(int64(i)*blockSize, blockSize, pack.Raw))
	}
	per := float64(heapInUse()-before) / n
	t.Logf("%.1f bytes of RAM per dedupe table entry", per)
	require.LessOrEqual(t, per, float64(maxDedupeBytesPerEntry))
	runtime.KeepAlive(d)
}

// TestDedupeWithinWrite writes a line whose blocks repeat, in one write: it is stored once per
// distinct block, and reads back; so it stays after a restart, and after the repeats are written
// over one at a time.
func TestDedupeWithinWrite(t *testing.T) {
	const line = 64 << 10
	b, store, ssd := newCrashDev(4*line), gatedStore{&gate{}, meta.NewMem()}, newCrashDev(8*line)
	l := layout{line: line, ssd: 8, mode: WriteBack, reduction: ReductionDedupe}
	pool := blockPool(2, 40)
	model := make([]byte, line)
	for i := 0; i < line; i += blockSize {
		copy(model[i:], pool[i/blockSize%2])
	}
	c := newCache(t, b, l, store, ssd)
	_, err := c.WriteAt(model, line)
	require.NoError(t, err)
	s := c.Stats().Tiers[0]
	one := func(p []byte) uint64 {
		var buf [2 * blockSize]byte
		return uint64(len(s2.Encode(buf[:], p)))
	}
	require.Equal(t, one(pool[0])+one(pool[1]), s.PhysicalBytes, "two distinct blocks stored once each")
	require.Equal(t, uint64(line/blockSize-2), s.DedupeHits)
	require.NoError(t, c.Close())
	c = newCache(t, b, l, store, ssd)
	defer func() { c.Close() }()
	got := make([]byte, line)
	for i := 0; i < line; i += 2 * blockSize {
		p := textLike(blockSize, uint64(i))
		copy(model[i:], p)
		_, err := c.WriteAt(p, line+int64(i))
		require.NoError(t, err)
		_, err = c.ReadAt(got, line)
		require.NoError(t, err)
		require.True(t, bytes.Equal(model, got), "after writing over block %d", i/blockSize)
	}
}
