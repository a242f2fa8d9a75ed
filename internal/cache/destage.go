package cache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/pkg/backend"
)

// destageRun is a stretch of dirty blocks that are adjacent on the backend: one backend write, or
// one WRITE_ZEROES for a run of zero blocks on a backend that has it.
type destageRun struct {
	off    int64
	pieces []destagePiece
	zero   bool // a WRITE_ZEROES: every piece is zero blocks
}

type destagePiece struct {
	line   uint64
	slot   uint32
	lo, hi int64  // bytes within the line
	zero   bool   // zero blocks: not read from the slot
	data   []byte // a ghost's bytes (ghost.go): not read from the slot either
}

// destageLocked writes the dirty blocks of lines (in ascending order, all locked by the caller)
// back to the backend, coalescing adjacent blocks into large writes (writeRuns); it flushes the
// backend, and only then marks them clean: a line that gets a new write meanwhile is locked out,
// so it can never be marked clean with old data. Blocks that fail their checksums are never
// written back: dealt with when read (lost: damaged), they are dirty no more, and the rest is
// written back again.
func (c *Cache) destageLocked(lines []uint64) (int64, error) {
	return c.destageEpochLocked(lines, nil, false)
}

// destageEpochLocked is destageLocked for the dirty blocks of epoch *ep only (all of them if ep is
// nil): in FLUSH order (epoch.go) a line's blocks of later epochs stay dirty. With release, it lets
// go of the lines' locks while its writes to the backend are under way (destageOnce).
func (c *Cache) destageEpochLocked(lines []uint64, ep *uint64, release bool) (int64, error) {
	var total int64
	var last *damageError
	for {
		n, err := c.destageOnce(lines, ep, release)
		total += n
		d, ok := asDamage(err)
		// Each damaged block found leaves the dirty data (or is repaired), unless recording it
		// failed: the same damage again ends the destage.
		if !ok || last != nil && *d == *last {
			return total, err
		}
		last = d
	}
}

