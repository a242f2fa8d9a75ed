package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// The tests here fail the cache's own storage on purpose, in the manner of Open CAS' functional
// tests: the N-th write to the SSD for each N, a dead SSD, the N-th metadata commit. Reads must stay
// correct (the backend has everything), a failing SSD must end up bypassed, and a restart must find
// nothing stale.

// faultLayout is the cache the fault tests run: a small write-through cache with both tiers;
// wbFaultLayout is the same in write-back.
var (
	faultLayout   = layout{line: 8 << 10, ram: 2, ssd: 6, mode: WriteThrough}
	wbFaultLayout = layout{line: 8 << 10, ram: 2, ssd: 6, mode: WriteBack}
)

const faultDevSize = 64 << 10

// sectorSets is a single client's model of the device: the ids each sector may hold. A failed
// write leaves both its old and new ids possible; a read narrows the set to what it returned.
type sectorSets [][]int64

func newSectorSets() sectorSets {
	m := make(sectorSets, faultDevSize/sector)
	for s := range m {
		m[s] = []int64{0}
	}
	return m
}

// check compares a read of sectors from first with the model and narrows the model.
func (m sectorSets) check(p []byte, first int) error {
	for i, id := range stamps(p, first) {
		if !slices.Contains(m[first+i], id) {
			return fmt.Errorf("sector %d reads write %d; the model allows %v", first+i, id, m[first+i])
		}
		m[first+i] = []int64{id}
	}
	return nil
}

// drive runs ops random sequential requests on c, checking every read against m. Write errors are
// allowed only if errOK; stop, if not nil, ends the run early when it reports true. lost, if not
// nil, is kept as what a kill -9 may leave in write-back, where writes no flush made durable may
// be lost: the ids of m at the last flush, and every write since.
func drive(c *Cache, rng *rand.Rand, m, lost sectorSets, ops int, errOK bool, stop func() bool) error {
	const perBlk = blockSize / sector
	for k := range ops {
		if stop != nil && stop() {
			return nil
		}
		n := perBlk * (1 + rng.IntN(2))
		first := perBlk * rng.IntN(len(m)/perBlk-1)
		if rng.IntN(3) == 0 {
			n = 1 + rng.IntN(12)
			first = rng.IntN(len(m) - n)
		}
		off, buf := int64(first)*sector, make([]byte, n*sector)
		id := rng.Int64N(1<<40) + 1
		var err error
		durable := false // a completed FUA write or flush makes every write before it durable
		switch r := rng.IntN(100); {
		case r < 45:
			if _, err := c.ReadAt(buf, off); err != nil {
				return fmt.Errorf("op %d: read [%d,%d): %w", k, first, first+n, err)
			}
			if err := m.check(buf, first); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
			continue
		case r < 80:
			stamp(buf, first, id)
			_, err = c.WriteAt(buf, off)
		case r < 90:
			stamp(buf, first, id)
			_, err = c.WriteAtFUA(buf, off)
			durable = err == nil
		case r < 93:
			id = 0
			err = c.WriteZeroes(off, int64(len(buf)), false)
		case r < 96:
			id = 0 // zero blocks, where the SSD tier reduces
			_, err = c.WriteAt(buf, off)
		default:
			err := c.Flush()
			if err != nil && !errOK {
				return fmt.Errorf("op %d: flush: %w", k, err)
			}
			m.durable(lost, err == nil)
			continue
		}
		for s := first; s < first+n; s++ {
			if err == nil {
				m[s] = []int64{id}
			} else if !slices.Contains(m[s], id) {
				m[s] = append(m[s], id)
			}
			if lost != nil && !slices.Contains(lost[s], id) {
				lost[s] = append(lost[s], id)
			}
		}
		m.durable(lost, durable)
		if err != nil && !errOK {
			return fmt.Errorf("op %d: write [%d,%d): %w", k, first, first+n, err)
		}
	}
	return nil
}

