package cache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// The tests here check write-back in FLUSH order (issue 47, WriteBackConfig.Order) at the block
// level. The writes between two FLUSHes, or up to and including a FUA write, form an epoch; at every
// moment the backend must hold a state a crash of the device could have left: every epoch before
// some epoch k whole, any subset of epoch k's writes, nothing later. A backend that checks its own
// contents after each change it gets (orderBackend) holds the cache to it, whatever the SSD tier
// holds or whether it survives: that is what makes the backend alone a usable, older disk.

const orderDevSize = 128 << 10

// orderLayout is the cache of these tests: 16 lines of 8 KiB on the backend, an SSD tier of 8, so
// that dirty data is always near its maximum (orderWatermarks are small: the destager is busy).
var (
	orderLayout     = layout{line: 8 << 10, ram: 2, ssd: 8, mode: WriteBack}
	orderWatermarks = WriteBackConfig{High: 0.25, Low: 0.1, Max: 0.5, Throttle: "none"}
)

// hentry is a write's mark on one sector: the id it gave (0: zeros) in its epoch; sure unless it
// may have left the old content (a write that failed, a TRIM, whose range reads as before or zero).
type hentry struct {
	epoch int
	id    int64
	sure  bool
}

// orderHistory is the client's record, by sector: the writes to it in order, the first being the
// device's zeros (epoch 0, before any); cur is the epoch open now. note says what the client is
// doing, for reports. Writes are recorded before they are issued: the backend may get one before
// its call returns.
type orderHistory struct {
	mu   sync.Mutex
	cur  int
	sec  [][]hentry
	note string
}

func newOrderHistory(sectors int) *orderHistory {
	h := &orderHistory{cur: 1, sec: make([][]hentry, sectors)}
	for s := range h.sec {
		h.sec[s] = []hentry{{sure: true}}
	}
	return h
}

// add records a write of id to [first, first+n) in the open epoch; failed then marks it unsure.
func (h *orderHistory) add(first, n int, id int64, sure bool, note string) {
	h.say(note, func() {
		for s := first; s < first+n; s++ {
			h.sec[s] = append(h.sec[s], hentry{h.cur, id, sure})
		}
	})
}

func (h *orderHistory) failed(first, n int) {
	h.say(h.note+", failed", func() {
		for s := first; s < first+n; s++ {
			h.sec[s][len(h.sec[s])-1].sure = false
		}
	})
}

// barrier ends the open epoch: a FLUSH or a FUA write completed. (One that failed ends none: the
// model then allows more states, never fewer.)
func (h *orderHistory) barrier(note string) { h.say(note, func() { h.cur++ }) }

// say sets the note and runs change, if not nil, under h.mu.
func (h *orderHistory) say(note string, change func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.note = note
	if change != nil {
		change()
	}
}

func (h *orderHistory) where() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return fmt.Sprintf("%s (epoch %d open)", h.note, h.cur)
}

// allowed calls fn with the epochs k, as intervals [lo, hi], newest first, at which sector s may
// hold v: a write of epoch k gave it v, or v is its content after every epoch before k (the last
// sure write before k, or a later unsure one). The caller holds h.mu. Ids other than 0 are unique.
func (h *orderHistory) allowed(s int, v int64, fn func(lo, hi int)) {
	next := h.cur // the epoch of the first sure write after the one looked at
	for i := len(h.sec[s]) - 1; i >= 0; i-- {
		e := h.sec[s][i]
		if e.id == v {
			fn(max(e.epoch, 1), next)
			if v != 0 {
				return
			}
		}
		if e.sure {
			next = e.epoch
		}
	}
}

// legal returns nil if ids (the write id of each sector, as stamps decodes them) is a state a
// crash could have left after the history h, else the first sector that proves no epoch fits. It
// counts, for each epoch k, the sectors that fit it: one pass over the sectors, each looking at its
// history from the newest write back to the one it holds (near the end, as the backend lags little).
func legal(ids []int64, h *orderHistory) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	cnt := make([]int, h.cur+2)
	for s, v := range ids {
		lo, hi := -1, -1
		h.allowed(s, v, func(a, b int) {
			if lo >= 0 && b >= lo-1 { // overlaps or meets the newer interval: one
				lo, hi = min(lo, a), max(hi, b)
				return
			}
			if lo >= 0 {
				cnt[lo]++
				cnt[hi+1]--
			}
			lo, hi = a, b
		})
		if lo >= 0 {
			cnt[lo]++
			cnt[hi+1]--
		}
	}
	for k, fit := 1, 0; k <= h.cur; k++ {
		if fit += cnt[k]; fit == len(ids) {
			return nil
		}
	}
	return h.explain(ids)
}