// destageOnce is destageEpochLocked's one pass. With release (a closed epoch *ep in FLUSH order:
// destageNextOrdered), it lets go of the lines' locks from when it knows what to write until the
// backend has it, so that clients' writes to the lines' other blocks do not wait for the backend.
// Nothing else changes the blocks it writes back meanwhile: they are dirty blocks of an epoch older
// than the open one, which no write overwrites (keepOverwritten keeps no ghost of them) and
// nothing sends to the backend (orderCheck) until their epoch is written back, which only this
// write back, the one under way (epochs.takers), ends. It marks clean only the blocks still of
// epoch *ep, and writes the epoch's ghosts of the lines (ghost.go) with them, then deletes those.
func (c *Cache) destageOnce(lines []uint64, ep *uint64, release bool) (bytes int64, err error) {
	type held struct {
		line        uint64
		slot        uint32 // noSlot: the line has only ghosts of the epoch
		dirty, zero lineBits
		ghosts      []ghost
	}
	var hs []held
	for _, line := range lines {
		h := held{line: line, slot: noSlot}
		if ep != nil && c.ssd.ep != nil {
			c.ssd.mu.RLock()
			h.ghosts = c.ssd.ep.ghostsOf(line, *ep)
			c.ssd.mu.RUnlock()
			if hasLost(h.ghosts) {
				// Its epoch lost a block (ghost.go): it can never be whole on the backend.
				for _, p := range hs {
					if p.slot != noSlot {
						c.ssd.unpin(p.slot)
					}
				}
				c.ssd.ep.lose(*ep)
				return 0, c.ssd.ep.haltedErr()
			}
		}
		if slot, d, z, ok := c.ssd.pinDirty(line, ep); ok {
			h.slot, h.dirty, h.zero = slot, d, z
		}
		if h.slot != noSlot || len(h.ghosts) > 0 {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return 0, nil
	}
	var rotted []unlockedBlocks // found damaged by others while the lines were let go (below)
	defer func() {
		for _, h := range hs {
			switch {
			case h.slot == noSlot:
			case err != nil:
				c.ssd.unpin(h.slot)
			default:
				c.ssd.clean(h.line, h.slot, h.dirty, ep)
			}
		}
		// Had they been damaged before this write back read them, it would have failed: so they
		// are on the backend, now clean blocks whose SSD copy is damaged; else dirty and lost.
		for _, u := range rotted {
			c.damaged(u.line, u.slot, u.rotted)
		}
	}()
	spans := make([]span, 0, len(hs))
	for _, h := range hs {
		if h.slot != noSlot {
			spans = append(spans, span{h.line, h.dirty})
		}
	}
	if err = c.ssd.j.dropStale(spans); err != nil {
		return 0, fmt.Errorf("destage: cache metadata: %w", err)
	}
	if err = c.ssd.j.settleClaims(spans); err != nil {
		return 0, fmt.Errorf("destage: settling the records of the blocks to write back: %w", err)
	}
	if err = c.ssd.j.syncInvalidations(); err != nil {
		return 0, fmt.Errorf("destage: cache metadata sync: %w", err)
	}
	var runs []destageRun
	var ps []destagePiece
	for _, h := range hs {
		start := int64(h.line) * c.line
		n := min(c.line, c.size-start)
		ps = ps[:0]
		h.dirty.Runs(int((n+blockSize-1)/blockSize), func(b0, b1 int) {
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, n)
			_ = zeroSpans(lo, hi, h.zero, func(lo, hi int64, z bool) error {
				ps = append(ps, destagePiece{line: h.line, slot: h.slot, lo: lo, hi: hi, zero: z})
				return nil
			})
		})
		if len(h.ghosts) > 0 {
			ps = append(ps, ghostPieces(h.line, h.ghosts, n)...)
			slices.SortFunc(ps, func(a, b destagePiece) int { return cmp.Compare(a.lo, b.lo) })
		}
		for _, p := range ps {
			// Zero blocks go as a WRITE_ZEROES of their own where the backend has one; else
			// they are written as zeros with the data around them.
			zero := p.zero && c.zero != nil
			if k := len(runs) - 1; k >= 0 && runs[k].end() == start+p.lo && runs[k].zero == zero &&
				runs[k].len()+(p.hi-p.lo) <= maxDestageWrite {
				runs[k].pieces = append(runs[k].pieces, p)
				continue
			}
			runs = append(runs, destageRun{off: start + p.lo, pieces: []destagePiece{p}, zero: zero})
		}
	}
	t0 := time.Now()
	if release {
		c.ssd.mu.Lock()
		for _, h := range hs {
			if h.slot != noSlot {
				c.ssd.ep.unlocked[h.slot] = &unlockedBlocks{line: h.line, slot: h.slot, bits: h.dirty}
			}
		}
		c.ssd.mu.Unlock()
		c.unlockLines(lines)
	}
	bytes, bad, err := c.writeRuns(runs)
	if err == nil {
		if err = c.b.Flush(); err != nil {
			c.wb.destageErrors.Add(1)
			err = fmt.Errorf("destage: backend flush: %w", err)
		}
	}
	if release {
		c.lockLines(lines)
		c.ssd.mu.Lock()
		for _, h := range hs {
			if h.slot == noSlot {
				continue
			}
			if u := c.ssd.ep.unlocked[h.slot]; !u.rotted.IsZero() {
				rotted = append(rotted, *u)
			}
			delete(c.ssd.ep.unlocked, h.slot)
		}
		c.ssd.mu.Unlock()
	}
	if err == nil && ep != nil {
		// Deleted durably before any later epoch can reach the backend, so that no restart
		// writes an older version over a newer one there (ghost.go).
		var ops []meta.Op
		for _, h := range hs {
			ops = append(ops, ghostOps(h.line, *ep, h.ghosts)...)
		}
		if len(ops) > 0 {
			if err = meta.CommitParts(c.ssd.j.store, ops, true, nil); err != nil {
				err = fmt.Errorf("destage: deleting the older versions written back: %w", err)
				// As for any failed commit: the tier is bypassed until the store passes a
				// probe. Retried alone, this would hold back every later epoch, and writers
				// waiting for room, for as long as the store fails.
				c.ssd.fail(err.Error())
			} else {
				c.ssd.mu.Lock()
				for _, h := range hs {
					c.ssd.ep.dropGhosts(h.line, *ep)
				}
				c.ssd.mu.Unlock()
			}
		}
	}
	for _, r := range bad {
		// Counted as any error of the tier's device: a dirty line the destager cannot read
		// keeps its dirty data from leaving, and a device that keeps failing is bypassed, so
		// that writes waiting for room go on to the backend (admitDirty) rather than wait.
		c.ssd.ioError(r.line, r.slot, r.err)
	}
	if err != nil {
		return 0, err
	}

	if blocks := bytes / blockSize; blocks > 0 {
		per := int64(time.Since(t0)) / blocks
		old := c.wb.blockTime.Load()
		c.wb.blockTime.Store(old + (per-old)/8)
	}
	c.wb.destagedBytes.Add(uint64(bytes))
	return bytes, nil
}

