package cache

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
)

// checkpointEvery is how often changes to the SSD tier's index are committed when nothing else
// asks for it sooner (a FLUSH, or a shortage of free slots).
const checkpointEvery = time.Second

// checkpointOps is how many queued changes ask for a checkpoint before checkpointEvery: at the
// rate a fast fill changes lines (tens of thousands a second with 4 KiB lines), a second's queue
// would take several metadata transactions to commit.
const checkpointOps = 16 * meta.PartOps

// journal keeps the SSD tier's index in the metadata store so that a restart finds the tier warm,
// without ever letting a record find data that is not what it says. Three rules do it:
//
//   - A record that marks blocks valid is committed only at a checkpoint, after the SSD has been
//     flushed, so the data it points to is on the SSD before the record is (also across power loss).
//   - Before a write, trim or zeroing changes a line on the backend, the line's record is committed
//     with those blocks invalid (invalidateDurably), so a crash in the middle never leaves a record
//     that calls old SSD data valid. A line changed since the last checkpoint cannot have its
//     record in memory committed (its valid bits may cover data not yet flushed to the SSD): what
//     is committed is its stored record without those blocks (base), which claims nothing new.
//   - A slot whose line was evicted is reused only after the record's deletion is committed, so no
//     record can point at a slot that now holds another line's data.
//
// Changes between checkpoints wait in queue, one op per line (the latest wins). The maps and
// pending are guarded by the tier's mutex; the fields below say what guards the others.
//
// Lock order: a request's line locks (a FUA write waits for a checkpoint holding them), then ckMu,
// then commitMu, then the tier's mu. healMu is held alone; the atomics need no lock.
//
// A checkpoint's commit may be larger than one metadata transaction (tens of thousands of lines
// change in a second of a fast fill), so it is committed in parts (meta.CommitParts), in line order,
// with one sync after the last. The rules hold for every prefix of it, which is all a crash can
// leave: each record is complete in itself and its data was flushed to the SSD before the first
// part; the invalidations it must not undo were committed before (influx, under commitMu, which the
// commit holds from the first part to the last); and the slots it frees are released only after
// the last part and its sync. A FLUSH or FUA write waiting for the checkpoint (durable) returns
// only after that sync. A part that fails leaves the parts before it committed (they leave
// committing and update base as they land) and the rest queued for the next checkpoint.
type journal struct {
	t            *tier
	store        meta.Store
	flushBackend func() error
	// backendChanges counts the foreground changes sent to the backend so far; backendFlushed is
	// its value when the backend's last flush began (guarded by ckMu).
	backendChanges func() uint64
	backendFlushed uint64
	reserve        int // slots kept free so that evictions can wait for a checkpoint

	queue      map[uint64]meta.Op // changes since the last checkpoint
	committing map[uint64]meta.Op // the changes a checkpoint is committing now
	// base holds, for each line with a change not yet committed, what the store holds of it (or
	// a record of the same slot with fewer blocks): all invalidateDurably may commit for such a
	// line is base without the invalidated blocks.
	base map[uint64]meta.Op
	// influx holds the blocks of each line that were invalidated (and committed so) since the
	// checkpoint under way took its snapshot: it must not commit them valid again.
	influx  map[uint64]lineBits
	pending []uint32 // evicted slots free once the checkpoint commits their deletion

	// commitMu orders commits: invalidations share it, a checkpoint's commit takes it alone, so a
	// checkpoint never commits a line's older record after a newer invalidation.
	commitMu sync.RWMutex
	ckMu     sync.Mutex // one checkpoint at a time
	// Group commit of durable(): asked counts the calls; covered is the last call number that a
	// completed checkpoint began after.
	asked   atomic.Uint64
	covered uint64 // guarded by ckMu
	kickCh  chan struct{}
	stop    chan struct{}
	done    chan struct{}

	// For the stats: checkpoints that committed, and the most records one of them committed.
	checkpoints atomic.Uint64
	largest     atomic.Uint64

	// The schedule of a bypassed tier's attempts to come back (heal): the next at nextHeal, each
	// failed one doubling healDelay up to maxHealDelay. A tier that fails again soon after it came
	// back keeps its delay, so that a flapping device is not hammered.
	healMu    sync.Mutex
	healFirst time.Duration
	nextHeal  time.Time
	healDelay time.Duration
	healedAt  time.Time
}

// The backoff of heal attempts: firstHealDelay after a bypass (healFirst, which tests shorten),
// doubling to maxHealDelay; a tier in service for stableAfter starts again from the first delay at
// its next bypass.
const (
	firstHealDelay = 5 * time.Second
	maxHealDelay   = 5 * time.Minute
	stableAfter    = 10 * time.Minute
)

