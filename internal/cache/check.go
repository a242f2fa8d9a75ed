package cache

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
)

// damaged deals with blocks of line, in slot, whose bytes failed their sums (sum.go). A dirty one
// the RAM tier holds too is written to the SSD again from there (repairFromRAM). The other dirty
// ones are lost, recorded so (lost.go) before anything else, and then every damaged block leaves
// both tiers, durably, so that neither a read nor the destager finds its bytes again (in FLUSH
// order the lost ones stay dirty, and halt the write back: epoch.go). A clean
// block is read from the backend from then on. The caller holds the line's lock. Each damaged
// block is so found and logged once (a scrub or a restart finds it no more), up to
// damageLogsPerMinute a minute.
func (c *Cache) damaged(line uint64, slot uint32, bits lineBits) {
	t := c.ssd
	t.mu.Lock()
	if cur, ok := t.slotOf(line); !ok || cur != slot {
		t.mu.Unlock()
		return
	}
	bits = bits.And(t.valid.Get(slot))
	dirty := t.dirtyAt(slot).And(bits)
	if u := t.unlockedLocked(line, slot); u != nil {
		// Being written back, with no lock of the line, by a write back that reads them checked:
		// whether they are lost is for it to say once it knows what the backend got (destageOnce).
		r := dirty.And(u.bits)
		u.rotted = u.rotted.Or(r)
		bits, dirty = bits.AndNot(r), dirty.AndNot(r)
	}
	t.mu.Unlock()
	for _, repair := range []func(uint64, uint32, lineBits) lineBits{c.repairFromRAM, c.repairFromSource} {
		if repaired := repair(line, slot, dirty); !repaired.IsZero() {
			bits, dirty = bits.AndNot(repaired), dirty.AndNot(repaired)
		}
	}
	if bits.IsZero() {
		return
	}
	start := int64(line) * c.line
	var lostErr error
	var lost int
	dirty.Runs(t.blocks, func(b0, b1 int) {
		lo, hi := start+int64(b0)*blockSize, min(start+int64(b1)*blockSize, c.size)
		if c.ordered() && c.lost.overlaps(lo, hi-lo) {
			return // kept dirty when it was lost (below): found again
		}
		lost += b1 - b0
		if c.damageLog.allow(c.log) {
			c.log.Error("SSD tier: dirty data failed its checksum and is lost: reads of the range fail until it is written again; the backend keeps its older data",
				"offset", lo, "bytes", hi-lo)
		}
		if err := c.lost.add(lo, hi-lo); err != nil && lostErr == nil {
			lostErr = err
		}
	})
	c.lostBlocks.Add(uint64(lost))
	if clean := bits.AndNot(dirty); !clean.IsZero() && c.damageLog.allow(c.log) {
		c.log.Warn("SSD tier: cached data failed its checksum; it is read from the backend again",
			"offset", start+int64(firstBit(clean))*blockSize, "blocks", clean.Count())
	}
	if lostErr != nil {
		// Lost in memory (reads fail), not on record: the dirty blocks stay as they are, for a
		// restart to find damaged again, and the tier is bypassed as for a metadata error.
		c.log.Error("SSD tier: cannot record the lost range", "err", lostErr)
		bits = bits.AndNot(dirty)
		t.fail(fmt.Sprintf("metadata: %v", lostErr))
	}
	if c.ordered() && !dirty.IsZero() {
		// In FLUSH order the lost blocks stay dirty, and their epoch stops the write back
		// (epoch.go): the backend keeps the last state a crash could have left.
		bits = bits.AndNot(dirty)
		t.mu.RLock()
		ep, _, _ := t.ep.of(slot, dirty)
		t.mu.RUnlock()
		if b := t.ep.broken.Load(); b == 0 || ep < b {
			c.log.Error("SSD tier: in flush order, a lost dirty block stops the write back: the backend keeps its consistent state from before it; writes that need the backend fail, until a restart with write_back.order: address writes back the rest without it",
				"epoch", ep, "offset", start+int64(firstBit(dirty))*blockSize)
		}
		t.ep.lose(ep)
	}
	if c.ram != nil {
		c.ram.invalidate(line, bits)
	}
	if err := t.j.invalidateDurably([]span{{line, bits}}, false); err != nil {
		t.fail(fmt.Sprintf("metadata commit: %v", err))
	}
}