// writeRuns writes runs to the backend, each holding its share of the cache's destageBudget while
// it is under way, and returns the bytes written by the time the first error stopped it, and the
// SSD tier's failed reads (for the caller to deal with under the lines' locks). The runs go
// together: on a disk behind a network or a queue, a write costs its latency more than its size,
// and the scattered blocks of random writes make many small runs.
func (c *Cache) writeRuns(runs []destageRun) (int64, []*tierReadError, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // guards bytes, first and bad, which the writes' goroutines update
		bytes int64
		first error
		bad   []*tierReadError
	)
	for _, r := range runs {
		w := destageWeight(r.len())
		_ = c.destageBudget.Acquire(context.Background(), w) // never fails: no deadline
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			c.destageBudget.Release(w)
			break
		}
		wg.Add(1)
		c.runners.run(func() {
			defer wg.Done()
			err := c.writeRun(r)
			c.destageBudget.Release(w)
			mu.Lock()
			defer mu.Unlock()
			var re *tierReadError
			if errors.As(err, &re) {
				bad = append(bad, re)
			}
			if err == nil {
				bytes += r.len()
			} else if first == nil {
				first = err
			}
		})
	}
	wg.Wait()
	return bytes, bad, first
}

// tierReadError is a write back's failed read of the SSD tier's line in slot.
type tierReadError struct {
	line uint64
	slot uint32
	err  error
}

func (e *tierReadError) Error() string { return "SSD tier read: " + e.err.Error() }
func (e *tierReadError) Unwrap() error { return e.err }

// destageWeight is what a write back of n bytes takes of destageBudget: its bytes, and at least
// the budget's share of one of destageWritesInFlight writes, which bounds the small ones' number.
func destageWeight(n int64) int64 {
	return max(n, destageBytesInFlight/destageWritesInFlight)
}

// writeRun reads a run's pieces from their slots and writes them to the backend as one write; a
// run of zero blocks is one WRITE_ZEROES, or a write of zeros where the backend turns that down.
func (c *Cache) writeRun(r destageRun) error {
	if r.zero {
		// Not unmapped: the client's WRITE_ZEROES may have asked to keep the blocks allocated,
		// which the zero bit does not record.
		err := c.zero.WriteZeroes(r.off, r.len(), false)
		if !errors.Is(err, backend.ErrNotSupported) {
			c.backendStats.write(0, err)
			if err != nil {
				c.wb.destageErrors.Add(1)
				return fmt.Errorf("destage at offset %d: write zeroes: %w", r.off, err)
			}
			c.wb.destageWrites.Add(1)
			return nil
		}
	}
	bufp := bufpool.Get(int(r.len()))
	defer bufpool.Put(bufp)
	buf := *bufp
	pos := int64(0)
	for _, p := range r.pieces {
		if p.zero || p.data != nil {
			clear(buf[pos : pos+p.hi-p.lo])
			copy(buf[pos:pos+p.hi-p.lo], p.data)
			pos += p.hi - p.lo
			continue
		}
		if err := c.ssd.st.read(p.line, p.slot, buf[pos:pos+p.hi-p.lo], p.lo, true); err != nil {
			c.wb.destageErrors.Add(1)
			return fmt.Errorf("destage at offset %d: %w", r.off, &tierReadError{p.line, p.slot, err})
		}
		pos += p.hi - p.lo
	}
	_, err := c.b.WriteAt(buf, r.off)
	c.backendStats.write(len(buf), err)
	if err != nil {
		c.wb.destageErrors.Add(1)
		return fmt.Errorf("destage at offset %d: %w", r.off, err)
	}
	c.wb.destageWrites.Add(1)
	return nil
}