func newJournal(t *tier, store meta.Store, reserve int, flushBackend func() error, backendChanges func() uint64) *journal {
	j := &journal{
		t: t, store: store, reserve: reserve, flushBackend: flushBackend, backendChanges: backendChanges,
		queue:     map[uint64]meta.Op{},
		base:      map[uint64]meta.Op{},
		influx:    map[uint64]lineBits{},
		kickCh:    make(chan struct{}, 1),
		healFirst: firstHealDelay,
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	t.j = j
	return j
}

// record queues a change; the caller holds the tier's mutex, and called keepBaseLocked before it
// changed the line. A queue that reaches checkpointOps asks for a checkpoint at once, which bounds
// both the queue's memory and how long a checkpoint's commit holds invalidations up.
func (j *journal) record(op meta.Op) {
	j.queue[op.Rec.Line] = op
	if len(j.queue) == checkpointOps {
		j.kick()
	}
}

// keepBaseLocked keeps line's record as the tier holds it in slot, before a change to be recorded,
// if nothing of it is queued: unchanged since the last commit, it is what the store holds.
func (j *journal) keepBaseLocked(line uint64, slot uint32) {
	if !j.knownLocked(line) {
		j.base[line] = j.t.recordLocked(line, slot)
	}
}

// storedLocked returns what the store holds of line, as far as invalidateDurably may rely on it,
// without the blocks bits, and the blocks it no longer claims (all of them for a deletion). A
// record of another slot than the line's now is returned as a deletion: the line left that slot
// when it was clean (a dirty line is never evicted), or with every block invalidated, so nothing
// dirty of it is lost. claims reports whether the store may call any of bits valid: unless the
// base says otherwise, it may (a record of another slot must go, whatever it claims).
func (j *journal) storedLocked(line uint64, bits lineBits) (op meta.Op, gone lineBits, claims bool) {
	b, ok := j.base[line]
	slot, cached := j.t.slotOf(line)
	if !ok || b.Delete || !cached || b.Rec.Slot != slot {
		return deleteOp(line), rangeBits(0, j.t.blocks), !(ok && b.Delete)
	}
	return j.without(b, bits), bits, !bitsFromWords(b.Rec.Valid).and(bits).isZero()
}

func deleteOp(line uint64) meta.Op { return meta.Op{Delete: true, Rec: meta.Line{Line: line}} }

// without returns op with the blocks bits neither valid nor dirty: a deletion if none is left.
func (j *journal) without(op meta.Op, bits lineBits) meta.Op {
	if op.Delete {
		return op
	}
	v := bitsFromWords(op.Rec.Valid).andNot(bits)
	if v.isZero() {
		return deleteOp(op.Rec.Line)
	}
	r := meta.Line{Line: op.Rec.Line, Slot: op.Rec.Slot, Valid: v.words(j.t.blocks)}
	if d := bitsFromWords(op.Rec.Dirty).andNot(bits); !d.isZero() {
		r.Dirty = d.words(j.t.blocks)
	}
	return meta.Op{Rec: r}
}

// committedLocked notes that op is what the store now holds of its line.
func (j *journal) committedLocked(op meta.Op) {
	if _, again := j.queue[op.Rec.Line]; again {
		j.base[op.Rec.Line] = op
	} else {
		delete(j.base, op.Rec.Line)
	}
}

// knownLocked reports whether line has a change not yet committed, so that the store may still hold
// an older record of it.
func (j *journal) knownLocked(line uint64) bool {
	if _, ok := j.queue[line]; ok {
		return true
	}
	_, ok := j.committing[line]
	return ok
}

// kick asks the background loop for a checkpoint soon.
func (j *journal) kick() {
	select {
	case j.kickCh <- struct{}{}:
	default:
	}
}

func (j *journal) loop() {
	defer close(j.done)
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-tick.C:
		case <-j.kickCh:
		}
		if j.t.failed.Load() && !time.Now().Before(j.healAt()) {
			if err := j.heal(); err != nil {
				j.healFailed()
				j.t.log.Debug("cache tier still bypassed", "tier", j.t.name, "err", err, "retry_in", time.Until(j.healAt()).Round(time.Second))
			}
		}
		j.t.mu.Lock()
		idle := len(j.queue) == 0 && len(j.pending) == 0
		j.t.mu.Unlock()
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

// checkpoint flushes the SSD and the backend, then commits every queued change with a sync, then
// frees the slots whose deletions it committed. Flushing the backend first means a record never
// calls SSD data valid that the backend could still lose: after a power cut the two agree. The
// backend is flushed only when foreground changes reached it since its last flush: clean data
// otherwise came from it already durable (a destage flushes before it marks anything clean). So in
// write-back a FLUSH costs the backend nothing, and keeps working while the backend is down.
// backendErr is the backend's flush failing (the changes wait for the next checkpoint); tierErr is
// the SSD or the metadata failing, and the tier must be bypassed.
func (j *journal) checkpoint() (backendErr, tierErr error) {
	j.ckMu.Lock()
	defer j.ckMu.Unlock()
	return j.checkpointLocked()
}

// freePending runs a checkpoint if evicted slots wait for one to be reused. Writers that found no
// free slot share it: a later one finds the slots freed already.
func (j *journal) freePending() error {
	j.ckMu.Lock()
	defer j.ckMu.Unlock()
	j.t.mu.Lock()
	waiting := len(j.pending) > 0
	j.t.mu.Unlock()
	if !waiting {
		return nil
	}
	return j.checkpointOrFail()
}

// durable makes every write that completed before the call durable on the SSD tier with the
// metadata that finds it (a FUA write in write-back). Concurrent callers share checkpoints: a
// caller waiting for the one under way is covered by the next, which starts after its call.
func (j *journal) durable() error {
	want := j.asked.Add(1)
	j.ckMu.Lock()
	defer j.ckMu.Unlock()
	if j.covered >= want {
		return nil
	}
	return j.checkpointOrFail()
}

// checkpointOrFail runs a checkpoint for a caller holding ckMu. The SSD or the metadata failing
// bypasses the tier; either error is returned.
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
	covers := j.asked.Load()
	t.mu.Lock()
	snap, pend := j.queue, j.pending
	records := len(snap) // committing is snap, and its lines leave it as their parts commit
	j.queue, j.committing, j.pending = map[uint64]meta.Op{}, snap, nil
	clear(j.influx)
	t.mu.Unlock()

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
			if bits, ok := j.influx[line]; ok {
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
				delete(j.committing, op.Rec.Line)
			}
			t.mu.Unlock()
		})
		if err != nil {
			tierErr = fmt.Errorf("metadata commit: %w", err)
		}
		j.commitMu.Unlock()
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	left := j.committing // what was not committed
	j.committing = nil
	if tierErr != nil || backendErr != nil {
		// Keep the changes not committed (newer ones win) and the slots for the next checkpoint.
		for line, op := range left {
			if _, newer := j.queue[line]; !newer {
				j.queue[line] = op
			}
		}
		j.pending = append(j.pending, pend...)
		return backendErr, tierErr
	}
	t.free = append(t.free, pend...)
	j.covered = covers
	j.checkpoints.Add(1)
	if n := uint64(records); n > j.largest.Load() {
		j.largest.Store(n) // only checkpoints (under ckMu) store it
	}
	return nil, nil
}

