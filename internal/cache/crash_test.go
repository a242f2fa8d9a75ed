package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// crashDev is a disk with a volatile write cache: writes since the last Flush are kept apart, and
// a power loss keeps a random subset of their sectors. Calls are serialized, which is fine for the
// small devices of tests.
type crashDev struct {
	mu      sync.Mutex
	cur     []byte // what reads see
	durable []byte // what survives power loss
	log     []pendingWrite
}

type pendingWrite struct {
	off  int64
	data []byte
}

func newCrashDev(size int64) *crashDev {
	return &crashDev{cur: make([]byte, size), durable: make([]byte, size)}
}

func (d *crashDev) ReadAt(p []byte, off int64) (int, error) {
	if err := backend.CheckRange(off, int64(len(p)), d.Size()); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(p, d.cur[off:]), nil
}

func (d *crashDev) WriteAt(p []byte, off int64) (int, error) {
	if err := backend.CheckRange(off, int64(len(p)), d.Size()); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.cur[off:], p)
	d.log = append(d.log, pendingWrite{off, slices.Clone(p)})
	return len(p), nil
}

func (d *crashDev) Trim(off, length int64) error { return d.WriteZeroes(off, length, true) }

func (d *crashDev) WriteZeroes(off, length int64, _ bool) error {
	_, err := d.WriteAt(make([]byte, length), off)
	return err
}

func (d *crashDev) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.log {
		copy(d.durable[w.off:], w.data)
	}
	d.log = nil
	return nil
}

func (d *crashDev) Size() int64  { return int64(len(d.cur)) }
func (d *crashDev) Close() error { return nil }

// powerLoss keeps each sector of each unflushed write with probability keep, in order, and drops
// the rest.
func (d *crashDev) powerLoss(rng *rand.Rand, keep float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.log {
		for s := int64(0); s < int64(len(w.data)); s += sector {
			if rng.Float64() < keep {
				copy(d.durable[w.off+s:], w.data[s:min(s+sector, int64(len(w.data)))])
			}
		}
	}
	d.log = nil
	copy(d.cur, d.durable)
}

// gate passes calls to a device that outlives an engine until it is cut; then every call fails. A
// cut waits for the calls in flight, so that an abandoned engine (its background checkpoint, its
// Close) can no longer touch what the next engine uses: the cut is the instant of the crash.
type gate struct {
	mu  sync.RWMutex
	cut bool
	// onCrash, if set, runs at the crash, once the calls in flight are done: the machine keeps
	// what a kill leaves of the files that outlive the process (machine.runLog).
	onCrash func()
}

var errCut = fmt.Errorf("crashed: %w", backend.ErrClosed)

func (g *gate) do(fn func() error) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.cut {
		return errCut
	}
	return fn()
}

func (g *gate) crash() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.cut && g.onCrash != nil {
		g.onCrash()
	}
	g.cut = true
}

// gatedDev is a device behind a gate (a crashDev, or any backend: its trims and WRITE_ZEROES
// pass if it has them); Close leaves the device open for the next engine.
type gatedDev struct {
	g *gate
	d backend.Backend
}

func (x gatedDev) ReadAt(p []byte, off int64) (n int, err error) {
	err = x.g.do(func() (e error) { n, e = x.d.ReadAt(p, off); return })
	return
}

func (x gatedDev) WriteAt(p []byte, off int64) (n int, err error) {
	err = x.g.do(func() (e error) { n, e = x.d.WriteAt(p, off); return })
	return
}

func (x gatedDev) Trim(off, length int64) error {
	tr, ok := x.d.(backend.Trimmer)
	if !ok {
		return backend.ErrNotSupported
	}
	return x.g.do(func() error { return tr.Trim(off, length) })
}

func (x gatedDev) WriteZeroes(off, length int64, mayUnmap bool) error {
	zw, ok := x.d.(backend.ZeroWriter)
	if !ok {
		return backend.ErrNotSupported
	}
	return x.g.do(func() error { return zw.WriteZeroes(off, length, mayUnmap) })
}

func (x gatedDev) Flush() error { return x.g.do(x.d.Flush) }
func (x gatedDev) Size() int64  { return x.d.Size() }
func (x gatedDev) Close() error { return nil }

// gatedStore is a metadata store behind a gate; Close leaves it open for the next engine.
type gatedStore struct {
	g *gate
	meta.Store
}

