package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/policy"
)

// WriteBackConfig tunes write-back. Ratios are of the SSD tier's lines.
type WriteBackConfig struct {
	// Destage starts above High and stops below Low; it also runs when the backend has been idle
	// for a second. Writes wait rather than let dirty lines pass Max.
	High, Low, Max float64
	// Destage and Throttle name the policies (policy.DestageNames, policy.ThrottleNames).
	Destage, Throttle string
}

// DefaultWriteBack is the write-back tuning unless configured otherwise.
var DefaultWriteBack = WriteBackConfig{High: 0.5, Low: 0.25, Max: 0.9, Destage: "watermark", Throttle: "proportional"}

// fill takes the defaults for what is not given: the watermarks where none is (a configuration
// that gives any takes its zeros as given, for validate to judge: low 0 destages until nothing is
// dirty), the policies where unnamed.
func (w *WriteBackConfig) fill() {
	d := DefaultWriteBack
	if w.High == 0 && w.Low == 0 && w.Max == 0 {
		w.High, w.Low, w.Max = d.High, d.Low, d.Max
	}
	if w.Destage == "" {
		w.Destage = d.Destage
	}
	if w.Throttle == "" {
		w.Throttle = d.Throttle
	}
}

func (w WriteBackConfig) watermarks() policy.Watermarks {
	return policy.Watermarks{High: w.High, Low: w.Low, Max: w.Max}
}

func (w WriteBackConfig) validate() error {
	if !(0 <= w.Low && w.Low < w.High && w.High <= w.Max && w.Max <= 1) {
		return fmt.Errorf("write-back watermarks low %.2f, high %.2f, max %.2f: need 0 <= low < high <= max <= 1", w.Low, w.High, w.Max)
	}
	return nil
}

// writeBack is the write-back machinery of a cache with an SSD tier.
type writeBack struct {
	cfg      WriteBackConfig
	destage  policy.Destage
	throttle policy.Throttle
	maxLines int

	mu       sync.Mutex
	cond     *sync.Cond
	reserved int // lines that writes in flight may dirty, counted against maxLines
	waiting  atomic.Int32
	closed   bool

	lastIO    atomic.Int64 // unix nanoseconds of the last client request
	draining  atomic.Int32 // flush commands and mode switches under way
	running   atomic.Bool
	blockTime atomic.Int64 // nanoseconds per block destaged, moving average
	kickCh    chan struct{}
	stop      chan struct{}
	done      chan struct{}

	destagedBytes, destageWrites, destageErrors atomic.Uint64
	destaged                                    rateMeter // of destagedBytes
	throttled                                   atomic.Uint64
	throttleNs                                  atomic.Int64
}

