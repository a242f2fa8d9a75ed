package cache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/linebits"
)

// Write-back in FLUSH order (WriteBackConfig.Order = OrderFlush). The writes between two FLUSHes,
// or up to and including a FUA write, form an epoch. The backend must always hold a state a crash
// of the device could have left: every epoch before some epoch k whole, any subset of epoch k's
// writes, nothing later. So:
//
//   - every dirty block carries the epoch that was open when it became dirty (epochs);
//   - the destager writes back only the oldest epoch's blocks (destageNextOrdered), coalesced and
//     reordered within it, and flushes the backend before it marks them clean, so a later epoch's
//     writes never reach the backend before an earlier one is whole and durable there;
//   - a write over a dirty block of an older epoch keeps the block's bytes first, a ghost
//     (ghost.go), which that epoch's write back sends in its place;
//   - nothing else sends a client's change to the backend ahead of older epochs (a write around
//     a full tier, a trim, a write in another mode, a flush of everything, a write over a dirty
//     block that cannot keep a ghost): it lets go of its line locks and writes the older epochs
//     back itself, in order, as the destager does (orderWait, waitEpochs), then goes on;
//   - when the SSD tier is lost while it holds epochs the backend lacks, writes that would need them
//     on the backend first fail (errOrderLost): the backend stays a state the device had, older;
//   - so too when a dirty block of epoch k fails its checksum with no copy in the RAM tier (lost,
//     check.go): epoch k can never be whole on the backend, so no later epoch may follow it there
//     (epochs.broken). The block stays dirty, so that a restart finds the same again, until the
//     user accepts the loss by a restart in address order, which writes back the rest without it.

// epochs is an SSD tier's flush-order bookkeeping. cur is read and moved without the tier's mutex;
// the rest is guarded by tier.mu.
type epochs struct {
	cur atomic.Uint64 // the open epoch: blocks dirtied now join it
	// bySlot has, for each slot with dirty blocks, its line and those blocks by epoch, ascending.
	bySlot map[uint32]*slotEpochs
	// pending are the epochs that still have dirty blocks, ascending, with the lines that hold
	// them (lines may list a line twice, or one written back since: takers check).
	pending []pendingEpoch
	// broken is the oldest epoch that lost a dirty block (0: none): write back stops before it;
	// halted once every epoch before it is written back (for good: later ones are newer).
	broken atomic.Uint64
	halted atomic.Bool
	// takers lets one write back at a time take the oldest epoch's lines (destageNextOrdered): one
	// of a closed epoch lets go of its line locks while its writes are under way, and no other may
	// write back or clean those blocks meanwhile. Taken holding no line lock.
	takers sync.Mutex
	// unlocked holds, by slot, the blocks such a write back writes while it is under way, with
	// those of them that a check (damaged) found damaged meanwhile: the write back reads them
	// checked, so whether they are lost is for it to say once it knows what the backend got
	// (destageOnce: TestOrderRotWhileWrittenBack). Guarded by the tier's mutex.
	unlocked map[uint32]*unlockedBlocks
	// ghosts are the older versions of dirty blocks that writes replaced while their epochs were
	// pending (ghost.go), by line and epoch, each counted as a dirty block of its epoch in pending;
	// ghostBytes their bytes. Guarded by the tier's mutex.
	ghosts     map[lineEpoch][]ghost
	ghostBytes int64
}

// unlockedBlocks are the blocks of line that a write back of a closed epoch writes, holding no lock
// of the line, and those of them found damaged meanwhile.
type unlockedBlocks struct {
	line         uint64
	slot         uint32
	bits, rotted lineBits
}

type slotEpochs struct {
	line uint64
	list []epochBits
}

type epochBits struct {
	epoch uint64
	bits  lineBits
}

type pendingEpoch struct {
	epoch  uint64
	since  time.Time // its first dirty block's
	blocks int
	lines  []uint64
	sorted bool // lines is in ascending order, without repeats
}

func newEpochs() *epochs {
	e := &epochs{bySlot: map[uint32]*slotEpochs{}, unlocked: map[uint32]*unlockedBlocks{}, ghosts: map[lineEpoch][]ghost{}}
	e.cur.Store(1)
	return e
}

// next ends the open epoch (a FLUSH, a FUA write) and returns the one it ended.
func (e *epochs) next() uint64 { return e.cur.Add(1) - 1 }