func (x gatedStore) Superblock() (sb meta.Superblock, ok bool, err error) {
	err = x.g.do(func() (e error) { sb, ok, e = x.Store.Superblock(); return })
	return
}

func (x gatedStore) SetSuperblock(sb meta.Superblock) error {
	return x.g.do(func() error { return x.Store.SetSuperblock(sb) })
}

func (x gatedStore) Commit(ops []meta.Op, sync bool) error {
	return x.g.do(func() error { return x.Store.Commit(ops, sync) })
}

func (x gatedStore) Sync() error { return x.g.do(x.Store.Sync) }

func (x gatedStore) Lines(fn func(meta.Line) error) error {
	return x.g.do(func() error { return x.Store.Lines(fn) })
}

func (x gatedStore) Ghosts(fn func(meta.Ghost) error) error {
	return x.g.do(func() error { return x.Store.Ghosts(fn) })
}

func (x gatedStore) Close() error { return nil }

// killAndRestart kills c, whose devices and store are m's behind g (the gate crashes: nothing c
// does after reaches them), starts a new engine of layout l on what m kept, closed when the test
// ends, and checks that every byte reads as model.
func killAndRestart(t *testing.T, m *machine, l layout, g *gate, c *Cache, model []byte) *Cache {
	t.Helper()
	g.crash()
	c.Close()
	g = &gate{}
	c = newCache(t, gatedDev{g, m.back}, l, gatedStore{g, m.store}, gatedDev{g, m.ssd})
	t.Cleanup(func() { c.Close() })
	got := make([]byte, len(model))
	_, err := c.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(model, got), "read after the kill")
	return c
}

// machine is what survives an engine: backend, SSD and metadata, and the clients' record of what
// they wrote, sector by sector.
type machine struct {
	back, ssd *crashDev
	store     *meta.Mem
	// seq orders acknowledgements and flush calls; durable is the seq at the call of the last
	// flush that completed.
	seq     atomic.Int64
	durable atomic.Int64
	mu      sync.Mutex
	hist    [][]ack // per sector, oldest first
	// runLog is the path of the SSD tier's run log ("": none); killed is what the last crash left
	// of it: the engine that wrote it may go on appending to its mapping after the crash, as a
	// killed process would not.
	runLog string
	killed []byte
	// damaged is set when the SSD was damaged since the last restart (damage): a block may then
	// read as lost after the restart, which checkRestart writes again (lostID numbers those
	// writes).
	damaged bool
	lostID  int64
}

// damage flips a byte at a random place of the SSD, as rot or a stray write would, but not one
// of the units that the restart after c's crash may take as they are (asIs).
func (m *machine) damage(rng *rand.Rand, c *Cache) {
	skip := asIs(c, m.store)
	at := rng.IntN(len(m.ssd.cur))
	for skip[int64(at)&^(blockSize-1)] {
		at = rng.IntN(len(m.ssd.cur))
	}
	m.ssd.change(func(b []byte) { b[at] ^= 1 << rng.IntN(8) })
	m.damaged = true
}

// asIs returns the device offsets of the units of a packed tier that a restart after c's crash
// may take as they are when they fail their sums (sum.go, "Adopted blocks"): the mutable ones
// that c finds, those it let go of (dead), and those that a record in store finds, which the
// restart loads when no run log replaces it. The last are not all among c's: a checkpoint that the
// crash cut short holds the dead units it releases apart from the tier, while records of its
// snapshot not committed yet still find them.
func asIs(c *Cache, store *meta.Mem) map[int64]bool {
	pk := packedOf(c.ssd)
	if pk == nil {
		return nil
	}
	units := map[int64]bool{}
	mutable := func(locs []uint64) {
		for _, l := range locs {
			if pack.IsMutable(l) {
				units[pack.Off(l)] = true
			}
		}
	}
	c.ssd.mu.RLock()
	mutable(pk.locs)
	mutable(pk.dead)
	c.ssd.mu.RUnlock()
	if err := store.Lines(func(r meta.Line) error { mutable(r.Loc); return nil }); err != nil {
		panic(err) // a Mem fails only once closed, which the machine's store never is
	}
	return units
}

// crashKind is how an engine ends: killed (kill -9, with or without a run log), or by a power loss.
type crashKind int

const (
	kill9       crashKind = iota // kill -9, no run log
	kill9Logged                  // kill -9, the SSD tier's run log on tmpfs
	powerLoss                    // power loss: unsynced metadata, unflushed writes and /run lost
)