// durable records in lost, if ok, that everything m allows now is durable.
func (m sectorSets) durable(lost sectorSets, ok bool) {
	if lost == nil || !ok {
		return
	}
	for s := range m {
		lost[s] = slices.Clone(m[s])
	}
}

// verifyAll reads the whole device through c and checks it against m.
func verifyAll(c *Cache, m sectorSets) error {
	all := make([]byte, faultDevSize)
	if _, err := c.ReadAt(all, 0); err != nil {
		return fmt.Errorf("read of the whole device: %w", err)
	}
	return m.check(all, 0)
}

// restartAfterKill crashes the engine on g (kill -9: what was written stays) and starts a new one
// of layout l on the same backend, SSD and store, without faults.
func restartAfterKill(t *testing.T, l layout, g *gate, old *Cache, back, ssd *crashDev, store meta.Store) *Cache {
	t.Helper()
	g.crash()
	old.Close()
	ng := &gate{}
	return newCache(t, gatedDev{ng, back}, l, gatedStore{ng, store}, gatedDev{ng, ssd})
}

// verifyRestart checks a cache restarted after a kill against the model: m in write-through, lost
// in write-back (then FlushAll must also leave the backend holding what the cache serves: nothing
// stale is kept, nothing dirty is lost on the way).
func verifyRestart(c *Cache, back *crashDev, m, lost sectorSets) error {
	if lost == nil {
		return verifyAll(c, m)
	}
	if err := verifyAll(c, lost); err != nil {
		return err
	}
	if err := c.FlushAll(context.Background(), nil); err != nil {
		return fmt.Errorf("FlushAll: %w", err)
	}
	raw := make([]byte, faultDevSize)
	back.ReadAt(raw, 0)
	for s, id := range stamps(raw, 0) {
		if want := lost[s][0]; id != want {
			return fmt.Errorf("after FlushAll the backend's sector %d holds write %d, the cache served %d", s, id, want)
		}
	}
	return nil
}

// faultModes are the modes the fault tests run, each with every reduction of the SSD tier:
// write-through, and write-back, where an SSD write that fails fails the client's write (the SSD
// was to hold its only copy) and a kill -9 may lose writes no flush made durable; write-back also
// in FLUSH order, whose own failures (a write that would reach the backend ahead of older
// epochs fails) the models allow as they allow any failed write.
var faultModes = []struct {
	name string
	l    layout
}{
	{"writethrough", faultLayout}, {"writeback", wbFaultLayout},
	{"writethrough-reduction-zero", withReduction(faultLayout, ReductionZero)},
	{"writeback-reduction-zero", withReduction(wbFaultLayout, ReductionZero)},
	{"writethrough-reduction-compress", withReduction(faultLayout, ReductionCompress)},
	{"writeback-reduction-compress", withReduction(wbFaultLayout, ReductionCompress)},
	{"writethrough-reduction-dedupe", withReduction(faultLayout, ReductionDedupe)},
	{"writeback-reduction-dedupe", withReduction(wbFaultLayout, ReductionDedupe)},
	{"writeback-order-flush", withOrder(wbFaultLayout, OrderFlush)},
	{"writeback-order-flush-reduction-compress", withOrder(withReduction(wbFaultLayout, ReductionCompress), OrderFlush)},
}

// withOrder is l with write-back order o.
func withOrder(l layout, o string) layout {
	l.order = o
	return l
}

// withReduction is l with reduction r; with dedupe, its content hash collides often (weakHash).
func withReduction(l layout, r Reduction) layout {
	l.reduction = r
	if r == ReductionDedupe {
		l.dedupeHash = weakHash
	}
	return l
}

// newModel returns the models drive keeps for layout l: lost only in write-back.
func newModel(l layout) (m, lost sectorSets) {
	if l.mode == WriteBack {
		return newSectorSets(), newSectorSets()
	}
	return newSectorSets(), nil
}

