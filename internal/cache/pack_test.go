package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/file"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// packedOf returns t's packed store, nil if t has another.
func packedOf(t *tier) *packed {
	pk, _ := t.st.(*packed)
	return pk
}

// textLike returns n bytes that compress as text does (words from a small vocabulary), seeded.
func textLike(n int, seed uint64) []byte {
	words := []string{"block ", "cache ", "tier ", "the ", "of ", "segment ", "line ", "write ", "read ", "\n"}
	r := rand.New(rand.NewPCG(seed, 1))
	var b bytes.Buffer
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.Bytes()[:n]
}

// TestPackedRoundTrip writes compressible data, zeros and random bytes through a tier with reduction
// compress, in each mode, and reads them back: at once, and after a restart on the same SSD and
// metadata, from the SSD tier (hits). The tier stores less than half of what it holds, and a zero
// block reads back as zeros after the restart.
func TestPackedRoundTrip(t *testing.T) {
	const line = 64 << 10
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			b, store, ssd := newCrashDev(32*line), gatedStore{&gate{}, meta.NewMem()}, newCrashDev(16*line)
			l := layout{line: line, ssd: 16, mode: mode, reduction: ReductionCompress}
			want := make([]byte, 8*line)
			copy(want, textLike(6*line, 1))
			// line 6 zeros, line 7 half random bytes (stored as they are), half zeros
			r := rand.New(rand.NewPCG(2, 2))
			for i := 7 * line; i < 7*line+line/2; i++ {
				want[i] = byte(r.Uint32())
			}
			c := newCache(t, b, l, store, ssd)
			_, err := c.WriteAt(want, 0)
			require.NoError(t, err)
			got := make([]byte, len(want))
			_, err = c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "read back at once")
			s := c.Stats().Tiers[0]
			require.Equal(t, uint64(len(want)), s.LogicalBytes)
			require.Less(t, s.PhysicalBytes, s.LogicalBytes/2, "compressible data and zeros")
			require.Greater(t, s.PhysicalBytes, uint64(line/2), "the random half block is stored whole")
			require.NoError(t, c.Close())

			c = newCache(t, b, l, store, ssd)
			hits := c.Stats().Tiers[0].Hits
			clear(got)
			_, err = c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "read back after a restart")
			require.Greater(t, c.Stats().Tiers[0].Hits, hits, "from the SSD tier")
			require.Equal(t, s.PhysicalBytes, c.Stats().Tiers[0].PhysicalBytes, "the same units after the restart")
			require.NoError(t, c.Close())
		})
	}
}

// TestPackedReclaim reads and writes several times more distinct data than the SSD tier has room
// for, so that reclaim empties segments over and over (dropping clean lines, moving dirty and hot
// ones), and checks every byte against a model. The tier never holds more than its room.
func TestPackedReclaim(t *testing.T) {
	const line = 16 << 10
	const lines = 96
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			b, store, ssd := mem.New(lines*line), meta.NewMem(), mem.New(16*line)
			model := textLike(lines*line, 3)
			_, err := b.WriteAt(model, 0)
			require.NoError(t, err)
			c := newCache(t, b, layout{line: line, ssd: 16, mode: mode, reduction: ReductionCompress}, store, ssd)
			r := rand.New(rand.NewPCG(4, 4))
			buf := make([]byte, line)
			for range 3000 {
				ln := int64(r.IntN(lines - 1))
				off, n := ln*line+int64(r.IntN(4))*blockSize, blockSize*(1+r.IntN(3))
				if r.IntN(3) == 0 {
					p := textLike(n, r.Uint64())
					copy(model[off:], p)
					_, err := c.WriteAt(p, off)
					require.NoError(t, err)
					continue
				}
				_, err := c.ReadAt(buf[:n], off)
				require.NoError(t, err)
				require.True(t, bytes.Equal(model[off:off+int64(n)], buf[:n]), "bytes at %d", off)
			}
			s := c.Stats().Tiers[0]
			require.Greater(t, s.Evictions, uint64(0), "reclaim dropped lines")
			require.LessOrEqual(t, s.PhysicalBytes, uint64(16*line))
			require.Zero(t, s.Errors)
			got := make([]byte, len(model))
			_, err = c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(model, got), "all of it, at the end")
		})
	}
}