func (k crashKind) String() string { return [...]string{"kill9-nolog", "kill9", "powerloss"}[k] }

// lossy reports whether a crash of this kind may lose acknowledged writes that no flush made
// durable, in mode: after a power loss, and in write-back after a kill without a run log.
func (k crashKind) lossy(mode Mode) bool { return k == powerLoss || (k == kill9 && mode == WriteBack) }

// withRunLog sets m's run log at a path in dir, and the layout's.
func (m *machine) withRunLog(dir string, l *layout) {
	m.runLog = dir + "/tierblk.runlog"
	l.runLog = m.runLog
}

// keepRunLog keeps what a crash of kind leaves of the run log: its content at the kill (set as
// g's onCrash), nothing after a power loss.
func (m *machine) keepRunLog(g *gate, kind crashKind) {
	if m.runLog == "" {
		return
	}
	g.onCrash = func() {
		m.killed = nil
		if kind != powerLoss {
			m.killed, _ = os.ReadFile(m.runLog)
		}
	}
}

// restoreRunLog puts back what the last crash left of the run log, before the next engine starts.
func (m *machine) restoreRunLog(t testing.TB) {
	if m.runLog == "" {
		return
	}
	if m.killed == nil {
		require.NoError(t, os.RemoveAll(m.runLog))
		return
	}
	require.NoError(t, os.WriteFile(m.runLog, m.killed, 0o600))
}

// ack is a write (id 0: zeroes) acknowledged at seq; fua writes are durable at once. A pending
// write is one a crash cut short, never acknowledged: it may have landed in whole, in part or not
// at all, so a read after the restart may find it or what came before it, sector by sector.
type ack struct {
	id      int64
	seq     int64
	fua     bool
	pending bool
}

// acceptable returns the ids a read of sector s may return: if the crash may lose writes (power
// loss, or kill -9 in write-back, which loses what no flush made durable), the last durable write
// and every later one; otherwise the last acknowledged write and the pending ones after it. A
// pending write is never what an older value may be lost to: it is neither acknowledged nor
// durable, even with FUA.
func (m *machine) acceptable(s int, lossy bool) []int64 {
	h := m.hist[s]
	base := 0
	for i, a := range h {
		if !a.pending && (!lossy || a.fua || a.seq < m.durable.Load()) {
			base = i
		}
	}
	ids := make([]int64, 0, len(h)-base)
	for _, a := range h[base:] {
		ids = append(ids, a.id)
	}
	return ids
}

// newMachine returns a machine with a backend of devSize bytes, all zeros, and an SSD of ssdSize.
// Every commit of more than two records lands in parts, so that a crash can fall between them.
func newMachine(devSize, ssdSize int64) *machine {
	m := &machine{back: newCrashDev(devSize), ssd: newCrashDev(ssdSize), store: meta.NewMem(),
		hist: make([][]ack, devSize/sector)}
	m.store.SetMaxOps(2)
	for s := range m.hist {
		m.hist[s] = []ack{{}}
	}
	return m
}

// checkRestart reads every sector through c, an engine just started on m after a crash, and checks
// it against the model, which then holds what was read: each sector must read a write the crash
// may have left (acceptable; lossy as there). In write-back the dirty data the restart found goes
// back first (FlushAll); then, as in the other modes, the backend should hold what the cache
// serves: split lists the sectors where it does not, for the caller to judge. all is what was read.
func (m *machine) checkRestart(c *Cache, lossy bool) (all []byte, split []int, err error) {
	all = make([]byte, m.back.Size())
	for off := int64(0); off < int64(len(all)); off += blockSize {
		p := all[off : off+blockSize]
		_, err := c.ReadAt(p, off)
		if errors.Is(err, ErrLost) && m.damaged {
			// Dirty data the damage hit: written again, with a new id, which clears the range.
			m.lostID++
			first := int(off / sector)
			stamp(p, first, -1-m.lostID)
			if _, err := c.WriteAt(p, off); err != nil {
				return nil, nil, fmt.Errorf("write over a lost block after restart: %w", err)
			}
			for s := first; s < first+blockSize/sector; s++ {
				m.hist[s] = []ack{{id: -1 - m.lostID}}
			}
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read after restart: %w", err)
		}
	}
	m.damaged = false
	if c.Mode() == WriteBack {
		if err := c.FlushAll(context.Background(), nil); err != nil {
			return nil, nil, fmt.Errorf("FlushAll after restart: %w", err)
		}
	}
	raw := make([]byte, len(all))
	m.back.ReadAt(raw, 0)
	got, onBackend := stamps(all, 0), stamps(raw, 0)
	for s, id := range got {
		if ok := m.acceptable(s, lossy); !slices.Contains(ok, id) {
			return nil, nil, fmt.Errorf("sector %d reads write %d after restart; acceptable: %v", s, id, ok)
		}
		m.hist[s] = []ack{{id: id}}
		if id != onBackend[s] {
			split = append(split, s)
		}
	}
	return all, split, nil
}