// update follows a change of slot's dirty bits from old to now (tier.setBitsLocked): blocks no
// longer dirty leave their epochs, newly dirty ones join the open epoch.
func (e *epochs) update(line uint64, slot uint32, old, now lineBits) {
	if gone := old.AndNot(now); !gone.IsZero() {
		e.remove(slot, gone)
	}
	added := now.AndNot(old)
	if added.IsZero() {
		return
	}
	cur := e.cur.Load()
	se := e.bySlot[slot]
	if se == nil {
		se = &slotEpochs{line: line}
		e.bySlot[slot] = se
	}
	p := e.pendingOf(cur)
	if k := len(se.list) - 1; k >= 0 && se.list[k].epoch == cur {
		se.list[k].bits = se.list[k].bits.Or(added)
	} else {
		se.list = append(se.list, epochBits{cur, added})
		p.lines = append(p.lines, line)
		p.sorted = false
	}
	p.blocks += added.Count()
}

// pendingOf returns the pending entry of epoch ep, made if there is none (the open epoch's is the
// newest; a restart's load makes others in any order).
func (e *epochs) pendingOf(ep uint64) *pendingEpoch {
	if k := len(e.pending) - 1; k >= 0 && e.pending[k].epoch == ep {
		return &e.pending[k]
	}
	k, found := slices.BinarySearchFunc(e.pending, ep, func(p pendingEpoch, ep uint64) int { return cmp.Compare(p.epoch, ep) })
	if !found {
		e.pending = slices.Insert(e.pending, k, pendingEpoch{epoch: ep, since: time.Now(), sorted: true})
	}
	return &e.pending[k]
}

// retag gives slot's dirty blocks d the epochs its record kept (meta.Line.Epoch, one a block), in
// place of the open epoch update gave them as the record was loaded.
func (e *epochs) retag(slot uint32, d lineBits, eps []uint64) {
	se := e.bySlot[slot]
	if se == nil {
		return
	}
	line := se.line
	for b, ep := range eps {
		if ep == 0 || !d.Has(b) {
			continue
		}
		one := linebits.Range(b, b+1)
		e.remove(slot, one)
		se = e.bySlot[slot]
		if se == nil {
			se = &slotEpochs{line: line}
			e.bySlot[slot] = se
		}
		k, found := slices.BinarySearchFunc(se.list, ep, func(x epochBits, ep uint64) int { return cmp.Compare(x.epoch, ep) })
		p := e.pendingOf(ep)
		if found {
			se.list[k].bits = se.list[k].bits.Or(one)
		} else {
			se.list = slices.Insert(se.list, k, epochBits{ep, one})
			p.lines = append(p.lines, line)
			p.sorted = false
		}
		p.blocks++
	}
}

// loaded ends a restart's load: the open epoch follows every epoch the records kept.
func (e *epochs) loaded() {
	if k := len(e.pending) - 1; k >= 0 && e.pending[k].epoch >= e.cur.Load() {
		e.cur.Store(e.pending[k].epoch + 1)
	}
}

// remove takes bits of slot out of their epochs.
func (e *epochs) remove(slot uint32, bits lineBits) {
	se := e.bySlot[slot]
	if se == nil {
		return
	}
	for i := range se.list {
		x := se.list[i].bits.And(bits)
		if x.IsZero() {
			continue
		}
		se.list[i].bits = se.list[i].bits.AndNot(x)
		e.uncount(se.list[i].epoch, x.Count())
	}
	se.list = slices.DeleteFunc(se.list, func(b epochBits) bool { return b.bits.IsZero() })
	if len(se.list) == 0 {
		delete(e.bySlot, slot)
	}
	e.dropDone()
}

// uncount takes n blocks out of epoch ep's count; dropDone then lets go of the epochs left with
// none.
func (e *epochs) uncount(ep uint64, n int) {
	if k, ok := slices.BinarySearchFunc(e.pending, ep, func(p pendingEpoch, ep uint64) int {
		return cmp.Compare(p.epoch, ep)
	}); ok {
		e.pending[k].blocks -= n
	}
}

func (e *epochs) dropDone() {
	e.pending = slices.DeleteFunc(e.pending, func(p pendingEpoch) bool { return p.blocks == 0 })
}

