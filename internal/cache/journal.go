package cache

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/runlog"
)

// checkpointEvery is how often changes to the SSD tier's index are committed when nothing else
// asks for it sooner (a FLUSH, or a shortage of free slots).
const checkpointEvery = time.Second

// checkpointOps is how many changed lines ask for a checkpoint before checkpointEvery: at the rate
// a fast fill changes lines (tens of thousands a second with 4 KiB lines), a second's changes
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
//     is committed is its stored record without those blocks, which claims nothing new.
//   - A slot whose line was evicted is reused only after the record's deletion is committed, so no
//     record can point at a slot that now holds another line's data.
//
// With a run log, every record queued for a checkpoint also goes to the log as it is queued, so
// that a kill of the process between checkpoints loses none (journal_runlog.go).
//
// Its state, and what guards each part of it:
//
//   - The tier's mu guards what is not committed yet, and the run log that holds it: log, changed (the latest record of each line
//     changed since the last checkpoint's snapshot), snapshot (the records the checkpoint under
//     way is committing), stored (what the store holds of each line in either),
//     invalidatedSinceSnapshot (the blocks the checkpoint under way must not commit valid) and
//     freeAfterCommit (the slots a checkpoint frees).
//   - checkpointMu (one checkpoint at a time) guards backendFlushed and durableCovered.
//   - commitMu guards no field: it orders commits (see the field).
//   - healMu guards the heal schedule: healFirst, nextHeal, healDelay and healedAt.
//   - durableCalls, roomMade, checkpoints and largestCheckpoint are atomic; t, store, flushBackend,
//     backendChanges, reserve and the channels are set by newJournal and never change.
//
// Lock order: a request's line locks (a FUA write waits for a checkpoint holding them), then
// checkpointMu, then commitMu, then the tier's mu. healMu is held alone.
//
// A checkpoint's commit may be larger than one metadata transaction (tens of thousands of lines
// change in a second of a fast fill), so it is committed in parts (meta.CommitParts), in line order,
// with one sync after the last. The rules hold for every prefix of it, which is all a crash can
// leave: each record is complete in itself and its data was flushed to the SSD before the first
// part; the invalidations it must not undo were committed before (invalidatedSinceSnapshot, under
// commitMu, which the commit holds from the first part to the last); and the slots it frees are
// released only after the last part and its sync. A FLUSH or FUA write waiting for the checkpoint
// (durable) returns only after that sync. A part that fails leaves the parts before it committed
// (as each landed, its lines left snapshot and stored was brought up to date) and the rest in
// changed again, for the next checkpoint.
type journal struct {
	t            *tier
	store        meta.Store
	flushBackend func() error
	// backendChanges counts the foreground changes sent to the backend so far; backendFlushed is
	// its value when the backend's last flush began.
	backendChanges func() uint64
	backendFlushed uint64
	reserve        int // slots kept free so that evictions can wait for a checkpoint

	// changed holds the record of each line changed since the last checkpoint took its snapshot,
	// as the tier holds it now: what the next checkpoint commits.
	changed map[uint64]meta.Op
	// snapshot holds the records the checkpoint under way is committing (changed, when it began);
	// each line leaves it as its part lands. nil between checkpoints.
	snapshot map[uint64]meta.Op
	// stored holds, for each line in changed or snapshot, what the store holds of it (or a record
	// of the same slot with fewer blocks): all invalidateDurably may commit for such a line is that
	// record without the invalidated blocks.
	stored map[uint64]meta.Op
	// invalidatedSinceSnapshot holds the blocks of each line that were invalidated (and committed
	// so) since the checkpoint under way took its snapshot: it must not commit them valid again.
	invalidatedSinceSnapshot map[uint64]lineBits
	// freeAfterCommit holds the slots whose lines left the tier: they are free once a checkpoint
	// has committed the deletion of their records.
	freeAfterCommit []uint32
	// log holds every record put in changed, in order, where a kill of the process does not lose
	// it (journal_runlog.go); nil without one.
	log *runlog.Log
	// At a restart, between load and settleSums: logSums holds, by line, the sums of every
	// record the run log replayed (journal_runlog.go), and fixes the blocks whose sums load could
	// not take from one record (sum.go).
	logSums map[uint64][]meta.Line
	fixes   []sumFix
	// sbMu orders the changes of the superblock after the start (updateSuperblock). It is taken
	// under the cache's lostSet.mu (the lost ranges), and only the store is used under it.
	sbMu sync.Mutex
	// resummed holds the lines whose sums changed by writes in place since their last record, on
	// a tier of slots or into a packed tier's mutable units (guarded by the tier's mu;
	// resummedLocked).
	resummed lineSet

	// commitMu orders commits: invalidations share it, a checkpoint's commit (and heal) takes it
	// alone, so a checkpoint never commits a line's older record after a newer invalidation.
	// checkpointMu makes checkpoints (checkpointLocked), heal and makeRoom's reclaim one at a time
	// and guards backendFlushed and durableCovered. Writers and the destager wait for it under
	// their line locks, so nothing under it waits for a line lock; it comes before commitMu, the
	// tier's inplace, packed.io and the tier's mu.
	commitMu     sync.RWMutex
	checkpointMu sync.Mutex
	// Group commit of durable(): durableCalls counts the calls; durableCovered is the last call
	// number that a completed checkpoint began after.
	durableCalls   atomic.Uint64
	durableCovered uint64
	// unsynced counts invalidateDurably's commits made without a sync since syncInvalidations
	// last synced them: until then a power cut may undo them (syncInvalidations).
	unsynced atomic.Uint64
	// checkpointSoon holds a request for a checkpoint (askCheckpoint) until the loop takes it.
	checkpointSoon chan struct{}
	// roomMade counts the reclaims makeRoom ran, so that writers that found no room together
	// share one (a reclaim lists the whole index).
	roomMade atomic.Uint64

	// For the stats: checkpoints that committed, and the most records one of them committed.
	checkpoints       atomic.Uint64
	largestCheckpoint atomic.Uint64

	// The schedule of a bypassed tier's attempts to come back (heal): the next at nextHeal, each
	// failed one doubling healDelay up to maxHealDelay. A tier that fails again soon after it came
	// back keeps its delay, so that a flapping device is not hammered. healMu guards healFirst,
	// nextHeal, healDelay and healedAt; heal takes it under the tier's mu, and nothing under it.
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
		changed:                  map[uint64]meta.Op{},
		stored:                   map[uint64]meta.Op{},
		invalidatedSinceSnapshot: map[uint64]lineBits{},
		checkpointSoon:           make(chan struct{}, 1),
		healFirst:                firstHealDelay,
	}
	j.resummed = linebits.NewSet(t.lines)
	t.j = j
	return j
}