// repairFromRAM writes the blocks of dirty (line's, damaged in slot) that the RAM tier holds back to
// the SSD tier from there, and returns those it repaired: RAM's copy of a block is as new as the
// SSD's (a write replaces both, a promotion copies checked bytes). The caller holds the line's
// lock.
func (c *Cache) repairFromRAM(line uint64, slot uint32, dirty lineBits) (repaired lineBits) {
	r := c.ram
	if r == nil || dirty.IsZero() {
		return lineBits{}
	}
	n := c.ssd.lineBytes(line)
	bp := bufpool.Get(int(n))
	defer bufpool.Put(bp)
	r.mu.RLock()
	rslot, ok := r.slotOf(line)
	var held lineBits
	if ok {
		held = dirty.And(r.valid.Get(rslot))
		_ = r.st.read(line, rslot, (*bp)[:n], 0, false) // RAM: nothing to fail
	}
	r.mu.RUnlock()
	held.Runs(c.ssd.blocks, func(b0, b1 int) {
		lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, n)
		if err := c.ssd.st.write(line, slot, (*bp)[lo:hi], lo); err == nil {
			repaired = repaired.Or(linebits.Range(b0, b1))
		}
	})
	if !repaired.IsZero() {
		c.repairs.Add(uint64(repaired.Count()))
		if c.damageLog.allow(c.log) {
			c.log.Warn("SSD tier: dirty data failed its checksum; written again from the RAM tier's copy",
				"offset", int64(line)*c.line+int64(firstBit(repaired))*blockSize, "blocks", repaired.Count())
		}
	}
	return repaired
}

// RepairSource fills p, whole blocks, with the bytes last written at the volume's offset off, and
// reports whether it knows them: a replica's log (replica.Replicated) knows the dirty data it has
// not released. It must never fill p with anything older than the last write there.
type RepairSource func(off int64, p []byte) bool

// SetRepairSource gives the cache a second copy of its dirty data: a dirty block that fails its
// checksum, and that the RAM tier does not hold, is written to the SSD tier again from it instead
// of being lost. nil removes it.
func (c *Cache) SetRepairSource(s RepairSource) {
	if s == nil {
		c.repairFrom.Store(nil)
		return
	}
	c.repairFrom.Store(&s)
}

// repairFromSource is repairFromRAM for the blocks the repair source knows, one block at a time:
// damage is rare, and each block may come from another record.
func (c *Cache) repairFromSource(line uint64, slot uint32, dirty lineBits) (repaired lineBits) {
	src := c.repairFrom.Load()
	if src == nil || dirty.IsZero() {
		return lineBits{}
	}
	start, n := int64(line)*c.line, c.ssd.lineBytes(line)
	bp := bufpool.Get(blockSize)
	defer bufpool.Put(bp)
	dirty.Runs(c.ssd.blocks, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			lo := int64(b) * blockSize
			p := (*bp)[:min(blockSize, n-lo)]
			if (*src)(start+lo, p) && c.ssd.st.write(line, slot, p, lo) == nil {
				repaired = repaired.Or(linebits.Range(b, b+1))
			}
		}
	})
	if !repaired.IsZero() {
		c.repairs.Add(uint64(repaired.Count()))
		if c.damageLog.allow(c.log) {
			c.log.Warn("SSD tier: dirty data failed its checksum; written again from a replica's log",
				"offset", start+int64(firstBit(repaired))*blockSize, "blocks", repaired.Count())
		}
	}
	return repaired
}

// damageLogsPerMinute is how many damaged blocks' log lines damaged writes a minute at most: a
// damaged tier (the same byte flipped in every block, say) would otherwise log every block. The
// stats count them all.
const damageLogsPerMinute = 20

// logLimit lets through up to damageLogsPerMinute log lines a minute, and then says how many it
// held back.
type logLimit struct {
	mu     sync.Mutex // guards since, n and out; nothing is taken under it
	since  time.Time
	n, out int
}