// How the destager goes: while it only tidies up, in batches of destageBatch bytes, so that a
// foreground write to a line being written back waits little and read misses find the backend
// free; when it is urgent (dirty data nears its maximum, a flush drains it), in batches of
// destageBatchUrgent bytes, which drain a burst through a smaller SSD tier at nearly twice the
// speed (bench writeback's burst row). Either way its writes are of at most maxDestageWrite; the
// writes back of every caller together hold at most destageBytesInFlight (their buffers are the
// daemon's memory: MemoryPlan) in at most destageWritesInFlight writes, so that one large write
// goes alone and the small ones of scattered dirty blocks go many at a time.
const (
	destageBatch          = 1 << 20
	destageBatchUrgent    = 16 << 20
	maxDestageWrite       = 4 << 20
	destageBytesInFlight  = maxDestageWrite
	destageWritesInFlight = 32
)

func (r destageRun) len() int64 {
	var n int64
	for _, p := range r.pieces {
		n += p.hi - p.lo
	}
	return n
}

func (r destageRun) end() int64 { return r.off + r.len() }

// destageNext writes back the dirty lines in the window at or after *cursor, moving the cursor
// past it (back to 0 at the end): adjacent line numbers, locked together, destageBatch bytes of
// them or destageBatchUrgent when urgent. It reports the bytes written and whether there was
// anything.
func (c *Cache) destageNext(cursor *uint64, urgent bool) (int64, bool, error) {
	batch := int64(destageBatch)
	if urgent {
		batch = destageBatchUrgent
	}
	window := uint64(max(1, batch/c.line))
	c.ssd.mu.Lock()
	lines := c.ssd.dirtyWindowLocked(cursor, window)
	c.ssd.mu.Unlock()
	if len(lines) == 0 {
		return 0, false, nil
	}
	lo, hi := lines[0], lines[len(lines)-1]
	c.locks.Lock(lo, hi)
	defer c.locks.Unlock(lo, hi)
	n, err := c.destageLocked(lines)
	return n, true, err
}

// dirtyWindowLocked returns the dirty lines at or after *cursor (from the start once past the
// last), from the first of them up to window lines on, and moves the cursor past them.
func (t *tier) dirtyWindowLocked(cursor *uint64, window uint64) []uint64 {
	first, ok := t.dset.Next(*cursor)
	if !ok && *cursor > 0 {
		first, ok = t.dset.Next(0)
	}
	var lines []uint64
	for l := first; ok && l < first+window; {
		lines = append(lines, l)
		l, ok = t.dset.Next(l + 1)
	}
	if len(lines) > 0 {
		*cursor = lines[len(lines)-1] + 1
	}
	return lines
}

// destageDoomed writes back lines (ascending) that the eviction policy chose while they were
// dirty. Until then they keep their slots, out of the policy's reach: once they hold the slots the
// tier keeps in reserve, its slots are full and its policy has nothing to evict, and the tier admits
// no new line at all (below the high watermark, with clients busy, nothing else writes them back).
func (c *Cache) destageDoomed(lines []uint64) error {
	c.lockLines(lines)
	defer c.unlockLines(lines)
	_, err := c.destageLocked(lines)
	return err
}