// record notes a change of a line; the caller holds the tier's mutex, and called keepStoredLocked
// before it changed the line. Reaching checkpointOps changed lines asks for a checkpoint at once,
// which bounds both their memory and how long a checkpoint's commit holds invalidations up.
//
// The record also goes to the run log, if the tier has one, before the caller lets go of the mutex:
// a write is acknowledged only after markValid recorded it, so a run killed after that leaves the
// record for the next run to replay (TestCrashRestart's kill-9 cases in write-back).
func (j *journal) record(op meta.Op) {
	j.changed[op.Rec.Line] = op
	half := j.log != nil && j.log.Append(op)
	if half || len(j.changed) == checkpointOps {
		j.askCheckpoint()
	}
}

// keepStoredLocked keeps line's record as the tier holds it in slot as what the store holds, before
// a change to be recorded, if the line has no change not yet committed: then it is.
func (j *journal) keepStoredLocked(line uint64, slot uint32) {
	if !j.uncommittedLocked(line) {
		j.stored[line] = j.t.recordLocked(line, slot)
	}
}

// storedWithoutLocked returns what the store holds of line, as far as invalidateDurably may rely on
// it, without the blocks bits, and the blocks a checkpoint under way must no longer commit valid
// (gone: all of them where the store's record goes). A record of another slot than the line's now
// is returned as a deletion: the line left that slot when it was clean (a dirty line is never
// evicted), or with every block invalidated, so nothing dirty of it is lost. claims reports whether
// the store may call any of bits valid: unless stored says otherwise, it may (a record of another
// slot must go, whatever it claims).
//
// Where the store holds nothing of the line (stored is a deletion) and it is cached, gone is bits
// alone: the record that the checkpoint under way commits may hold other blocks, dirty ones among
// them, whose data its flush made durable, and a FLUSH waiting for it relies on them
// (TestCrashRestart's write-back cases lost a flushed write when gone was every block).
func (j *journal) storedWithoutLocked(line uint64, bits lineBits) (op meta.Op, gone lineBits, claims bool) {
	b, ok := j.stored[line]
	slot, cached := j.t.slotOf(line)
	if ok && b.Delete && cached {
		return deleteOp(line), bits, false
	}
	if !ok || b.Delete || !cached || b.Rec.Slot != slot {
		return deleteOp(line), linebits.Range(0, j.t.blocks), !(ok && b.Delete)
	}
	return j.without(b, bits), bits, !linebits.FromWords(b.Rec.Valid).And(bits).IsZero()
}