func (m *machine) record(first, n int, a ack) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for s := first; s < first+n; s++ {
		m.hist[s] = append(m.hist[s], a)
	}
}

// TestCrashRestart runs clients against a cache, crashes it at random points (kill -9, or power
// loss that also drops unsynced metadata and unflushed writes of the SSD and backend), damages the
// SSD at times (a byte flipped: a block may then read as lost, which is written again), starts a
// new engine on what is left and checks every sector: the last acknowledged write after kill -9;
// after power loss the last write made durable (by a flush or FUA) or a later one. The restarted
// cache must also agree with its backend, so that no eviction can later change what a read
// returns. In write-back, where kill -9 too may lose writes no flush made durable, the restarted
// cache may hold dirty data the backend lacks: after a FlushAll the backend must hold exactly what
// the cache serves. Each case runs with every reduction of the SSD tier.
func TestCrashRestart(t *testing.T) {
	cases := []struct {
		name string
		l    layout
		wide bool // clients write ranges up to a quarter of the device: a full SSD tier (ownedRange)
	}{
		{"wt-4k", layout{line: 4 << 10, ram: 2, ssd: 8, mode: WriteThrough}, false},
		{"wt-16k-s3fifo", layout{line: 16 << 10, ram: 1, ssd: 4, mode: WriteThrough, policy: "s3fifo"}, false},
		{"wt-8k-ssd-only", layout{line: 8 << 10, ssd: 6, mode: WriteThrough}, false},
		{"wa-8k", layout{line: 8 << 10, ram: 2, ssd: 6, mode: WriteAround}, false},
		{"wb-4k", layout{line: 4 << 10, ram: 2, ssd: 8, mode: WriteBack, order: OrderAddress}, false},
		{"wb-16k-ssd-only", layout{line: 16 << 10, ssd: 4, mode: WriteBack, policy: "s3fifo", order: OrderAddress}, false},
		{"wb-4k-full", layout{line: 4 << 10, ram: 1, ssd: 8, mode: WriteBack, order: OrderAddress}, true},
		{"wb-16k-full", layout{line: 16 << 10, ssd: 4, mode: WriteBack, order: OrderAddress}, true},
		{"wb-4k-order-flush", layout{line: 4 << 10, ram: 2, ssd: 8, mode: WriteBack, order: OrderFlush}, false},
		{"wb-4k-full-order-flush", layout{line: 4 << 10, ram: 1, ssd: 8, mode: WriteBack, order: OrderFlush}, true},
	}
	seed := testSeed(t)
	for i, tc := range cases {
		kinds := []crashKind{kill9Logged, powerLoss}
		if tc.l.mode == WriteBack {
			kinds = append(kinds, kill9)
		}
		for _, kind := range kinds {
			for _, r := range []Reduction{ReductionOff, ReductionZero, ReductionCompress, ReductionDedupe} {
				l := withReduction(tc.l, r)
				t.Run(tc.name+"-"+kind.String()+"-reduction-"+r.String(), func(t *testing.T) {
					t.Parallel()
					runCrashes(t, l, tc.wide, kind, seed, seed+uint64(i)*1000+uint64(kind)*300)
				})
			}
		}
	}
}