// explain finds the first sector at which no epoch fits the sectors up to it, and says what it
// holds and what it may hold at the epochs the sectors before it allow. The caller holds h.mu.
func (h *orderHistory) explain(ids []int64) error {
	before := make([]int, h.cur) // the epochs every sector so far fits
	for k := range before {
		before[k] = k + 1
	}
	narrowed := "none"
	for s, v := range ids {
		fits := make([]bool, h.cur+1)
		h.allowed(s, v, func(lo, hi int) {
			for k := lo; k <= hi; k++ {
				fits[k] = true
			}
		})
		both := slices.DeleteFunc(slices.Clone(before), func(k int) bool { return !fits[k] })
		if len(both) > 0 {
			if len(both) < len(before) {
				narrowed = fmt.Sprintf("sector %d, which holds %s, its writes %s", s, h.describe(s, v), h.trail(s))
			}
			before = both
			continue
		}
		var may []string
		for _, k := range before[max(0, len(before)-4):] {
			may = append(may, fmt.Sprintf("k=%d: %v", k, h.candidates(s, k)))
		}
		return fmt.Errorf("sector %d (block %d) holds %s; the sectors before it fit only epochs k in %v (the last to narrow them: %s), "+
			"where it may hold (its content after epochs < k, or a write of epoch k) %s; its writes (epoch:id, ? unsure): %s",
			s, s*sector/blockSize, h.describe(s, v), before, narrowed, strings.Join(may, ", "), h.trail(s))
	}
	return fmt.Errorf("no epoch fits, yet every sector fits one: a bug of the checker")
}

// candidates returns what sector s may hold at epoch k: its content after every epoch before k,
// and what each write of epoch k gave it.
func (h *orderHistory) candidates(s, k int) []int64 {
	var base, in []int64
	for _, e := range h.sec[s] {
		switch {
		case e.epoch < k && e.sure:
			base = []int64{e.id}
		case e.epoch < k:
			base = append(base, e.id)
		case e.epoch == k:
			in = append(in, e.id)
		}
	}
	return append(base, in...)
}

func (h *orderHistory) describe(s int, v int64) string {
	switch i := slices.IndexFunc(h.sec[s], func(e hentry) bool { return e.id == v }); {
	case v == 0:
		return "zeros"
	case v == corrupt:
		return "bytes no write gave it (corrupt)"
	case i < 0:
		return fmt.Sprintf("write %d, which never wrote this sector", v)
	default:
		return fmt.Sprintf("write %d of epoch %d", v, h.sec[s][i].epoch)
	}
}

// trail lists the last writes to sector s.
func (h *orderHistory) trail(s int) string {
	var b []string
	for _, e := range h.sec[s][max(0, len(h.sec[s])-10):] {
		b = append(b, fmt.Sprintf("%d:%d%s", e.epoch, e.id, map[bool]string{false: "?"}[e.sure]))
	}
	return strings.Join(b, " ")
}

// orderBackend is the backend under the cache: a crashDev that, after each write, WRITE_ZEROES and
// TRIM it completes, checks what reads now see and states a power loss could leave now
// (what was flushed, and a random part of each write since, as crashDev.powerLoss keeps), which
// catches epochs sent without a backend flush between them. It records the first violation rather
// than fail the engine's call. Its changes and checks are serialized; it keeps write ids, not bytes,
// so that checks cost little.
type orderBackend struct {
	*crashDev
	h *orderHistory

	mu            sync.Mutex
	rng           *rand.Rand
	ids, durable  []int64 // by sector: what reads see, what a power loss keeps
	pending       []pendingIDs
	changes       int
	bad, badPower error // the first violation seen, and the first only a power loss shows
}

type pendingIDs struct {
	first int
	ids   []int64
}

// orderLosses is how many states a power loss could leave orderBackend checks after each change.
const orderLosses = 2

func newOrderBackend(h *orderHistory, seed uint64) *orderBackend {
	n := orderDevSize / sector
	return &orderBackend{crashDev: newCrashDev(orderDevSize), h: h,
		rng: rand.New(rand.NewPCG(seed, 77)), ids: make([]int64, n), durable: make([]int64, n)}
}

func (b *orderBackend) WriteAt(p []byte, off int64) (n int, err error) {
	err = b.change(off, int64(len(p)), func() error { n, err = b.crashDev.WriteAt(p, off); return err })
	return n, err
}

func (b *orderBackend) WriteZeroes(off, length int64, mayUnmap bool) error {
	return b.change(off, length, func() error { return b.crashDev.WriteZeroes(off, length, mayUnmap) })
}

func (b *orderBackend) Trim(off, length int64) error {
	return b.change(off, length, func() error { return b.crashDev.Trim(off, length) })
}

func (b *orderBackend) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.pending {
		copy(b.durable[w.first:], w.ids)
	}
	b.pending = nil
	return b.crashDev.Flush()
}

// change runs do, which changes [off, off+n), reads back the sectors it touched and checks.
func (b *orderBackend) change(off, n int64, do func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := do(); err != nil || n == 0 {
		return err
	}
	first, end := int(off/sector), int((off+n+sector-1)/sector)
	buf := make([]byte, (end-first)*sector)
	if _, err := b.crashDev.ReadAt(buf, int64(first)*sector); err != nil {
		return err
	}
	ids := stamps(buf, first)
	copy(b.ids[first:], ids)
	b.pending = append(b.pending, pendingIDs{first, ids})
	b.changes++
	if b.bad != nil {
		return nil
	}
	what := func() string {
		return fmt.Sprintf("backend change %d, sectors [%d,%d), during %s", b.changes, first, end, b.h.where())
	}
	if err := legal(b.ids, b.h); err != nil {
		b.bad = fmt.Errorf("after %s, the backend reads: %w", what(), err)
		return nil
	}
	if err := b.checkLosses(orderLosses); err != nil && b.badPower == nil {
		b.badPower = fmt.Errorf("after %s, a power loss of the backend may leave (no backend flush between epochs?): %w", what(), err)
	}
	return nil
}