func deleteOp(line uint64) meta.Op { return meta.Op{Delete: true, Rec: meta.Line{Line: line}} }

// without returns op with the blocks bits neither valid, dirty nor zero: a deletion if none is
// left.
func (j *journal) without(op meta.Op, bits lineBits) meta.Op {
	if op.Delete {
		return op
	}
	v := linebits.FromWords(op.Rec.Valid).AndNot(bits)
	if v.IsZero() {
		return deleteOp(op.Rec.Line)
	}
	r := meta.Line{Line: op.Rec.Line, Slot: op.Rec.Slot, Valid: v.Words(j.t.blocks)}
	if d := linebits.FromWords(op.Rec.Dirty).AndNot(bits); !d.IsZero() {
		r.Dirty = d.Words(j.t.blocks)
	}
	if z := linebits.FromWords(op.Rec.Zero).AndNot(bits); !z.IsZero() {
		r.Zero = z.Words(j.t.blocks)
	}
	for b, l := range op.Rec.Loc {
		if l != 0 && !bits.Has(b) {
			if r.Loc == nil {
				r.Loc = make([]uint64, len(op.Rec.Loc))
			}
			r.Loc[b] = l
		}
	}
	if stored := v.AndNot(linebits.FromWords(r.Zero)); op.Rec.Sum != nil && !stored.IsZero() {
		r.Sum = make([]uint32, len(op.Rec.Sum))
		for b := range r.Sum {
			if stored.Has(b) {
				r.Sum[b] = op.Rec.Sum[b]
			}
		}
	}
	if d := linebits.FromWords(r.Dirty); op.Rec.Epoch != nil && !d.IsZero() {
		r.Epoch = make([]uint64, len(op.Rec.Epoch))
		for b := range r.Epoch {
			if d.Has(b) {
				r.Epoch[b] = op.Rec.Epoch[b]
			}
		}
	}
	return meta.Op{Rec: r}
}

// storedBefore is what stored held of a line before a commit of it was counted on (committing).
type storedBefore struct {
	line uint64
	op   meta.Op
}

// committingLocked notes op as what the store holds of its line ahead of the commit that the
// caller is about to make of it, and returns what stored held before, for uncommit should that
// commit fail. A line with nothing in stored (one set aside by a bypass, whose record the tier no
// longer knows) is taken to have a record at slot claiming every block.
func (j *journal) committingLocked(op meta.Op, slot uint32) storedBefore {
	b, ok := j.stored[op.Rec.Line]
	if !ok {
		b = meta.Op{Rec: meta.Line{Line: op.Rec.Line, Slot: slot, Valid: linebits.Range(0, j.t.blocks).Words(j.t.blocks)}}
	}
	j.committedLocked(op)
	return storedBefore{op.Rec.Line, b}
}

// uncommit puts back what stored held of the lines of a commit that failed: the store may still
// hold their older records, and a record the journal thinks gone is one that nothing takes back
// before newer data reaches the backend, so that a restart serves the older data
// (TestInvalidationAfterFailedCommit; TestFailNthCommit, where a moved line's older dirty record
// came back over the write the backend had). A commit in parts may have landed some of them:
// thinking the store holds more than it does costs a commit later, nothing else.
func (j *journal) uncommit(before []storedBefore) {
	j.t.mu.Lock()
	defer j.t.mu.Unlock()
	for _, b := range before {
		j.stored[b.line] = b.op
	}
}