func newWriteBack(cfg WriteBackConfig, slots int) (*writeBack, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &writeBack{cfg: cfg, maxLines: max(1, int(cfg.Max*float64(slots))), kickCh: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	var err error
	if w.destage, err = policy.NewDestage(cfg.Destage); err != nil {
		return nil, err
	}
	if w.throttle, err = policy.NewThrottle(cfg.Throttle); err != nil {
		return nil, err
	}
	w.cond = sync.NewCond(&w.mu)
	w.blockTime.Store(int64(100 * time.Microsecond))
	return w, nil
}

// wake tells writes waiting for room to look again. Dirty lines drop without w.mu, so it
// broadcasts holding w.mu: a write that found no room is then inside cond.Wait, never between its
// check and Wait, where a bare Broadcast would be lost and it would wait for good.
func (w *writeBack) wake() {
	w.mu.Lock()
	w.cond.Broadcast()
	w.mu.Unlock()
}

func (w *writeBack) kick() {
	select {
	case w.kickCh <- struct{}{}:
	default:
	}
}

// Mode returns the cache's mode.
func (c *Cache) Mode() Mode { return Mode(c.mode.Load()) }

func (c *Cache) ratio() float64 {
	return float64(c.ssd.dirtyCount.Load()) / float64(c.ssd.slots)
}

// admitDirty throttles a write-back write that may dirty n lines, then reserves room for them
// below the maximum, waiting for the destager if there is none: writes never fail for lack of
// space, and dirty lines never pass the maximum. releaseDirty(n) gives the reservation back.
func (c *Cache) admitDirty(n int) error {
	w := c.wb
	if d := c.throttleDelay(n); d > 0 {
		w.throttled.Add(1)
		w.throttleNs.Add(int64(d))
		time.Sleep(d)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for int(c.ssd.dirtyCount.Load())+w.reserved+n > w.maxLines && !w.closed {
		if w.reserved == 0 && n > w.maxLines {
			break // one request larger than the whole allowance: let it through alone
		}
		w.waiting.Add(1)
		w.kick()
		w.cond.Wait()
		w.waiting.Add(-1)
	}
	if w.closed {
		return errors.New("cache: closed while waiting for room for dirty data")
	}
	w.reserved += n
	return nil
}

// releaseDirty gives back the room admitDirty(n) reserved.
func (c *Cache) releaseDirty(n int) {
	w := c.wb
	w.mu.Lock()
	w.reserved -= n
	w.mu.Unlock()
	w.cond.Broadcast()
}

// throttleDelay is the delay the throttle policy gives a write that may dirty n lines now.
func (c *Cache) throttleDelay(n int) time.Duration {
	w := c.wb
	return w.throttle.Delay(policy.ThrottleState{Ratio: c.ratio(), BlockTime: time.Duration(w.blockTime.Load()),
		Blocks: n * c.ssd.blocks, Watermarks: w.cfg.watermarks()})
}

// rateMeter measures how fast a counter grows, from samples the destager takes at least every
// 100 ms (rateEvery apart), over about the last second.
type rateMeter struct {
	mu      sync.Mutex
	samples [rateSamples]rateSample
	n       int // samples taken; the newest is samples[(n-1)%rateSamples]
}

type rateSample struct {
	at time.Time
	v  uint64
}

const (
	rateSamples = 12
	rateEvery   = 100 * time.Millisecond
	rateWindow  = time.Second
)

// sample records v at now, unless the newest sample is less than rateEvery old.
func (m *rateMeter) sample(now time.Time, v uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n > 0 && now.Sub(m.samples[(m.n-1)%rateSamples].at) < rateEvery {
		return
	}
	m.samples[m.n%rateSamples] = rateSample{now, v}
	m.n++
}

// rate is the growth per second to v at now from the newest sample at least rateWindow old, or
// the oldest one kept if none is that old (a stalled sampler just widens the window).
func (m *rateMeter) rate(now time.Time, v uint64) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return 0
	}
	var from rateSample
	for i := m.n - 1; i >= max(0, m.n-rateSamples); i-- {
		if from = m.samples[i%rateSamples]; now.Sub(from.at) >= rateWindow {
			break
		}
	}
	dt := now.Sub(from.at).Seconds()
	if dt <= 0 || v < from.v {
		return 0
	}
	return float64(v-from.v) / dt
}

// writeBackSegs writes a request to the SSD tier as dirty data; the backend gets it later. The
// caller holds the line locks. A line the SSD tier cannot take now goes to the backend.
func (c *Cache) writeBackSegs(segs []seg, p []byte, fua bool) error {
	// Clean cached blocks about to be overwritten are invalidated durably first: a crash in the
	// middle must not leave a record calling a half-new block clean (the backend has the old one).
	var spanBuf [2]span // most requests touch one or two lines: no allocation
	spans := spanBuf[:0]
	for _, s := range segs {
		v, d := c.ssd.bits(s.line)
		if b := s.touched().and(v).andNot(d); !b.isZero() {
			spans = append(spans, span{s.line, b})
		}
		if c.ram != nil {
			c.ram.invalidate(s.line, s.touched())
		}
	}
	if len(spans) > 0 {
		if err := c.ssd.j.invalidateDurably(spans, false); err != nil {
			return fmt.Errorf("cache metadata: %w", err)
		}
	}
	var whichBuf [2]int
	which := whichBuf[:0]
	for i := range segs {
		which = append(which, i)
	}
	var grantBuf [2]grant
	grants := c.acquireSegs(c.ssd, segs, which, grantBuf[:0])
	for i, s := range segs {
		if err := c.writeBackSeg(s, grants[i], p); err != nil {
			for _, g := range grants[i+1:] {
				if g.ok {
					c.ssd.unpin(g.slot)
				}
			}
			return err
		}
	}
	if fua {
		return c.ssd.j.durable()
	}
	return nil
}