func (l *logLimit) allow(log *slog.Logger) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.since) > time.Minute {
		if l.out > 0 {
			log.Warn("SSD tier: more damaged blocks were found than were logged; tierblk stats counts them all", "not_logged", l.out)
		}
		l.since, l.n, l.out = now, 0, 0
	}
	if l.n++; l.n <= damageLogsPerMinute {
		return true
	}
	if l.out++; l.out == 1 {
		log.Warn("SSD tier: more damaged blocks than are logged in a minute; tierblk stats counts them all",
			"logged", damageLogsPerMinute)
	}
	return false
}

// firstBit returns the lowest block set in m (m is not empty).
func firstBit(m lineBits) int {
	for i, w := range m {
		if w != 0 {
			return 64*i + bits.TrailingZeros64(w)
		}
	}
	return 0
}

// checkLine reads every block the SSD tier stores of line, under the line's lock, checking each
// against its sum; those that fail are dealt with (damaged). It returns the blocks it read and
// how many failed; err is an I/O error of the tier's device.
func (c *Cache) checkLine(line uint64) (read, bad int, err error) {
	t := c.ssd
	c.locks.Lock(line, line)
	defer c.locks.Unlock(line, line)
	g := t.pin(line)
	if !g.ok {
		return 0, 0, nil
	}
	defer t.unpin(g.slot)
	n := t.lineBytes(line)
	bp := bufpool.Get(int(n))
	defer bufpool.Put(bp)
	var check func(bits lineBits)
	check = func(bits lineBits) {
		bits.Runs(t.blocks, func(b0, b1 int) {
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, n)
			rerr := t.st.read(line, g.slot, (*bp)[lo:hi], lo, false)
			if rerr == nil {
				read += b1 - b0
				return
			}
			t.ioError(line, g.slot, rerr)
			if d, ok := asDamage(rerr); ok {
				read += d.bits.Count()
				bad += d.bits.Count()
				check(linebits.Range(b0, b1).AndNot(d.bits)) // the others of the run
			} else if err == nil {
				err = rerr
			}
		})
	}
	check(g.valid.AndNot(g.zero).AndNot(c.knownLost(line, g.valid)))
	return read, bad, err
}

// knownLost returns the blocks of line among bits whose ranges are lost already (lost.go). In
// FLUSH order those stay dirty on the tier, damaged (damaged), and are not read again: each read
// would count the same damage again towards the tier's bypass (ioError). (In address order they
// have left the tier.)
func (c *Cache) knownLost(line uint64, bits lineBits) (lost lineBits) {
	if !c.ordered() {
		return lost
	}
	start := int64(line) * c.line
	bits.Runs(c.ssd.blocks, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			lo := start + int64(b)*blockSize
			if c.lost.overlaps(lo, min(blockSize, c.size-lo)) {
				lost = lost.Or(linebits.Range(b, b+1))
			}
		}
	})
	return lost
}

// ScrubStats describe the last scrub of the SSD tier (Cache.Scrub), or the one under way.
type ScrubStats struct {
	Running bool `json:"running"`
	// Lines is how many lines the tier held when the scrub began; Done how many it has checked.
	Lines uint64 `json:"lines"`
	Done  uint64 `json:"done"`
	// Bytes are the bytes read and checked; Damaged the blocks that failed their sums, of which
	// Lost held dirty data (their ranges are in Stats.Lost).
	Bytes   uint64 `json:"bytes"`
	Damaged uint64 `json:"damaged_blocks"`
	Lost    uint64 `json:"lost_blocks"`
	Errors  uint64 `json:"read_errors"`
	// Started and Ended are Unix times in seconds (Ended 0 while running).
	Started float64 `json:"started,omitempty"`
	Ended   float64 `json:"ended,omitempty"`
	Err     string  `json:"error,omitempty"`
}

// scrubState is the scrub's progress, read by Stats while it runs.
type scrubState struct {
	running                                 atomic.Bool
	lines, done, bytes, damaged, lost, errs atomic.Uint64
	started, ended                          atomic.Int64 // Unix nanoseconds
	err                                     atomic.Pointer[string]
}