// TestPackedCorruptUnit damages the SSD bytes of a compressed line: a clean line is read again from
// the backend, a dirty one fails with an error, and neither ever reads as other data.
func TestPackedCorruptUnit(t *testing.T) {
	const line = 16 << 10
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			b, store, ssd := mem.New(8*line), meta.NewMem(), mem.New(8*line)
			c := newCache(t, b, layout{line: line, ssd: 8, mode: mode, reduction: ReductionCompress}, store, ssd)
			want := textLike(line, 5)
			_, err := c.WriteAt(want, 0)
			require.NoError(t, err)
			junk := make([]byte, 8*line)
			for i := range junk {
				junk[i] = 0xa5
			}
			_, err = ssd.WriteAt(junk, 0)
			require.NoError(t, err)
			got := make([]byte, line)
			_, err = c.ReadAt(got, 0)
			if mode == WriteBack {
				require.Error(t, err, "a dirty line whose units do not decode")
			} else {
				require.NoError(t, err)
				require.True(t, bytes.Equal(want, got), "a clean line is read from the backend")
			}
		})
	}
}

// TestPackedLargeLines writes and reads whole 1 MiB lines (256 blocks, more units in one write
// than packed.write keeps on its stack) through a tier with reduction compress.
func TestPackedLargeLines(t *testing.T) {
	const line = 1 << 20
	b, ssd := mem.New(4*line), mem.New(8*line)
	c := newCache(t, b, layout{line: line, ssd: 8, mode: WriteBack, reduction: ReductionCompress}, meta.NewMem(), ssd)
	want := textLike(2*line, 6)
	_, err := c.WriteAt(want, line)
	require.NoError(t, err)
	got := make([]byte, len(want))
	_, err = c.ReadAt(got, line)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got))
}

// TestIncompressible checks the sampling that spares random-looking blocks a compression: random
// bytes, and random bytes with fio's offset stamped at every 512 bytes, are taken as they are;
// text, stamped sectors and blocks half zeros are compressed.
func TestIncompressible(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	random := make([]byte, blockSize)
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	fioLike := bytes.Clone(random)
	for off := 0; off < blockSize; off += 512 {
		copy(fioLike[off:], []byte{0, 0x60, 0x24, 0, 0, 0, 0, 0})
	}
	halfZero := bytes.Clone(random)
	clear(halfZero[blockSize/2:])
	stamped := make([]byte, blockSize)
	stamp(stamped, 8, 42)
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"random", random, true},
		{"random with fio's offsets", fioLike, true},
		{"text", textLike(blockSize, 1), false},
		{"stamped sectors", stamped, false},
		{"half zeros", halfZero, false},
		{"zeros", make([]byte, blockSize), false},
	} {
		require.Equal(t, tc.want, pack.Incompressible(tc.b), tc.name)
	}
}

// TestDefaultReductionKeepsLayout opens an SSD tier made with the slot layout (reduction zero) with
// the default reduction, compress, not chosen by the config: the tier keeps its layout and its
// data. Named in the config, compress is refused on it, and nothing changes.
func TestDefaultReductionKeepsLayout(t *testing.T) {
	const line = 16 << 10
	b, store, ssd := newCrashDev(8*line), gatedStore{&gate{}, meta.NewMem()}, newCrashDev(8*line)
	l := layout{line: line, ssd: 8, mode: WriteBack, reduction: ReductionZero}
	want := textLike(2*line, 12)
	c := newCache(t, b, l, store, ssd)
	_, err := c.WriteAt(want, 0)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	cfg := testConfig(layout{line: line, ssd: 8, mode: WriteBack, reduction: DefaultReduction}, store, ssd)
	_, err = New(b, cfg)
	require.ErrorIs(t, err, ErrMismatch, "compress named on a slot tier")

	cfg.ReductionDefault = true
	c, err = New(b, cfg)
	require.NoError(t, err)
	defer c.Close()
	s := c.Stats().Tiers[0]
	require.Equal(t, "zero", s.Reduction)
	require.Equal(t, uint64(2*line/blockSize), s.LogicalBytes/blockSize)
	got := make([]byte, len(want))
	_, err = c.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the dirty data, from the tier it kept")
}

