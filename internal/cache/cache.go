// Package cache is tierblk's tiered cache engine: it sits between a volume and a backend, and is a
// backend itself. Reads look up the RAM tier, then the SSD tier, then the backend; a miss brings the
// whole line into the tiers whose admission policy takes it, and their eviction policies choose what
// leaves. Lines (4 KiB to 1 MiB) carry one valid bit per 4 KiB block, so a partial write never needs
// a read from the backend.
//
// The engine must never return data older than a write acknowledged before the read was issued,
// whatever races with it (another connection, promotion, eviction), and never lets a crash make the
// SSD tier's metadata call stale data valid (see journal). Every request locks the lines it touches,
// in order, which also makes concurrent misses on one line fetch it once. A tier whose storage keeps
// failing is bypassed, never trusted; reads then go on from the backend.
package cache

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tierblk/tierblk/internal/fetch"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/pkg/backend"
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
	// WriteBack tunes write-back (zero: DefaultWriteBack).
	WriteBack WriteBackConfig
	Log       *slog.Logger
}

// ErrMismatch: the SSD tier's metadata was written for another backend or layout. It is refused,
// never reused: its lines would be another disk's data.
var ErrMismatch = errors.New("the SSD tier holds a cache made for another setup")

// Cache is a backend.Backend that caches another. Concurrent calls are safe.
type Cache struct {
	b     backend.Backend
	size  int64
	line  int64
	mode  atomic.Int32 // a Mode; SetMode changes it while requests run
	wb    *writeBack   // with an SSD tier
	ram   *tier
	ssd   *tier
	locks lineLocks
	log   *slog.Logger
	trim  backend.Trimmer
	zero  backend.ZeroWriter
	// ssdAsync is the SSD tier's device when it reads asynchronously (ReadAtAsync).
	ssdAsync backend.AsyncReader
	bufs     bufPool
	closed   atomic.Bool

	backendStats ioCounters
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
	c := &Cache{b: b, size: b.Size(), line: cfg.LineSize, log: cfg.Log}
	c.mode.Store(int32(cfg.Mode))
	c.trim, _ = b.(backend.Trimmer)
	c.zero, _ = b.(backend.ZeroWriter)
	var err error
	if cfg.RAM.Size > 0 {
		if c.ram, err = newTier(c.spec("ram", cfg.RAM, 0), c.log); err != nil {
			return nil, err
		}
		c.ram.ram = alignedAlloc(c.ram.slots * int(c.line))
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

// ssdReserve is how many SSD slots stay out of the policy's capacity, so that evicted slots can
// wait for a checkpoint before reuse without stalling fills: 1/64 of the tier, up to 4096, but on
// a small tier 1/8 of it, up to 256. A checkpoint frees at most the reserve, and a flush of the SSD
// comes with each: a 1 GiB burst through a 64 MiB tier ran 2,500 checkpoints with 1/64 (16 slots)
// and 400 with 128 slots, and went from 220 to 310 MiB/s.
func ssdReserve(slots int) int { return max(1, min(max(slots/64, min(slots/8, 256)), 4096)) }

func (c *Cache) openSSD(cfg Config) error {
	slots := int(cfg.SSD.Size / c.line)
	spec := c.spec("ssd", cfg.SSD, ssdReserve(slots))
	spec.lines = uint64((c.size + c.line - 1) / c.line)
	t, err := newTier(spec, c.log)
	if err != nil {
		return err
	}
	if c.wb, err = newWriteBack(cfg.WriteBack, slots); err != nil {
		return err
	}
	t.dev = cfg.SSDDevice
	t.cong = newCongestion(cfg.SSDDevice, cfg.Congestion)
	c.ssdAsync, _ = cfg.SSDDevice.(backend.AsyncReader)
	t.doomedWake = c.wb.kick
	j := newJournal(t, cfg.Meta, ssdReserve(slots), c.b.Flush, c.backendChanges.Load)
	want := meta.Superblock{Version: meta.FormatVersion, LineSize: uint32(c.line), Backend: cfg.BackendID,
		BackendSize: c.size, Slots: uint32(slots)}
	sb, ok, err := cfg.Meta.Superblock()
	switch {
	case err != nil:
		return fmt.Errorf("SSD tier metadata: %w", err)
	case !ok:
		if err := cfg.Meta.SetSuperblock(want); err != nil {
			return fmt.Errorf("SSD tier metadata: %w", err)
		}
	default:
		if err := sb.Mismatch(want); err != nil {
			return fmt.Errorf("%w: %s", ErrMismatch, strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		if err := j.load(); err != nil {
			return fmt.Errorf("SSD tier: %w", err)
		}
		c.log.Info("SSD tier warm", "lines", t.index.Len(), "slots", slots)
	}
	if t.dirtyLines > 0 {
		c.log.Info("SSD tier holds dirty data from the last run; it will be written back",
			"lines", t.dirtyLines, "mode", c.Mode())
	}
	c.ssd = t
	go j.loop()
	go c.destager()
	return nil
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

// seg is the part of a request that falls in one line.
type seg struct {
	line   uint64
	start  int64 // device offset of the line
	n      int64 // bytes of the line (the last line may be short)
	lo, hi int64 // the request's bytes within the line
	pOff   int64 // where they are in the request's buffer
}

func (s seg) blocks() int { return int((s.n + blockSize - 1) / blockSize) }

// touched are the blocks the request touches; full those it covers entirely.
func (s seg) touched() lineBits {
	return rangeBits(int(s.lo/blockSize), int((s.hi+blockSize-1)/blockSize))
}

func (s seg) full() lineBits {
	end := s.hi / blockSize
	if s.hi == s.n {
		end = int64(s.blocks())
	}
	return rangeBits(int((s.lo+blockSize-1)/blockSize), int(end))
}

// segments splits a request by line, appending to segs (a caller's small array keeps the common
// one-line request from allocating).
func (c *Cache) segments(segs []seg, off, length int64) []seg {
	first, last := off/c.line, (off+length-1)/c.line
	for line := first; line <= last; line++ {
		start := line * c.line
		s := seg{line: uint64(line), start: start, n: min(c.line, c.size-start)}
		s.lo = max(off, start) - start
		s.hi = min(off+length, start+s.n) - start
		s.pOff = start + s.lo - off
		segs = append(segs, s)
	}
	return segs
}

func (c *Cache) lockSegs(segs []seg) {
	c.locks.lock(segs[0].line, segs[len(segs)-1].line)
}

func (c *Cache) unlockSegs(segs []seg) {
	c.locks.unlock(segs[0].line, segs[len(segs)-1].line)
}

// ReadAt implements backend.Backend.
func (c *Cache) ReadAt(p []byte, off int64) (int, error) {
	t0 := time.Now()
	defer func() { c.readLat.observe(time.Since(t0)) }()
	if err := c.read(p, off, false); err != nil {
		return 0, err
	}
	c.asked.Add(uint64(len(p)))
	return len(p), nil
}

// ReadAtAsync implements backend.AsyncReader for the reads the SSD tier serves alone: a request
// within one line, which the RAM tier does not hold and the SSD tier does. Such a read is started
// on the SSD device and ReadAtAsync returns, so that a server keeps no goroutine waiting for each
// SSD-tier hit (bench cache --parts hits); done is called on the device's goroutine. Any other read
// is left to ReadAt (false), as is a line another request holds (without a RAM tier: holds
// exclusively, see lineLocks): the caller must not wait for it.
func (c *Cache) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	if c.ssdAsync == nil || len(p) == 0 || c.check(off, int64(len(p))) != nil || c.Mode() == PassThrough {
		return false
	}
	var segBuf [2]seg
	segs := c.segments(segBuf[:0], off, int64(len(p)))
	if len(segs) != 1 {
		return false
	}
	s := segs[0]
	need := s.touched()
	// A RAM-tier hit, the cheapest read, is left to ReadAt before the line is locked: ReadAt locks
	// it again. Should RAM take the line meanwhile, the SSD tier's copy is as current.
	if c.ram.usable() && c.ram.holds(s.line, need) {
		return false
	}
	// Without a RAM tier to promote into, the read changes nothing but counters: it holds the line
	// shared with other such reads, and two reads of one line do not wait for each other.
	shared := !c.ram.usable()
	unlock := func() { c.unlockSegs(segs) }
	if shared {
		if !c.locks.tryRLock(s.line) {
			return false
		}
		unlock = func() { c.locks.runlock(s.line) }
	} else if !c.locks.tryLock(s.line) {
		return false
	}
	slot, valid, ok := c.ssd.lookupHit(s.line, need)
	if !ok {
		unlock()
		return false
	}
	// From here on the read is this call's: it counts as read does.
	t0 := time.Now()
	if c.wb != nil {
		c.wb.lastIO.Store(t0.UnixNano())
	}
	if c.ram.usable() {
		c.ram.misses.Add(1)
	}
	src := source{t: c.ssd, slot: slot, valid: valid}
	end := func(err error) { // once the line is let go
		if err == nil {
			c.asked.Add(uint64(len(p)))
		}
		c.readLat.observe(time.Since(t0))
		done(err)
	}
	finish := func(err error) { unlock(); end(err) }
	// fallback serves the read from the backend after the SSD tier failed it. A miss fills the
	// tiers: held shared, the line is let go and read locks it again, exclusively.
	fallback := func() {
		if shared {
			unlock()
			end(c.read(p, off, false))
			return
		}
		finish(c.readMiss(segs, p, false))
	}
	if c.ram.usable() && c.ram.admits(c.promotion(s)) && c.promoteAsync(s, src, p, finish) {
		return true
	}
	if c.ssdAsync.ReadAtAsync(p, int64(slot)*c.line+s.lo, func(err error) {
		if err != nil { // as readHit does, off the device's goroutine
			go func() {
				c.ssd.ioError(s.line, slot, err)
				c.ssd.unpin(slot)
				fallback()
			}()
			return
		}
		c.ssd.hitBytes.Add(uint64(len(p)))
		c.ssd.unpin(slot)
		finish(nil)
	}) {
		return true
	}
	// The device would not start it (an unaligned buffer): read's own way, on a goroutine.
	go func() {
		if c.readHit(s, src, p, false) {
			finish(nil)
			return
		}
		fallback()
	}()
	return true
}

// promoteAsync is promote started on the SSD device: the blocks p touches are read into a RAM
// slot, then copied to p, and finish is called. It reports false, having done nothing, where RAM
// has no slot to spare, the blocks to read are not one run or the device will not start the read:
// the caller then reads the SSD tier alone.
func (c *Cache) promoteAsync(s seg, src source, p []byte, finish func(error)) bool {
	g := c.ram.acquire(s.line)
	if !g.ok {
		return false
	}
	slot, missing := g.slot, s.touched().andNot(g.valid)
	runs, lo, hi := 0, int64(0), int64(0)
	missing.runs(s.blocks(), func(b0, b1 int) {
		runs++
		lo, hi = int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
	})
	at := int64(slot) * c.line
	ended := func(err error) {
		if err != nil { // as promote does, off the device's goroutine
			go func() {
				c.ram.unpin(slot)
				c.ssd.ioError(s.line, src.slot, err)
				c.ssd.unpin(src.slot)
				finish(c.readMiss([]seg{s}, p, false))
			}()
			return
		}
		copy(p, c.ram.ram[at+s.lo:])
		c.ram.validate(s.line, slot, missing, false)
		c.ssd.hitBytes.Add(uint64(len(p)))
		c.ssd.unpin(src.slot)
		finish(nil)
	}
	switch {
	case runs == 0: // another request promoted the blocks meanwhile
		ended(nil)
		return true
	case runs == 1 && c.ssdAsync.ReadAtAsync(c.ram.ram[at+lo:at+hi], int64(src.slot)*c.line+lo, ended):
		return true
	}
	c.ram.unpin(slot)
	return false
}

// Prefetch brings a range into the cache, whatever the admission policies say (NBD_CMD_CACHE).
func (c *Cache) Prefetch(off, length int64) error {
	if err := c.check(off, length); err != nil {
		return err
	}
	buf := c.bufs.get(int(min(length, 4<<20)))
	defer c.bufs.put(buf)
	for length > 0 {
		n := min(length, int64(len(buf)))
		if err := c.read(buf[:n], off, true); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// source says where a segment's data comes from.
type source struct {
	t      *tier // nil: the backend
	slot   uint32
	valid  lineBits // the slot's valid blocks at lookup
	served bool     // by the RAM tier, during the lookup
}

// check refuses a request on a closed cache or outside the device.
func (c *Cache) check(off, length int64) error {
	if c.closed.Load() {
		return backend.ErrClosed
	}
	return backend.CheckRange(off, length, c.size)
}

func (c *Cache) read(p []byte, off int64, force bool) error {
	if err := c.check(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	if c.wb != nil {
		c.wb.lastIO.Store(time.Now().UnixNano())
	}
	if c.Mode() == PassThrough && (c.ssd == nil || c.ssd.dirtyCount.Load() == 0) {
		return c.backendRead(p, off)
	}
	var segBuf [2]seg
	var srcBuf [2]source
	segs := c.segments(segBuf[:0], off, int64(len(p)))
	c.lockSegs(segs)
	defer c.unlockSegs(segs)
	src := srcBuf[:0]
	for i, s := range segs {
		src = append(src, source{})
		need := s.touched()
		if c.ram.usable() && c.ram.readHit(s.line, need, p[s.pOff:s.pOff+s.hi-s.lo], s.lo) {
			src[i].served = true
			continue
		}
		if c.ssd != nil { // even bypassed: it may hold dirty data
			if slot, valid, ok := c.ssd.lookup(s.line, need); ok {
				src[i] = source{t: c.ssd, slot: slot, valid: valid}
			}
		}
	}
	c.readHits(segs, src, p, force)
	for i := 0; i < len(segs); {
		if src[i].served {
			i++
			continue
		}
		j := i + 1
		for j < len(segs) && !src[j].served {
			j++
		}
		if err := c.readMiss(segs[i:j], p, force); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// readHits serves the segments the SSD tier holds. Segments whose lines sit in adjacent slots are
// read with one request (a sequential fill stores a run of lines so, see tier.acquireRun), and
// several such runs at once: the device serves them in parallel (bench cache --parts hits, 1M
// reads). Then, if RAM admits them, they are copied into RAM one after the other from what was
// read: promotions at once would pin each other's victims and leave RAM short of full
// (TestCacheAdmin). A single segment promotes as readHit does. A run the SSD fails is read again
// line by line, so that only the lines that fail are dropped; a segment that fails is left to the
// backend: its source is cleared.
func (c *Cache) readHits(segs []seg, src []source, p []byte, force bool) {
	promotes := func(s seg) bool {
		return c.ram.usable() && (force || c.ram.admits(c.promotion(s)))
	}
	hit := func(i int, promote bool) {
		if c.readHit(segs[i], src[i], p, promote) {
			src[i].served = true
		}
		src[i].t = nil // read, or failed: the line goes to the backend
	}
	var runBuf [2][2]int // [first, last] indexes of segments; most requests touch one or two lines
	runs := runBuf[:0]
	hits := 0
	for i := range src {
		if src[i].t == nil {
			continue
		}
		hits++
		if n := len(runs); n > 0 && runs[n-1][1] == i-1 && src[i].slot == src[i-1].slot+1 {
			runs[n-1][1] = i
			continue
		}
		runs = append(runs, [2]int{i, i})
	}
	switch hits {
	case 0:
		return
	case 1:
		i := runs[0][0]
		hit(i, promotes(segs[i]))
		return
	}
	readRun := func(r [2]int) {
		if r[0] == r[1] {
			hit(r[0], false)
			return
		}
		a, b := segs[r[0]], segs[r[1]]
		err := c.ssd.readSlot(src[r[0]].slot, p[a.pOff:b.pOff+b.hi-b.lo], a.lo)
		for i := r[0]; i <= r[1]; i++ {
			if err != nil {
				hit(i, false)
				continue
			}
			c.ssd.unpin(src[i].slot)
			c.ssd.hitBytes.Add(uint64(segs[i].hi - segs[i].lo))
			src[i].served, src[i].t = true, nil
		}
	}
	if len(runs) == 1 {
		readRun(runs[0])
	} else {
		var wg sync.WaitGroup
		for _, r := range runs {
			wg.Go(func() { readRun(r) })
		}
		wg.Wait()
	}
	for _, r := range runs {
		for i := r[0]; i <= r[1]; i++ {
			if s := segs[i]; src[i].served && promotes(s) {
				c.fillTier(c.ram, s, c.ram.acquire(s.line), p[s.pOff:s.pOff+s.hi-s.lo], s.lo, s.full())
			}
		}
	}
}

// readHit serves a segment from the SSD tier, promoting the blocks it reads to RAM if promote is
// set. It reports false if the SSD failed the read (the line is dropped and the caller goes to the
// backend).
func (c *Cache) readHit(s seg, src source, p []byte, promote bool) bool {
	dst := p[s.pOff : s.pOff+s.hi-s.lo]
	t := src.t
	defer t.unpin(src.slot)
	if promote {
		if ok, done := c.promote(s, src, dst); done {
			if ok {
				t.hitBytes.Add(uint64(len(dst)))
			}
			return ok
		}
	}
	if err := t.readSlot(src.slot, dst, s.lo); err != nil {
		t.ioError(s.line, src.slot, err)
		return false
	}
	t.hitBytes.Add(uint64(len(dst)))
	return true
}

// promote copies the blocks a read touches from the SSD slot into the RAM tier, then serves dst
// from there. Only those blocks: a RAM tier smaller than the working set would otherwise read a
// whole line from the SSD for every 4 KiB hit, and evict as much (bench cache --parts hits).
// done is false if RAM had no slot to spare (the caller reads the SSD directly).
func (c *Cache) promote(s seg, src source, dst []byte) (ok, done bool) {
	g := c.ram.acquire(s.line)
	if !g.ok {
		return false, false
	}
	slot, ssdSlot := g.slot, src.slot
	missing := s.touched().andNot(g.valid)
	var err error
	missing.runs(s.blocks(), func(b0, b1 int) {
		if err != nil {
			return
		}
		lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
		ram := c.ram.ram[int64(slot)*c.line+lo : int64(slot)*c.line+hi]
		err = c.ssd.readSlot(ssdSlot, ram, lo)
	})
	if err != nil {
		c.ram.unpin(slot)
		c.ssd.ioError(s.line, ssdSlot, err)
		return false, true
	}
	copy(dst, c.ram.ram[int64(slot)*c.line+s.lo:])
	c.ram.validate(s.line, slot, missing, false)
	return true, true
}

func (c *Cache) access(s seg, write bool) policy.Access {
	return policy.Access{Key: policy.Key(s.line), Offset: s.start + s.lo, Length: s.hi - s.lo, Write: write}
}

// promotion is the access of a read that the SSD tier serves, asking RAM to admit it.
func (c *Cache) promotion(s seg) policy.Access {
	a := c.access(s, false)
	a.Promotion = true
	return a
}

// readMiss fetches a run of adjacent missed segments with one backend read: for a segment that a
// tier admits or already partly holds, what package fetch's rule says; only the requested bytes
// otherwise. Blocks the SSD tier holds are served from it, not from the backend, so
// that every path gives one answer per block: they are never older than the backend, and after a
// power cut they may differ from a backend write that was never flushed. Then it fills the tiers
// with what it fetched.
func (c *Cache) readMiss(segs []seg, p []byte, force bool) error {
	type fill struct {
		ram, ssd bool
		held     source // the SSD tier's partial copy of the line, pinned
		lo, hi   int64  // the bytes of the line fetched
	}
	fills := make([]fill, len(segs))
	cached := func(f fill) bool { return f.ram || f.ssd || f.held.t != nil }
	for i, s := range segs {
		if c.ssd != nil {
			if slot, valid, ok := c.ssd.pin(s.line); ok {
				fills[i].held = source{t: c.ssd, slot: slot, valid: valid}
			}
		}
	}
	defer func() {
		for _, f := range fills {
			if f.held.t != nil {
				f.held.t.unpin(f.held.slot)
			}
		}
	}()
	first, last := segs[0], segs[len(segs)-1]
	var from, to int64
	c.streams.Follow(first.start+first.lo, func(seq bool) int64 {
		for i, s := range segs {
			a := c.access(s, false)
			a.Sequential = seq || int64(len(p)) > c.line // a request of several lines is a sequential run
			fills[i].ssd = c.ssd.usable() && (force || c.ssd.admits(a))
			fills[i].ram = c.ram.usable() && (force || c.ram.admits(a))
		}
		r := fetch.Blocks
		switch {
		case force:
			r = fetch.Line
		case seq:
			r = fetch.Ahead
		}
		for i, s := range segs {
			// The segments between the first and the last are whole lines already.
			fills[i].lo, fills[i].hi = fetch.Range(s.lo, s.hi, s.n, cached(fills[i]), r)
		}
		from, to = first.start+fills[0].lo, last.start+fills[len(fills)-1].hi
		return to
	})
	buf := c.bufs.get(int(to - from))
	defer c.bufs.put(buf)
	if err := c.backendRead(buf, from); err != nil {
		return err
	}
	c.fetched.Add(uint64(to - from))
	// The SSD tier's lines are acquired as one run, in adjacent slots where it has them.
	var whichBuf [2]int
	which := whichBuf[:0]
	for i, f := range fills {
		if f.ssd {
			which = append(which, i)
		}
	}
	var grantBuf [2]grant
	grants := c.acquireSegs(c.ssd, segs, which, grantBuf[:0])
	for i, s := range segs {
		f := fills[i]
		data := buf[s.start+f.lo-from : s.start+f.hi-from] // the line's bytes [f.lo, f.hi)
		if !cached(f) {
			copy(p[s.pOff:s.pOff+s.hi-s.lo], data)
			continue
		}
		got := rangeBits(int(f.lo/blockSize), int((f.hi+blockSize-1)/blockSize)) // the blocks fetched
		if h := f.held; h.t != nil {
			if err := c.overlay(s, h, data, f.lo, got); err != nil {
				return err
			}
		}
		copy(p[s.pOff:s.pOff+s.hi-s.lo], data[s.lo-f.lo:])
		if f.ssd {
			c.fillTier(c.ssd, s, grants[0], data, f.lo, got)
			grants = grants[1:]
		}
		if f.ram {
			c.fillTier(c.ram, s, c.ram.acquire(s.line), data, f.lo, got)
		}
	}
	return nil
}

// overlay replaces the blocks of data (the line's bytes from base, read from the backend; got are
// its blocks) that the SSD slot holds with the SSD's copy. If the SSD fails, the backend's data
// stays for clean blocks, which the backend holds too, and the line is dropped from the tier; a
// dirty block's only copy is the SSD's, so the read fails, as bcache fails it, rather than return
// the backend's older data (TestDirtyReadOnSSDError).
func (c *Cache) overlay(s seg, h source, data []byte, base int64, got lineBits) error {
	var err error
	h.valid.and(got).runs(s.blocks(), func(b0, b1 int) {
		if err != nil {
			return
		}
		lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
		tmp := c.bufs.get(int(hi - lo))
		defer c.bufs.put(tmp)
		if rerr := h.t.readSlot(h.slot, tmp, lo); rerr != nil {
			_, dirty := h.t.bits(s.line)
			h.t.ioError(s.line, h.slot, rerr)
			if !dirty.and(rangeBits(b0, b1)).isZero() {
				err = fmt.Errorf("cache: the SSD tier failed a read of data not yet written back: %w", rerr)
			}
			return
		}
		copy(data[lo-base:hi-base], tmp)
	})
	return err
}

// fillTier stores the blocks bits of the line in tier t from data, the line's bytes from base,
// skipping blocks t already holds: those are never older than the backend. g is the line's
// acquired slot, if any.
func (c *Cache) fillTier(t *tier, s seg, g grant, data []byte, base int64, bits lineBits) {
	if !g.ok {
		return
	}
	slot, missing := g.slot, bits.andNot(g.valid)
	var err error
	missing.runs(s.blocks(), func(b0, b1 int) {
		if err == nil {
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
			err = t.writeSlot(slot, data[lo-base:hi-base], lo)
		}
	})
	if err != nil {
		t.unpin(slot)
		t.ioError(s.line, slot, err)
		return
	}
	t.validate(s.line, slot, missing, false)
}

func (c *Cache) backendRead(p []byte, off int64) error {
	var start time.Time
	if c.ssd != nil && c.ssd.cong != nil {
		start = time.Now()
	}
	_, err := c.b.ReadAt(p, off)
	if !start.IsZero() {
		c.ssd.cong.backendReadTook(time.Since(start))
	}
	c.backendStats.read(len(p), err)
	return err
}

// WriteAt implements backend.Backend.
func (c *Cache) WriteAt(p []byte, off int64) (int, error) {
	if err := c.write(p, off, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAtFUA implements backend.FUAWriter. In write-back a FUA write makes every write acknowledged
// before it durable too (a checkpoint does it); on a bypassed SSD tier, whose records of dirty data
// may never be committed, writing that data back does.
func (c *Cache) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := c.write(p, off, true); err != nil {
		return 0, err
	}
	if c.ssd != nil && !c.ssd.usable() && c.ssd.dirtyCount.Load() > 0 {
		if err := c.FlushAll(context.Background(), nil); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (c *Cache) write(p []byte, off int64, fua bool) error {
	t0 := time.Now()
	defer func() { c.writeLat.observe(time.Since(t0)) }()
	if err := c.check(off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	var segBuf [2]seg
	segs := c.segments(segBuf[:0], off, int64(len(p)))
	mode := c.Mode()
	if c.wb != nil {
		c.wb.lastIO.Store(time.Now().UnixNano())
	}
	if mode == WriteBack && c.ssd.usable() {
		// Throttled before the line locks are taken: the destager needs them to make room.
		if err := c.admitDirty(len(segs)); err != nil {
			return err
		}
		defer c.releaseDirty(len(segs))
		c.lockSegs(segs)
		defer c.unlockSegs(segs)
		return c.writeBackSegs(segs, p, fua)
	}
	c.lockSegs(segs)
	defer c.unlockSegs(segs)
	if err := c.destageTouched(segs); err != nil {
		return err
	}
	if err := c.invalidate(segs, fua); err != nil {
		return err
	}
	if mode != WriteThrough && mode != WriteBack {
		return c.backendWrite(p, off, fua)
	}
	return c.writeThrough(segs, p, off, fua)
}

// writeThrough writes RAM, the SSD and then the backend; the cached blocks become valid only once
// the backend has the data. The SSD's writes go to the page cache (see daemon.openSSD), a memory
// copy, cheaper than handing them to another goroutine. The caller holds the line locks.
func (c *Cache) writeThrough(segs []seg, p []byte, off int64, fua bool) error {
	type filled struct {
		t    *tier
		line uint64
		slot uint32
		bits lineBits
	}
	var buf [4]filled
	done := buf[:0]
	var whichBuf [2]int
	var grantBuf [2]grant
	for _, t := range []*tier{c.ram, c.ssd} {
		if !t.usable() {
			continue
		}
		which := whichBuf[:0]
		for i, s := range segs {
			if c.storesWrite(t, s) {
				which = append(which, i)
			}
		}
		for k, g := range c.acquireSegs(t, segs, which, grantBuf[:0]) {
			s := segs[which[k]]
			if bits, ok := c.writeTier(t, s, g, p); ok {
				done = append(done, filled{t, s.line, g.slot, bits})
			}
		}
	}
	err := c.backendWrite(p, off, fua)
	for _, f := range done {
		if err != nil {
			f.t.unpin(f.slot)
			continue
		}
		f.t.validate(f.line, f.slot, f.bits, false)
	}
	return err
}

// storesWrite reports whether t stores the write of s: the whole blocks it covers, if t holds the
// line or admits it.
func (c *Cache) storesWrite(t *tier, s seg) bool {
	if s.full().isZero() {
		return false
	}
	v, _ := t.bits(s.line)
	return !v.isZero() || t.admits(c.access(s, true))
}

// acquireSegs acquires in t the lines of segs[i] for each i of which (ascending) as one run
// (tier.acquireLines), appending their grants to grants.
func (c *Cache) acquireSegs(t *tier, segs []seg, which []int, grants []grant) []grant {
	if len(which) == 0 {
		return grants
	}
	var lineBuf [2]uint64
	lines := lineBuf[:0]
	for _, i := range which {
		lines = append(lines, segs[i].line)
	}
	grants = slices.Grow(grants, len(lines))[:len(grants)+len(lines)]
	t.acquireLines(lines, grants[len(grants)-len(lines):])
	return grants
}

// writeTier stores the whole blocks a write covers in t, in the slot g acquired for the line (if
// any). The caller validates them once the backend has the data.
func (c *Cache) writeTier(t *tier, s seg, g grant, p []byte) (lineBits, bool) {
	full := s.full()
	if !g.ok {
		return full, false
	}
	slot := g.slot
	var err error
	full.runs(s.blocks(), func(b0, b1 int) {
		if err == nil {
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
			err = t.writeSlot(slot, p[s.pOff+lo-s.lo:s.pOff+hi-s.lo], lo)
		}
	})
	if err != nil {
		t.unpin(slot)
		t.ioError(s.line, slot, err)
		return full, false
	}
	return full, true
}

// invalidate drops the cached blocks a change is about to touch: in RAM at once, on the SSD with a
// metadata commit, so that no crash can leave a record calling the old data valid.
func (c *Cache) invalidate(segs []seg, sync bool) error {
	for _, s := range segs {
		if c.ram != nil {
			c.ram.invalidate(s.line, s.touched())
		}
	}
	if c.ssd == nil {
		return nil
	}
	spans := make([]span, len(segs))
	for i, s := range segs {
		spans[i] = span{s.line, s.touched()}
	}
	if err := c.ssd.j.invalidateDurably(spans, sync); err != nil {
		// The store may still call the old data valid, and a restart would trust it: the change
		// must not reach the backend.
		c.ssd.fail(fmt.Sprintf("metadata commit: %v", err))
		return fmt.Errorf("cache metadata: cannot invalidate the SSD tier's copy before the change: %w", err)
	}
	return nil
}

func (c *Cache) backendWrite(p []byte, off int64, fua bool) error {
	var err error
	if fua {
		_, err = backend.WriteFUA(c.b, p, off)
	} else {
		_, err = c.b.WriteAt(p, off)
	}
	c.backendChanges.Add(1)
	c.backendStats.write(len(p), err)
	return err
}

// Trim implements backend.Trimmer: the cached copies go, then the backend trims.
func (c *Cache) Trim(off, length int64) error {
	if c.trim == nil {
		return backend.ErrNotSupported
	}
	return c.change(off, length, func() error { return c.trim.Trim(off, length) })
}

// WriteZeroes implements backend.ZeroWriter.
func (c *Cache) WriteZeroes(off, length int64, mayUnmap bool) error {
	if c.zero == nil {
		return backend.ErrNotSupported
	}
	return c.change(off, length, func() error { return c.zero.WriteZeroes(off, length, mayUnmap) })
}

// change runs a backend operation that changes data without passing it through the cache.
func (c *Cache) change(off, length int64, op func() error) error {
	if err := c.check(off, length); err != nil {
		return err
	}
	if length == 0 {
		return op()
	}
	var segBuf [2]seg
	segs := c.segments(segBuf[:0], off, length)
	c.lockSegs(segs)
	defer c.unlockSegs(segs)
	if err := c.destageTouched(segs); err != nil {
		return err
	}
	if err := c.invalidate(segs, false); err != nil {
		return err
	}
	defer c.backendChanges.Add(1)
	return op()
}

// Flush implements backend.Backend: the backend flushes, and with an SSD tier a checkpoint does it
// (write-through data on the SSD must not be older than what a FLUSH made durable).
func (c *Cache) Flush() error {
	if c.closed.Load() {
		return backend.ErrClosed
	}
	if !c.ssd.usable() {
		if c.ssd == nil {
			return c.b.Flush()
		}
		if c.ssd.dirtyCount.Load() > 0 {
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
			backendErr = c.Flush() // the bypassed tier's way, above
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
	var errs []error
	backendOpen := true
	if c.ssd != nil {
		// Dirty data stays on the SSD for the next start: no destage here.
		c.wb.mu.Lock()
		c.wb.closed = true
		c.wb.mu.Unlock()
		c.wb.cond.Broadcast()
		close(c.wb.stop)
		close(c.ssd.j.stop)
		if !waitClosed(closeGrace, c.wb.done, c.ssd.j.done) {
			// A destage or checkpoint is waiting for a backend that does not answer (an NBD
			// disk waits a minute for its server to come back): closing the backend fails it,
			// and what it was writing back stays dirty on the SSD.
			c.log.Warn("cache: the backend is not answering; closing it to stop; dirty data stays on the SSD tier",
				"waited", closeGrace)
			errs = append(errs, c.b.Close())
			backendOpen = false
			<-c.wb.done
			<-c.ssd.j.done
		}
		if !c.ssd.failed.Load() {
			backendErr, tierErr := c.ssd.j.checkpoint()
			errs = append(errs, backendErr, tierErr)
		}
		errs = append(errs, c.ssd.j.store.Close(), c.ssd.dev.Close())
	}
	if backendOpen {
		errs = append(errs, c.b.Close())
	}
	return errors.Join(errs...)
}

// closeGrace is how long Close waits for the destager and the journal to finish what they are
// doing before it closes the backend under them.
var closeGrace = 5 * time.Second

// waitClosed waits for every channel to close, or for d to pass; it reports whether they closed.
func waitClosed(d time.Duration, chans ...chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, ch := range chans {
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
	return true
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	s := Stats{Mode: c.Mode().String(), LineSize: int(c.line), Backend: c.backendStats.snapshot(),
		ReadLatency: c.readLat.snapshot(), WriteLatency: c.writeLat.snapshot(), Dirty: c.dirtyStats(),
		ReadBytes: c.asked.Load(), FetchedBytes: c.fetched.Load()}
	for _, t := range []*tier{c.ram, c.ssd} {
		if t != nil {
			s.Tiers = append(s.Tiers, t.stats())
		}
	}
	return s
}

// alignedAlloc returns n bytes at an address aligned for direct I/O.
func alignedAlloc(n int) []byte {
	raw := make([]byte, n+blockSize)
	skip := int(-uintptr(unsafe.Pointer(&raw[0])) & (blockSize - 1))
	return raw[skip : skip+n : skip+n]
}
