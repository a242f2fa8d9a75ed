package cache

import (
	"fmt"
	"maps"
	"slices"

	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
)

// load rebuilds the tier's index from the store after a restart, with the records of logged (the
// last record of each line the run log holds, runlog.Replay) in place of the store's: the store's
// record of such a line is kept in stored, and the line in changed, for the checkpoint that the
// caller runs before anything else.
func (j *journal) load(logged map[uint64]meta.Op) error {
	t := j.t
	t.mu.Lock()
	defer t.mu.Unlock()
	l := &loader{j: j, t: t, used: make([]bool, t.slots)}
	if err := l.addStored(logged); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err := l.addLogged(logged); err != nil {
		return fmt.Errorf("%w: %w", errRunLogRecord, err)
	}
	if err := t.st.loadedLocked(j.stored); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	l.freeUnused()
	l.rebuildPolicy()
	if t.ep != nil {
		t.ep.loaded()
	}
	return nil
}

// loader is load's state while it takes in the records, under the tier's mu: the slots that the
// records taken so far claim, so that none is claimed twice (a packed tier's store keeps count of
// their units so, packed.claimUnits).
type loader struct {
	j    *journal
	t    *tier
	used []bool // the slots claimed so far
}

// addStored takes in the store's records, but for the lines the run log has a later record of
// (logged): the store's record of such a line is kept in stored, as what the store holds.
func (l *loader) addStored(logged map[uint64]meta.Op) error {
	return l.j.store.Lines(func(r meta.Line) error {
		if _, ok := logged[r.Line]; ok {
			l.j.stored[r.Line] = meta.Op{Rec: r}
			return nil
		}
		return l.add(r)
	})
}

// addLogged takes in the run log's records, in line order, each line in changed for the checkpoint
// that commits them; a line the store holds nothing of is stored as a deletion.
func (l *loader) addLogged(logged map[uint64]meta.Op) error {
	j := l.j
	for _, line := range slices.Sorted(maps.Keys(logged)) {
		op := logged[line]
		if _, ok := j.stored[line]; !ok {
			j.stored[line] = deleteOp(line)
		}
		j.changed[line] = op
		if op.Delete {
			continue
		}
		if err := l.add(op.Rec); err != nil {
			return err
		}
		j.logFixes(op.Rec)
	}
	return nil
}

// add checks record r against the tier and puts its line in the index, with its bits, sums and (on
// a packed tier) units.
func (l *loader) add(r meta.Line) error {
	t := l.t
	v, d, z, err := l.check(r)
	if err != nil {
		return err
	}
	if err := t.st.claimUnits(r, true); err != nil {
		return err
	}
	if err := l.loadSums(r, v.AndNot(z)); err != nil {
		return err
	}
	l.used[r.Slot] = true
	t.index.Put(r.Line, int32(r.Slot))
	t.setLocked(r.Line, r.Slot, v, d, z)
	if t.ep != nil && r.Epoch != nil {
		t.ep.retag(r.Slot, d, r.Epoch)
	}
	return nil
}

// check reports whether record r fits the tier: its slot free and in range, its line within the
// backend, and its dirty and zero bits within its valid bits, which fit a line. It returns the
// record's valid, dirty and zero bits.
func (l *loader) check(r meta.Line) (v, d, z lineBits, err error) {
	t := l.t
	if int(r.Slot) >= t.slots || l.used[r.Slot] {
		return v, d, z, fmt.Errorf("line %d: slot %d is out of range or used twice (%d slots)", r.Line, r.Slot, t.slots)
	}
	if t.lines > 0 && r.Line >= t.lines {
		return v, d, z, fmt.Errorf("line %d is beyond the backend's %d lines", r.Line, t.lines)
	}
	v = linebits.FromWords(r.Valid)
	if v.AndNot(linebits.Range(0, t.blocks)) != (lineBits{}) || v.IsZero() {
		return v, d, z, fmt.Errorf("line %d: valid bits %x do not fit a line of %d blocks", r.Line, r.Valid, t.blocks)
	}
	d = linebits.FromWords(r.Dirty)
	if d.AndNot(v) != (lineBits{}) {
		return v, d, z, fmt.Errorf("line %d: dirty bits %x outside the valid bits %x", r.Line, r.Dirty, r.Valid)
	}
	if !d.IsZero() && t.dirty.IsNil() {
		return v, d, z, fmt.Errorf("line %d has dirty data but this tier keeps none", r.Line)
	}
	z = linebits.FromWords(r.Zero)
	if z.AndNot(v) != (lineBits{}) {
		return v, d, z, fmt.Errorf("line %d: zero bits %x outside the valid bits %x", r.Line, r.Zero, r.Valid)
	}
	return v, d, z, nil
}

// loadSums puts the sums of record r's stored blocks (valid and not zero) in its slot.
func (l *loader) loadSums(r meta.Line, stored lineBits) error {
	t := l.t
	switch {
	case stored.IsZero():
	case r.Sum == nil:
		// A record from before checksums: its blocks' sums are what they hold (sumFix).
		for b := range t.blocks {
			if stored.Has(b) {
				l.j.fixes = append(l.j.fixes, sumFix{line: r.Line, b: b})
			}
		}
	case len(r.Sum) != t.blocks:
		return fmt.Errorf("line %d: %d checksums for a line of %d blocks", r.Line, len(r.Sum), t.blocks)
	default:
		sums := t.sumsOf(r.Slot)
		for b := range sums {
			sums[b].Store(r.Sum[b])
		}
	}
	return nil
}

// freeUnused lists the slots no record claimed as free, the lowest to be taken first.
func (l *loader) freeUnused() {
	t := l.t
	t.free, t.fresh = t.free[:0], t.slots
	for s := t.slots - 1; s >= 0; s-- {
		if !l.used[s] {
			t.free = append(t.free, uint32(s))
		}
	}
}

// rebuildPolicy rebuilds the policy in line order. Should the tier hold more lines than the
// policy's capacity (a larger reserve than the last run's), the policy evicts the excess as usual.
func (l *loader) rebuildPolicy() {
	t := l.t
	lines := make([]uint64, 0, t.index.Len())
	for line := range t.index.All() {
		lines = append(lines, line)
	}
	slices.Sort(lines)
	for _, line := range lines {
		t.victims = t.victims[:0]
		t.evict.Insert(policy.Key(line))
		t.dropVictimsLocked()
	}
}