// flushBackendIfChanged flushes the backend if foreground changes reached it since its last flush.
// The caller holds ckMu.
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

// dropStale deletes, with a sync, the stored records of lines that moved to another slot since
// they were stored, where those records call any of the given blocks valid: the destager is about
// to write newer data for the blocks to the backend, and a restart must not serve the older data
// such a record finds as clean. (A line moves only when it is clean or wholly invalidated, so the
// deletion loses nothing dirty.)
func (j *journal) dropStale(spans []span) error {
	j.commitMu.RLock()
	defer j.commitMu.RUnlock()
	t := j.t
	var ops []meta.Op
	t.mu.Lock()
	for _, s := range spans {
		b, ok := j.base[s.line]
		slot, cached := t.slotOf(s.line)
		if !ok || b.Delete || (cached && b.Rec.Slot == slot) || bitsFromWords(b.Rec.Valid).and(s.bits).isZero() {
			continue
		}
		del := deleteOp(s.line)
		// The line stays queued, so that the next checkpoint stores it as it is now.
		if cached {
			j.queue[s.line] = t.recordLocked(s.line, slot)
		} else {
			j.queue[s.line] = del
		}
		if _, ok := j.influx[s.line]; !ok {
			j.influx[s.line] = lineBits{} // present: the checkpoint under way must not store the old slot again
		}
		j.committedLocked(del)
		ops = append(ops, del)
	}
	t.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	return meta.CommitParts(j.store, ops, true, nil)
}

// span is the part of a line a request touches, as blocks.
type span struct {
	line uint64
	bits lineBits
}