// checkLosses checks n states a power loss of the backend could leave now. The caller holds b.mu.
func (b *orderBackend) checkLosses(n int) error {
	for range n {
		if len(b.pending) == 0 {
			return nil
		}
		img := slices.Clone(b.durable)
		for _, w := range b.pending {
			for i, id := range w.ids {
				if b.rng.IntN(2) == 0 {
					img[w.first+i] = id
				}
			}
		}
		if err := legal(img, b.h); err != nil {
			return err
		}
	}
	return nil
}

// violation returns the first violation, one seen in what reads see before one only a power loss
// shows, after n more power-loss states of the backend as it is now.
func (b *orderBackend) violation(n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLosses(n); err != nil && b.badPower == nil {
		b.badPower = fmt.Errorf("at the end (%s), a power loss of the backend may leave: %w", b.h.where(), err)
	}
	if b.bad != nil {
		return b.bad
	}
	return b.badPower
}

// orderRig is one client on a write-back cache over an orderBackend, with an SSD tier that fails
// every I/O once dropped.
type orderRig struct {
	c     *Cache
	back  *orderBackend
	ssd   *fault.Backend
	raw   *mem.Mem // the SSD tier's bytes under ssd, for damage
	store meta.Store
	// g stands between the engine and what outlives it (the backend, the SSD, the store), so that
	// a kill cuts them from the killed engine at once (restart).
	g     *gate
	l     layout
	order string
	h     *orderHistory
	rng   *rand.Rand
	id    int64
}

func newOrderRig(t testing.TB, l layout, order string, seed uint64) *orderRig {
	h := newOrderHistory(orderDevSize / sector)
	raw := mem.New(l.ssd * l.line)
	r := &orderRig{h: h, back: newOrderBackend(h, seed), rng: rand.New(rand.NewPCG(seed, 1)),
		ssd: fault.New(raw, fault.Options{Seed: int64(seed)}), raw: raw, store: meta.NewMem(),
		g: &gate{}, l: l, order: order}
	r.open(t)
	return r
}

// open starts an engine on the rig's devices, behind its gate.
func (r *orderRig) open(t testing.TB) {
	cfg := testConfig(r.l, gatedStore{r.g, r.store}, gatedDev{r.g, r.ssd})
	cfg.WriteBack = orderWatermarks
	cfg.WriteBack.Order = r.order
	c, err := New(gatedDev{r.g, r.back}, cfg)
	require.NoError(t, err)
	if r.l.dedupeHash != nil {
		packedOf(c.ssd).dd.Hash = r.l.dedupeHash
	}
	r.c = c
}

// restart stops the engine and starts another on what it left: with Close, or killed (its gate
// cut at once, the run log as the kill left it), which with a run log loses no acknowledged write.
// The epochs not yet on the backend must keep their order across it.
func (r *orderRig) restart(t testing.TB, kill bool) {
	if kill {
		var left []byte
		r.g.onCrash = func() { left, _ = os.ReadFile(r.l.runLog) }
		r.g.crash()
		r.c.Close()
		require.NoError(t, os.WriteFile(r.l.runLog, left, 0o600))
		r.g = &gate{}
	} else {
		r.c.Close()
	}
	r.open(t)
}

// write writes sectors [first, first+n): stamped with a new id, or zeros (how: "write", "fua",
// "zeros": a write of zero bytes, "write-zeroes", "trim").
func (r *orderRig) write(k int, how string, first, n int) error {
	off, length := int64(first)*sector, int64(n)*sector
	r.id++
	id, sure := r.id, how != "trim"
	if how != "write" && how != "fua" {
		id = 0
	}
	buf := make([]byte, length)
	if id != 0 {
		stamp(buf, first, id)
	}
	note := fmt.Sprintf("op %d, %s of sectors [%d,%d) id %d", k, how, first, first+n, id)
	r.h.add(first, n, id, sure, note)
	var err error
	switch how {
	case "write", "zeros":
		_, err = r.c.WriteAt(buf, off)
	case "fua":
		_, err = r.c.WriteAtFUA(buf, off)
	case "write-zeroes":
		err = r.c.WriteZeroes(off, length, r.rng.IntN(2) == 0)
	case "trim":
		err = r.c.Trim(off, length)
	}
	switch {
	case err != nil:
		r.h.failed(first, n)
		return fmt.Errorf("%s: %w", note, err)
	case how == "fua":
		r.h.barrier(note + ", done")
	}
	return nil
}

// damage flips a byte in each of n random blocks of the SSD tier's device, as rot would: a dirty
// block so damaged is lost, and in FLUSH order its epoch can never be whole on the backend.
func (r *orderRig) damage(t testing.TB, n int) {
	size := r.l.ssd * r.l.line
	b := make([]byte, 1)
	for range n {
		at := int64(r.rng.IntN(int(size/blockSize)))*blockSize + int64(r.rng.IntN(blockSize))
		_, err := r.raw.ReadAt(b, at)
		require.NoError(t, err)
		b[0] ^= 1 << r.rng.IntN(8)
		_, err = r.raw.WriteAt(b, at)
		require.NoError(t, err)
	}
}

