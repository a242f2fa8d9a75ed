package cache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/rangelock"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// The tests here keep a write-back SSD tier full of dirty data with writes from one block to
// several times the tier's size, and hold it to the contract of a full tier: no write fails for lack of
// room, whatever the layout, the line size or the backend's health (while it recovers).

// fullTierRig drives a write-back cache with clients writing, reading and flushing at once, and
// keeps a model of the device: the write id of every sector.
type fullTierRig struct {
	c      *Cache
	size   int64
	maxLen int64
	locks  *rangelock.Locks
	mu     sync.Mutex
	model  []int64
	nextID atomic.Int64
	writes atomic.Int64 // writes of more than the SSD tier's bytes
}

// request picks a range: a length from one block to maxLen, spread evenly over its powers of two
// (so that small requests are as many as large ones), at a block boundary or a sector one.
func (r *fullTierRig) request(rng *rand.Rand) (off, n int64) {
	top := 0
	for int64(blockSize)<<top < r.maxLen {
		top++
	}
	n = min(r.maxLen, int64(blockSize)<<rng.IntN(top+1))
	n = max(sector, n/2+rng.Int64N(n/2+1)) &^ (sector - 1)
	off = rng.Int64N((r.size-n)/sector+1) * sector
	if rng.IntN(2) == 0 {
		off &^= blockSize - 1
	}
	return off, n
}

// client runs ops requests. A write may never fail; a read or flush only if otherErrOK (the
// backend is down, and a read miss has nowhere to go).
func (r *fullTierRig) client(rng *rand.Rand, ops int, otherErrOK func() bool) error {
	for k := range ops {
		off, n := r.request(rng)
		first := int(off / sector)
		switch op := rng.IntN(10); {
		case op < 5:
			id := r.nextID.Add(1)
			buf := make([]byte, n)
			stamp(buf, first, id)
			r.locks.Lock(off, off+n)
			var err error
			if op == 0 {
				_, err = r.c.WriteAtFUA(buf, off)
			} else {
				_, err = r.c.WriteAt(buf, off)
			}
			if err == nil {
				r.mu.Lock()
				for s := range int(n / sector) {
					r.model[first+s] = id
				}
				r.mu.Unlock()
			}
			r.locks.Unlock(off, off+n)
			if err != nil {
				return fmt.Errorf("op %d: write of %d bytes at %d: %w", k, n, off, err)
			}
			if n > r.c.ssd.dev.Size() {
				r.writes.Add(1)
			}
		case op < 9:
			buf := make([]byte, n)
			r.locks.Lock(off, off+n)
			_, err := r.c.ReadAt(buf, off)
			var bad error
			if err == nil {
				r.mu.Lock()
				for s, id := range stamps(buf, first) {
					if want := r.model[first+s]; id != want {
						bad = fmt.Errorf("op %d: sector %d reads write %d, want %d", k, first+s, id, want)
						break
					}
				}
				r.mu.Unlock()
			}
			r.locks.Unlock(off, off+n)
			if bad != nil {
				return bad
			}
			if err != nil && !otherErrOK() {
				return fmt.Errorf("op %d: read of %d bytes at %d: %w", k, n, off, err)
			}
		default:
			if err := r.c.Flush(); err != nil && !otherErrOK() {
				return fmt.Errorf("op %d: flush: %w", k, err)
			}
		}
	}
	return nil
}

// run has clients clients run ops requests each, then requires none to have failed, writes larger
// than the tier among them, and, after a FLUSH and a write-back of every dirty line, the backend
// raw to hold the model.
func (r *fullTierRig) run(t *testing.T, raw backend.Backend, seed uint64, clients, ops int, otherErrOK func() bool) {
	t.Helper()
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for k := range clients {
		wg.Go(func() { errs[k] = r.client(rand.New(rand.NewPCG(seed, uint64(k))), ops, otherErrOK) })
	}
	wg.Wait()
	for k, err := range errs {
		require.NoError(t, err, "seed %d, client %d", seed, k)
	}
	require.NotZero(t, r.writes.Load(), "no write was larger than the SSD tier")
	require.NoError(t, r.c.Flush())
	require.NoError(t, r.c.FlushAll(context.Background(), nil))
	require.Zero(t, r.c.ssd.dirtyCount.Load(), "dirty lines after FlushAll")
	all := make([]byte, r.size)
	_, err := raw.ReadAt(all, 0)
	require.NoError(t, err)
	for s, id := range stamps(all, 0) {
		require.Equal(t, r.model[s], id, "seed %d: the backend's sector %d after FlushAll", seed, s)
	}
}