// TestFailNthSSDWrite fails the N-th write to the SSD, tearing it, for every N the workload
// reaches: reads stay correct, and so does the cache after a restart.
func TestFailNthSSDWrite(t *testing.T) {
	seed := testSeed(t)
	maxN := 60
	if testing.Short() {
		maxN = 20
	}
	for _, fm := range faultModes {
		t.Run(fm.name, func(t *testing.T) {
			l, wb := fm.l, fm.l.mode == WriteBack
			for n := int64(1); n <= int64(maxN); n++ {
				rng := rand.New(rand.NewPCG(seed, uint64(n)))
				back, ssdDev, store := newCrashDev(faultDevSize), newCrashDev(l.ssd*l.line), meta.NewMem()
				g := &gate{}
				ssd := fault.New(gatedDev{g, ssdDev}, fault.Options{Seed: int64(seed) + n, TornWrites: true,
					Rules: []fault.Rule{{Op: fault.Write, Nth: n}}})
				c := newCache(t, gatedDev{g, back}, l, gatedStore{g, store}, ssd)
				m, lost := newModel(l)
				if err := drive(c, rng, m, lost, 120, wb, nil); err != nil {
					t.Fatalf("seed %d, SSD write %d failed: %v", seed, n, err)
				}
				if ssd.Faults()[fault.Write] == 0 {
					c.Close()
					break // the workload makes fewer SSD writes: every N has been tried
				}
				if st := c.Stats(); st.Tiers[1].Errors == 0 {
					t.Errorf("seed %d, SSD write %d failed: the SSD tier counted no error: %+v", seed, n, st.Tiers[1])
				}
				c = restartAfterKill(t, l, g, c, back, ssdDev, store)
				if err := verifyRestart(c, back, m, lost); err != nil {
					t.Fatalf("seed %d, SSD write %d failed: after restart: %v", seed, n, err)
				}
				c.Close()
			}
		})
	}
}

// TestDeadSSD makes every call to the SSD fail halfway through a workload: reads stay correct, the
// tier is bypassed, and a restart on the revived SSD finds nothing stale.
func TestDeadSSD(t *testing.T) {
	for _, r := range []Reduction{ReductionOff, ReductionZero, ReductionCompress, ReductionDedupe} {
		t.Run(r.String(), func(t *testing.T) { testDeadSSD(t, withReduction(faultLayout, r)) })
	}
}

func testDeadSSD(t *testing.T, faultLayout layout) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	back, ssdDev, store := newCrashDev(faultDevSize), newCrashDev(faultLayout.ssd*faultLayout.line), meta.NewMem()
	g := &gate{}
	ssd := fault.New(gatedDev{g, ssdDev}, fault.Options{Seed: int64(seed)})
	c := newCache(t, gatedDev{g, back}, faultLayout, gatedStore{g, store}, ssd)
	m := newSectorSets()
	if err := drive(c, rng, m, nil, 80, false, nil); err != nil {
		t.Fatalf("seed %d: before the SSD died: %v", seed, err)
	}
	ssd.SetFailing(true)
	// Flushes may fail once the SSD is dead (its checkpoint fails); writes and reads may not.
	if err := drive(c, rng, m, nil, 200, false, nil); err != nil && !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("seed %d: with the SSD dead: %v", seed, err)
	}
	if err := verifyAll(c, m); err != nil {
		t.Fatalf("seed %d: with the SSD dead: %v", seed, err)
	}
	st := c.Stats().Tiers[1]
	if !st.Failed || st.Reason == "" {
		t.Fatalf("seed %d: the dead SSD tier is still in use: %+v", seed, st)
	}
	ssd.SetFailing(false)
	c = restartAfterKill(t, faultLayout, g, c, back, ssdDev, store)
	defer c.Close()
	if err := verifyAll(c, m); err != nil {
		t.Fatalf("seed %d: after restart: %v", seed, err)
	}
}

