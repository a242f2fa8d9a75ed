package cache

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/meta"
)

// askCheckpoint asks the background loop for a checkpoint soon (the loop also tries a heal that is
// due first).
func (j *journal) askCheckpoint() {
	select {
	case j.checkpointSoon <- struct{}{}:
	default:
	}
}

func (j *journal) loop(stop <-chan struct{}) {
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
	for tickOrKick(stop, tick.C, j.checkpointSoon) {
		if j.t.failed.Load() && !time.Now().Before(j.healAt()) {
			if err := j.heal(); err != nil {
				j.healFailed()
				j.t.log.Debug("cache tier still bypassed", "tier", j.t.name, "err", err, "retry_in", time.Until(j.healAt()).Round(time.Second))
			}
		}
		j.t.mu.Lock()
		idle := len(j.changed) == 0 && len(j.freeAfterCommit) == 0 && !j.t.st.hasDeadLocked()
		j.t.mu.Unlock()
		if t := j.t; !t.failed.Load() && t.st.short() {
			// Room is short (a packed tier): free segments, which come free at the checkpoint below.
			t.st.reclaim()
			idle = false
		}
		if !idle {
			backendErr, tierErr := j.checkpoint()
			if tierErr != nil {
				j.t.fail(tierErr.Error())
			}
			if backendErr != nil {
				j.t.log.Warn("checkpoint: backend flush failed; will retry", "err", backendErr)
			}
		}
	}
}

// checkpoint flushes the SSD and the backend, then commits the record of every changed line with a
// sync, then frees the slots whose deletions it committed. Flushing the backend first means a
// record never calls SSD data valid that the backend could still lose: after a power cut the two
// agree. The backend is flushed only when foreground changes reached it since its last flush: clean
// data otherwise came from it already durable (a destage flushes before it marks anything clean).
// So in write-back a FLUSH costs the backend nothing, and keeps working while the backend is down.
// backendErr is the backend's flush failing (the changes wait for the next checkpoint); tierErr is
// the SSD or the metadata failing, and the tier must be bypassed.
func (j *journal) checkpoint() (backendErr, tierErr error) {
	j.checkpointMu.Lock()
	defer j.checkpointMu.Unlock()
	return j.checkpointLocked()
}

// checkpointForSlots runs a checkpoint if evicted slots wait for one to be reused. Writers that
// found no free slot share it: a later one finds the slots freed already.
func (j *journal) checkpointForSlots() error {
	j.checkpointMu.Lock()
	defer j.checkpointMu.Unlock()
	j.t.mu.Lock()
	waiting := len(j.freeAfterCommit) > 0
	j.t.mu.Unlock()
	if !waiting {
		return nil
	}
	return j.checkpointOrFail()
}

// makeRoom frees room on a packed tier (packed.reclaim) for a writer that found none, and runs the
// checkpoint that makes it free. seen is roomMade when the writer looked for room: if another
// writer's makeRoom ran since, the writer tries that room first.
func (j *journal) makeRoom(seen uint64) error {
	j.checkpointMu.Lock()
	defer j.checkpointMu.Unlock()
	if j.t.failed.Load() {
		return errNoRoom
	}
	if j.roomMade.Load() != seen {
		return nil
	}
	j.t.st.reclaim()
	defer j.roomMade.Add(1)
	return j.checkpointOrFail()
}

// durable makes every write that completed before the call durable on the SSD tier with the
// metadata that finds it (a FUA write in write-back). Concurrent callers share checkpoints: a
// caller waiting for the one under way is covered by the next, which starts after its call.
func (j *journal) durable() error {
	want := j.durableCalls.Add(1)
	j.checkpointMu.Lock()
	defer j.checkpointMu.Unlock()
	if j.durableCovered >= want {
		return nil
	}
	return j.checkpointOrFail()
}

// checkpointOrFail runs a checkpoint for a caller holding checkpointMu. The SSD or the metadata
// failing bypasses the tier; either error is returned.
func (j *journal) checkpointOrFail() error {
	backendErr, tierErr := j.checkpointLocked()
	if tierErr != nil {
		j.t.fail(tierErr.Error())
		return tierErr
	}
	return backendErr
}