// oldest returns the oldest epoch with dirty blocks.
func (e *epochs) oldest() (uint64, bool) {
	if len(e.pending) == 0 {
		return 0, false
	}
	return e.pending[0].epoch, true
}

// of returns the epoch of slot's dirty blocks in bits, oldest and newest (ok false: none dirty).
func (e *epochs) of(slot uint32, bits lineBits) (lo, hi uint64, ok bool) {
	se := e.bySlot[slot]
	if se == nil {
		return 0, 0, false
	}
	for _, b := range se.list {
		if b.bits.And(bits).IsZero() {
			continue
		}
		if !ok {
			lo, ok = b.epoch, true
		}
		hi = b.epoch
	}
	return lo, hi, ok
}

// blockEpochs returns the epoch of each of slot's blocks (of blocks), 0 for those not dirty: what
// its record keeps of them (meta.Line.Epoch).
func (e *epochs) blockEpochs(slot uint32, blocks int) []uint64 {
	eps := make([]uint64, blocks)
	if se := e.bySlot[slot]; se != nil {
		for _, b := range se.list {
			b.bits.Runs(blocks, func(b0, b1 int) {
				for i := b0; i < b1; i++ {
					eps[i] = b.epoch
				}
			})
		}
	}
	return eps
}

// bitsOf returns slot's dirty blocks of epoch ep.
func (e *epochs) bitsOf(slot uint32, ep uint64) lineBits {
	if se := e.bySlot[slot]; se != nil {
		for _, b := range se.list {
			if b.epoch == ep {
				return b.bits
			}
		}
	}
	return lineBits{}
}

// takeOldest returns the oldest epoch and up to window of its lines, the first ones in ascending
// order, however far apart (an epoch's random writes are, and each batch costs a backend flush),
// taking them out of the epoch's list (putBack returns them if their write back fails). While only one epoch is pending, the open one, which still grows, lines is nil:
// every dirty block is of that epoch, and the caller walks the tier's dirty set in address order
// as address order does (its list is only kept from growing).
func (e *epochs) takeOldest(window uint64) (ep uint64, lines []uint64, ok bool) {
	if len(e.pending) == 0 {
		return 0, nil, false
	}
	p := &e.pending[0]
	if len(e.pending) == 1 && !e.hasGhosts(p.epoch) {
		if len(p.lines) > 2*len(e.bySlot)+64 {
			p.lines = e.linesOf(p.epoch)
		}
		return p.epoch, nil, true
	}
	if !p.sorted {
		slices.Sort(p.lines)
		p.lines = slices.Compact(p.lines)
		p.sorted = true
	}
	if len(p.lines) == 0 {
		// Lines taken whose write back ended without an error yet left blocks of the epoch dirty
		// (a block dirtied again meanwhile can only join the open epoch): found again.
		p.lines = e.linesOf(p.epoch)
	}
	n := min(len(p.lines), int(window))
	lines = slices.Clone(p.lines[:n])
	p.lines = p.lines[n:]
	return p.epoch, lines, true
}

// linesOf returns the lines with dirty blocks (or ghosts) of epoch ep, ascending.
func (e *epochs) linesOf(ep uint64) []uint64 {
	var lines []uint64
	for _, se := range e.bySlot {
		for _, b := range se.list {
			if b.epoch == ep {
				lines = append(lines, se.line)
			}
		}
	}
	for k := range e.ghosts {
		if k.epoch == ep {
			lines = append(lines, k.line)
		}
	}
	slices.Sort(lines)
	return slices.Compact(lines)
}

// hasGhosts reports whether epoch ep has ghosts.
func (e *epochs) hasGhosts(ep uint64) bool {
	for k := range e.ghosts {
		if k.epoch == ep {
			return true
		}
	}
	return false
}

// putBack returns lines to epoch ep's list after their write back failed.
func (e *epochs) putBack(ep uint64, lines []uint64) {
	for i := range e.pending {
		if e.pending[i].epoch == ep {
			e.pending[i].lines = append(e.pending[i].lines, lines...)
			e.pending[i].sorted = false
			return
		}
	}
}

// orderWait is a change that must wait, without its line locks, until the epochs up to epoch are
// on the backend (waitEpochs), or with writeBack only until the write back under way has ended
// (epochs.takers), and then be tried again.
type orderWait struct {
	epoch     uint64
	writeBack bool
}

func (o *orderWait) Error() string { return "cache: waiting for older epochs to be written back" }

