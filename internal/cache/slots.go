package cache

import (
	"slices"

	"github.com/tierblk/tierblk/internal/policy"
)

// grant is what acquiring or looking up a line gave: its pinned slot, the blocks it held and which
// of those are zero blocks (not in the slot), if ok.
type grant struct {
	slot  uint32
	valid lineBits
	zero  lineBits
	ok    bool
}

// acquire returns the pinned slot of line, inserting the line (with no valid block) if it is not
// cached. It fails when no slot is free right now: a persistent tier's evicted slots become free
// only after a checkpoint, which acquire then asks for.
func (t *tier) acquire(line uint64) grant {
	var g [1]grant
	t.acquireLines([]uint64{line}, g[:])
	return g[0]
}

// acquireLines is acquire for the lines of one request (ascending), under one hold of the mutex,
// putting each line's grant in out. The lines it inserts take adjacent slots where the tier has
// them (a run of fresh slots, or freed ones in ascending order), so that a later read of those
// lines is one request to the device (readHits; bench cache --parts hits, 1M reads).
func (t *tier) acquireLines(lines []uint64, out []grant) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applyHitsLocked() // the policy chooses its victims knowing the latest hits
	var buf [16]uint32
	run := t.takeRunLocked(lines, buf[:0])
	for i, line := range lines {
		out[i] = t.acquireLocked(line, &run)
	}
	for i := len(run) - 1; i >= 0; i-- { // unused: the lowest is taken first again
		t.free = append(t.free, run[i])
	}
	if t.j != nil && t.freeSlots() < t.j.reserve/2 {
		t.j.askCheckpoint()
	}
}

// takeRunLocked takes the free slots that the uncached ones of lines will need, in ascending
// order: fresh ones if there are enough, else freed ones first. None for fewer than two lines.
func (t *tier) takeRunLocked(lines []uint64, run []uint32) []uint32 {
	n := 0
	for _, line := range lines {
		if _, ok := t.slotOf(line); !ok {
			n++
		}
	}
	if n = min(n, t.freeSlots()); n < 2 || t.failed.Load() {
		return run
	}
	if t.slots-t.fresh < n {
		k := min(n, len(t.free))
		for i := len(t.free) - 1; i >= len(t.free)-k; i-- {
			run = append(run, t.free[i])
		}
		t.free = t.free[:len(t.free)-k]
	}
	for len(run) < n {
		run = append(run, uint32(t.fresh))
		t.fresh++
	}
	slices.Sort(run)
	return run
}

// acquireLocked is acquire with the mutex held, taking a new line's slot from run first.
func (t *tier) acquireLocked(line uint64, run *[]uint32) grant {
	if slot, ok := t.slotOf(line); ok {
		t.pins[slot]++
		return grant{slot: slot, valid: t.valid.Get(slot), zero: t.zeroAt(slot), ok: true}
	}
	free := func() int { return t.freeSlots() + len(*run) }
	if t.failed.Load() {
		return grant{} // bypassed: a write in flight when it failed must not refill it
	}
	if free() == 0 && t.evict.Len() < t.evict.Capacity() {
		// Nothing to evict: the free slots wait for a checkpoint.
		if t.j != nil {
			t.j.askCheckpoint()
		}
		return grant{}
	}
	t.victims = t.victims[:0]
	t.evict.Insert(policy.Key(line))
	t.dropVictimsLocked()
	if free() == 0 {
		// The evicted slots are pinned by I/O or wait for a checkpoint: do not cache the line now.
		t.evict.Remove(policy.Key(line))
		if t.j != nil {
			t.j.askCheckpoint()
		}
		return grant{}
	}
	var slot uint32
	if len(*run) > 0 {
		slot, *run = (*run)[0], (*run)[1:]
	} else {
		slot = t.takeFreeLocked()
	}
	t.index.Put(line, int32(slot))
	t.setLocked(line, slot, lineBits{}, lineBits{}, lineBits{})
	t.pins[slot]++
	t.promotions.Add(1)
	return grant{slot: slot, ok: true}
}

// takeFreeLocked takes a free slot, the last released first; the caller knows there is one.
func (t *tier) takeFreeLocked() uint32 {
	if n := len(t.free); n > 0 {
		slot := t.free[n-1]
		t.free = t.free[:n-1]
		return slot
	}
	t.fresh++
	return uint32(t.fresh - 1)
}

func (t *tier) slotOf(line uint64) (uint32, bool) {
	s, ok := t.index.Get(line)
	return uint32(s), ok
}

func (t *tier) freeSlots() int { return len(t.free) + t.slots - t.fresh }

// dropVictimsLocked drops the lines the policy just evicted, but for dirty ones: those are doomed,
// and leave when the destager has written them back.
func (t *tier) dropVictimsLocked() {
	for _, v := range t.victims {
		if slot, ok := t.slotOf(v); ok && !t.dirtyAt(slot).IsZero() {
			t.doomed[v] = true
			if t.doomedWake != nil {
				t.doomedWake()
			}
			continue
		}
		t.evictions.Add(1)
		t.dropLocked(v)
	}
}

// doomedLines returns up to n doomed lines, in ascending order. A doomed line that became clean
// without the destager (its dirty blocks trimmed or overwritten through another mode) goes now.
func (t *tier) doomedLines(n int) []uint64 {
	t.mu.Lock()
	lines := make([]uint64, 0, min(n, len(t.doomed)))
	for l := range t.doomed {
		slot, ok := t.slotOf(l)
		switch {
		case !ok:
			delete(t.doomed, l)
		case t.dirtyAt(slot).IsZero():
			t.evictions.Add(1)
			t.dropLocked(l)
		default:
			lines = append(lines, l)
		}
	}
	t.mu.Unlock()
	slices.Sort(lines)
	return lines[:min(n, len(lines))]
}