func runCrashes(t *testing.T, l layout, wide bool, kind crashKind, base, seed uint64) {
	const (
		devSize = 128 << 10
		clients = 4
	)
	cycles := 12
	if testing.Short() {
		cycles = 4
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	power, lossy := kind == powerLoss, kind.lossy(l.mode)
	m := newMachine(devSize, l.ssd*l.line)
	if kind != kill9 {
		m.withRunLog(t.TempDir(), &l)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (replay with CACHE_TEST_SEED=%d): %s", seed, base, fmt.Sprintf(format, args...))
	}
	for cycle := range cycles {
		g := &gate{}
		m.keepRunLog(g, kind)
		opts := fault.Options{Seed: int64(seed) + int64(cycle), MaxDelay: 100 * time.Microsecond}
		b := fault.New(gatedDev{g, m.back}, opts)
		opts.Seed++
		ssd := fault.New(gatedDev{g, m.ssd}, opts)
		m.restoreRunLog(t)
		c := newCache(t, b, l, gatedStore{g, m.store}, ssd)
		if err := c.Recovered(); kind == kill9Logged && cycle > 0 && err != nil {
			fail("cycle %d: the restart after a kill found no run log: %v", cycle, err)
		}

		// After a restart every sector must read as the model allows, and as the backend has it.
		all, split, err := m.checkRestart(c, lossy)
		if err != nil {
			fail("cycle %d: %v", cycle, err)
		}
		// In write-back nothing reaches the backend before the tier's records of it survive
		// power loss (syncInvalidations): no split then either.
		if len(split) > 0 && (!power || l.mode == WriteBack) {
			fail("cycle %d: sector %d reads differently from the cache and the backend: an eviction would change it",
				cycle, split[0])
		}
		if len(split) > 0 {
			// Allowed by the contract (both are the durable write or a later one) but the device
			// is not one disk: an eviction would change what these sectors read. Rewrite them,
			// so that the model below stays exact.
			t.Logf("seed %d: cycle %d: after power loss %d sectors read differently from the cache and the backend (first: %d)",
				seed, cycle, len(split), split[0])
			for _, s := range split {
				if _, err := c.WriteAt(all[s*sector:(s+1)*sector], int64(s)*sector); err != nil {
					fail("cycle %d: rewrite of sector %d: %v", cycle, s, err)
				}
			}
		}
		if err := c.Flush(); err != nil { // what the model holds now is durable
			fail("cycle %d: flush after restart: %v", cycle, err)
		}
		m.durable.Store(0)

		var wg sync.WaitGroup
		ops := 10 + rng.IntN(40)
		for client := range clients {
			crng := rand.New(rand.NewPCG(seed, uint64(cycle*clients+client+1)))
			wg.Go(func() {
				for k := range ops {
					// A client owns its share of the 4 KiB blocks, so that the model knows the
					// order of the writes to each sector; lines are shared.
					first, n := ownedSectors(crng, devSize, clients, client)
					if wide {
						first, n = ownedRange(crng, devSize, clients, client)
					}
					off, length := int64(first)*sector, int64(n)*sector
					id := int64(cycle+1)<<32 | int64(client)<<16 | int64(k+1)
					buf := make([]byte, length)
					var err error
					a := ack{id: id}
					switch r := crng.IntN(100); {
					case r < 25:
						if _, err = c.ReadAt(buf, off); err == nil {
							m.mu.Lock()
							for i, got := range stamps(buf, first) {
								h := m.hist[first+i]
								if want := h[len(h)-1].id; got != want {
									err = fmt.Errorf("sector %d reads write %d, want %d", first+i, got, want)
								}
							}
							m.mu.Unlock()
						}
						if err != nil {
							t.Errorf("seed %d: cycle %d: read: %v", seed, cycle, err)
						}
						continue
					case r < 75:
						stamp(buf, first, id)
						_, err = c.WriteAt(buf, off)
					case r < 85:
						stamp(buf, first, id)
						a.fua = true
						_, err = c.WriteAtFUA(buf, off)
					case r < 88:
						a.id = 0
						err = c.WriteZeroes(off, length, false)
					case r < 92:
						a.id = 0 // zero blocks, where the SSD tier reduces
						_, err = c.WriteAt(buf, off)
					default:
						call := m.seq.Add(1)
						if err = c.Flush(); err == nil {
							for d := m.durable.Load(); d < call && !m.durable.CompareAndSwap(d, call); d = m.durable.Load() {
							}
						}
						n = 0
					}
					if err != nil {
						t.Errorf("seed %d: cycle %d: write [%d,%d): %v", seed, cycle, first, first+n, err)
						return
					}
					a.seq = m.seq.Add(1)
					m.record(first, n, a)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			fail("cycle %d failed", cycle)
		}
		// Crash: perhaps while the background checkpoint runs.
		time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
		g.crash()
		if power {
			// Of badger's log, what reached the disk: a prefix of the commits not synced.
			m.store.CrashKeeping(rng.IntN(m.store.Unsynced() + 1))
			m.back.powerLoss(rng, rng.Float64())
			m.ssd.powerLoss(rng, rng.Float64())
		}
		// Damage, at times: never a wrong byte after the restart. Not on a tier of slots in
		// write-back, nor in a packed tier's mutable units: it takes their dirty blocks as they
		// are after a crash, rewritten in place or not (sum.go, "Adopted blocks"). Nor in FLUSH
		// order, where a lost dirty block halts the write back for good, as it must
		// (TestOrderLostBlock, and TestOrderFlushModel's damage), and the model here would stop.
		adopts := l.mode == WriteBack && l.reduction < ReductionCompress
		if halts := l.order == OrderFlush; !adopts && !halts && rng.IntN(3) == 0 {
			m.damage(rng, c)
		}
		c.Close() // stops the abandoned engine's checkpoint loop; every call it makes fails
	}
}

// ownedSectors picks, for writer w of writers, sectors [first, first+n) within one 4 KiB block b
// of a device of devSize bytes with b%writers == w: the whole block or, half of the time, part of
// it. Writers never share a sector, so a model knows the order of the writes to each one.
func ownedSectors(rng *rand.Rand, devSize, writers, w int) (first, n int) {
	const perBlk = blockSize / sector
	blk := rng.IntN(devSize/blockSize/writers)*writers + w
	first, n = blk*perBlk, perBlk
	if rng.IntN(2) == 0 {
		n = 1 + rng.IntN(perBlk)
		first += rng.IntN(perBlk - n + 1)
	}
	return first, n
}

// ownedRange picks, for writer w of writers, sectors [first, first+n) within the w-th of writers
// equal parts of a device of devSize bytes: up to the whole part, whole 4 KiB blocks half of the
// time. On a small SSD tier in write-back, the writers together keep it full of dirty data and
// write over it.
func ownedRange(rng *rand.Rand, devSize, writers, w int) (first, n int) {
	const perBlk = blockSize / sector
	part := devSize / sector / writers
	n = 1 + rng.IntN(part)
	first = w*part + rng.IntN(part-n+1)
	if rng.IntN(2) == 0 {
		n = perBlk * (1 + rng.IntN(part/perBlk))
		first = w*part + perBlk*rng.IntN((part-n)/perBlk+1)
	}
	return first, n
}

// TestCorruptRecords: a stored record that cannot be true (a slot out of range or used twice, bits
// that do not fit a line, a line beyond the backend) fails the
// cache's start with an error that says what is wrong, rather than a panic or a wrong index.
func TestCorruptRecords(t *testing.T) {
	const line = 16 << 10
	l := layout{line: line, ssd: 8, mode: WriteBack}
	all := []uint64{1}
	for _, tc := range []struct {
		name string
		recs []meta.Line
		want string
	}{
		{"slot out of range", []meta.Line{{Line: 1, Slot: 8, Valid: all}}, "slot 8 is out of range or used twice"},
		{"slot used twice", []meta.Line{{Line: 1, Slot: 2, Valid: all}, {Line: 3, Slot: 2, Valid: all}}, "out of range or used twice"},
		{"no valid block", []meta.Line{{Line: 1, Slot: 0}}, "do not fit a line"},
		{"valid bits past the line", []meta.Line{{Line: 1, Slot: 0, Valid: []uint64{1 << 4}}}, "do not fit a line of 4 blocks"},
		{"dirty line beyond the backend", []meta.Line{{Line: 64, Slot: 0, Valid: all, Dirty: all}}, "line 64 is beyond the backend's 64 lines"},
		{"clean line beyond the backend", []meta.Line{{Line: 1 << 40, Slot: 0, Valid: all}}, "beyond the backend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, store, ssd := mem.New(64*line), meta.NewMem(), mem.New(8*line)
			newCache(t, b, l, store, ssd).Close() // the superblock
			store.Crash()                         // reopens it; Close synced everything
			var ops []meta.Op
			for _, r := range tc.recs {
				ops = append(ops, meta.Op{Rec: r})
			}
			require.NoError(t, store.Commit(ops, true))
			_, err := New(b, testConfig(l, store, ssd))
			require.ErrorIs(t, err, ErrCorrupt)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