// writeBackSeg writes a segment to the SSD tier as dirty data, in the slot g acquired for its line
// if it got one.
func (c *Cache) writeBackSeg(s seg, g grant, p []byte) error {
	data := p[s.pOff : s.pOff+s.hi-s.lo]
	// Evicted slots are reused once a checkpoint has committed their deletion: waiting for one
	// costs a flush of the SSD and frees them all, where writing around costs a write to the slow
	// disk, one request after another (a burst past the SSD tier ran at the slow disk's 15 MiB/s
	// instead of the destager's 100). Other writers may take the freed slots first: a few tries.
	for try := 0; !g.ok && try < slotTries; try++ {
		if err := c.ssd.j.freePending(); err != nil {
			break
		}
		g = c.ssd.acquire(s.line)
	}
	slot, valid := g.slot, g.valid
	if !g.ok {
		// No slot still (the tier failed, or its evicted slots are busy): write through.
		return c.writeAroundSeg(s, data)
	}
	// A block the write covers in part needs the rest of its bytes: from the slot when it holds
	// them (the file's direct I/O merges in place), else from the backend.
	lo, hi := s.lo, s.hi
	touched, full := s.touched(), s.full()
	b0, b1 := int(lo/blockSize), int((hi+blockSize-1)/blockSize)-1
	headRMW := !full.has(b0) && !valid.has(b0)
	tailRMW := !full.has(b1) && !valid.has(b1)
	if headRMW {
		lo = int64(b0) * blockSize
	}
	if tailRMW {
		hi = min(int64(b1+1)*blockSize, s.n)
	}
	buf := data
	if headRMW || tailRMW {
		buf = c.bufs.get(int(hi - lo))
		defer c.bufs.put(buf)
		for _, b := range []struct {
			rmw bool
			blk int
		}{{headRMW, b0}, {tailRMW, b1}} {
			if !b.rmw {
				continue
			}
			bl, bh := int64(b.blk)*blockSize, min(int64(b.blk+1)*blockSize, s.n)
			if err := c.backendRead(buf[bl-lo:bh-lo], s.start+bl); err != nil {
				c.ssd.unpin(slot)
				return err
			}
		}
		copy(buf[s.lo-lo:], data)
	}
	if err := c.ssd.writeSlot(slot, buf, lo); err != nil {
		c.ssd.unpin(slot)
		c.ssd.ioError(s.line, slot, err)
		return fmt.Errorf("cache: SSD tier write failed: %w", err)
	}
	if !c.ssd.validate(s.line, slot, touched, true) {
		// The line was evicted while its data was written: the backend takes the write instead.
		return c.writeAroundSeg(s, data)
	}
	// A write of a whole line stays on the SSD tier only: streams (copies, backups, logs) would
	// otherwise push what is read out of the RAM tier, and cost a copy each. A read promotes it.
	if c.ram.usable() && full != rangeBits(0, s.blocks()) && c.storesWrite(c.ram, s) {
		g := c.ram.acquire(s.line)
		if bits, ok := c.writeTier(c.ram, s, g, p); ok {
			c.ram.validate(s.line, g.slot, bits, false)
		}
	}
	return nil
}

// slotTries bounds how many checkpoints a write-back write waits for to get a slot.
const slotTries = 4

// writeAroundSeg sends a write-back segment the SSD tier could not take to the backend. The line
// is not cached, but the store may still hold a record of it whose deletion has not landed yet
// (an eviction waiting for a checkpoint): that record is deleted first, or a crash would bring the
// old data back.
func (c *Cache) writeAroundSeg(s seg, data []byte) error {
	if err := c.ssd.j.invalidateDurably([]span{{s.line, s.touched()}}, false); err != nil {
		return fmt.Errorf("cache metadata: %w", err)
	}
	return c.backendWrite(data, s.start+s.lo, false)
}

// destageRun is a stretch of dirty blocks that are adjacent on the backend: one backend write.
type destageRun struct {
	off    int64
	pieces []destagePiece
}

