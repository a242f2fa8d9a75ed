package cache

import (
	"fmt"
	"time"

	"github.com/tierblk/tierblk/internal/policy"
)

// maxTierErrors is how many I/O errors a tier's storage may return (since it last came back into
// service) before the tier is bypassed: each error already drops the line it hit, and a device that
// keeps failing is not trusted until it passes a probe (journal.heal).
const maxTierErrors = 8

// ioError counts an error of the tier's storage on line, drops the line (its slot's content is now
// unknown) and bypasses the tier after maxTierErrors.
func (t *tier) ioError(line uint64, slot uint32, err error) {
	n := t.recentErrs.Add(1)
	if d, ok := asDamage(err); ok {
		// The device read what it was asked: the blocks are bad, not the line. Counted towards
		// a bypass all the same: a device that damages many blocks in a short time is not
		// trusted.
		t.onDamage(d.line, slot, d.bits)
		if n >= maxTierErrors {
			t.fail(fmt.Sprintf("%d errors, the last: %v", n, err))
		}
		return
	}
	t.errs.Add(1)
	t.mu.Lock()
	if s, ok := t.slotOf(line); ok && s == slot {
		if t.dirtyAt(slot).IsZero() {
			t.log.Warn("cache tier I/O error; line dropped", "tier", t.name, "line", line, "err", err)
			t.evict.Remove(policy.Key(line))
			t.dropLocked(line)
		} else {
			// The only copy of acknowledged writes: kept, for the destager to try again.
			t.log.Error("cache tier I/O error on a line with dirty data; kept", "tier", t.name, "line", line, "err", err)
		}
	}
	t.mu.Unlock()
	if n >= maxTierErrors {
		t.fail(fmt.Sprintf("%d I/O errors, the last: %v", n, err))
	}
}

// fail bypasses the tier: no read is served from its clean lines and nothing new is cached until
// it comes back (journal.heal, tried with backoff). Its clean lines are set aside with their
// records, so that it comes back warm. Dirty lines stay: they hold the only copy of acknowledged
// writes, and the destager keeps trying to write them back.
func (t *tier) fail(reason string) {
	if t.failed.Swap(true) {
		return
	}
	t.reason.Store(&reason)
	t.bypasses.Add(1)
	var retry time.Duration
	if t.j != nil {
		retry = t.j.scheduleHeal()
	}
	t.log.Error("cache tier bypassed", "tier", t.name, "reason", reason, "retry_in", retry)
	t.mu.Lock()
	var lines []uint64
	for line := range t.index.All() {
		lines = append(lines, line)
	}
	for _, line := range lines {
		slot, _ := t.slotOf(line)
		if !t.dirtyAt(slot).IsZero() {
			continue
		}
		t.evict.Remove(policy.Key(line))
		// A line with no valid block is a fill under way: nothing of it is stored to come back.
		if t.setAside != nil && !t.valid.Get(slot).IsZero() {
			t.setAsideLocked(line)
		} else {
			t.dropLocked(line)
		}
	}
	t.mu.Unlock()
}