// committedLocked notes that op is what the store now holds of its line.
func (j *journal) committedLocked(op meta.Op) {
	if _, again := j.changed[op.Rec.Line]; again {
		j.stored[op.Rec.Line] = op
	} else {
		delete(j.stored, op.Rec.Line)
	}
}

// uncommittedLocked reports whether line has a change not yet committed (in changed or snapshot),
// so that the store may still hold an older record of it.
func (j *journal) uncommittedLocked(line uint64) bool {
	if _, ok := j.changed[line]; ok {
		return true
	}
	_, ok := j.snapshot[line]
	return ok
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
	var before []storedBefore
	t.mu.Lock()
	for _, s := range spans {
		b, ok := j.stored[s.line]
		slot, cached := t.slotOf(s.line)
		if !ok || b.Delete || (cached && b.Rec.Slot == slot) || linebits.FromWords(b.Rec.Valid).And(s.bits).IsZero() {
			continue
		}
		del := deleteOp(s.line)
		// The line stays changed, so that the next checkpoint stores it as it is now.
		if cached {
			j.record(t.recordLocked(s.line, slot))
		} else {
			j.record(del)
		}
		if _, ok := j.invalidatedSinceSnapshot[s.line]; !ok {
			// Present, even with no block: the checkpoint under way must not store the old slot
			// again.
			j.invalidatedSinceSnapshot[s.line] = lineBits{}
		}
		before = append(before, j.committingLocked(del, b.Rec.Slot))
		ops = append(ops, del)
	}
	t.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	err := meta.CommitParts(j.store, ops, true, nil)
	if err != nil {
		j.uncommit(before)
	}
	return err
}

// settleClaims makes what the store may claim of the dirty blocks spans true before the destager
// writes them back: a checkpoint, if a claim is stale. A write in place keeps a stored record of
// dirty data true (the slot holds the newest data), but a zero bit is not in the slot: data written
// over with zeros leaves an older record calling the slot's older data valid, and a zero block
// written over with data leaves one calling the block zero while the slot holds the data. Until the
// next checkpoint that is what the durability contract allows of an unflushed write; but once the
// destage has made the newest data durable on the backend (a FLUSH that a bypassed tier's FlushAll
// serves returns then), a crash must not bring the older claim back. On a packed tier (pack.go)
// nothing is written in place at all: a stored record may find an older unit of a dirty block than
// the tier holds, which is settled the same way. The checkpoint stores the
// lines as the tier holds them, their data flushed to the SSD; the caller holds the lines' locks,
// so no write makes a claim stale again before the destage ends. If it fails, nothing has reached
// the backend, and the destage fails.
func (j *journal) settleClaims(spans []span) error {
	if !j.staleClaims(spans) {
		return nil
	}
	j.checkpointMu.Lock()
	defer j.checkpointMu.Unlock()
	if !j.staleClaims(spans) { // a checkpoint settled them meanwhile
		return nil
	}
	return j.checkpointOrFail()
}

// staleClaims reports whether the store may hold a record of a line of spans that disagrees with
// the tier on which of the span's dirty blocks are zero blocks, or on where their units are: the
// store's record (stored) or the one the checkpoint under way is committing (snapshot).
func (j *journal) staleClaims(spans []span) bool {
	t := j.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range spans {
		slot, cached := t.slotOf(s.line)
		if !cached {
			continue
		}
		zero := t.zeroAt(slot)
		for _, m := range []map[uint64]meta.Op{j.stored, j.snapshot} {
			if b, ok := m[s.line]; ok && !b.Delete && b.Rec.Slot == slot {
				claimed := linebits.FromWords(b.Rec.Dirty).And(s.bits)
				if claimed.And(linebits.FromWords(b.Rec.Zero)) != claimed.And(zero) {
					return true
				}
				if t.st.staleUnits(slot, claimed, b.Rec.Loc) {
					return true
				}
			}
		}
	}
	return false
}

// span is the part of a line a request touches, as blocks.
type span struct {
	line uint64
	bits lineBits
}

