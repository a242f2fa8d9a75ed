// Package cache is tierblk's tiered cache engine: it sits between a volume and a backend, and is a
// backend itself. Reads look up the RAM tier, then the SSD tier, then the backend; a miss brings
// what package fetch says (the blocks it touches; to the line's end for a sequential reader) into
// the tiers whose admission policy takes the line, and their eviction policies choose what leaves.
// Lines (4 KiB to 1 MiB) carry one valid bit per 4 KiB block, so neither a partial write nor a
// partial fill needs a read of the rest of the line from the backend.
//
// The engine must never return data older than a write acknowledged before the read was issued,
// whatever races with it (another connection, promotion, eviction), never lets a crash make the
// SSD tier's metadata call stale data valid (see journal), and, with a run log, never loses a write
// it acknowledged to a kill of the process (journal_runlog.go). Every request locks the lines it
// touches, in order, which also makes concurrent misses on one line fetch it once. A tier whose storage keeps
// failing is bypassed, never trusted; reads then go on from the backend.
//
// # Locks
//
// Each mutex says in its comment what it guards. Where a goroutine holds two at once it took them
// in this order, and never takes one while it holds one later in the list:
//
//  1. writeBack.mu, in admitDirty, where a write-back write waits (writeBack.cond) for room below
//     the maximum of dirty lines: let go before anything below is taken, and nothing is taken
//     under it. The destager, which makes that room, needs line locks.
//  2. writeBack.modeMu: shared by a write-back write until its lines are dirty, alone by SetMode.
//  3. epochs.takers, by a write back in FLUSH order (destageNextOrdered), which takes line
//     locks under it and, for a closed epoch, lets go of them and takes them again.
//  4. Line locks (linelock.Locks), in ascending line order; a shard's mutex only to find a line's
//     lock, never while waiting for one. ReadAtAsync and ReadAtOn only try them, and an
//     asynchronous read lets its line go on the goroutine that ends it.
//  5. destageBudget (a semaphore), by a write back, under its lines' locks (or with them let go:
//     destageOnce).
//  6. lostSet.mu, then journal.sbMu (the lost ranges live in the superblock): nothing but the
//     metadata store is used under them.
//  7. journal.checkpointMu: checkpoints, heal and makeRoom's reclaim. Writers and the destager
//     wait for it under their line locks (for a slot, room, a FUA write, settled claims), so its
//     holder never waits for a line lock, a writer or the items above.
//  8. journal.commitMu (invalidations shared, a checkpoint's commit and heal alone) and
//     tier.inplace (writes in place shared, a checkpoint's snapshot alone); never held together.
//  9. packed.io: shared by reads of units (an asynchronous read until it ends) and by reclaim,
//     alone by packed.releaseUnits, which frees room.
//  10. The mutex of fetch.Streams, under which readMiss asks the tiers' admission policies.
//  11. tier.mu, of one tier at a time: the RAM tier's and the SSD tier's are never held together.
//  12. Under tier.mu: packed.mu, the access buffer's stripe mutexes (accessbuf.Buffer),
//     journal.healMu and the run log's append.
//
// The mutexes of the destage rate (ratemeter.Meter) and of congestion.Check (only tried),
// logLimit.mu and writeRuns' mutex are leaves: nothing is taken under them. No goroutine takes an
// RWMutex shared while it holds it shared already (a waiting writer would stop the second), and a
// goroutine that reaps its own reads (a ublk queue's loop, ReadAtOn) only tries a line lock or
// packed.io while one of its reads holds it.
package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/tierblk/tierblk/internal/fetch"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/linelock"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
)

// blockSize is the unit of the valid and dirty bits: a write that covers whole 4 KiB blocks never
// needs a read from the backend. A line has at most linebits.MaxBlocks of them.
const blockSize = fetch.BlockSize

// The engine's names for linebits' types: the bits of a line's blocks (valid, dirty, zero), a
// tier's table of them by slot, and the set of dirty lines the destager walks.
type (
	lineBits = linebits.Bits
	bitTable = linebits.Table
	lineSet  = linebits.Set
)