func (r *orderRig) flush(k int) error {
	note := fmt.Sprintf("op %d, flush", k)
	r.h.say(note, nil)
	if err := r.c.Flush(); err != nil {
		return fmt.Errorf("%s: %w", note, err)
	}
	r.h.barrier(note + ", done") // the epoch ends when the flush returns: nothing is issued meanwhile
	return nil
}

// op issues a random request: writes of whole or partial blocks, FUA writes, FLUSHes, TRIMs,
// WRITE_ZEROES, writes of zeros, and reads (not checked here: they fill and promote lines).
func (r *orderRig) op(k int) error {
	const perBlk = blockSize / sector
	sectors := len(r.h.sec)
	n, first := perBlk*(1+r.rng.IntN(2)), perBlk*r.rng.IntN(sectors/perBlk-1)
	if r.rng.IntN(3) == 0 {
		n = 1 + r.rng.IntN(12)
		first = r.rng.IntN(sectors - n)
	}
	switch x := r.rng.IntN(100); {
	case x < 10:
		_, err := r.c.ReadAt(make([]byte, n*sector), int64(first)*sector)
		return err
	case x < 55:
		return r.write(k, "write", first, n)
	case x < 65:
		return r.write(k, "fua", first, n)
	case x < 70:
		return r.write(k, "zeros", first, n)
	case x < 76:
		return r.write(k, "write-zeroes", first, n)
	case x < 82:
		return r.write(k, "trim", first, n)
	default:
		return r.flush(k)
	}
}

// orderRun is what one run of the model (runOrder) did and found.
type orderRun struct {
	destaged  uint64 // bytes written back
	lostEpoch uint64 // the epoch a damaged dirty block halted the write back at (0: none)
	ghosts    uint64 // older versions of dirty blocks kept for writes over them (ghost.go)
}

// runOrder is one seeded run of the model: random requests on a fresh cache. In a fifth of the
// runs the SSD tier fails every I/O from a random request on and ten more requests follow, any of
// which may fail: the dirty data only the tier held is gone, and the backend alone must still be a
// legal state. In another fifth a few blocks of the SSD tier's device are damaged at a random
// request and twenty more follow, any of which may fail (a damaged dirty block is lost). In
// another the run stops at a random request, the SSD tier abandoned as it is. In another the
// engine restarts at a random request (Close, or a kill with a run log: no acknowledged write is
// lost either way) and the run goes on on the restarted engine. Otherwise FlushAll drains the
// dirty data at the end (allowed to fail after damage). It returns what the run did, the order
// violation found, and apart from it a failure the model does not allow (a request that failed
// while the SSD worked).
func runOrder(t testing.TB, l layout, order string, seed uint64, ops int) (run orderRun, violation, err error) {
	rng := rand.New(rand.NewPCG(seed, 2))
	end, drop, dmg, restart := ops, -1, -1, -1
	switch rng.IntN(5) {
	case 0:
		drop = rng.IntN(ops)
		end = drop + 10
	case 1:
		end = rng.IntN(ops)
	case 2:
		restart = rng.IntN(ops)
		l.runLog = filepath.Join(t.TempDir(), "runlog")
	case 3:
		dmg = rng.IntN(ops)
		end = dmg + 20
	}
	failFrom := max(drop, dmg) // requests from it on may fail
	r := newOrderRig(t, l, order, seed)
	for k := 0; k < end && err == nil; k++ {
		if k == restart {
			kill := rng.IntN(2) == 0
			r.h.say(fmt.Sprintf("op %d, a restart (killed: %v)", k, kill), nil)
			r.restart(t, kill)
		}
		if k == drop {
			r.ssd.SetFailing(true)
			r.h.say(fmt.Sprintf("op %d, the SSD tier dropped", k), nil)
			if r.rng.IntN(4) > 0 {
				// Bypassed at once, as the engine does after a few errors: finding them takes the
				// destager's backoff, seconds, which only one drop in four waits for.
				r.c.ssd.fail("the test dropped the SSD tier")
			}
		}
		if k == dmg {
			r.h.say(fmt.Sprintf("op %d, the SSD tier damaged", k), nil)
			r.damage(t, 1+r.rng.IntN(3))
		}
		if e := r.op(k); e != nil && (failFrom < 0 || k < failFrom) {
			err = fmt.Errorf("with the SSD tier working: %w", e)
		}
	}
	if err == nil && (end == ops || dmg >= 0) && drop < 0 {
		r.h.say("FlushAll at the end", nil)
		if e := r.c.FlushAll(context.Background(), nil); e != nil && dmg < 0 {
			err = fmt.Errorf("FlushAll: %w", e)
		}
	}
	violation = r.back.violation(8) // the backend as the run leaves it, and 8 power losses of it
	st := r.c.Stats().Dirty
	run = orderRun{destaged: st.DestagedBytes, lostEpoch: st.LostEpoch, ghosts: st.GhostsKept}
	r.h.say("Close", nil)
	r.c.Close()
	if violation == nil {
		violation = r.back.violation(0) // of what Close sent
	}
	if violation != nil && drop >= 0 {
		violation = fmt.Errorf("%w; in a run whose SSD tier was dropped at op %d", violation, drop)
	}
	if violation != nil && restart >= 0 {
		violation = fmt.Errorf("%w; in a run whose engine restarted at op %d", violation, restart)
	}
	if violation != nil && dmg >= 0 {
		violation = fmt.Errorf("%w; in a run whose SSD tier was damaged at op %d", violation, dmg)
	}
	return run, violation, err
}

