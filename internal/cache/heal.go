package cache

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
)

// scheduleHeal plans the first attempt to bring a just-bypassed tier back and returns its delay.
func (j *journal) scheduleHeal() time.Duration {
	j.healMu.Lock()
	defer j.healMu.Unlock()
	if j.healDelay == 0 || time.Since(j.healedAt) > stableAfter {
		j.healDelay = j.healFirst
	}
	j.nextHeal = time.Now().Add(j.healDelay)
	return j.healDelay
}

// healFailed plans the next attempt after a failed one.
func (j *journal) healFailed() {
	j.healMu.Lock()
	defer j.healMu.Unlock()
	j.healDelay = min(2*j.healDelay, maxHealDelay)
	j.nextHeal = time.Now().Add(j.healDelay)
}

func (j *journal) healAt() time.Time {
	j.healMu.Lock()
	defer j.healMu.Unlock()
	return j.nextHeal
}

// heal brings a bypassed tier back into service once its storage and metadata work again: a probe
// of the SSD (a write read back, a flush), then a checkpoint, which commits what the bypass left
// queued; then the lines set aside come back as their stored records have them. Those records are
// what the tier held when it was bypassed: a change to a set-aside line deleted its record before
// the change reached the backend (invalidateDurably), and while the checkpoint and this reading
// hold checkpointMu and commitMu nothing else commits. A set-aside line whose record is gone is
// dropped.
func (j *journal) heal() error {
	t := j.t
	j.checkpointMu.Lock()
	defer j.checkpointMu.Unlock()
	if !t.failed.Load() {
		return nil
	}
	if err := j.probe(); err != nil {
		return err
	}
	if backendErr, tierErr := j.checkpointLocked(); tierErr != nil || backendErr != nil {
		return errors.Join(tierErr, backendErr)
	}
	j.commitMu.Lock()
	defer j.commitMu.Unlock()
	t.mu.Lock()
	want := maps.Clone(t.setAside)
	t.mu.Unlock()
	found := make(map[uint64]meta.Line, len(want))
	if err := j.store.Lines(func(r meta.Line) error {
		if slot, ok := want[r.Line]; ok && slot == r.Slot {
			found[r.Line] = r
		}
		return nil
	}); err != nil {
		return fmt.Errorf("reading the metadata: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := slices.Sorted(maps.Keys(t.setAside))
	back := 0
	for _, line := range lines {
		slot := t.setAside[line]
		delete(t.setAside, line)
		r, ok := found[line]
		v, d, z := linebits.FromWords(r.Valid), linebits.FromWords(r.Dirty), linebits.FromWords(r.Zero)
		if !ok || v.IsZero() || d.AndNot(v) != (lineBits{}) || z.AndNot(v) != (lineBits{}) {
			j.record(deleteOp(line))
			t.releaseWhenUnpinnedLocked(slot)
			continue
		}
		t.index.Put(line, int32(slot))
		t.setLocked(line, slot, v, d, z)
		t.victims = t.victims[:0]
		t.evict.Insert(policy.Key(line))
		t.dropVictimsLocked()
		back++
	}
	t.recentErrs.Store(0)
	t.heals.Add(1)
	t.failed.Store(false)
	j.healMu.Lock()
	j.healedAt = time.Now()
	j.healMu.Unlock()
	was := ""
	if r := t.reason.Swap(nil); r != nil {
		was = *r
	}
	t.log.Info("cache tier back in service", "tier", t.name, "lines", back, "bypassed_for", was)
	return nil
}

// probe checks that the SSD takes a write (to a free slot, when there is one), reads it back and
// flushes, and that the metadata store syncs.
func (j *journal) probe() error {
	t := j.t
	t.mu.Lock()
	slot, free := uint32(0), t.freeSlots() > 0
	if free {
		slot = t.takeFreeLocked()
	}
	t.mu.Unlock()
	if free {
		err := probeSlot(t, slot)
		t.mu.Lock()
		t.free = append(t.free, slot)
		t.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if err := t.dev.Flush(); err != nil {
		return fmt.Errorf("flush of the SSD tier: %w", err)
	}
	if err := j.store.Sync(); err != nil {
		return fmt.Errorf("metadata sync: %w", err)
	}
	return nil
}

// probeSlot writes a pattern where no line's data is (a slot nobody uses; free room on a packed
// tier, whose slots are not places) and reads it back.
func probeSlot(t *tier, slot uint32) error {
	buf := bufpool.Aligned(2 * blockSize)
	w, r := buf[:blockSize], buf[blockSize:]
	for i := range w {
		w[i] = byte(i*7 + int(slot))
	}
	if err := t.st.probe(slot, w, r); err != nil {
		return err
	}
	if !bytes.Equal(w, r) {
		return errors.New("probe of the SSD tier: a block read back differs from what was written")
	}
	return nil
}