// TestDirtyReadOnSSDError: in write-back, a read of acknowledged data that only the SSD tier holds
// fails while the SSD fails its reads, rather than return the backend's older data; clean data is
// still read from the backend, and once the SSD reads again the written data is there. In address
// order, which leaves the data dirty below the watermarks: FLUSH order may write it back at once
// after the FLUSH, and then serve it from the backend.
func TestDirtyReadOnSSDError(t *testing.T) {
	const line = 16 << 10
	b := mem.New(32 * line)
	ssd := fault.New(mem.New(8*line), fault.Options{})
	c := newCache(t, b, layout{line: line, ssd: 8, mode: WriteBack, admission: "always", order: OrderAddress}, nil, ssd)
	defer c.Close()
	written := bytes.Repeat([]byte{7}, 2*line)
	_, err := c.WriteAt(written, 0)
	require.NoError(t, err)
	require.NoError(t, c.Flush())
	clean := make([]byte, 4096)
	_, err = c.ReadAt(clean, 8*line) // a clean line of zeroes, cached by the read
	require.NoError(t, err)

	ssd.SetFailing(true)
	for _, r := range []struct{ off, n int64 }{{0, 4096}, {line - 4096, 8192}, {0, 2 * line}, {line + 512, 1024}} {
		buf := make([]byte, r.n)
		_, err := c.ReadAt(buf, r.off)
		require.ErrorIs(t, err, fault.ErrInjected, "a read of %d bytes at %d", r.n, r.off)
		started, err := readAtAsync(t, c, buf, r.off)
		require.True(t, !started || errors.Is(err, fault.ErrInjected), "an asynchronous read of %d bytes at %d: %v", r.n, r.off, err)
	}
	_, err = c.ReadAt(clean, 8*line)
	require.NoError(t, err, "clean data comes from the backend")
	require.Equal(t, make([]byte, 4096), clean)

	ssd.SetFailing(false)
	got := make([]byte, 2*line)
	_, err = c.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, written, got, "the written data is still there")
}

// failStore fails the nth Commit (counting from 1), and every later one if sticky.
type failStore struct {
	meta.Store
	nth    int
	sticky bool

	mu    sync.Mutex
	calls int
	fired bool
}

var errCommit = errors.New("injected metadata commit failure")

func (f *failStore) Commit(ops []meta.Op, sync bool) error {
	f.mu.Lock()
	f.calls++
	fail := f.calls == f.nth || (f.sticky && f.calls > f.nth)
	f.fired = f.fired || fail
	f.mu.Unlock()
	if fail {
		return errCommit
	}
	return f.Store.Commit(ops, sync)
}

func (f *failStore) hasFired() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// TestFailNthCommit fails the N-th metadata commit (only that one, or every one from it on), stops
// the workload right after and kills the engine: a restart must find nothing stale.
func TestFailNthCommit(t *testing.T) {
	seed := testSeed(t)
	maxN := 40
	if testing.Short() {
		maxN = 12
	}
	for _, fm := range faultModes {
		t.Run(fm.name, func(t *testing.T) {
			l := fm.l
			for _, sticky := range []bool{false, true} {
				for n := 1; n <= maxN; n++ {
					rng := rand.New(rand.NewPCG(seed, uint64(n)))
					back, ssdDev, mem := newCrashDev(faultDevSize), newCrashDev(l.ssd*l.line), meta.NewMem()
					mem.SetMaxOps(2) // commits land in parts: the n-th commit may be the middle of one
					g := &gate{}
					store := &failStore{Store: gatedStore{g, mem}, nth: n, sticky: sticky}
					c := newCache(t, gatedDev{g, back}, l, store, gatedDev{g, ssdDev})
					m, lost := newModel(l)
					// Writes may fail once the metadata does: the model then allows old and new data.
					if err := drive(c, rng, m, lost, 150, true, store.hasFired); err != nil {
						t.Fatalf("seed %d, commit %d failed (sticky %v): %v", seed, n, sticky, err)
					}
					fired := store.hasFired()
					c = restartAfterKill(t, l, g, c, back, ssdDev, mem)
					if err := verifyRestart(c, back, m, lost); err != nil {
						t.Fatalf("seed %d, commit %d failed (sticky %v): after restart: %v", seed, n, sticky, err)
					}
					c.Close()
					if !fired {
						break
					}
				}
			}
		})
	}
}