// fullTierCases are the shapes TestWriteBackFullTier runs: every reduction, with lines of 4 KiB
// and 64 KiB, over an SSD tier of 1 MiB and a RAM tier of 256 KiB.
func fullTierCases() []layout {
	var out []layout
	for _, r := range []Reduction{ReductionOff, ReductionZero, ReductionCompress, ReductionDedupe} {
		for _, line := range []int64{4 << 10, 64 << 10} {
			l := withReduction(layout{line: line, ram: (256 << 10) / line, ssd: (1 << 20) / line, mode: WriteBack}, r)
			l.name = fmt.Sprintf("%s-%dk", r, line>>10)
			out = append(out, l)
		}
	}
	return out
}

// TestWriteBackFullTier writes requests of one block to four times the SSD tier over dirty data,
// with reads and FLUSHes, from three clients at once: no request fails, every read returns what
// the model says, and the backend holds it all after FlushAll.
func TestWriteBackFullTier(t *testing.T) {
	seed := testSeed(t)
	forFullTierCases(t, func(t *testing.T, l layout, back *mem.Mem) {
		r := newFullTierRig(t, l, back)
		r.run(t, back, seed, 3, 40, func() bool { return false })
	})
}

// forFullTierCases runs test for each of fullTierCases, in parallel, with a backend of 8 MiB.
func forFullTierCases(t *testing.T, test func(t *testing.T, l layout, back *mem.Mem)) {
	for _, l := range fullTierCases() {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			test(t, l, mem.New(8<<20))
		})
	}
}

// newFullTierRig builds a cache of layout l over b, closed when the test ends, and a rig that
// drives it with requests of up to four times its SSD tier.
func newFullTierRig(t *testing.T, l layout, b backend.Backend) *fullTierRig {
	c := newCache(t, b, l, nil, nil)
	t.Cleanup(func() { c.Close() })
	return &fullTierRig{c: c, size: b.Size(), maxLen: 4 * c.ssd.dev.Size(), locks: rangelock.New(), model: make([]int64, b.Size()/sector)}
}