// invalidateDurably clears the given blocks and commits that before returning (with sync, also
// across power loss). Lines with nothing cached and no change uncommitted need no commit, nor lines
// whose stored record already claims none of the blocks.
//
// What it commits also leaves out the line's other clean blocks (in memory they stay valid): the
// next write to any of them until the next checkpoint, which stores the line whole again, then
// needs no commit. A clean block is on the backend too, so a restart only reads it from there
// again. Writes spread over a clean cache (after a flush) cost a commit per line and checkpoint
// rather than one per write (bench writeback's 4K random write and 8K 80/20 rows measure it).
func (j *journal) invalidateDurably(spans []span, sync bool) error {
	j.commitMu.RLock()
	defer j.commitMu.RUnlock()
	t := j.t
	var ops []meta.Op
	var before []storedBefore
	t.mu.Lock()
	for _, s := range spans {
		if slot, ok := t.setAside[s.line]; ok {
			// A line set aside by a bypass keeps its stored record for the tier's return: the
			// record goes now, as the line does (a heal or restart must not find the old data).
			delete(t.setAside, s.line)
			t.releaseWhenUnpinnedLocked(slot)
			del := deleteOp(s.line)
			j.record(del)
			j.invalidatedSinceSnapshot[s.line] = linebits.Range(0, t.blocks)
			before = append(before, j.committingLocked(del, slot))
			ops = append(ops, del)
			continue
		}
		uncommitted := j.uncommittedLocked(s.line)
		storedOp, gone, claims := j.storedWithoutLocked(s.line, s.bits)
		claims = claims || !uncommitted
		op, invalidated := t.invalidateLocked(s.line, s.bits)
		switch {
		case !uncommitted && !invalidated:
			continue // the store's record, if any, already has these blocks invalid
		case uncommitted:
			// The line changed since the last checkpoint: its record in memory may call blocks
			// valid whose data is not on the SSD for sure yet (not flushed), so it cannot be
			// committed now. The stored record without these blocks can: it claims nothing the
			// store did not, and keeps the dirty blocks it finds. The next checkpoint, after a
			// flush, stores the line as it is.
			j.record(op)
			op = storedOp
		default:
			// Committed without its clean blocks below, the stored record is no longer the one
			// in memory: changed, the line keeps what the store holds in stored, and the next
			// checkpoint stores it whole.
			j.record(op)
		}
		// A checkpoint under way must not commit these blocks valid again after this.
		j.invalidatedSinceSnapshot[s.line] = j.invalidatedSinceSnapshot[s.line].Or(gone)
		if !claims {
			continue
		}
		op = j.without(op, t.cleanLocked(s.line))
		slot, _ := t.slotOf(s.line)
		before = append(before, j.committingLocked(op, slot))
		ops = append(ops, op)
	}
	t.mu.Unlock()
	for i := range ops {
		ops[i].Invalidates = true
	}
	if len(ops) == 0 {
		if sync {
			// Nothing new to commit, but an earlier invalidation of these blocks may have been
			// committed without a sync: a FUA write must not rely on it surviving power loss.
			return j.store.Sync()
		}
		return nil
	}
	// No checkpoint commits these records: if the commit fails, only a retry can still land them.
	// Each claims no more than the store did, so they may land in parts (a request over many lines).
	err := meta.CommitParts(j.store, ops, sync, nil)
	if err != nil {
		err = meta.CommitParts(j.store, ops, sync, nil)
	}
	if err != nil {
		j.uncommit(before)
		return err
	}
	if !sync {
		j.unsynced.Add(1)
	}
	return nil
}

// syncInvalidations makes the invalidations committed without a sync survive power loss, before
// a write back sends to the backend what replaced the blocks they invalidated. Until then a power
// cut may bring back a stored record calling the older bytes on the SSD clean, while the backend
// holds the newer ones: the tier would serve the older bytes until it evicted the line, and then
// the newer (TestCrashRestart's write-back cases after power loss, TestWriteBackPowerCut).
func (j *journal) syncInvalidations() error {
	n := j.unsynced.Load()
	if n == 0 {
		return nil
	}
	if err := j.store.Sync(); err != nil {
		return err
	}
	// Commits counted after the load may have landed after the sync began: they stay counted.
	j.unsynced.Add(-n)
	return nil
}