// errOrderLost: writes the backend lacks are lost (a dirty block failed its checksum, or the SSD
// tier failed holding them), so a change that would reach the backend after them is refused: in
// FLUSH order the backend keeps the state of the last epoch written back, which a crash of the
// device could have left. What was lost follows it in the error.
var errOrderLost = errors.New("cache: writes the backend lacks are lost; in flush order the backend keeps its older, consistent state and takes no later change")

// lose marks epoch ep as one that lost a dirty block (check.go's damaged): no epoch from it on
// is written back.
func (e *epochs) lose(ep uint64) {
	for {
		b := e.broken.Load()
		if b != 0 && b <= ep || e.broken.CompareAndSwap(b, ep) {
			return
		}
	}
}

// stopped returns the error for a write back of the epochs up to ep while oldest is the oldest
// pending one: nil unless an epoch among them lost a dirty block.
func (e *epochs) stopped(oldest, ep uint64) error {
	if b := e.broken.Load(); b != 0 && oldest >= b && oldest <= ep {
		e.halted.Store(true)
		return e.haltedErr()
	}
	return nil
}

func (e *epochs) haltedErr() error {
	return fmt.Errorf("%w: a dirty block of epoch %d failed its checksum with no other copy (restart with write_back.order: address to write back the rest without it)", errOrderLost, e.broken.Load())
}

// ordered reports whether the cache writes back in FLUSH order.
func (c *Cache) ordered() bool { return c.ssd != nil && c.ssd.ep != nil }

// orderCheck says whether a change to pieces may go on now (nil), or must wait (an *orderWait).
// The caller holds the pieces' line locks. A change that sends data to the backend (direct:
// around the tier, or in another mode) needs every epoch before the open one there; one that
// writes back the dirty blocks of its lines (destageTouched) needs every epoch before theirs. (A
// write-back write over dirty blocks of an older epoch keeps their older data: keepOverwritten.)
func (c *Cache) orderCheck(pieces []piece, direct bool) error {
	if !c.ordered() {
		return nil
	}
	t := c.ssd
	t.mu.RLock()
	defer t.mu.RUnlock()
	oldest, any := t.ep.oldest()
	if !any {
		return nil
	}
	need := uint64(0) // every epoch below need must be on the backend
	if direct {
		need = t.ep.cur.Load()
	}
	for _, s := range pieces {
		slot, ok := t.slotOf(s.line)
		if !ok {
			continue
		}
		if _, hi, ok := t.ep.of(slot, t.dirtyAt(slot)); ok {
			need = max(need, hi)
		}
	}
	if need > oldest {
		return &orderWait{epoch: need - 1}
	}
	return nil
}

// waitEpochs returns, holding no line lock, once the epochs up to ep are on the backend; it writes
// them back itself meanwhile, as the destager does when urgent (which it also makes the destager),
// so that it needs nothing else to run. It retries a write back that fails for up to backendWait,
// as writes that must reach the backend do (retryBackend), but fails at once when the SSD tier is
// bypassed (errOrderLost) or the cache closes.
func (c *Cache) waitEpochs(ep uint64) error { return c.waitEpochsCtx(context.Background(), ep, nil) }