// TestInvalidationAfterFailedCommit: a write-back write over clean blocks of a line that also holds
// dirty data fails when the invalidation of those blocks cannot be committed; the next write over
// them, once the store commits again (through the bypassed tier's way to the backend), must still
// commit the invalidation, though the failed one was counted on, or a restart serves the older clean
// data the store still calls valid.
func TestInvalidationAfterFailedCommit(t *testing.T) {
	l := layout{line: 16 << 10, ssd: 8, mode: WriteBack, admission: "always", order: OrderAddress}
	back, ssdDev, mem := newCrashDev(32*l.line), newCrashDev(l.ssd*l.line), meta.NewMem()
	g := &gate{}
	store := &failStore{Store: gatedStore{g, mem}}
	c := newCache(t, gatedDev{g, back}, l, store, gatedDev{g, ssdDev})
	block := func(b byte) []byte { return bytes.Repeat([]byte{b}, blockSize) }
	_, err := back.WriteAt(block(1), blockSize)
	require.NoError(t, err)
	require.NoError(t, c.Prefetch(0, l.line)) // the line's blocks clean on the SSD tier
	_, err = c.WriteAt(block(2), 0)           // and its first block dirty
	require.NoError(t, err)
	require.NoError(t, c.Flush())
	require.EqualValues(t, 1, c.ssd.dirtyCount.Load(), "below the watermarks, the line stays dirty")

	store.mu.Lock()
	store.nth, store.sticky = store.calls+1, true // the invalidation's commit and its retry fail
	store.mu.Unlock()
	_, err = c.WriteAt(block(3), blockSize)
	require.ErrorIs(t, err, errCommit)
	store.mu.Lock()
	store.nth, store.sticky = 0, false
	store.mu.Unlock()
	_, err = c.WriteAt(block(4), blockSize)
	require.NoError(t, err)
	require.NoError(t, c.Flush())

	c = restartAfterKill(t, l, g, c, back, ssdDev, mem)
	defer c.Close()
	got := make([]byte, 2*blockSize)
	_, err = c.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, append(block(2), block(4)...), got)
}

// TestWriteBackInvalidationFailure: in write-back, a write over clean cached blocks whose
// invalidation cannot be committed fails and bypasses the SSD tier, as in write-through: the store
// may still call the old data valid.
func TestWriteBackInvalidationFailure(t *testing.T) {
	const line = 16 << 10
	b := mem.New(32 * line)
	store := &failStore{Store: meta.NewMem()}
	c := newCache(t, b, layout{line: line, ssd: 8, mode: WriteBack, admission: "always"}, store, nil)
	defer c.Close()
	buf := make([]byte, line)
	require.NoError(t, c.Prefetch(0, line)) // clean blocks on the SSD tier
	require.NoError(t, c.Flush())
	store.mu.Lock()
	store.nth, store.sticky = store.calls+1, true // the write's commit and its retry fail
	store.mu.Unlock()
	_, err := c.WriteAt(buf, 0)
	store.mu.Lock()
	store.sticky = false
	store.mu.Unlock()
	require.ErrorIs(t, err, errCommit)
	require.True(t, store.hasFired())
	st := c.Stats().Tiers[0]
	require.True(t, st.Failed, "the SSD tier is bypassed")
	require.Contains(t, st.Reason, "metadata commit")
}
