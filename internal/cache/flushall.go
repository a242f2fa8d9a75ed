package cache

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tierblk/tierblk/pkg/backend"
)

// FlushAll writes back the dirty data the cache holds when it is called and flushes the backend:
// when it returns nil, every write acknowledged before the call is durable on the backend (what
// `tierblk flush` promises). It ends whatever writers do meanwhile, since it never waits for the
// cache to become clean: it takes a snapshot of the dirty blocks at the start and writes back the
// lines that hold some of them, each once at most, with what the line holds then (blocks dirtied
// since go along, which still covers the snapshot). Snapshot blocks that something else writes back
// meanwhile (the destager, a write through another mode) need nothing more. progress, if not nil,
// is told the bytes of the snapshot on the backend so far and the snapshot's bytes, from
// (0, total) to (total, total).
func (c *Cache) FlushAll(ctx context.Context, progress func(done, total int64)) error {
	if c.closed.Load() {
		return errors.New("cache: closed")
	}
	if c.ordered() {
		if err := c.drainEpochs(ctx, progress); err != nil {
			return err
		}
		return c.flush(false)
	}
	if err := c.drainSnapshot(ctx, progress); err != nil {
		return err
	}
	// The snapshot's blocks are durable on the backend (destageLocked flushed it after each
	// batch); this makes the writes sent to the backend through other modes durable too.
	return c.flush(false)
}

// drainSnapshot writes back the SSD tier's dirty blocks of now, in address order, a window of
// destageBatchUrgent bytes of lines at a time with its writes under way together, as the
// destager does when urgent. Only the lines written back are locked, not the lines between them:
// writes to other lines go on.
func (c *Cache) drainSnapshot(ctx context.Context, progress func(done, total int64)) error {
	if c.ssd == nil || c.wb == nil {
		return nil
	}
	t := c.ssd
	s := t.snapshotDirty()
	defer t.dropSnap(s)
	total := int64(s.total) * blockSize
	report := func() {
		if progress != nil {
			progress(total-t.snapLeft(s)*blockSize, total)
		}
	}
	report()
	window := uint64(max(1, destageBatchUrgent/c.line))
	for pass := 0; t.snapLeft(s) > 0; pass++ {
		if pass > 0 {
			// Every block of the snapshot is dirty until it is written back (setLocked), and one
			// pass in address order meets every dirty line: a block left is a bug, reported
			// rather than chased.
			return fmt.Errorf("cache: flush: %d bytes of the dirty data of its start were not found dirty", t.snapLeft(s)*blockSize)
		}
		for cursor := uint64(0); ; {
			if err := ctx.Err(); err != nil {
				return err
			}
			lines, more := t.snapLines(s, &cursor, window)
			if len(lines) > 0 {
				c.lockLines(lines)
				_, err := c.destageLocked(t.stillInSnap(s, lines))
				c.unlockLines(lines)
				c.wb.wake()
				if err != nil {
					return err
				}
				report()
			}
			if !more {
				break
			}
		}
	}
	return nil
}

// dirtySnap is the dirty data of the SSD tier when a flush began, less what has been written back
// since: by slot (a dirty line keeps its slot until it is clean), the blocks dirty then and not
// marked clean since. A block marked clean is on the backend, flushed (tier.clean), or was written
// back before a change that went to the backend (destageTouched). Its table is a copy of the
// tier's dirty bits: a flush takes as much memory again as those, for as long as it runs.
type dirtySnap struct {
	pending     bitTable
	left, total int // blocks
}

// cleaned takes the blocks gone of slot, just marked clean, out of the snapshot.
func (s *dirtySnap) cleaned(slot uint32, gone lineBits) {
	p := s.pending.Get(slot)
	if x := p.And(gone); !x.IsZero() {
		s.pending.Set(slot, p.AndNot(gone))
		s.left -= x.Count()
	}
}

// snapshotDirty takes a snapshot of the tier's dirty blocks, kept up to date as they are marked
// clean until dropSnap.
func (t *tier) snapshotDirty() *dirtySnap {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &dirtySnap{left: t.dirtyBlocks, total: t.dirtyBlocks}
	if s.left == 0 {
		return s // nothing to track: not registered
	}
	s.pending = t.dirty.Clone()
	t.snaps = append(t.snaps, s)
	return s
}

func (t *tier) dropSnap(s *dirtySnap) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.snaps = slices.DeleteFunc(t.snaps, func(x *dirtySnap) bool { return x == s })
}

