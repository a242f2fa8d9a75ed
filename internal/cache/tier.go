package cache

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/accessbuf"
	"github.com/tierblk/tierblk/internal/congestion"
	"github.com/tierblk/tierblk/internal/keyindex"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/pkg/backend"
)

// tier is one level of the cache: a fixed number of slots, each holding one line, an index from line
// number to slot, the valid bits of every slot, and the policies that choose what stays. Where a
// slot's blocks are (RAM, the SSD's slots, the packed log) is its store's business (store.go).
//
// Slots are pinned while their data is read or written without the tier's mutex, so that an
// eviction racing with that I/O never hands the slot to another line before the I/O is done.
type tier struct {
	name     string
	lineSize int64
	blocks   int
	slots    int
	st       store             // where the slots' blocks are: RAM, the SSD's slots or its packed log
	dev      backend.Backend   // SSD tier: the device st keeps the blocks on; nil for RAM
	j        *journal          // SSD tier: persistence of the index; nil for RAM
	cong     *congestion.Check // SSD tier on a device the kernel times; nil otherwise
	log      *slog.Logger

	// Checksums (SSD tier, sum.go): sums holds a sum for each block of each slot (by slot*blocks
	// + block; meaningful for valid blocks that are not zero blocks), size is the backend's size
	// (its last block may be short), inplace orders writes in place before a checkpoint's
	// snapshot, sumErrs counts the blocks that failed their sums, and onDamage (set by the
	// cache) deals with such blocks of line: a clean one is dropped, a dirty one lost.
	sums     []atomic.Uint32
	size     int64
	inplace  sync.RWMutex // guards no field; shared by writes in place, alone by checkpointLocked
	sumErrs  atomic.Uint64
	adopt    []atomic.Uint64 // see sum.go, "Adopted blocks"
	adopting atomic.Bool
	adopted  atomic.Uint64
	onDamage func(line uint64, slot uint32, bits lineBits)
	// recheck has the cache check line's blocks under its lock, soon (reclaim found a unit of it
	// damaged, holding no line lock).
	recheck func(line uint64)

	// mu guards the tier's state: the fields from here to setAside but the atomics, the journal's
	// maps and run log (changed, snapshot, stored, invalidatedSinceSnapshot, freeAfterCommit,
	// resummed, log), and a packed tier's locs, refs, dead, stored, hot, gen, fresh and dedupe
	// table. RAM-tier hits take it shared (readHit) and leave their accesses in recent for the next
	// holder of it exclusively to give the eviction policy; everything else takes it exclusively.
	// Only packed.mu, the access stripes' mutexes and journal.healMu are taken under it (the
	// package doc has the order); the RAM tier's and the SSD tier's are never held together.
	mu      sync.RWMutex
	recent  accessbuf.Buffer
	index   keyindex.Index // line -> slot
	valid   bitTable
	free    []uint32        // released slots
	fresh   int             // slots [fresh, slots) were never used: no free-list entry needed for them
	pins    []int32         // by slot: I/O in flight (a slice: pinning is on every request's path)
	zombies map[uint32]bool // slots evicted while pinned, released at the last unpin
	evict   policy.Eviction
	admit   policy.Admission
	// hitsTold is the count of hits the admission policy has heard of (policy.HitObserver).
	hitsTold uint64
	victims  []uint64 // lines the current Insert evicted

	// Write-back (SSD tier): which blocks hold data the backend does not have. A dirty line is
	// never dropped: when the policy evicts one it is doomed, and leaves once destaged.
	lines       uint64 // the backend's size in lines; 0 for a tier that tracks none (RAM)
	dirty       bitTable
	dirtyLines  int
	dirtyBlocks int
	dset        lineSet
	doomed      map[uint64]bool
	// doomedWake tells the destager a line was doomed (called with mu held; must not block).
	doomedWake func()
	dirtyCount atomic.Int64 // dirtyLines, readable without the mutex
	// ep is the dirty blocks' epochs in FLUSH order (epoch.go); nil in address order.
	ep *epochs

	// Data reduction (SSD tier, zero.go): zero marks the valid blocks that hold zeros and were not
	// written to the slot; reduce says whether new ones are made (Config.Reduction). validBlocks
	// and zeroBlocks count the set bits of valid and zero, for the stats.
	zero        bitTable
	reduction   Reduction
	reduce      bool
	validBlocks int
	zeroBlocks  int
	// snaps are the dirty data that the flushes under way write back (FlushAll): setLocked takes
	// from each the blocks it marks clean.
	snaps []*dirtySnap

	policyName, admissionName string

	// While the tier is bypassed (failed), its clean lines are set aside rather than dropped: out
	// of the index, their slots held and their records kept in the store, so that the tier comes
	// back warm (journal.heal) and a restart finds them. A change to one deletes its record first.
	setAside map[uint64]uint32 // line -> slot; SSD tier only

	failed     atomic.Bool
	reason     atomic.Pointer[string]
	recentErrs atomic.Uint64 // I/O errors since the tier last came into service
	bypasses   atomic.Uint64
	heals      atomic.Uint64
	errs       atomic.Uint64
	hits       atomic.Uint64
	misses     atomic.Uint64
	hitBytes   atomic.Uint64
	promotions atomic.Uint64
	admitted   atomic.Uint64
	rejected   atomic.Uint64
	evictions  atomic.Uint64
	invalids   atomic.Uint64
}