// waitEpochsCtx is waitEpochs until ctx ends, telling progress, if not nil, after each window
// written back.
func (c *Cache) waitEpochsCtx(ctx context.Context, ep uint64, progress func()) error {
	t, w := c.ssd, c.wb
	w.waiting.Add(1)
	defer w.waiting.Add(-1)
	w.kick()
	var cursor uint64
	var failing time.Time // since when the write backs fail
	for backoff := 10 * time.Millisecond; ; {
		t.mu.RLock()
		oldest, any := t.ep.oldest()
		t.mu.RUnlock()
		if !any || oldest > ep {
			return nil
		}
		if err := t.ep.stopped(oldest, ep); err != nil {
			return err
		}
		if c.closed.Load() {
			return errors.New("cache: closed")
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		_, _, err := c.destageNextOrdered(&cursor, true)
		if progress != nil {
			progress()
		}
		switch {
		case err == nil:
			failing, backoff = time.Time{}, 10*time.Millisecond
			continue
		case !t.usable():
			return fmt.Errorf("%w: the SSD tier failed holding them: %w", errOrderLost, err)
		case failing.IsZero():
			failing = time.Now()
		case time.Since(failing) > backendWait:
			return err
		}
		w.backendWaits.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// drainEpochs is FlushAll's write back in FLUSH order: it ends the open epoch and waits for the
// destager to write back every epoch up to it, reporting progress as drainSnapshot does.
func (c *Cache) drainEpochs(ctx context.Context, progress func(done, total int64)) error {
	t := c.ssd
	ep := t.ep.next()
	left := func() int64 {
		t.mu.RLock()
		defer t.mu.RUnlock()
		var n int64
		for _, p := range t.ep.pending {
			if p.epoch <= ep {
				n += int64(p.blocks) * blockSize
			}
		}
		return n
	}
	total := left()
	report := func() {
		if progress != nil {
			progress(total-min(total, left()), total)
		}
	}
	report()
	if total == 0 {
		return nil
	}
	err := c.waitEpochsCtx(ctx, ep, report)
	report()
	return err
}

// waitIfOrdered looks at err, what a change under its line locks returned, once it let go of them:
// an *orderWait is waited for (waitEpochs, or the write back under way), and again reports that
// the change must be tried again; else err is the change's outcome, or the wait's failure. The
// callers loop on it rather than take the change as a closure, which would cost every write an
// allocation.
func (c *Cache) waitIfOrdered(err error) (again bool, _ error) {
	if err == nil {
		return false, nil
	}
	var ow *orderWait
	if !errors.As(err, &ow) {
		return false, err
	}
	if ow.writeBack {
		c.ssd.ep.takers.Lock()
		//lint:ignore SA2001 taking the lock is the wait: for the write back that holds it to end
		c.ssd.ep.takers.Unlock()
		return true, nil
	}
	if err := c.waitEpochs(ow.epoch); err != nil {
		return false, err
	}
	return true, nil
}

// closedEpochsPending reports whether, in FLUSH order, an epoch that a FLUSH has ended still has
// dirty blocks to write back (and may be written back): the destager then runs, whatever the
// watermarks say. Waiting would win nothing, as an epoch coalesces only within itself, and would
// cost: a write over a dirty block of an older epoch waits until every epoch up to it is on the
// backend, and the backend lags further behind the device.
func (c *Cache) closedEpochsPending() bool {
	if !c.ordered() {
		return false
	}
	t := c.ssd
	t.mu.RLock()
	defer t.mu.RUnlock()
	oldest, any := t.ep.oldest()
	return any && oldest < t.ep.cur.Load() && t.ep.stopped(oldest, oldest) == nil
}

// destageNextOrdered writes back the next window of the oldest epoch's dirty blocks (only those:
// a line's blocks of later epochs stay dirty), in address order. It reports the bytes written and
// whether there was anything.
func (c *Cache) destageNextOrdered(cursor *uint64, urgent bool) (int64, bool, error) {
	t := c.ssd
	batch := int64(destageBatch)
	if urgent {
		batch = destageBatchUrgent
	}
	window := uint64(max(1, batch/c.line))
	t.ep.takers.Lock()
	defer t.ep.takers.Unlock()
	t.mu.Lock()
	if oldest, any := t.ep.oldest(); any && t.ep.stopped(oldest, oldest) != nil {
		t.mu.Unlock()
		return 0, false, nil
	}
	ep, lines, ok := t.ep.takeOldest(window)
	if ok && lines == nil {
		lines = t.dirtyWindowLocked(cursor, window)
	}
	t.mu.Unlock()
	if !ok || len(lines) == 0 {
		return 0, ok, nil
	}
	c.lockLines(lines)
	defer c.unlockLines(lines)
	// A closed epoch's blocks stay as they are while it is written back (destageOnce); the open
	// one's may be written again at any time.
	n, err := c.destageEpochLocked(lines, &ep, ep < t.ep.cur.Load())
	if err != nil {
		t.mu.Lock()
		t.ep.putBack(ep, lines)
		t.mu.Unlock()
	}
	return n, true, err
}

// unlockedLocked returns the blocks of line in slot that a write back of a closed epoch writes
// holding no lock of the line, or nil. The caller holds t.mu.
func (t *tier) unlockedLocked(line uint64, slot uint32) *unlockedBlocks {
	if t.ep == nil {
		return nil
	}
	if u := t.ep.unlocked[slot]; u != nil && u.line == line {
		return u
	}
	return nil
}