// orderCases are the SSD tier's layouts and reductions the model runs on.
var orderCases = []struct {
	name string
	l    layout
}{
	{"slots", withReduction(orderLayout, ReductionOff)},
	{"slots-reduction-zero", withReduction(orderLayout, ReductionZero)},
	{"packed-compress", withReduction(orderLayout, ReductionCompress)},
	{"packed-dedupe", withReduction(orderLayout, ReductionDedupe)},
}

// orderSeed is run's seed in case i of a test started from base. CACHE_ORDER_RUN=n runs only run
// n: with CACHE_TEST_SEED and the subtest's name, a failure replays alone.
func orderSeed(base uint64, i, run int) uint64 { return base<<24 | uint64(i)<<16 | uint64(run) }

func orderRuns(t *testing.T, normal, short int) (first, end int) {
	if s := os.Getenv("CACHE_ORDER_RUN"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "CACHE_ORDER_RUN")
		return n, n + 1
	}
	if testing.Short() {
		return 0, short
	}
	return 0, normal
}

// TestOrderFlushModel runs the model with Order: OrderFlush, 500 seeded runs (30 with -short) for
// each layout and reduction of the SSD tier: the backend must be a legal crash state after every
// change it gets, in what it reads and in what a power loss of it could keep.
func TestOrderFlushModel(t *testing.T) {
	base := testSeed(t)
	for i, oc := range orderCases {
		t.Run(oc.name, func(t *testing.T) {
			t.Parallel()
			first, end := orderRuns(t, 500, 30)
			var destaged, ghosts uint64
			halted := 0
			for run := first; run < end; run++ {
				seed := orderSeed(base, i, run)
				did, violation, err := runOrder(t, oc.l, OrderFlush, seed, 80)
				destaged += did.destaged
				ghosts += did.ghosts
				if did.lostEpoch != 0 {
					halted++
				}
				replay := fmt.Sprintf("seed %d, run %d (replay: CACHE_TEST_SEED=%d CACHE_ORDER_RUN=%d "+
					"go test ./internal/cache -run 'TestOrderFlushModel/%s$')", seed, run, base, run, oc.name)
				require.NoError(t, violation, "%s: write-back out of FLUSH order", replay)
				require.NoError(t, err, replay)
			}
			require.NotZero(t, destaged, "nothing was written back: the model tested no write-back")
			require.NotZero(t, ghosts, "no write went over an older epoch's dirty block: the model tested no ghost")
			t.Logf("%d runs of %d lost a dirty block to damage, halting the write back", halted, end-first)
			if end-first >= 100 {
				require.NotZero(t, halted, "no damage hit dirty data: the model tested no lost block")
			}
		})
	}
}

// TestOrderAddressBreaksModel shows the checker is not vacuous: with Order: OrderAddress (dirty
// data written back in address order, across FLUSHes) it finds violations, both in a workload made
// to show one and in the random model.
func TestOrderAddressBreaksModel(t *testing.T) {
	base := testSeed(t)
	t.Run("pair", func(t *testing.T) {
		// Block A in line 12 (epoch 1), FLUSH, block B in line 3 (epoch 2), FLUSH; FlushAll then
		// writes both back in one batch, B's run first and one backend flush after both: the
		// backend reads B without A if B's write lands first, and a power loss before that flush
		// may keep B and lose A either way.
		const perLine = 8 << 10 / sector
		found := 0
		for run := range 30 {
			r := newOrderRig(t, orderLayout, OrderAddress, orderSeed(base, 100, run))
			require.NoError(t, r.write(0, "write", 12*perLine, blockSize/sector))
			require.NoError(t, r.flush(1))
			require.NoError(t, r.write(2, "write", 3*perLine, blockSize/sector))
			require.NoError(t, r.flush(3))
			r.h.say("FlushAll", nil)
			require.NoError(t, r.c.FlushAll(context.Background(), nil))
			require.NoError(t, r.c.Close())
			if err := r.back.violation(4); err != nil {
				if found == 0 {
					t.Logf("run %d: %v", run, err)
				}
				found++
			}
		}
		t.Logf("violations in %d runs of 30", found)
		require.NotZero(t, found, "address order writes B (epoch 2) back with A (epoch 1): the checker must see it")
	})
	t.Run("model", func(t *testing.T) {
		found, runs := 0, 0
		for run := 0; run < 200 && found < 5; run++ {
			runs++
			_, violation, err := runOrder(t, orderCases[run%len(orderCases)].l, OrderAddress, orderSeed(base, 101, run), 80)
			require.NoError(t, err, "seed %d", orderSeed(base, 101, run))
			if violation != nil {
				if found == 0 {
					t.Logf("run %d: %v", run, violation)
				}
				found++
			}
		}
		t.Logf("violations in %d runs of %d", found, runs)
		require.NotZero(t, found, "the random model must find address order out of FLUSH order")
	})
}