// BenchmarkUnitDecode is what a hit pays to get a 4 KiB block out of its unit: S2's decoding of a
// compressed one against the copy of one stored as it is (all a RAM tier's hit does). It is why
// the RAM tier does not compress (docs/architecture.md#data-reduction-the-packed-layout).
func BenchmarkUnitDecode(b *testing.B) {
	src := textLike(blockSize, 1)
	for _, tc := range []struct {
		name  string
		codec int
		unit  []byte
	}{{"s2", pack.S2, s2.Encode(nil, src)}, {"raw", pack.Raw, src}} {
		b.Run(tc.name, func(b *testing.B) {
			l := pack.Loc(0, len(tc.unit), tc.codec)
			dst := make([]byte, blockSize)
			b.SetBytes(blockSize)
			for b.Loop() {
				if err := pack.Decode(dst, tc.unit, l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// cutAfterDev is a gated device that crashes its gate at its n-th write: a crash at a chosen
// point of what the cache does next.
type cutAfterDev struct {
	gatedDev
	n *atomic.Int64
}

func (d cutAfterDev) WriteAt(p []byte, off int64) (int, error) {
	if d.n.Add(-1) < 0 {
		d.g.crash()
	}
	return d.gatedDev.WriteAt(p, off)
}

// rewriteBlocks writes n blocks at random over the device model mirrors, text that compresses or,
// one time in three, random bytes that do not: rewrites leave dead units across a packed tier's
// segments, among the dirty ones.
func rewriteBlocks(t *testing.T, c *Cache, model []byte, rng *rand.Rand, n int) {
	t.Helper()
	for range n {
		off := int64(rng.IntN(len(model)/blockSize)) * blockSize
		p := textLike(blockSize, rng.Uint64())
		if rng.IntN(3) == 0 {
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
		}
		_, err := c.WriteAt(p, off)
		require.NoError(t, err)
		copy(model[off:], p)
	}
}

// TestCrashDuringReclaim crashes a packed tier (kill -9, no run log) at each write of a reclaim
// that copies dirty units, the data flushed before: after the restart every byte reads as flushed,
// and is written back so. Reclaim's copies are new units whose records the crash may or may not
// have committed; either way the old units must still be there.
func TestCrashDuringReclaim(t *testing.T) {
	const line = 16 << 10
	const lines = 12
	for _, r := range []Reduction{ReductionCompress, ReductionDedupe} {
		for cut := range 6 {
			t.Run(fmt.Sprintf("%s-write-%d", r, cut), func(t *testing.T) {
				m := newMachine(lines*line, 8*line)
				l := layout{line: line, ssd: 8, mode: WriteBack, reduction: r}
				g := &gate{}
				n := &atomic.Int64{}
				n.Store(1 << 40)
				c := newCache(t, gatedDev{g, m.back}, l, gatedStore{g, m.store}, cutAfterDev{gatedDev{g, m.ssd}, n})
				model := make([]byte, lines*line)
				rng := rand.New(rand.NewPCG(uint64(cut), 7))
				pk := packedOf(c.ssd)
				// How many copies reclaim makes depends on what the background loop's own reclaim
				// left it; where that is fewer than the cut, more rewrites leave it more to copy.
				for range 10 {
					n.Store(1 << 40)
					rewriteBlocks(t, c, model, rng, 200)
					require.NoError(t, c.Flush())
					n.Store(int64(cut))
					pk.mu.Lock()
					pk.target = len(pk.used) // reclaim empties every segment it can
					pk.mu.Unlock()
					c.ssd.st.reclaim()
					if n.Load() < 0 {
						break
					}
				}
				if reached := n.Load() < 0; cut <= 1 {
					require.True(t, reached, "reclaim's copies reached the cut")
				} else if !reached {
					t.Logf("reclaim wrote less than %d times: the crash came after it", cut+1)
				}
				c = killAndRestart(t, m, l, g, c, model)
				require.NoError(t, c.FlushAll(context.Background(), nil))
				require.True(t, bytes.Equal(model, m.back.cur), "written back")
			})
		}
	}
}

// BenchmarkHits1M measures 1 MiB reads that the SSD tier serves alone (no RAM tier), of random
// (incompressible) data, over a RAM backend: the CPU a 1 MiB SSD-tier hit costs the cache,
// checksums included, for each reduction (bench cache --parts checksums, the 1M row, through
// NBD). The SSD is in RAM ("mem", whose reads are copies), or a file in the test's directory
// opened as the daemon opens one ("file": reads with O_DIRECT, through io_uring where the kernel
// has it). A 32 MiB working set, written once and read once first; misses counts reads that were
// not hits (0 when the tier holds the working set).
func BenchmarkHits1M(b *testing.B) {
	const size = 32 << 20
	for _, dev := range []string{"mem", "file"} {
		for _, r := range []Reduction{ReductionOff, ReductionCompress} {
			b.Run(dev+"/reduction-"+r.String(), func(b *testing.B) {
				l := layout{line: 64 << 10, ssd: 2 * size / (64 << 10), reduction: r}
				var ssd backend.Backend = mem.New(l.ssd * l.line)
				if dev == "file" {
					u := url.URL{Scheme: "file", Path: filepath.Join(b.TempDir(), "ssd"),
						RawQuery: fmt.Sprintf("direct=reads&size=%d", l.ssd*l.line)}
					var err error
					if ssd, err = file.Open(&u, backend.Options{}); errors.Is(err, backend.ErrNoDirectIO) {
						testenv.Skip(b, testenv.DirectIO, "the SSD tier's file cannot be opened direct")
					}
					require.NoError(b, err)
				}
				c := newCache(b, mem.New(size), l, nil, ssd)
				defer c.Close()
				data := make([]byte, size)
				_, _ = rand.NewChaCha8([32]byte{1}).Read(data)
				_, err := c.WriteAt(data, 0)
				require.NoError(b, err)
				_, err = c.ReadAt(data, 0)
				require.NoError(b, err)
				misses := c.ssd.misses.Load()
				b.SetBytes(1 << 20)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					rng := rand.New(rand.NewPCG(rand.Uint64(), 0))
					buf := make([]byte, 1<<20)
					for pb.Next() {
						if _, err := c.ReadAt(buf, rng.Int64N(size>>20)<<20); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(c.ssd.misses.Load()-misses), "misses")
			})
		}
	}
}

// TestMutableUnits: on a packed tier, a block rewritten while dirty gets a mutable unit, which its
// next rewrites go into in place, also after a checkpoint committed it, with no new record; after a
// kill (no run log) the restart takes that block as the last write left it. A dirty block written
// once keeps a unit that is never written in place, and damage to it after the kill is found: its
// range is lost, not served.
func TestMutableUnits(t *testing.T) {
	const line = 16 << 10
	l := layout{line: line, ssd: 32, mode: WriteBack, reduction: ReductionCompress}
	back, ssd, store := newCrashDev(4*line), newCrashDev(l.ssd*l.line), meta.NewMem()
	g := &gate{}
	c := newCache(t, gatedDev{g, back}, l, gatedStore{g, store}, gatedDev{g, ssd})
	rng := rand.NewChaCha8([32]byte{7})
	block := func() []byte {
		p := make([]byte, blockSize)
		_, _ = rng.Read(p) // incompressible: stored as it is
		return p
	}
	write := func(b int, p []byte) {
		t.Helper()
		_, err := c.WriteAt(p, int64(b)*blockSize)
		require.NoError(t, err)
	}
	loc := func(b int) uint64 {
		c.ssd.mu.RLock()
		defer c.ssd.mu.RUnlock()
		slot, ok := c.ssd.slotOf(0)
		require.True(t, ok)
		return packedOf(c.ssd).slotLocs(slot, b, b+1)[0]
	}
	checkpoint := func() {
		t.Helper()
		backendErr, tierErr := c.ssd.j.checkpoint()
		require.NoError(t, errors.Join(backendErr, tierErr))
	}

	write(0, block()) // dirty, written once
	write(1, block())
	checkpoint()
	require.False(t, pack.IsMutable(loc(0)), "a block written once got a mutable unit")
	write(0, block()) // rewritten while dirty
	checkpoint()
	rewritten := loc(0)
	require.True(t, pack.IsMutable(rewritten), "a block rewritten while dirty did not get a mutable unit")
	last := block()
	write(0, last)
	require.Equal(t, rewritten, loc(0), "a rewrite of a block in a mutable unit was not written in place")
	once := loc(1)
	require.False(t, pack.IsMutable(once))

	g.crash() // a kill: the SSD keeps what was written, the store what was committed
	c.Close()
	ssd.change(func(b []byte) { b[pack.Off(once)+100] ^= 1 })
	c = newCache(t, gatedDev{&gate{}, back}, l, gatedStore{&gate{}, store}, gatedDev{&gate{}, ssd})
	defer c.Close()
	got := make([]byte, blockSize)
	_, err := c.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, last, got, "the block rewritten in place reads other than its last write")
	require.EqualValues(t, 1, c.Stats().Tiers[0].Adopted)
	_, err = c.ReadAt(got, blockSize)
	require.ErrorIs(t, err, ErrLost, "damage to a block written once was not found after the kill")
}

// TestPackReadMixed reads a packed line of compressed, zero and incompressible blocks into a
// buffer that holds other bytes: each block reads as written, the zero blocks (no unit) as zeros,
// whichever way its neighbours are read (decoded, or straight into the buffer).
func TestPackReadMixed(t *testing.T) {
	const line = 32 << 10
	c := newCache(t, mem.New(4*line), layout{line: line, ssd: 32, mode: WriteBack, reduction: ReductionCompress}, nil, nil)
	defer c.Close()
	want := make([]byte, line)
	rng := rand.NewChaCha8([32]byte{3})
	for b, kind := range []string{"text", "zero", "random", "random", "zero", "text", "zero", "random"} {
		p := want[b*blockSize : (b+1)*blockSize]
		switch kind {
		case "text":
			copy(p, textLike(blockSize, uint64(b)))
		case "random":
			_, _ = rng.Read(p)
		}
	}
	_, err := c.WriteAt(want, 0)
	require.NoError(t, err)
	c.ssd.mu.RLock()
	slot, ok := c.ssd.slotOf(0)
	c.ssd.mu.RUnlock()
	require.True(t, ok)
	for _, r := range [][2]int{{0, line}, {blockSize, line}, {100, line - 100}, {blockSize, 3 * blockSize}} {
		got := bytes.Repeat([]byte{0xff}, r[1]-r[0])
		require.NoError(t, c.ssd.st.read(0, slot, got, int64(r[0]), false))
		require.True(t, bytes.Equal(want[r[0]:r[1]], got), "bytes [%d, %d) read wrong", r[0], r[1])
	}
}

// TestReclaimListsBounded: reclaim lists at most maxReclaimMoves block references to copy or drop
// at once (and one line past them), whatever room it has to make: set low here, a tier asked to
// empty every segment takes several passes, each within it, and loses nothing. The writes go on
// with the background loop running (dirty data at its maximum waits for the destager).
func TestReclaimListsBounded(t *testing.T) {
	const line = 16 << 10
	const lines = 24
	for _, r := range []Reduction{ReductionCompress, ReductionDedupe} {
		t.Run(r.String(), func(t *testing.T) {
			defer func(n int) { maxReclaimMoves = n }(maxReclaimMoves)
			maxReclaimMoves = 8
			back := mem.New(lines * line)
			c := newCache(t, back, layout{line: line, ssd: 16, mode: WriteBack, reduction: r}, nil, nil)
			defer c.Close()
			model := make([]byte, lines*line)
			rewriteBlocks(t, c, model, rand.New(rand.NewPCG(3, 7)), 300)
			require.NoError(t, c.Flush())
			// From here only the test reclaims and checkpoints.
			c.bg.halt()
			c.bg.wait()
			pk := packedOf(c.ssd)
			pk.mu.Lock()
			pk.target = len(pk.used) // reclaim empties every segment it can
			pk.mu.Unlock()
			passes, full := 0, 0
			for listed := -1; listed != 0 && passes < 20; passes++ {
				listed = c.ssd.st.reclaim()
				require.LessOrEqual(t, listed, maxReclaimMoves+c.ssd.blocks, "pass %d", passes)
				if listed >= maxReclaimMoves {
					full++
				}
				// The checkpoint frees what the pass emptied (makeRoom would reclaim again, unseen).
				backendErr, tierErr := c.ssd.j.checkpoint()
				require.NoError(t, errors.Join(backendErr, tierErr))
			}
			t.Logf("%d passes, %d of them at the bound", passes, full)
			require.Greater(t, full, 1, "no two passes reached the bound: the test tests nothing")
			got := make([]byte, len(model))
			_, err := c.ReadAt(got, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(model, got), "read back after the reclaims")
			require.NoError(t, c.FlushAll(context.Background(), nil))
			raw := make([]byte, len(model))
			_, err = back.ReadAt(raw, 0)
			require.NoError(t, err)
			require.True(t, bytes.Equal(model, raw), "written back")
		})
	}
}

// TestReclaimTakesItsRoomAtOnce: writers may take free segments between reclaim's choice of
// victims and its copies, down to the reserve. Reclaim then takes the room of the copies of as
// many whole victims as fit, at once: copies that ran out half-way would leave their victims half
// full and the reserve spent,
// and every later reclaim without room to copy into (a tier wedged with most of its room in holes,
// every write going the backend's way). Data stays right throughout.
func TestReclaimTakesItsRoomAtOnce(t *testing.T) {
	const line = 16 << 10
	const lines = 48 // of 64 lines of room: all of it dirty stays below the maximum
	back := mem.New(lines * line)
	c := newCache(t, back, layout{line: line, ssd: 64, mode: WriteBack, reduction: ReductionCompress}, nil, nil)
	defer c.Close()
	c.bg.halt() // only the test and its writes reclaim and checkpoint: the same every run
	c.bg.wait()
	model := make([]byte, lines*line)
	rewriteBlocks(t, c, model, rand.New(rand.NewPCG(5, 9)), 1200)
	require.NoError(t, c.Flush())
	pk := packedOf(c.ssd)
	pk.mu.Lock()
	pk.target = len(pk.used) // reclaim plans to empty every segment it can
	pk.mu.Unlock()
	// Writers take every free segment above the reserve, and what is left of the open one, once
	// reclaim has chosen: what is left is the reserve, too little for the copies chosen.
	var taken []int64
	var planned, left int64
	before := map[int64]int64{} // the used bytes of the segments of the units to copy
	defer func() { reclaimPicked = nil }()
	reclaimPicked = func(units []uint64) {
		pk.mu.Lock()
		for _, l := range units {
			planned += int64(pack.Len(l))
			s := pack.Off(l) / pk.segSize
			before[s] = pk.used[s]
		}
		pk.mu.Unlock()
		for {
			var off [1]int64
			if pk.alloc([]int{blockSize}, off[:], false) != nil {
				break
			}
			taken = append(taken, off[0])
		}
		pk.mu.Lock()
		pk.sealLocked()
		left = int64(len(pk.free)) * pk.segSize
		pk.mu.Unlock()
	}
	c.ssd.st.reclaim()
	reclaimPicked = nil
	require.NotEmpty(t, taken, "no room taken between the choice and the copies: the test tests nothing")
	require.Greater(t, planned, left, "copies of %d bytes fit the %d bytes left: the test tests nothing", planned, left)
	// Once the checkpoints commit the moves, each victim is empty or as it was, never in part.
	for range 2 {
		backendErr, tierErr := c.ssd.j.checkpoint()
		require.NoError(t, errors.Join(backendErr, tierErr))
	}
	emptied := 0
	pk.mu.Lock()
	for s, u := range before {
		if pk.used[s] == 0 {
			emptied++
		} else if pk.used[s] != u {
			t.Errorf("segment %d holds %d bytes, %d before the reclaim: emptied in part", s, pk.used[s], u)
		}
	}
	pk.mu.Unlock()
	t.Logf("%d of %d victims emptied in %d bytes left of %d planned", emptied, len(before), left, planned)
	// A failed allocation may leave a segment open with nothing in it: as good as free.
	empty := func() int {
		pk.mu.Lock()
		defer pk.mu.Unlock()
		n := len(pk.free)
		if pk.open >= 0 && pk.used[pk.open] == 0 {
			n++
		}
		return n
	}
	reserve := pk.reserve
	require.GreaterOrEqual(t, empty(), reserve, "empty segments after the reclaim and its checkpoints")
	// The room the writers took is given back; reclaim then frees room as it should.
	pk.mu.Lock()
	for _, off := range taken {
		pk.releaseLocked(off, blockSize)
	}
	pk.mu.Unlock()
	require.NoError(t, c.ssd.j.makeRoom(c.ssd.j.roomMade.Load()))
	require.Greater(t, empty(), reserve, "empty segments after a reclaim with room")
	got := make([]byte, len(model))
	_, err := c.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(model, got), "read back after the reclaims")
	require.NoError(t, c.FlushAll(context.Background(), nil))
	_, err = back.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(model, got), "written back")
}