// setLocked sets the valid, dirty and zero bits of line's slot, keeping the block counts and the
// set of dirty lines. Dirty and zero are subsets of valid.
func (t *tier) setLocked(line uint64, slot uint32, valid, dirty, zero lineBits) {
	if t.pins[slot] == 0 {
		// Blocks that were stored and are not now (invalidated, or zeros now): a packed tier's
		// units of them die. A pinned slot keeps them until its last unpin, for the reads that
		// found them.
		had := t.valid.Get(slot).AndNot(t.zeroAt(slot))
		t.st.dropBlocksLocked(slot, had.AndNot(valid.AndNot(zero)))
	}
	t.setBitsLocked(line, slot, valid, dirty, zero)
}

// setBitsLocked is setLocked leaving a packed tier's units as they are (a line set aside keeps
// them for its return).
func (t *tier) setBitsLocked(line uint64, slot uint32, valid, dirty, zero lineBits) {
	t.validBlocks += valid.Count() - t.valid.Get(slot).Count()
	t.valid.Set(slot, valid)
	if t.dirty.IsNil() {
		return
	}
	t.zeroBlocks += zero.Count() - t.zero.Get(slot).Count()
	t.zero.Set(slot, zero)
	old := t.dirty.Get(slot)
	t.dirty.Set(slot, dirty)
	if len(t.snaps) > 0 {
		if gone := old.AndNot(dirty); !gone.IsZero() {
			for _, s := range t.snaps {
				s.cleaned(slot, gone)
			}
		}
	}
	if t.ep != nil {
		t.ep.update(line, slot, old, dirty)
	}
	t.dirtyBlocks += dirty.Count() - old.Count()
	switch {
	case old.IsZero() && !dirty.IsZero():
		t.dirtyLines++
		t.dset.Add(line)
	case !old.IsZero() && dirty.IsZero():
		t.dirtyLines--
		t.dset.Remove(line)
	}
	t.dirtyCount.Store(int64(t.dirtyLines))
}

// dropLocked forgets line (evicted or invalidated) and releases its slot. The policy has already
// let go of it.
func (t *tier) dropLocked(line uint64) {
	slot, ok := t.slotOf(line)
	if !ok {
		return
	}
	if t.j != nil {
		t.j.keepStoredLocked(line, slot)
	}
	t.index.Delete(line)
	t.setLocked(line, slot, lineBits{}, lineBits{}, lineBits{})
	if t.doomed != nil {
		delete(t.doomed, line)
	}
	if t.j != nil {
		t.j.record(deleteOp(line))
	}
	t.releaseWhenUnpinnedLocked(slot)
}

// releaseWhenUnpinnedLocked releases slot now, or at its last unpin if I/O is under way on it.
func (t *tier) releaseWhenUnpinnedLocked(slot uint32) {
	if t.pins[slot] > 0 {
		t.zombies[slot] = true
		return
	}
	t.releaseLocked(slot)
}

// setAsideLocked takes clean line out of the index of a bypassed SSD tier, keeping its slot and
// its records (in changed, and in the store) as they are. The policy has already let go of it.
func (t *tier) setAsideLocked(line uint64) {
	slot, ok := t.slotOf(line)
	if !ok {
		return
	}
	t.index.Delete(line)
	t.setBitsLocked(line, slot, lineBits{}, lineBits{}, lineBits{})
	delete(t.doomed, line)
	t.setAside[line] = slot
}

// releaseLocked returns a slot nobody uses. A persistent tier cannot reuse it before the deletion
// of its old record is committed: a crash would otherwise let that record find new data.
func (t *tier) releaseLocked(slot uint32) {
	t.st.releaseSlotLocked(slot)
	if t.j != nil {
		t.j.freeAfterCommit = append(t.j.freeAfterCommit, slot)
		return
	}
	t.free = append(t.free, slot)
}

// noRoom gives up storing data of line in slot on a packed tier short of room (errNoRoom): a line
// left with no valid block (a fill under way) goes.
func (t *tier) noRoom(line uint64, slot uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.slotOf(line); ok && s == slot && t.valid.Get(slot).IsZero() {
		t.evict.Remove(policy.Key(line))
		t.dropLocked(line)
	}
	t.unpinLocked(slot)
}

// unpin ends I/O on slot.
func (t *tier) unpin(slot uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unpinLocked(slot)
}

func (t *tier) unpinLocked(slot uint32) {
	if t.pins[slot]--; t.pins[slot] > 0 {
		return
	}
	t.st.unpinnedLocked(slot)
	if t.zombies[slot] {
		delete(t.zombies, slot)
		t.releaseLocked(slot)
	}
}

// acquirePieces acquires in t the lines of pieces[i] for each i of which (ascending) as one run
// (tier.acquireLines), appending their grants to grants.
func (c *Cache) acquirePieces(t *tier, pieces []piece, which []int, grants []grant) []grant {
	if len(which) == 0 {
		return grants
	}
	var lineBuf [2]uint64
	lines := lineBuf[:0]
	for _, i := range which {
		lines = append(lines, pieces[i].line)
	}
	grants = slices.Grow(grants, len(lines))[:len(grants)+len(lines)]
	t.acquireLines(lines, grants[len(grants)-len(lines):])
	return grants
}