// TestOrderWriteThroughModel shows the checker is not too strict: in write-through every write
// reaches the backend before it is acknowledged, in the client's order, so every state is legal.
func TestOrderWriteThroughModel(t *testing.T) {
	base := testSeed(t)
	for i, oc := range orderCases {
		t.Run(oc.name, func(t *testing.T) {
			t.Parallel()
			l := oc.l
			l.mode = WriteThrough
			first, end := orderRuns(t, 50, 10)
			for run := first; run < end; run++ {
				seed := orderSeed(base, 200+i, run)
				_, violation, err := runOrder(t, l, OrderFlush, seed, 80)
				require.NoError(t, violation, "seed %d, run %d", seed, run)
				require.NoError(t, err, "seed %d, run %d", seed, run)
			}
		})
	}
}

// TestOrderLegal checks legal against the definition on small random histories (writes, some
// failed, zeros and TRIMs): a state built as a crash leaves one (the epochs before k applied whole,
// an unsure write either way, then a random part of epoch k's writes in a random order) is legal,
// and on random states legal agrees with a direct search over k of candidates.
func TestOrderLegal(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 3))
	type w struct {
		epoch, first, n int
		id              int64
		sure            bool
	}
	const sectors = 6
	for run := range 2000 {
		h, ws := newOrderHistory(sectors), []w(nil)
		for id := int64(1); id <= 12; id++ {
			if rng.IntN(4) == 0 {
				h.barrier("")
			}
			x := w{epoch: h.cur, first: rng.IntN(sectors), id: id * int64(min(1, rng.IntN(4))), sure: rng.IntN(5) > 0}
			x.n = 1 + rng.IntN(sectors-x.first)
			h.add(x.first, x.n, x.id, x.sure, "")
			ws = append(ws, x)
		}
		k, built := 1+rng.IntN(h.cur), make([]int64, sectors)
		apply := func(x w, p int) { // each sector with probability 1/p, or half that if unsure
			for s := x.first; s < x.first+x.n; s++ {
				if rng.IntN(p) == 0 && (x.sure || rng.IntN(2) == 0) {
					built[s] = x.id
				}
			}
		}
		var last []w // epoch k's writes
		for _, x := range ws {
			if x.epoch < k {
				apply(x, 1)
			} else if x.epoch == k {
				last = append(last, x)
			}
		}
		for _, i := range rng.Perm(len(last)) {
			apply(last[i], 2)
		}
		require.NoError(t, legal(built, h), "run %d: a state built with k=%d", run, k)

		random := make([]int64, sectors)
		for s := range random {
			random[s] = int64(rng.IntN(13))
		}
		fits := false
		for k := 1; k <= h.cur && !fits; k++ {
			fits = true
			for s, v := range random {
				fits = fits && slices.Contains(h.candidates(s, k), v)
			}
		}
		require.Equal(t, fits, legal(random, h) == nil, "run %d: state %v: %v", run, random, legal(random, h))
	}
}