// Mode is how writes treat the cache.
type Mode int

const (
	// WriteThrough writes the backend and the cache; a write completes when both have it.
	WriteThrough Mode = iota
	// WriteAround writes only the backend and drops the cached copy of what it wrote.
	WriteAround
	// PassThrough sends everything to the backend; writes still drop cached copies, so that the
	// cache is not stale when another mode is used again.
	PassThrough
	// WriteBack writes to the SSD tier only; the destager writes dirty data back to the backend
	// later. A FLUSH or FUA makes it durable on the SSD with the metadata that finds it.
	WriteBack
)

var modeNames = []string{"writethrough", "writearound", "passthrough", "writeback"}

func (m Mode) String() string { return modeNames[m] }

// ParseMode parses a mode name.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown cache mode %q; use writethrough, writearound, passthrough or writeback", s)
}

// DefaultPolicy is the tiers' eviction policy unless the config names one: S3-FIFO, whose small
// FIFO queue lets a line read once (a random scan over the whole disk, a backup) leave without
// pushing out the lines in its main queue. On the repository's real traces it misses less than LRU
// at 10 % and 20 % of their lines, with 4 KiB and 64 KiB lines; n-hit admission, the other way to
// keep such lines out, missed more on both (docs/cache-policy.md).
const DefaultPolicy = "s3fifo"

// DefaultAdmission is the tiers' admission unless the config names one: every miss while the
// tier's hits pay for storing lines, only lines missed twice while they do not (policy.Auto).
// Storing a line costs CPU (on the SSD tier a write, a record and a flush; in RAM a copy and an
// eviction) that a cold random workload pays for nothing (bench cold's 50/50 row measures it;
// docs/cache-policy.md has the comparison).
const DefaultAdmission = "auto"

// Line sizes.
const (
	DefaultLineSize = 64 << 10
	MinLineSize     = blockSize
	MaxLineSize     = 1 << 20
)

// TierConfig configures one tier.
type TierConfig struct {
	Size      int64  // bytes; 0: no such tier
	Policy    string // eviction policy name (see package policy); default DefaultPolicy
	Admission string // admission policy spec; default DefaultAdmission
}

// Config configures a cache.
type Config struct {
	LineSize int64 // default DefaultLineSize
	Mode     Mode
	RAM      TierConfig
	SSD      TierConfig
	// SSDDevice holds the SSD tier's lines (a file or block device, opened for direct I/O); the
	// cache owns it. Meta, required with it, holds the SSD tier's index; the cache owns it too.
	SSDDevice backend.Backend
	Meta      meta.Store
	// Congestion is the SSD tier's congestion threshold: while its device's requests take longer
	// than this on average, and longer than the backend's reads, it admits no missed line.
	// 0: DefaultCongestion; negative: never congested.
	Congestion time.Duration
	// BackendID identifies the backend in the superblock (its URL), so that an SSD tier is never
	// used in front of another backend.
	BackendID string
	// RunLog is the SSD tier's run log, a file on tmpfs (/run) that keeps the index records
	// written since the last checkpoint across a kill of the process (internal/runlog); empty:
	// none, and a kill loses those records (and in write-back the writes they find).
	RunLog string
	// WriteBack tunes write-back (zero: DefaultWriteBack).
	WriteBack WriteBackConfig
	// Reduction is what the SSD tier stores no more of (zero.go); the zero value stores
	// everything as it is.
	Reduction Reduction
	// ReductionDefault says Reduction is DefaultReduction, not chosen: an SSD tier stored in the
	// other layout keeps its own (reduction zero for the slot layout, compress for the packed one)
	// rather than being refused, so that a tier made before the default changed still starts.
	ReductionDefault bool
	Log              *slog.Logger
}

// ErrMismatch: the SSD tier's metadata was written for another backend or layout. It is refused,
// never reused: its lines would be another disk's data.
var ErrMismatch = errors.New("the SSD tier holds a cache made for another setup")