// destageTouched writes back the dirty blocks of the lines a non-write-back change touches (the
// caller holds their locks), so that the change never loses the part of a dirty block it does not
// cover, and the backend's copy is whole before the cache lets go of it.
func (c *Cache) destageTouched(pieces []piece) error {
	if c.ssd == nil || c.ssd.dirtyCount.Load() == 0 {
		return nil
	}
	var lines []uint64
	for _, s := range pieces {
		if _, d := c.ssd.bits(s.line); !d.IsZero() {
			lines = append(lines, s.line)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	_, err := c.destageLocked(lines)
	return err
}

// destager writes dirty data back in the background, as its policy says, with backoff while the
// backend fails.
func (c *Cache) destager(stop <-chan struct{}) {
	w := c.wb
	var cursor uint64
	backoff := time.Duration(0)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for tickOrKick(stop, tick.C, w.kickCh) {
		w.destaged.Sample(time.Now(), w.destagedBytes.Load())
		if w.waiting.Load() > 0 {
			// Dirty lines also go without the destager (a write or trim through another mode
			// writes them back first): waiting writes must see that even with nothing to destage.
			w.wake()
		}
		for {
			st := c.destageState()
			var doomed []uint64
			if !w.destage.Run(st) && !c.closedEpochsPending() {
				// Not the policy's choice: doomed lines are written back whatever the watermarks.
				// (When the policy runs, its large address-order batches take them along.)
				if doomed = c.ssd.doomedLines(int(destageBatchUrgent / c.line)); len(doomed) == 0 {
					break
				}
			}
			t0 := time.Now()
			var any bool
			var err error
			switch {
			case c.ordered():
				// Doomed lines too leave in their epoch's turn, urgently.
				w.running.Store(true)
				_, any, err = c.destageNextOrdered(&cursor, len(doomed) > 0 || w.destage.Urgent(st))
			case len(doomed) > 0:
				any, err = true, c.destageDoomed(doomed)
			default:
				w.running.Store(true)
				_, any, err = c.destageNext(&cursor, w.destage.Urgent(st))
			}
			w.wake()
			w.destaged.Sample(time.Now(), w.destagedBytes.Load())
			if err != nil {
				select {
				case <-stop:
					return // Close failed it: nothing to retry
				default:
				}
				backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
				c.log.Warn("destage failed; retrying", "in", backoff, "err", err)
				if !sleepOrStop(stop, backoff) {
					return
				}
				continue
			}
			backoff = 0
			if !any {
				break
			}
			if !w.destage.Urgent(st) && !sleepOrStop(stop, time.Since(t0)) {
				return // leave the backend to clients half of the time
			}
			select {
			case <-stop:
				return
			default:
			}
		}
		w.running.Store(false)
	}
}

func (c *Cache) destageState() policy.DestageState {
	w := c.wb
	return policy.DestageState{
		Ratio:      c.ratio(),
		Running:    w.running.Load(),
		Idle:       time.Duration(time.Now().UnixNano() - w.lastIO.Load()),
		Draining:   c.Mode() != WriteBack,
		Waiting:    w.waiting.Load() > 0,
		Watermarks: w.cfg.watermarks(),
	}
}

func (c *Cache) dirtyStats() DirtyStats {
	if c.wb == nil {
		return DirtyStats{}
	}
	w := c.wb
	c.ssd.mu.Lock()
	lines, blocks := c.ssd.dirtyLines, c.ssd.dirtyBlocks
	var pending int
	var oldest uint64
	var behind float64
	var lost uint64
	var ghosts int
	var ghostBytes int64
	if ep := c.ssd.ep; ep != nil {
		lost = ep.broken.Load()
		for _, gs := range ep.ghosts {
			ghosts += len(gs)
		}
		ghostBytes = ep.ghostBytes
		if len(ep.pending) > 0 {
			pending, oldest, behind = len(ep.pending), ep.pending[0].epoch, time.Since(ep.pending[0].since).Seconds()
		}
	}
	c.ssd.mu.Unlock()
	return DirtyStats{
		Order: w.cfg.Order, PendingEpochs: pending, OldestEpoch: oldest, BackendBehind: behind, LostEpoch: lost,
		Ghosts: ghosts, GhostBytes: ghostBytes, GhostsKept: w.ghosts.Load(),
		Lines: uint64(lines), Bytes: uint64(blocks) * blockSize, Ratio: float64(lines) / float64(w.lines),
		High: w.cfg.High, Low: w.cfg.Low, Max: w.cfg.Max,
		Destaging: w.running.Load(), DestagedBytes: w.destagedBytes.Load(), DestageWrites: w.destageWrites.Load(),
		DestageErrors: w.destageErrors.Load(), DestageRate: w.destaged.Rate(time.Now(), w.destagedBytes.Load()),
		ThrottledWrites: w.throttled.Load(), ThrottleSeconds: float64(w.throttleNs.Load()) / 1e9,
		ThrottleDelay: c.throttleDelay(c.ssd.blocks).Seconds(), BackendWaits: w.backendWaits.Load(),
	}
}