// tierSpec says how to build a tier.
type tierSpec struct {
	name      string
	slots     int
	lineSize  int64
	policy    string
	admission string
	reserve   int // slots kept out of the policy's capacity, see journal
	// lines is the backend's size in lines: a tier that can hold dirty data (the SSD) tracks
	// dirty lines by number, to write them back in address order, and keeps zero bits. 0 for a
	// tier without.
	lines uint64
	// reduction is what the tier stores no more of (a tier with lines only).
	reduction Reduction
	// size is the backend's size in bytes (a tier with lines only).
	size int64
}

func newTier(s tierSpec, log *slog.Logger) (*tier, error) {
	t := &tier{
		name:          s.name,
		lineSize:      s.lineSize,
		blocks:        int(s.lineSize / blockSize),
		slots:         s.slots,
		log:           log,
		index:         keyindex.New(s.slots, true),
		valid:         linebits.NewTable(s.slots, int(s.lineSize/blockSize)),
		pins:          make([]int32, s.slots),
		zombies:       map[uint32]bool{},
		policyName:    s.policy,
		admissionName: s.admission,
	}
	if s.lines > 0 {
		t.lines = s.lines
		t.dirty = linebits.NewTable(s.slots, t.blocks)
		t.zero = linebits.NewTable(s.slots, t.blocks)
		t.reduction = s.reduction
		t.reduce = s.reduction >= ReductionZero
		t.dset = linebits.NewSet(s.lines)
		t.doomed = map[uint64]bool{}
		t.setAside = map[uint64]uint32{}
		t.sums = make([]atomic.Uint32, s.slots*t.blocks)
		t.size = s.size
	}
	var err error
	t.evict, err = policy.NewEviction(s.policy, policy.Config{
		Capacity:    s.slots - s.reserve,
		Preallocate: true,
		OnEvict:     func(k policy.Key) { t.victims = append(t.victims, uint64(k)) },
	})
	if err != nil {
		return nil, fmt.Errorf("%s tier: %w", s.name, err)
	}
	if t.admit, err = policy.NewAdmission(s.admission); err != nil {
		return nil, fmt.Errorf("%s tier: %w", s.name, err)
	}
	return t, nil
}

// usable reports whether the tier may be used: it exists and has not been bypassed.
func (t *tier) usable() bool { return t != nil && !t.failed.Load() }

// lookup returns the slot of line, pinned, with its valid and zero bits, if the line is cached and
// valid over need. A hit updates the eviction policy. The pinned slot keeps those blocks' data even
// if the line is evicted meanwhile, and the bits stay true of that data while the caller holds the
// line's lock.
func (t *tier) lookup(line uint64, need lineBits) grant {
	g := t.lookupHit(line, need)
	if !g.ok {
		t.misses.Add(1)
	}
	return g
}

// lookupHit is lookup for a caller that goes elsewhere on a miss without counting it.
func (t *tier) lookupHit(line uint64, need lineBits) grant {
	t.mu.Lock()
	defer t.mu.Unlock()
	slot, ok := t.slotOf(line)
	if !ok || !t.valid.Get(slot).Covers(need) {
		return grant{}
	}
	t.evict.Get(policy.Key(line))
	t.pins[slot]++
	t.hits.Add(1)
	t.st.hitLocked(slot)
	return grant{slot: slot, valid: t.valid.Get(slot), zero: t.zeroAt(slot), ok: true}
}

