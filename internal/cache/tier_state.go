package cache

import (
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
)

// markValid marks bits of line valid (and dirty, for a write-back write) after its data was
// written to slot, and unpins the slot; of bits, those in zeros are zero blocks, not written
// (writeBlocks), the others hold their data in the slot. If the line was evicted meanwhile (it was
// clean: a dirty line is never evicted), nothing is marked and markValid reports false.
func (t *tier) markValid(line uint64, slot uint32, bits lineBits, dirty bool, zeros lineBits) (marked bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.unpinLocked(slot)
	if s, ok := t.slotOf(line); ok && s == slot {
		marked = true
		v, d, z := t.valid.Get(slot), t.dirtyAt(slot), t.zeroAt(slot)
		nv, nd, nz := v.Or(bits), d, z.AndNot(bits).Or(zeros.And(bits))
		if dirty {
			nd = d.Or(bits)
		}
		if nv == v && nd == d && nz == z {
			// Data rewritten in place under the same bits (a dirty block overwritten, say): the
			// record is what it was. Not queuing it spares a checkpoint, whose SSD flush would write
			// back a busy line's pages every second for nothing; a FLUSH still flushes the SSD.
			return marked
		}
		if t.j != nil {
			t.j.keepStoredLocked(line, slot)
		}
		t.setLocked(line, slot, nv, nd, nz)
		if t.j != nil {
			t.j.record(t.recordLocked(line, slot))
		}
	}
	return marked
}

// clean marks bits of line clean after the destager wrote them to the backend (and flushed it),
// and unpins the slot; only those still of epoch *ep if ep is not nil (a write back in FLUSH order
// that let go of the line's lock meanwhile: destageOnce). A doomed line left with nothing dirty
// goes.
func (t *tier) clean(line uint64, slot uint32, bits lineBits, ep *uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.slotOf(line); ok && s == slot {
		if ep != nil {
			bits = bits.And(t.ep.bitsOf(slot, *ep))
		}
		t.j.keepStoredLocked(line, slot)
		d := t.dirtyAt(slot).AndNot(bits)
		t.setLocked(line, slot, t.valid.Get(slot), d, t.zeroAt(slot))
		t.j.record(t.recordLocked(line, slot))
		if d.IsZero() && t.doomed[line] {
			t.evictions.Add(1)
			t.dropLocked(line)
		}
	}
	t.unpinLocked(slot)
}

// pinDirty returns line's slot, pinned, its dirty bits (of epoch *ep only, unless ep is nil) and
// its zero bits, if it has such dirty ones.
func (t *tier) pinDirty(line uint64, ep *uint64) (slot uint32, dirty, zero lineBits, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot, ok = t.slotOf(line); !ok {
		return 0, lineBits{}, lineBits{}, false
	}
	dirty = t.dirtyAt(slot)
	if ep != nil {
		dirty = dirty.And(t.ep.bitsOf(slot, *ep))
	}
	if dirty.IsZero() {
		return 0, lineBits{}, lineBits{}, false
	}
	t.pins[slot]++
	return slot, dirty, t.zeroAt(slot), true
}

// invalidateLocked clears bits of line; a line left with no valid block is dropped.
func (t *tier) invalidateLocked(line uint64, bits lineBits) (op meta.Op, changed bool) {
	slot, ok := t.slotOf(line)
	if !ok {
		return deleteOp(line), false
	}
	old := t.valid.Get(slot)
	v := old.AndNot(bits)
	if v == old {
		return t.recordLocked(line, slot), false
	}
	t.invalids.Add(1)
	if v.IsZero() {
		t.evict.Remove(policy.Key(line))
		t.dropLocked(line)
		return deleteOp(line), true
	}
	t.setLocked(line, slot, v, t.dirtyAt(slot).AndNot(bits), t.zeroAt(slot).AndNot(bits))
	return t.recordLocked(line, slot), true
}

// invalidate clears bits of line in a tier without persistence (RAM).
func (t *tier) invalidate(line uint64, bits lineBits) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.invalidateLocked(line, bits)
}

func (t *tier) recordLocked(line uint64, slot uint32) meta.Op {
	r := meta.Line{Line: line, Slot: slot, Valid: t.valid.Get(slot).Words(t.blocks)}
	if d := t.dirtyAt(slot); !d.IsZero() {
		r.Dirty = d.Words(t.blocks)
		if t.ep != nil {
			r.Epoch = t.ep.blockEpochs(slot, t.blocks)
		}
	}
	if z := t.zeroAt(slot); !z.IsZero() {
		r.Zero = z.Words(t.blocks)
	}
	stored := t.valid.Get(slot).AndNot(t.zeroAt(slot))
	r.Loc = t.st.unitsOf(slot, stored)
	if t.sums != nil && !stored.IsZero() {
		r.Sum = make([]uint32, t.blocks)
		sums := t.sumsOf(slot)
		for b := range sums {
			if stored.Has(b) {
				r.Sum[b] = sums[b].Load()
			}
		}
	}
	return meta.Op{Rec: r}
}