func (s *scrubState) stats() ScrubStats {
	out := ScrubStats{Running: s.running.Load(), Lines: s.lines.Load(), Done: s.done.Load(),
		Bytes: s.bytes.Load(), Damaged: s.damaged.Load(), Lost: s.lost.Load(), Errors: s.errs.Load()}
	if t := s.started.Load(); t != 0 {
		out.Started = float64(t) / 1e9
	}
	if t := s.ended.Load(); t != 0 {
		out.Ended = float64(t) / 1e9
	}
	if e := s.err.Load(); e != nil {
		out.Err = *e
	}
	return out
}

// ErrScrubRunning is what Scrub returns while another scrub runs.
var ErrScrubRunning = fmt.Errorf("a scrub of the SSD tier is already running")

// scrubBatch is how many line numbers Scrub looks up under one hold of the tier's mutex.
const scrubBatch = 4096

// Scrub reads every block the SSD tier stores and checks it against its sum, line by line in
// address order, each under its line's lock (a client's request to the line waits for one line's
// read at most), at up to rate bytes a second (0: as fast as the device goes). A block that fails
// is dealt with as a read that finds it would (damaged): so rot in dirty data is found, and its
// range reported lost, before a read or the destager needs it. It returns when done or when ctx
// ends; progress is in Stats().Scrub.
func (c *Cache) Scrub(ctx context.Context, rate int64) (ScrubStats, error) {
	if c.ssd == nil {
		return ScrubStats{}, fmt.Errorf("the cache has no SSD tier to scrub")
	}
	s := &c.scrub
	if !s.running.CompareAndSwap(false, true) {
		return s.stats(), ErrScrubRunning
	}
	t := c.ssd
	t.mu.Lock()
	lines := t.index.Len() + len(t.setAside)
	t.mu.Unlock()
	s.lines.Store(uint64(lines))
	for _, v := range []*atomic.Uint64{&s.done, &s.bytes, &s.damaged, &s.lost, &s.errs} {
		v.Store(0)
	}
	s.started.Store(time.Now().UnixNano())
	s.ended.Store(0)
	s.err.Store(nil)
	lost0 := c.lostBlocks.Load()
	err := c.scrubLines(ctx, rate)
	s.lost.Store(c.lostBlocks.Load() - lost0)
	if err != nil {
		msg := err.Error()
		s.err.Store(&msg)
	}
	s.ended.Store(time.Now().UnixNano())
	s.running.Store(false)
	out := s.stats()
	c.log.Info("SSD tier scrub ended", "lines", out.Done, "bytes", out.Bytes, "damaged_blocks", out.Damaged,
		"lost_blocks", out.Lost, "read_errors", out.Errors, "err", err)
	return out, err
}

func (c *Cache) scrubLines(ctx context.Context, rate int64) error {
	t, s := c.ssd, &c.scrub
	start := time.Now()
	var batch []uint64
	for first := uint64(0); first < t.lines; first += scrubBatch {
		batch = batch[:0]
		t.mu.Lock()
		for line := first; line < min(first+scrubBatch, t.lines); line++ {
			if _, ok := t.slotOf(line); ok {
				batch = append(batch, line)
			}
		}
		t.mu.Unlock()
		for _, line := range batch {
			if err := ctx.Err(); err != nil {
				return err
			}
			if t.failed.Load() {
				// Its clean lines are set aside, out of reach: what is left to check would read
				// as nothing. The dirty lines stay, and reads check them.
				return fmt.Errorf("the SSD tier was bypassed (%s): scrub stopped; it can run again once the tier is back in service", t.stats().Reason)
			}
			read, bad, err := c.checkLine(line)
			s.done.Add(1)
			s.bytes.Add(uint64(read) * blockSize)
			s.damaged.Add(uint64(bad))
			if err != nil {
				s.errs.Add(1)
			}
			if rate > 0 {
				// Paced: the bytes read so far take at least as long as rate allows.
				due := start.Add(time.Duration(float64(s.bytes.Load()) / float64(rate) * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					select {
					case <-time.After(d):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
		}
	}
	return nil
}

// LostRanges returns the ranges whose data was lost (ErrLost).
func (c *Cache) LostRanges() []meta.Range { return c.lost.list() }