// invalidateDurably clears the given blocks and commits that before returning (with sync, also
// across power loss). Lines with nothing cached and nothing pending need no commit, nor lines whose
// stored record already claims none of the blocks.
//
// What it commits also leaves out the line's other clean blocks (in memory they stay valid): the
// next write to any of them until the next checkpoint, which stores the line whole again, then
// needs no commit. A clean block is on the backend too, so a restart only reads it from there
// again. Writes spread over a clean cache (after a flush) cost a commit per line and checkpoint
// rather than one per write: through NBD, 4K random writes ran 1-39 % faster and the 8K 80/20 mix
// 4-13 % (3 paired rounds each, every one faster).
func (j *journal) invalidateDurably(spans []span, sync bool) error {
	j.commitMu.RLock()
	defer j.commitMu.RUnlock()
	t := j.t
	var ops []meta.Op
	t.mu.Lock()
	for _, s := range spans {
		if slot, ok := t.setAside[s.line]; ok {
			// A line set aside by a bypass keeps its stored record for the tier's return: the
			// record goes now, as the line does (a heal or restart must not find the old data).
			delete(t.setAside, s.line)
			t.releaseWhenUnpinnedLocked(slot)
			del := deleteOp(s.line)
			j.queue[s.line] = del
			j.influx[s.line] = rangeBits(0, t.blocks)
			j.committedLocked(del)
			ops = append(ops, del)
			continue
		}
		known := j.knownLocked(s.line)
		stored, gone, claims := j.storedLocked(s.line, s.bits)
		claims = claims || !known
		op, changed := t.invalidateLocked(s.line, s.bits)
		switch {
		case !known && !changed:
			continue // the store's record, if any, already has these blocks invalid
		case known:
			// The line changed since the last checkpoint: its record in memory may call blocks
			// valid whose data is not on the SSD for sure yet (not flushed), so it cannot be
			// committed now. The stored record without these blocks can: it claims nothing the
			// store did not, and keeps the dirty blocks it finds. The next checkpoint, after a
			// flush, stores the line as it is.
			j.queue[s.line] = op
			op = stored
		default:
			// Committed without its clean blocks below, the stored record is no longer the one
			// in memory: queued, the line keeps what the store holds as its base, and the next
			// checkpoint stores it whole.
			j.queue[s.line] = op
		}
		// A checkpoint under way must not commit these blocks valid again after this.
		j.influx[s.line] = j.influx[s.line].or(gone)
		if !claims {
			continue
		}
		op = j.without(op, t.cleanLocked(s.line))
		j.committedLocked(op)
		ops = append(ops, op)
	}
	t.mu.Unlock()
	if len(ops) == 0 {
		if sync {
			// Nothing new to commit, but an earlier invalidation of these blocks may have been
			// committed without a sync: a FUA write must not rely on it surviving power loss.
			return j.store.Sync()
		}
		return nil
	}
	// These records left the queue: if the commit fails, only a retry can still land them. Each
	// claims no more than the store did, so they may land in parts (a request over many lines).
	err := meta.CommitParts(j.store, ops, sync, nil)
	if err != nil {
		err = meta.CommitParts(j.store, ops, sync, nil)
	}
	return err
}

// load rebuilds the tier's index from the store after a restart.
func (j *journal) load() error {
	t := j.t
	t.mu.Lock()
	defer t.mu.Unlock()
	used := make([]bool, t.slots)
	err := j.store.Lines(func(r meta.Line) error {
		if int(r.Slot) >= t.slots || used[r.Slot] {
			return fmt.Errorf("line %d: slot %d is out of range or used twice (%d slots)", r.Line, r.Slot, t.slots)
		}
		if t.lines > 0 && r.Line >= t.lines {
			return fmt.Errorf("line %d is beyond the backend's %d lines", r.Line, t.lines)
		}
		v := bitsFromWords(r.Valid)
		if v.andNot(rangeBits(0, t.blocks)) != (lineBits{}) || v.isZero() {
			return fmt.Errorf("line %d: valid bits %x do not fit a line of %d blocks", r.Line, r.Valid, t.blocks)
		}
		d := bitsFromWords(r.Dirty)
		if d.andNot(v) != (lineBits{}) {
			return fmt.Errorf("line %d: dirty bits %x outside the valid bits %x", r.Line, r.Dirty, r.Valid)
		}
		if !d.isZero() && t.dirty.words == nil {
			return fmt.Errorf("line %d has dirty data but this tier keeps none", r.Line)
		}
		used[r.Slot] = true
		t.index.Put(r.Line, int32(r.Slot))
		t.setLocked(r.Line, r.Slot, v, d)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	t.free, t.fresh = t.free[:0], t.slots
	for s := t.slots - 1; s >= 0; s-- {
		if !used[s] {
			t.free = append(t.free, uint32(s))
		}
	}
	// Rebuild the policy in line order. Should the tier hold more lines than the policy's capacity
	// (a larger reserve than the last run's), the policy evicts the excess as usual.
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
	return nil
}