// holds reports whether the tier holds the blocks need of line, counting nothing.
func (t *tier) holds(line uint64, need lineBits) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	slot, ok := t.slotOf(line)
	return ok && t.valid.Get(slot).Covers(need)
}

// readHit copies a RAM tier hit into dst (the line's bytes from off). It holds the tier's mutex
// shared, so that hits on every core copy at once; eviction, which needs it exclusively, waits for
// the copy. The access reaches the eviction policy later (accessbuf.Buffer).
func (t *tier) readHit(line uint64, need lineBits, dst []byte, off int64) bool {
	if !t.copyHit(line, need, dst, off) {
		t.misses.Add(1)
		return false
	}
	return true
}

// copyHit is readHit, counting nothing where the tier does not hold the blocks.
func (t *tier) copyHit(line uint64, need lineBits, dst []byte, off int64) bool {
	t.mu.RLock()
	slot, ok := t.slotOf(line)
	if !ok || !t.valid.Get(slot).Covers(need) {
		t.mu.RUnlock()
		return false
	}
	_ = t.st.read(line, slot, dst, off, false) // RAM: nothing to fail
	full := t.recent.Record(line)
	t.mu.RUnlock()
	t.hits.Add(1)
	t.hitBytes.Add(uint64(len(dst)))
	if full && t.mu.TryLock() {
		t.applyHitsLocked()
		t.mu.Unlock()
	}
	return true
}

// ramSlot returns the bytes of slot of the RAM tier, for a promotion that reads the SSD tier
// straight into them.
func (t *tier) ramSlot(slot uint32) []byte { return t.st.(*ramStore).slot(slot) }

// applyHitsLocked gives the eviction policy the hits recorded since the last call. A line evicted
// meanwhile is no longer the policy's: its access is ignored.
func (t *tier) applyHitsLocked() {
	t.recent.Drain(func(line uint64) { t.evict.Get(policy.Key(line)) })
}

// pin returns the slot of line, pinned, with its valid and zero bits, if the line is cached (even
// partly). It does not count as an access.
func (t *tier) pin(line uint64) grant {
	t.mu.Lock()
	defer t.mu.Unlock()
	slot, ok := t.slotOf(line)
	if !ok {
		return grant{}
	}
	t.pins[slot]++
	return grant{slot: slot, valid: t.valid.Get(slot), zero: t.zeroAt(slot), ok: true}
}

// bits returns the valid and dirty bits of line, zero if it is not cached.
func (t *tier) bits(line uint64) (valid, dirty lineBits) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot, ok := t.slotOf(line); ok {
		return t.valid.Get(slot), t.dirtyAt(slot)
	}
	return lineBits{}, lineBits{}
}

// cleanLocked returns the blocks of line that are valid and not dirty.
func (t *tier) cleanLocked(line uint64) lineBits {
	slot, ok := t.slotOf(line)
	if !ok {
		return lineBits{}
	}
	return t.valid.Get(slot).AndNot(t.dirtyAt(slot))
}

// admits asks the admission policy about a missed line, after telling it of the hits since it was
// last asked if it wants to know (policy.HitObserver); a congested tier refuses a read's miss first
// (a write-through write of a new line is no miss: what was just written is likely read soon).
func (t *tier) admits(a policy.Access) bool {
	if !a.Write && t.cong.Refuse() {
		t.rejected.Add(1)
		return false
	}
	t.mu.Lock()
	if o, ok := t.admit.(policy.HitObserver); ok {
		hits := t.hits.Load()
		o.ObserveHits(hits - t.hitsTold)
		t.hitsTold = hits
	}
	ok := t.admit.Admit(a)
	t.mu.Unlock()
	if ok {
		t.admitted.Add(1)
	} else {
		t.rejected.Add(1)
	}
	return ok
}

// dirtyAt returns the dirty bits of slot (none on a tier without write-back).
func (t *tier) dirtyAt(slot uint32) lineBits {
	if t.dirty.IsNil() {
		return lineBits{}
	}
	return t.dirty.Get(slot)
}