type destagePiece struct {
	line   uint64
	slot   uint32
	lo, hi int64 // bytes within the line
}

// destageLocked writes the dirty blocks of lines (in ascending order, all locked by the caller)
// back to the backend, coalescing adjacent blocks into large writes, up to inflight of them under
// way at once; it flushes the backend, and only then marks them clean: a line that gets a new
// write meanwhile is locked out, so it can never be marked clean with old data.
func (c *Cache) destageLocked(lines []uint64, inflight int) (bytes int64, err error) {
	type held struct {
		line  uint64
		slot  uint32
		dirty lineBits
	}
	var hs []held
	for _, line := range lines {
		if slot, d, ok := c.ssd.pinDirty(line); ok {
			hs = append(hs, held{line, slot, d})
		}
	}
	if len(hs) == 0 {
		return 0, nil
	}
	defer func() {
		for _, h := range hs {
			if err != nil {
				c.ssd.unpin(h.slot)
			} else {
				c.ssd.clean(h.line, h.slot, h.dirty)
			}
		}
	}()
	spans := make([]span, len(hs))
	for i, h := range hs {
		spans[i] = span{h.line, h.dirty}
	}
	if err = c.ssd.j.dropStale(spans); err != nil {
		return 0, fmt.Errorf("destage: cache metadata: %w", err)
	}
	var runs []destageRun
	for _, h := range hs {
		start := int64(h.line) * c.line
		n := min(c.line, c.size-start)
		h.dirty.runs(int((n+blockSize-1)/blockSize), func(b0, b1 int) {
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, n)
			p := destagePiece{h.line, h.slot, lo, hi}
			if k := len(runs) - 1; k >= 0 && runs[k].end() == start+lo && runs[k].len()+(hi-lo) <= maxDestageWrite {
				runs[k].pieces = append(runs[k].pieces, p)
				return
			}
			runs = append(runs, destageRun{off: start + lo, pieces: []destagePiece{p}})
		})
	}
	t0 := time.Now()
	if bytes, err = c.writeRuns(runs, inflight); err != nil {
		return 0, err
	}
	if err = c.b.Flush(); err != nil {
		c.wb.destageErrors.Add(1)
		return 0, fmt.Errorf("destage: backend flush: %w", err)
	}
	if blocks := bytes / blockSize; blocks > 0 {
		per := int64(time.Since(t0)) / blocks
		old := c.wb.blockTime.Load()
		c.wb.blockTime.Store(old + (per-old)/8)
	}
	c.wb.destagedBytes.Add(uint64(bytes))
	return bytes, nil
}

// writeRuns writes runs to the backend, up to inflight at once, and returns the bytes written by
// the time the first error stopped it.
func (c *Cache) writeRuns(runs []destageRun, inflight int) (int64, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		bytes int64
		first error
	)
	slots := make(chan struct{}, inflight)
	for _, r := range runs {
		slots <- struct{}{}
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			break
		}
		wg.Go(func() {
			err := c.writeRun(r)
			mu.Lock()
			if err == nil {
				bytes += r.len()
			} else if first == nil {
				first = err
			}
			mu.Unlock()
			<-slots
		})
	}
	wg.Wait()
	return bytes, first
}

// writeRun reads a run's pieces from their slots and writes them to the backend as one write.
func (c *Cache) writeRun(r destageRun) error {
	buf := c.bufs.get(int(r.len()))
	defer c.bufs.put(buf)
	pos := int64(0)
	for _, p := range r.pieces {
		if err := c.ssd.readSlotCached(p.slot, buf[pos:pos+p.hi-p.lo], p.lo); err != nil {
			c.ssd.errs.Add(1)
			c.wb.destageErrors.Add(1)
			return fmt.Errorf("destage at offset %d: SSD tier read: %w", r.off, err)
		}
		pos += p.hi - p.lo
	}
	_, err := c.b.WriteAt(buf, r.off)
	c.backendStats.write(len(buf), err)
	if err != nil {
		c.wb.destageErrors.Add(1)
		return fmt.Errorf("destage at offset %d: %w", r.off, err)
	}
	c.wb.destageWrites.Add(1)
	return nil
}