// ErrCorrupt is wrapped by New's error when the SSD tier's metadata holds a record that cannot be
// true (a slot out of range or used twice, a line beyond the backend).
var ErrCorrupt = errors.New("metadata is corrupt")

// Cache is a backend.Backend that caches another. Concurrent calls are safe.
type Cache struct {
	b     backend.Backend
	size  int64
	line  int64
	mode  atomic.Int32 // a Mode; SetMode changes it while requests run
	wb    *writeBack   // with an SSD tier
	bg    *background  // with an SSD tier: the checkpoint loop and the destager
	ram   *tier
	ssd   *tier
	locks linelock.Locks
	log   *slog.Logger
	trim  backend.Trimmer
	zero  backend.ZeroWriter
	// ssdAsync is the SSD tier's device when it reads asynchronously (ReadAtAsync), ssdRing when
	// it reads on a caller's ring (ReadAtOn).
	ssdAsync backend.AsyncReader
	ssdRing  backend.RingReader
	// backAsync is the backend where it reads asynchronously (an NBD export, an iSCSI LUN, a file
	// read direct through its ring: file.Open gives one without a ring no such method), and
	// backRing where it reads on a caller's ring (a file read direct): the misses missAsync takes
	// on. filling counts those whose fills have not ended, which Close waits for. runners runs
	// their fills, and the destager's writes.
	backAsync backend.AsyncReader
	backRing  backend.RingReader
	filling   sync.WaitGroup
	runners   *runners
	closed    atomic.Bool
	// lastRun is nil when the start found every index record the SSD tier's last run wrote (its
	// run log replayed), else why not; see Recovered.
	lastRun error

	backendStats ioCounters
	// destageBudget bounds the destage writes under way across all their callers (the destager,
	// a flush, the writes that destage the lines they touch or evict): their bytes to
	// destageBytesInFlight, so that their buffers stay within MemoryPlan's share, and their number
	// to destageWritesInFlight (destageWeight).
	destageBudget *semaphore.Weighted
	// streams follows sequential readers, whose misses fetch on to their line's end.
	streams fetch.Streams
	// asked counts the bytes clients read; fetched the bytes read misses fetched from the backend
	// (their ratio is the read amplification).
	asked, fetched atomic.Uint64
	// backendChanges counts the foreground changes sent to the backend (writes, trims, zeroing,
	// failed or not): a checkpoint flushes the backend only when it has some it has not flushed.
	backendChanges atomic.Uint64
	readLat        histogram
	writeLat       histogram
	// lost holds the ranges whose dirty data the SSD tier damaged (lost.go); lostBlocks counts
	// the blocks lost so; scrub is the SSD tier's scrub (check.go).
	lost       lostSet
	lostBlocks atomic.Uint64
	scrub      scrubState
	// repairs counts the damaged dirty blocks written again from the RAM tier's copy or from
	// repairFrom (SetRepairSource); damageLog limits the log lines about damaged blocks.
	repairs    atomic.Uint64
	repairFrom atomic.Pointer[RepairSource]
	damageLog  logLimit
}