func (j *journal) checkpointLocked() (backendErr, tierErr error) {
	t := j.t
	covers := j.durableCalls.Load()
	// With inplace, no write in place is between its record's new sum and its bytes (sum.go):
	// the snapshot commits no sum before the flush below has its bytes on the SSD.
	t.inplace.Lock()
	t.mu.Lock()
	snap, toFree := j.changed, j.freeAfterCommit
	records := len(snap) // snapshot is snap, and its lines leave it as their parts commit
	// Every record logged so far is in snap: once it is committed, a replay may skip them.
	logged := j.loggedLocked()
	j.changed, j.snapshot, j.freeAfterCommit = map[uint64]meta.Op{}, snap, nil
	toRelease := t.st.snapshotLocked() // a packed tier's dead units, freed as the slots are
	clear(j.invalidatedSinceSnapshot)
	t.mu.Unlock()
	t.inplace.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { backendErr = j.flushBackendIfChanged() })
	if err := t.dev.Flush(); err != nil {
		tierErr = fmt.Errorf("flush of the SSD tier: %w", err)
	}
	wg.Wait()
	if tierErr == nil && backendErr == nil {
		j.commitMu.Lock()
		t.mu.Lock()
		ops := make([]meta.Op, 0, records)
		for line, op := range snap {
			if bits, ok := j.invalidatedSinceSnapshot[line]; ok {
				// Blocks invalidated since the snapshot were committed so already: the snapshot
				// must not claim them again. What else it claims is on the SSD now (flushed
				// above), dirty blocks included, which a FLUSH waiting for this checkpoint
				// needs. A line that moved to another slot since was clean or wholly
				// invalidated when it left: its old record goes.
				if slot, cached := t.slotOf(line); !op.Delete && (!cached || slot != op.Rec.Slot) {
					op = deleteOp(line)
				} else {
					op = j.without(op, bits)
				}
			}
			ops = append(ops, op)
		}
		t.mu.Unlock()
		slices.SortFunc(ops, func(a, b meta.Op) int { return cmp.Compare(a.Rec.Line, b.Rec.Line) })
		// Each record stands alone (see the rules above), so the commit may land in parts.
		err := meta.CommitParts(j.store, ops, true, func(part []meta.Op) {
			t.mu.Lock()
			for _, op := range part {
				j.committedLocked(op)
				delete(j.snapshot, op.Rec.Line)
			}
			t.mu.Unlock()
		})
		if err != nil {
			tierErr = fmt.Errorf("metadata commit: %w", err)
		}
		j.commitMu.Unlock()
	}

	t.mu.Lock()
	left := j.snapshot // what was not committed
	j.snapshot = nil
	if tierErr != nil || backendErr != nil {
		// Keep the changes not committed (newer ones win) and the slots for the next checkpoint.
		for line, op := range left {
			if _, newer := j.changed[line]; !newer {
				j.changed[line] = op
			}
		}
		j.freeAfterCommit = append(j.freeAfterCommit, toFree...)
		t.st.keepDeadLocked(toRelease)
		t.mu.Unlock()
		return backendErr, tierErr
	}
	// The log's watermark moves before the freed slots can be reused: a record of a line that
	// left one of them must never be replayed over the slot's next line.
	if j.log != nil {
		j.log.Committed(logged)
	}
	t.free = append(t.free, toFree...)
	j.durableCovered = covers
	j.checkpoints.Add(1)
	if n := uint64(records); n > j.largestCheckpoint.Load() {
		j.largestCheckpoint.Store(n) // only checkpoints (under checkpointMu) store it
	}
	t.mu.Unlock()
	t.st.releaseUnits(toRelease) // not under the tier's mu: it waits for reads, which take it
	return nil, nil
}

// flushBackendIfChanged flushes the backend if foreground changes reached it since its last flush.
// The caller holds checkpointMu.
func (j *journal) flushBackendIfChanged() error {
	n := j.backendChanges()
	if n == j.backendFlushed {
		return nil
	}
	if err := j.flushBackend(); err != nil {
		return err
	}
	j.backendFlushed = n
	return nil
}