// How the destager goes: while it only tidies up, in batches of destageBatch bytes, one write at
// a time, so that a foreground write to a line being written back waits little and read misses
// find the backend free; when it is urgent (dirty data nears its maximum, a flush drains it), in
// batches of destageBatchUrgent bytes, destageInFlight writes of at most maxDestageWrite under way
// at once. A burst of 256 MiB through a 64 MiB SSD tier runs at the destager's speed: 160 MiB/s
// with 1 MiB batches, about 300 with these, whether the writes go one or four at a time (the
// benchmark's slow disk serves one request at a time; a disk with a queue takes them together).
const (
	destageBatch       = 1 << 20
	destageBatchUrgent = 16 << 20
	destageInFlight    = 4
	maxDestageWrite    = 4 << 20
)

func (r destageRun) len() int64 {
	var n int64
	for _, p := range r.pieces {
		n += p.hi - p.lo
	}
	return n
}

func (r destageRun) end() int64 { return r.off + r.len() }

// destageNext writes back the dirty lines in the window at or after *cursor, moving the cursor
// past it (back to 0 at the end): adjacent line numbers, locked together, destageBatch bytes of
// them or destageBatchUrgent when urgent. It reports the bytes written and whether there was
// anything.
func (c *Cache) destageNext(cursor *uint64, urgent bool) (int64, bool, error) {
	batch, inflight := int64(destageBatch), 1
	if urgent {
		batch, inflight = destageBatchUrgent, destageInFlight
	}
	window := uint64(max(1, batch/c.line))
	c.ssd.mu.Lock()
	first, ok := c.ssd.dset.next(*cursor)
	if !ok && *cursor > 0 {
		first, ok = c.ssd.dset.next(0)
	}
	var lines []uint64
	for l := first; ok && l < first+window; {
		lines = append(lines, l)
		l, ok = c.ssd.dset.next(l + 1)
	}
	c.ssd.mu.Unlock()
	if len(lines) == 0 {
		return 0, false, nil
	}
	lo, hi := lines[0], lines[len(lines)-1]
	*cursor = hi + 1
	c.locks.lock(lo, hi)
	defer c.locks.unlock(lo, hi)
	n, err := c.destageLocked(lines, inflight)
	return n, true, err
}

// destageDoomed writes back lines (ascending) that the eviction policy chose while they were
// dirty. Until then they keep their slots, out of the policy's reach: once they hold the slots the
// tier keeps in reserve, its slots are full and its policy has nothing to evict, and the tier admits
// no new line at all (below the high watermark, with clients busy, nothing else writes them back).
func (c *Cache) destageDoomed(lines []uint64) error {
	for _, l := range lines {
		c.locks.lock(l, l)
	}
	defer func() {
		for _, l := range lines {
			c.locks.unlock(l, l)
		}
	}()
	_, err := c.destageLocked(lines, destageInFlight)
	return err
}

// destageTouched writes back the dirty blocks of the lines a non-write-back change touches (the
// caller holds their locks), so that the change never loses the part of a dirty block it does not
// cover, and the backend's copy is whole before the cache lets go of it.
func (c *Cache) destageTouched(segs []seg) error {
	if c.ssd == nil || c.ssd.dirtyCount.Load() == 0 {
		return nil
	}
	var lines []uint64
	for _, s := range segs {
		if _, d := c.ssd.bits(s.line); !d.isZero() {
			lines = append(lines, s.line)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	_, err := c.destageLocked(lines, destageInFlight)
	return err
}

// destager writes dirty data back in the background, as its policy says, with backoff while the
// backend fails.
func (c *Cache) destager() {
	w := c.wb
	defer close(w.done)
	var cursor uint64
	backoff := time.Duration(0)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		case <-w.kickCh:
		}
		w.destaged.sample(time.Now(), w.destagedBytes.Load())
		if w.waiting.Load() > 0 {
			// Dirty lines also go without the destager (a write or trim through another mode
			// writes them back first): waiting writes must see that even with nothing to destage.
			w.wake()
		}
		for {
			st := c.destageState()
			var doomed []uint64
			if !w.destage.Run(st) {
				// Not the policy's choice: doomed lines are written back whatever the watermarks.
				// (When the policy runs, its large address-order batches take them along.)
				if doomed = c.ssd.doomedLines(int(destageBatchUrgent / c.line)); len(doomed) == 0 {
					break
				}
			}
			t0 := time.Now()
			var any bool
			var err error
			if len(doomed) > 0 {
				any, err = true, c.destageDoomed(doomed)
			} else {
				w.running.Store(true)
				_, any, err = c.destageNext(&cursor, w.destage.Urgent(st))
			}
			w.wake()
			w.destaged.sample(time.Now(), w.destagedBytes.Load())
			if err != nil {
				select {
				case <-w.stop:
					return // Close failed it: nothing to retry
				default:
				}
				backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
				c.log.Warn("destage failed; retrying", "in", backoff, "err", err)
				if !sleepOrStop(w.stop, backoff) {
					return
				}
				continue
			}
			backoff = 0
			if !any {
				break
			}
			if !w.destage.Urgent(st) && !sleepOrStop(w.stop, time.Since(t0)) {
				return // leave the backend to clients half of the time
			}
			select {
			case <-w.stop:
				return
			default:
			}
		}
		w.running.Store(false)
	}
}