// TestOrderLostBlock: in FLUSH order a dirty block that fails its checksum with no other copy
// halts the write back before its epoch (the epoch can never be whole on the backend): the older
// epochs are written back, the later ones are not, writes that need the backend fail, and the
// stats say so. A restart in FLUSH order finds the same again; one in address order writes the rest
// back without the lost block, whose range reads as lost until it is written again.
func TestOrderLostBlock(t *testing.T) {
	for _, then := range []string{OrderFlush, OrderAddress} {
		t.Run("restart-"+then, func(t *testing.T) {
			l := layout{line: 8 << 10, ssd: 8, mode: WriteBack}
			const perLine = 8 << 10 / sector
			back := newCrashDev(orderDevSize)
			front := fault.New(back, fault.Options{})
			raw, store := mem.New(l.ssd*l.line), meta.NewMem()
			open := func(order string) *Cache {
				g := &gate{} // keeps Close from closing what the next engine opens
				cfg := testConfig(l, gatedStore{g, store}, gatedDev{g, raw})
				cfg.WriteBack = orderWatermarks
				cfg.WriteBack.Order = order
				c, err := New(gatedDev{g, front}, cfg)
				require.NoError(t, err)
				return c
			}
			c := open(OrderFlush)
			// The backend takes no write yet, so that all three epochs stay dirty.
			front.SetFailing(true)
			blocks := map[string]int{"A": 12 * perLine, "B": 3 * perLine, "C": 5 * perLine} // first sectors
			for i, name := range []string{"A", "B", "C"} {
				p := make([]byte, blockSize)
				stamp(p, blocks[name], int64(i+1))
				_, err := c.WriteAt(p, int64(blocks[name])*sector)
				require.NoError(t, err)
				require.NoError(t, c.Flush()) // A in epoch 1, B in 2, C in 3
			}
			// B's bytes on the SSD tier rot.
			c.ssd.mu.RLock()
			slot, ok := c.ssd.slotOf(3)
			c.ssd.mu.RUnlock()
			require.True(t, ok)
			b := make([]byte, 1)
			at := int64(slot)*l.line + 100
			_, err := raw.ReadAt(b, at)
			require.NoError(t, err)
			b[0] ^= 0x10
			_, err = raw.WriteAt(b, at)
			require.NoError(t, err)

			// The destager or the read finds it, whichever comes first.
			front.SetFailing(false)
			_, err = c.ReadAt(make([]byte, blockSize), int64(blocks["B"])*sector)
			require.ErrorIs(t, err, ErrLost)
			require.EqualValues(t, 2, c.Stats().Dirty.LostEpoch)
			err = c.FlushAll(context.Background(), nil)
			require.ErrorIs(t, err, errOrderLost, "FlushAll past the lost epoch")
			require.ErrorContains(t, err, "epoch 2")
			readBack := func(name string) int64 {
				p := make([]byte, blockSize)
				_, err := back.ReadAt(p, int64(blocks[name])*sector)
				require.NoError(t, err)
				return stamps(p, blocks[name])[0]
			}
			require.EqualValues(t, 1, readBack("A"), "epoch 1, before the lost one, is written back")
			require.Zero(t, readBack("B"), "B was lost")
			require.Zero(t, readBack("C"), "epoch 3, after the lost one, must not reach the backend")
			sc, err := c.Scrub(context.Background(), 0)
			require.NoError(t, err)
			require.Zero(t, sc.Damaged, "a scrub skips the lost block it knows: found again, it would count towards a bypass")
			require.EqualValues(t, 1, c.Stats().Lost.Blocks, "the lost block counts once, however often it is found")
			// A write over the lost block goes on (it keeps a lost ghost, which keeps epoch 2
			// from the backend), and the block reads as written.
			p := make([]byte, blockSize)
			stamp(p, blocks["B"], 7)
			_, err = c.WriteAt(p, int64(blocks["B"])*sector)
			require.NoError(t, err, "a write over the lost block")
			require.NoError(t, c.Flush())
			readB := func() int64 {
				got := make([]byte, blockSize)
				_, err := c.ReadAt(got, int64(blocks["B"])*sector)
				require.NoError(t, err, "B, written again, is no longer lost")
				return stamps(got, blocks["B"])[0]
			}
			require.EqualValues(t, 7, readB())
			err = c.FlushAll(context.Background(), nil)
			require.ErrorIs(t, err, errOrderLost, "epoch 2 is still without its lost block")
			require.EqualValues(t, 2, c.Stats().Dirty.LostEpoch)
			require.Zero(t, readBack("B"))
			require.Zero(t, readBack("C"))
			// Writes to other lines go on into the SSD tier until dirty data reaches its maximum,
			// which no write back can lower now: then they fail rather than wait for good.
			var werr error
			wrote := 0
			for line := 6; line < 16 && werr == nil; line++ {
				_, werr = c.WriteAt(make([]byte, blockSize), int64(line)*l.line)
				if werr == nil {
					wrote++
				}
			}
			require.ErrorIs(t, werr, errOrderLost, "a write with no room left")
			require.NotZero(t, wrote, "writes with room left go on")
			require.NoError(t, c.Close())

			c = open(then)
			defer c.Close()
			require.EqualValues(t, 7, readB(), "B as written over, across the restart")
			err = c.FlushAll(context.Background(), nil)
			if then == OrderFlush {
				require.ErrorIs(t, err, errOrderLost, "the restart finds the lost epoch again, by its lost ghost")
				require.EqualValues(t, 2, c.Stats().Dirty.LostEpoch)
				require.Zero(t, readBack("B"))
				require.Zero(t, readBack("C"))
				return
			}
			require.NoError(t, err)
			require.EqualValues(t, 3, readBack("C"), "address order writes the rest back")
			require.EqualValues(t, 7, readBack("B"), "with B's newest data")
			stamp(p, blocks["B"], 9)
			_, err = c.WriteAt(p, int64(blocks["B"])*sector)
			require.NoError(t, err)
			got := make([]byte, blockSize)
			_, err = c.ReadAt(got, int64(blocks["B"])*sector)
			require.NoError(t, err, "written again, no longer lost")
			require.EqualValues(t, 9, stamps(got, blocks["B"])[0])
		})
	}
}

// stallingDev is a backend whose writes, while it stalls, wait until they are let go, each telling
// that it waits.
type stallingDev struct {
	*crashDev
	stall   atomic.Bool
	waiting chan struct{}
	resume  chan struct{}
	// written has the id stamped on the first sector of each write, by that sector, in order.
	mu      sync.Mutex
	written map[int][]int64
}

func (s *stallingDev) WriteAt(p []byte, off int64) (int, error) {
	if s.stall.Load() {
		select {
		case s.waiting <- struct{}{}:
		default:
		}
		<-s.resume
	}
	n, err := s.crashDev.WriteAt(p, off)
	if err == nil {
		s.mu.Lock()
		for i, id := range stamps(p, int(off/sector)) {
			if first := int(off/sector) + i; first%(blockSize/sector) == 0 {
				s.written[first] = append(s.written[first], id)
			}
		}
		s.mu.Unlock()
	}
	return n, err
}