// New builds a cache in front of b, which it owns from then on (Close closes it). With an SSD tier
// it checks the metadata's superblock against b and cfg and loads the index: the tier is warm.
func New(b backend.Backend, cfg Config) (*Cache, error) {
	if cfg.LineSize == 0 {
		cfg.LineSize = DefaultLineSize
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Cache{b: b, size: b.Size(), line: cfg.LineSize, log: cfg.Log, destageBudget: semaphore.NewWeighted(destageBytesInFlight)}
	c.mode.Store(int32(cfg.Mode))
	c.trim, _ = b.(backend.Trimmer)
	c.zero, _ = b.(backend.ZeroWriter)
	c.backAsync, _ = b.(backend.AsyncReader)
	c.backRing, _ = b.(backend.RingReader)
	c.runners = newRunners()
	var err error
	if cfg.RAM.Size > 0 {
		if c.ram, err = newTier(c.spec("ram", cfg.RAM, 0), c.log); err != nil {
			return nil, err
		}
		c.ram.st = newRAMStore(c.ram.slots, c.line)
	}
	if cfg.SSDDevice != nil {
		if err := c.openSSD(cfg); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (cfg *Config) validate() error {
	l := cfg.LineSize
	if l < MinLineSize || l > MaxLineSize || l&(l-1) != 0 {
		return fmt.Errorf("line size %d: use a power of two from 4KiB to 1MiB", l)
	}
	if cfg.RAM.Size != 0 && cfg.RAM.Size < l {
		return fmt.Errorf("RAM tier size %d is smaller than one line (%d); use 0 for no RAM tier", cfg.RAM.Size, l)
	}
	if cfg.Reduction < ReductionOff || int(cfg.Reduction) >= len(reductionNames) {
		return fmt.Errorf("reduction %d: use ReductionOff, ReductionZero, ReductionCompress or ReductionDedupe", cfg.Reduction)
	}
	if cfg.Mode == WriteBack && cfg.SSDDevice == nil {
		return errors.New("write-back needs an SSD tier: the RAM tier may never hold the only copy of written data")
	}
	if cfg.SSDDevice != nil {
		if cfg.Meta == nil {
			return errors.New("an SSD tier needs a metadata store")
		}
		if cfg.SSD.Size == 0 {
			cfg.SSD.Size = cfg.SSDDevice.Size()
		}
		if cfg.SSD.Size < 2*l || cfg.SSD.Size > cfg.SSDDevice.Size() {
			return fmt.Errorf("SSD tier size %d: use at least two lines (%d) and at most the SSD's size (%d)",
				cfg.SSD.Size, 2*l, cfg.SSDDevice.Size())
		}
		if cfg.SSD.Size/l > 1<<31-1 {
			return fmt.Errorf("SSD tier size %d needs more than 2^31 lines; use a larger line size", cfg.SSD.Size)
		}
	}
	return nil
}

func (c *Cache) spec(name string, tc TierConfig, reserve int) tierSpec {
	s := tierSpec{name: name, slots: int(tc.Size / c.line), lineSize: c.line, policy: tc.Policy,
		admission: tc.Admission, reserve: reserve}
	if s.policy == "" {
		s.policy = DefaultPolicy
	}
	if s.admission == "" {
		s.admission = DefaultAdmission
	}
	return s
}

// Recovered returns nil when the start found every index record that the SSD tier's last run
// wrote, however it ended (its run log, Config.RunLog, replayed): then every write that run
// acknowledged reads back, as before a kill -9, and a kernel device that outlived the run may be
// taken over. Otherwise it says why not (no log, another tier's, records lost); a cache without an
// SSD tier holds nothing to recover, and returns nil.
func (c *Cache) Recovered() error {
	if c.ssd == nil {
		return nil
	}
	return c.lastRun
}

// Size implements backend.Backend.
func (c *Cache) Size() int64 { return c.size }

// Waits implements backend.Waiter: the backend's requests that waited and the SSD tier's.
func (c *Cache) Waits() uint64 {
	n := backend.WaitsOf(c.b)
	if c.ssd != nil {
		n += backend.WaitsOf(c.ssd.dev)
	}
	return n
}

// ReadOnly reports whether the backend is read-only.
func (c *Cache) ReadOnly() bool {
	r, ok := c.b.(backend.ReadOnlyReporter)
	return ok && r.ReadOnly()
}

// Flush implements backend.Backend: the backend flushes, and with an SSD tier a checkpoint does it
// (write-through data on the SSD must not be older than what a FLUSH made durable).
func (c *Cache) Flush() error { return c.flush(true) }

// flush is Flush; FlushAll, which has written back the dirty data a bypassed tier's Flush needs on
// the backend, calls it with drain false, not to write back the data dirtied since.
func (c *Cache) flush(drain bool) error {
	if c.closed.Load() {
		return backend.ErrClosed
	}
	if c.ordered() {
		c.ssd.ep.next() // writes from now on are of the next epoch
		c.wb.kick()     // which the destager may write back now (closedEpochsPending)
	}
	if !c.ssd.usable() {
		if c.ssd == nil {
			return c.b.Flush()
		}
		if drain && c.ssd.dirtyCount.Load() > 0 {
			// A bypassed tier's records of dirty data may never be committed: that data is
			// durable only once written back to the backend (FlushAll ends here again).
			return c.FlushAll(context.Background(), nil)
		}
		if err := c.b.Flush(); err != nil {
			return err
		}
		// The bypass keeps the records of the lines it set aside; the writes since deleted the
		// records of those they changed, without a sync: the sync makes that survive power loss.
		return c.ssd.j.store.Sync()
	}
	backendErr, tierErr := c.ssd.j.checkpoint()
	if tierErr != nil {
		c.ssd.fail(tierErr.Error())
		if backendErr == nil {
			backendErr = c.flush(drain) // the bypassed tier's way, above
		}
	}
	return backendErr
}

// Heal tries at once to bring a bypassed SSD tier back into service (it is otherwise tried with
// backoff); it returns why the tier stays bypassed, or nil if the tier is in service.
func (c *Cache) Heal() error {
	if c.ssd == nil {
		return errors.New("this cache has no SSD tier")
	}
	if err := c.ssd.j.heal(); err != nil {
		c.ssd.j.healFailed()
		return fmt.Errorf("the SSD tier stays bypassed: %w", err)
	}
	return nil
}

// Close writes the SSD tier's index and closes the SSD, the metadata and the backend.
func (c *Cache) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.filling.Wait()
	c.runners.close()
	var errs []error
	backendOpen := true
	if c.ssd != nil {
		// Dirty data stays on the SSD for the next start: no destage here.
		c.wb.mu.Lock()
		c.wb.closed = true
		c.wb.mu.Unlock()
		c.wb.cond.Broadcast()
		if !c.bg.halt() {
			// A destage or checkpoint is waiting for a backend that does not answer (an NBD
			// disk waits a minute for its server to come back): closing the backend fails it,
			// and what it was writing back stays dirty on the SSD.
			c.log.Warn("cache: the backend is not answering; closing it to stop; dirty data stays on the SSD tier",
				"waited", c.bg.grace)
			errs = append(errs, c.b.Close())
			backendOpen = false
			c.bg.wait()
		}
		if !c.ssd.failed.Load() {
			c.ssd.j.recordResummed()
			backendErr, tierErr := c.ssd.j.checkpoint()
			errs = append(errs, backendErr, tierErr)
			if backendErr == nil && tierErr == nil {
				errs = append(errs, c.ssd.j.closed())
			}
		}
		errs = append(errs, c.ssd.j.closeLog(), c.ssd.j.store.Close(), c.ssd.dev.Close())
	}
	if backendOpen {
		errs = append(errs, c.b.Close())
	}
	return errors.Join(errs...)
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	s := Stats{Mode: c.Mode().String(), LineSize: int(c.line), Backend: c.backendStats.snapshot(),
		ReadLatency: c.readLat.snapshot(), WriteLatency: c.writeLat.snapshot(), Dirty: c.dirtyStats(),
		ReadBytes: c.asked.Load(), FetchedBytes: c.fetched.Load(), Scrub: c.scrub.stats()}
	for _, r := range c.lost.list() {
		s.Lost.Bytes += uint64(r.Len)
		if len(s.Lost.Ranges) < maxLostListed {
			s.Lost.Ranges = append(s.Lost.Ranges, r)
		}
	}
	s.Lost.Blocks = c.lostBlocks.Load()
	s.Lost.Repaired = c.repairs.Load()
	for _, t := range []*tier{c.ram, c.ssd} {
		if t != nil {
			s.Tiers = append(s.Tiers, t.stats())
		}
	}
	return s
}