// TestWriteBackFullTierBackendDown is TestWriteBackFullTier with the backend failing every call for
// a while, from the first write-back on, until it has failed calls again and again: writes wait,
// then complete; none fails.
func TestWriteBackFullTierBackendDown(t *testing.T) {
	seed := testSeed(t)
	forFullTierCases(t, func(t *testing.T, l layout, back *mem.Mem) {
		fb := fault.New(back, fault.Options{Seed: int64(seed)})
		r := newFullTierRig(t, l, fb)
		c := r.c
		var down atomic.Bool
		stop, done := make(chan struct{}), make(chan struct{})
		// The outage: from the first write-back until the backend failed 12 calls, or the test
		// ended, failed or not.
		defer func() { close(stop); <-done }()
		go func() {
			defer close(done)
			for c.wb.destageWrites.Load() == 0 {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
			down.Store(true)
			fb.SetFailing(true)
			for faults(fb) < 12 {
				select {
				case <-stop:
					fb.SetFailing(false)
					return
				case <-time.After(time.Millisecond):
				}
			}
			fb.SetFailing(false)
		}()
		r.run(t, back, seed, 3, 30, down.Load)
		require.True(t, down.Load(), "the backend never went down")
		t.Logf("writes retried for the backend: %d; throttled: %d", c.wb.backendWaits.Load(), c.wb.throttled.Load())
	})
}

// faults counts the calls f failed.
func faults(f *fault.Backend) (n int64) {
	for _, k := range f.Faults() {
		n += k
	}
	return n
}

// roomOnDestage is an SSD tier's backend that runs give once, at the first write after it is
// armed: room on a packed tier coming free while a writer writes its dirty lines back.
type roomOnDestage struct {
	gatedDev
	give  atomic.Pointer[func()]
	fired atomic.Bool
}

func (d *roomOnDestage) WriteAt(p []byte, off int64) (int, error) {
	if give := d.give.Swap(nil); give != nil {
		(*give)()
		d.fired.Store(true)
	}
	return d.gatedDev.WriteAt(p, off)
}

// A write-back write over a line's dirty block and a clean one that finds no room on a full packed
// tier writes the dirty block back (errDirtyNoRoom), and room comes free while it does; the write
// then goes into the tier, dirty, over blocks a committed record called clean or dirty with older
// units. The destager takes it to the backend before any checkpoint commits its record; after a
// kill -9 without a run log, each block reads the last write, and the backend holds it. (The
// interleaving that had a restart serve the older units as clean, a checkpoint committing the
// written-back blocks clean before the write's retry, needs the journal's loop between the two;
// TestCrashRestart's write-back cases with a full packed tier meet it by chance.)
func TestWriteBackNoRoomOverDirtyThenRoom(t *testing.T) {
	const line = 4 * blockSize
	const lines = 8
	for _, r := range []Reduction{ReductionCompress, ReductionDedupe} {
		t.Run(r.String(), func(t *testing.T) {
			m := newMachine(lines*line, 8*line)
			l := layout{line: line, ssd: 8, mode: WriteBack, reduction: r}
			g := &gate{}
			back := &roomOnDestage{gatedDev: gatedDev{g, m.back}}
			c := newCache(t, back, l, gatedStore{g, m.store}, gatedDev{g, m.ssd})
			rng := rand.New(rand.NewPCG(5, 9))
			model := make([]byte, lines*line)
			write := func(off int64, n int) {
				t.Helper()
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32()) // incompressible: a unit of a whole block each
				}
				_, err := c.WriteAt(p, off)
				require.NoError(t, err)
				copy(model[off:], p)
			}
			// Line 1: four blocks written and written back (clean), then block 0 again (dirty).
			// From that write on only the test's writes destage and reclaim: the destager would
			// otherwise write block 0 back, at times before the test could stop it.
			write(line, line)
			require.NoError(t, c.FlushAll(context.Background(), nil))
			c.bg.halt()
			c.bg.wait()
			write(line, blockSize)
			_, d := c.ssd.bits(1)
			require.True(t, d.Has(0), "block 0 is dirty")
			// A checkpoint frees the room of the units the writes replaced, before the test
			// hides the free room.
			backendErr, tierErr := c.ssd.j.checkpoint()
			require.NoError(t, backendErr)
			require.NoError(t, tierErr)
			pk := packedOf(c.ssd)
			pk.mu.Lock()
			hidden := append([]int32(nil), pk.free[pk.reserve:]...)
			pk.free = pk.free[:pk.reserve]
			pk.at = pk.segSize // the open segment full
			target := pk.target
			pk.target = 0 // reclaim finds nothing to do
			pk.mu.Unlock()
			give := func() {
				pk.mu.Lock()
				pk.free = append(pk.free, hidden...)
				pk.target = target
				pk.mu.Unlock()
			}
			back.give.Store(&give)

			write(line, 2*blockSize) // over the dirty block 0 and the clean block 1
			require.True(t, back.fired.Load(), "the write did not write its dirty block back for room")
			v, d := c.ssd.bits(1)
			require.True(t, d.Has(0) && d.Has(1), "the write went around the tier (valid %v, dirty %v)", v, d)

			// The destager takes the new data to the backend (and flushes it there) before any
			// checkpoint commits the record that finds it; then the kill.
			c.locks.Lock(1, 1)
			_, err := c.destageLocked([]uint64{1})
			c.locks.Unlock(1, 1)
			require.NoError(t, err)
			killAndRestart(t, m, l, g, c, model)
			checkBackend(t, m.back, model)
		})
	}
}