// writesOf returns the ids written to block's first sector, in order.
func (s *stallingDev) writesOf(block int) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.written[block*blockSize/sector])
}

// stalledOrder is a write-back cache in FLUSH order (16 KiB lines, 8 of them on the SSD tier
// ssd) over a backend whose writes stall while stall is set, until letGo; write stamps block with
// id, in the cache and in want (the backend's expected end). Its cleanup lets the backend go and
// closes the cache, also after a failure.
type stalledOrder struct {
	c     *Cache
	back  *stallingDev
	want  []byte
	letGo func()
}

// stalledOrderSSD is the size of its SSD tier.
const stalledOrderSSD = 8 * 16 << 10

func newStalledOrder(t *testing.T, ssd backend.Backend, store meta.Store) *stalledOrder {
	l := layout{line: 16 << 10, ssd: stalledOrderSSD / (16 << 10), mode: WriteBack}
	back := &stallingDev{crashDev: newCrashDev(orderDevSize), waiting: make(chan struct{}, 16), resume: make(chan struct{}),
		written: map[int][]int64{}}
	if ssd == nil {
		ssd = mem.New(l.ssd * l.line)
	}
	if store == nil {
		store = meta.NewMem()
	}
	cfg := testConfig(l, store, ssd)
	cfg.WriteBack = WriteBackConfig{High: 0.9, Low: 0.8, Max: 0.95, Throttle: "none", Order: OrderFlush}
	c, err := New(back, cfg)
	require.NoError(t, err)
	var once sync.Once
	s := &stalledOrder{c: c, back: back, want: make([]byte, orderDevSize), letGo: func() {
		back.stall.Store(false)
		once.Do(func() { close(back.resume) })
	}}
	t.Cleanup(func() {
		s.letGo()
		c.Close()
	})
	return s
}

func (s *stalledOrder) write(block int, id int64) error {
	p := s.want[block*blockSize : (block+1)*blockSize]
	stamp(p, block*blockSize/sector, id)
	_, err := s.c.WriteAt(p, int64(block)*blockSize)
	return err
}

// TestOrderWriteBackLetsTheLineGo: while a closed epoch's blocks are being written back, a client
// write to another block of their line goes on without waiting for the backend; one over a block
// being written back waits for it, and the backend ends with the newest data of both.
func TestOrderWriteBackLetsTheLineGo(t *testing.T) {
	s := newStalledOrder(t, nil, nil)
	c, back, write, letGo, want := s.c, s.back, s.write, s.letGo, s.want
	const line = 4 // blocks 4 to 7 with 16 KiB lines
	require.NoError(t, write(line, 1))
	back.stall.Store(true)
	require.NoError(t, c.Flush()) // ends epoch 1, which the destager writes back at once
	<-back.waiting

	done := make(chan error, 1)
	go func() { done <- write(line+2, 2) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("a write to another block of a line being written back waits for the backend")
	}
	go func() { done <- write(line, 3) }() // over the block being written back: waits for it
	letGo()
	require.NoError(t, <-done)
	require.NoError(t, c.FlushAll(context.Background(), nil))
	require.Zero(t, c.Stats().Dirty.Lines)
	checkBackend(t, back.crashDev, want)
}

// TestOrderRotWhileWrittenBack: a dirty block that rots on the SSD tier once a write back of its
// closed epoch has read it, checked, while that write back holds no lock of its line, is not lost:
// the backend gets the good copy. A read meanwhile fails (the SSD's copy is bad, the backend's is
// not there yet); once the write back is done reads get the data from the backend, nothing was
// recorded lost, and the write back goes on with later epochs.
func TestOrderRotWhileWrittenBack(t *testing.T) {
	ssd := newCrashDev(stalledOrderSSD)
	s := newStalledOrder(t, ssd, nil)
	c, back, write, letGo, want := s.c, s.back, s.write, s.letGo, s.want
	const block = 4
	require.NoError(t, write(block, 1))
	back.stall.Store(true)
	require.NoError(t, c.Flush()) // ends epoch 1, which the destager reads and then writes back
	<-back.waiting
	damages[0].do(ssd)

	got := make([]byte, blockSize)
	_, err := c.ReadAt(got, block*blockSize)
	require.Error(t, err, "a read of the rotted block served its damaged bytes")
	require.NotErrorIs(t, err, ErrLost)
	letGo()
	require.NoError(t, c.FlushAll(context.Background(), nil))
	st := c.Stats()
	require.Zero(t, st.Lost.Blocks, "a block the write back had read before it rotted was recorded lost")
	require.Zero(t, st.Dirty.LostEpoch, "the write back halted for a block the backend has")
	_, err = c.ReadAt(got, block*blockSize)
	require.NoError(t, err)
	require.Equal(t, want[block*blockSize:(block+1)*blockSize], got)

	require.NoError(t, write(block+1, 2))
	require.NoError(t, c.Flush())
	require.NoError(t, c.FlushAll(context.Background(), nil))
	require.Zero(t, c.Stats().Dirty.Lines)
	checkBackend(t, back.crashDev, want)
}