// snapLeft returns the blocks of the snapshot not yet written back.
func (t *tier) snapLeft(s *dirtySnap) int64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return int64(s.left)
}

// snapLines returns the lines at or after *cursor that hold blocks of the snapshot, from the first
// of them up to window lines on, and moves the cursor past them; more is false once it has passed
// the last dirty line. It looks at a bounded number of dirty lines per call (lines dirtied since
// the snapshot are skipped), so as not to hold the tier's mutex for long.
func (t *tier) snapLines(s *dirtySnap, cursor *uint64, window uint64) (lines []uint64, more bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var end uint64
	for budget := 4 * window; budget > 0; budget-- {
		l, ok := t.dset.Next(*cursor)
		if !ok || (len(lines) > 0 && l >= end) {
			return lines, ok
		}
		*cursor = l + 1
		if slot, ok := t.slotOf(l); ok && !s.pending.Get(slot).IsZero() {
			if len(lines) == 0 {
				end = l + window
			}
			lines = append(lines, l)
		}
	}
	return lines, true
}

// stillInSnap returns those of lines (locked by the caller) that still hold blocks of the
// snapshot: the others were written back meanwhile.
func (t *tier) stillInSnap(s *dirtySnap, lines []uint64) []uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.DeleteFunc(slices.Clone(lines), func(l uint64) bool {
		slot, ok := t.slotOf(l)
		return !ok || s.pending.Get(slot).IsZero()
	})
}

// SetMode switches the cache's mode. Leaving write-back, it first stops new dirty data: the switch
// waits for the write-back writes under way, and from then on writes go the new mode's way (one to
// a dirty line writes that line back first). Then it writes back the dirty data, all of which is
// in the snapshot it takes after the switch (FlushAll), so it ends whatever writers do. If ctx ends
// first, the cache stays in the new mode and the destager writes the rest back.
func (c *Cache) SetMode(ctx context.Context, m Mode, progress func(done, total int64)) error {
	if m == WriteBack && c.wb == nil {
		return errors.New("cache: write-back needs an SSD tier")
	}
	if c.wb != nil {
		c.wb.modeMu.Lock() // waits for the write-back writes under way (write)
	}
	old := Mode(c.mode.Swap(int32(m)))
	if c.wb != nil {
		c.wb.modeMu.Unlock()
	}
	c.log.Info("cache mode", "from", old, "to", m)
	if m == WriteBack || c.wb == nil {
		return nil
	}
	if old == WriteBack {
		c.wb.kick() // the destager drains too (Draining)
	}
	return c.FlushAll(ctx, progress)
}

// DirtyMark is the SSD tier's dirty data when it was taken (MarkDirty), less what has been written
// back since. A write-back replica (internal/replica) takes one to learn when the changes it holds
// are on the backend without making the cache write anything back: once Left is 0 and a Flush
// has returned after that, every write acknowledged before the mark is durable on the backend.
type DirtyMark struct {
	t *tier
	s *dirtySnap
}

// MarkDirty takes a DirtyMark. It holds a copy of the dirty bits until Drop.
func (c *Cache) MarkDirty() *DirtyMark {
	if c.ssd == nil || c.wb == nil {
		return &DirtyMark{}
	}
	return &DirtyMark{t: c.ssd, s: c.ssd.snapshotDirty()}
}

// Left returns the bytes of the mark's dirty data not yet written back.
func (m *DirtyMark) Left() int64 {
	if m.t == nil {
		return 0
	}
	return m.t.snapLeft(m.s) * blockSize
}

// FlushBackend flushes the backend alone: the writes the cache sent it (write-backs, writes around
// a full tier, trims) are durable there when it returns. Unlike Flush it starts no epoch and takes
// no checkpoint: a write-back replica calls it before it releases records, which must not split
// the clients' epochs.
func (c *Cache) FlushBackend() error {
	if c.closed.Load() {
		return backend.ErrClosed
	}
	return c.b.Flush()
}

// Drop lets the mark go: the tier stops keeping it up to date.
func (m *DirtyMark) Drop() {
	if m.t != nil {
		m.t.dropSnap(m.s)
	}
}

// Backend is the backend the cache is in front of. Writing it around the cache is for a cache that
// holds nothing and serves nothing yet (a take-over applying another primary's log, replica):
// anywhere else the cache's lines would go stale.
func (c *Cache) Backend() backend.Backend { return c.b }