func sleepOrStop(stop chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}

func (c *Cache) destageState() policy.DestageState {
	w := c.wb
	return policy.DestageState{
		Ratio:      c.ratio(),
		Running:    w.running.Load(),
		Idle:       time.Duration(time.Now().UnixNano() - w.lastIO.Load()),
		Draining:   w.draining.Load() > 0 || c.Mode() != WriteBack,
		Waiting:    w.waiting.Load() > 0,
		Watermarks: w.cfg.watermarks(),
	}
}

// FlushAll writes every dirty line back and flushes the backend; when it returns nil the backend
// holds everything the cache has acknowledged. progress, if not nil, is told the dirty bytes
// written back so far and the dirty bytes there were at the start.
func (c *Cache) FlushAll(ctx context.Context, progress func(done, total int64)) error {
	if c.closed.Load() {
		return errors.New("cache: closed")
	}
	if c.ssd != nil && c.wb != nil {
		w := c.wb
		w.draining.Add(1)
		defer w.draining.Add(-1)
		c.ssd.mu.Lock()
		total := int64(c.ssd.dirtyBlocks) * blockSize
		c.ssd.mu.Unlock()
		var done int64
		var cursor uint64
		for c.ssd.dirtyCount.Load() > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, _, err := c.destageNext(&cursor, true)
			w.wake()
			if err != nil {
				return err
			}
			done += n
			if progress != nil {
				progress(min(done, total), total)
			}
		}
	}
	return c.Flush()
}

// SetMode switches the cache's mode. Leaving write-back, new writes stop being absorbed at once
// and every dirty line is written back before SetMode returns.
func (c *Cache) SetMode(ctx context.Context, m Mode, progress func(done, total int64)) error {
	if m == WriteBack && c.wb == nil {
		return errors.New("cache: write-back needs an SSD tier")
	}
	old := Mode(c.mode.Swap(int32(m)))
	c.log.Info("cache mode", "from", old, "to", m)
	if m == WriteBack || c.wb == nil {
		return nil
	}
	return c.FlushAll(ctx, progress)
}

func (c *Cache) dirtyStats() DirtyStats {
	if c.wb == nil {
		return DirtyStats{}
	}
	w := c.wb
	c.ssd.mu.Lock()
	lines, blocks := c.ssd.dirtyLines, c.ssd.dirtyBlocks
	c.ssd.mu.Unlock()
	return DirtyStats{
		Lines: uint64(lines), Bytes: uint64(blocks) * blockSize, Ratio: float64(lines) / float64(c.ssd.slots),
		High: w.cfg.High, Low: w.cfg.Low, Max: w.cfg.Max,
		Destaging: w.running.Load(), DestagedBytes: w.destagedBytes.Load(), DestageWrites: w.destageWrites.Load(),
		DestageErrors: w.destageErrors.Load(), DestageRate: w.destaged.rate(time.Now(), w.destagedBytes.Load()),
		ThrottledWrites: w.throttled.Load(), ThrottleSeconds: float64(w.throttleNs.Load()) / 1e9,
		ThrottleDelay: c.throttleDelay(1).Seconds(),
	}
}
