package cache

import (
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// ReadAtAsync implements backend.AsyncReader for the reads within one line that the SSD tier
// serves alone (the RAM tier does not hold them and the SSD tier does), where the SSD device
// reads asynchronously, and for the misses within one line that no tier holds any of, where the
// backend does (missAsync). Such a read is started on the device and ReadAtAsync returns, so that
// a server keeps no goroutine waiting for each SSD-tier hit (bench cache --parts hits) or miss
// (bench cold's nas-read row); done is called on the device's goroutine. Any other read is left
// to ReadAt (false), as is a line another request holds (without a RAM tier: holds exclusively,
// see linelock.Locks): the caller must not wait for it.
func (c *Cache) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	var start, fetch readStart
	if c.ssdAsync != nil {
		start = c.ssdAsync.ReadAtAsync
	}
	if c.backAsync != nil {
		fetch = c.backAsync.ReadAtAsync
	}
	return (start != nil || fetch != nil) && c.readAsync(start, fetch, false, p, off, done)
}

// ReadAtOn implements backend.RingReader for the reads ReadAtAsync starts, the SSD tier's read
// on the caller's ring (a ublk queue's), for RAM-tier hits within one line: those are a copy,
// made at once, and done is called before ReadAtOn returns, on the ring's goroutine as the others;
// and for misses within one line of a backend that reads on a ring too (a file opened direct):
// missAsync.
func (c *Cache) ReadAtOn(r backend.Ring, p []byte, off int64, done func(error)) bool {
	var start, fetch readStart // nil: no read of the SSD tier's device, or of the backend, on r
	if c.ssdRing != nil {
		start = func(p []byte, off int64, done func(error)) bool { return c.ssdRing.ReadAtOn(r, p, off, done) }
	}
	if c.backRing != nil {
		fetch = func(p []byte, off int64, done func(error)) bool { return c.backRing.ReadAtOn(r, p, off, done) }
	}
	return c.readAsync(start, fetch, true, p, off, done)
}

// readStart starts a read of a device (the SSD tier's, the backend) and reports whether it did.
type readStart func(p []byte, off int64, done func(error)) bool

// readAsync is ReadAtAsync with the SSD tier's reads started by start (none where it is nil: the
// caller reads hits with ReadAt), and its misses' backend reads by fetch (as for start).
// onRing says that start runs them on a ring the caller's goroutine owns and reaps: RAM-tier hits
// are then served at once, and nothing here may wait for another request, whose SSD read may be
// in flight on that same ring (a packed tier's read lock, held by such reads, is only tried: a
// reclaim waiting for it would stop new readers, the caller among them, and the ring's reads
// would never end).
func (c *Cache) readAsync(start, fetch readStart, onRing bool, p []byte, off int64, done func(error)) bool {
	if len(p) == 0 || c.check(off, int64(len(p))) != nil || c.Mode() == PassThrough {
		return false
	}
	var pieceBuf [2]piece
	pieces := c.split(pieceBuf[:0], off, int64(len(p)))
	if len(pieces) != 1 {
		return false
	}
	s := pieces[0]
	need := s.touched()
	if c.ram.usable() && c.ram.holds(s.line, need) {
		// A RAM-tier hit, the cheapest read, is served at once, or left to ReadAt before the line
		// is locked: ReadAt locks it again. Should RAM take the line meanwhile, the SSD tier's copy
		// is as current.
		return onRing && c.readRAMNow(s, p, off, done)
	}
	if c.ssd == nil {
		return false
	}
	// Without a RAM tier to promote into, the read changes nothing but counters: it holds the line
	// shared with other such reads, and two reads of one line do not wait for each other.
	shared := !c.ram.usable()
	if (shared && !c.locks.TryRLock(s.line)) || (!shared && !c.locks.TryLock(s.line)) {
		return false
	}
	var g grant
	if start != nil {
		g = c.ssd.lookupHit(s.line, need)
	}
	if !g.ok {
		// A miss, or a hit with no device to start it on: the line was only looked at. Held
		// alone, it stays held for the miss.
		if fetch == nil || shared {
			c.unlockLine(s.line, shared)
			return fetch != nil && c.missAsync(fetch, s, p, off, done, false)
		}
		return c.missAsync(fetch, s, p, off, done, true)
	}
	h := &hitRead{c: c, pieces: [1]piece{s}, p: p, off: off, done: done, shared: shared}
	h.src = source{t: c.ssd, slot: g.slot, valid: g.valid, zero: g.zero}
	// From here on the read is this call's: it counts as read does.
	h.t0 = time.Now()
	if c.wb != nil {
		c.wb.lastIO.Store(h.t0.UnixNano())
	}
	if c.ram.usable() {
		c.ram.misses.Add(1)
	}
	if !h.startOnDevice(start, onRing, g.zero.And(need).IsZero()) {
		// Zero blocks, or the device would not start it (an unaligned buffer): read's own way,
		// on a goroutine.
		go h.readHit()
	}
	return true
}

// hitRead is a read of an SSD-tier hit that readAsync took on, with the line locked (held shared
// with other such reads where there is no RAM tier to promote into) and the slot pinned; its steps
// end on the device's goroutine.
type hitRead struct {
	c      *Cache
	pieces [1]piece // the line the read is within
	p      []byte
	off    int64
	done   func(error)
	shared bool      // the line is held shared
	src    source    // the SSD tier's slot of the line, pinned
	t0     time.Time // when the read was taken on
}

// unlock lets go of the line.
func (h *hitRead) unlock() { h.c.unlockLine(h.pieces[0].line, h.shared) }

// unlockLine lets go of a line held shared, or alone.
func (c *Cache) unlockLine(line uint64, shared bool) {
	if shared {
		c.locks.RUnlock(line)
		return
	}
	c.locks.Unlock(line, line)
}

// end ends the read, once the line is let go (endRead).
func (h *hitRead) end(err error) { h.c.endRead(err, h.off, len(h.p), h.t0, h.done) }

// endRead ends a read of n bytes at off, which a caller started at t0 and found the data of, or
// failed with err, as ReadAt does: it refuses a lost range (readEnd), counts the read and calls
// done, and returns the error done got.
func (c *Cache) endRead(err error, off int64, n int, t0 time.Time, done func(error)) error {
	if err = c.readEnd(err, off, int64(n)); err == nil {
		c.asked.Add(uint64(n))
	}
	c.readLat.observe(time.Since(t0))
	done(err)
	return err
}

// finish lets go of the line and ends the read.
func (h *hitRead) finish(err error) { h.unlock(); h.end(err) }

// fallback serves the read from the backend after the SSD tier failed it. A miss fills the tiers:
// held shared, the line is let go and read locks it again, exclusively.
func (h *hitRead) fallback() {
	c := h.c
	if h.shared {
		h.unlock()
		h.end(c.read(h.p, h.off, false))
		return
	}
	h.finish(c.readMiss(h.pieces[:], h.p, false))
}

// startOnDevice starts the read on the SSD tier's device by start, with a promotion into RAM where
// RAM admits the line; noZeros says that none of the blocks read is a zero block. It reports false,
// having started nothing, where the device cannot serve the read alone.
func (h *hitRead) startOnDevice(start readStart, onRing, noZeros bool) bool {
	c, s, slot := h.c, h.pieces[0], h.src.slot
	// Zero blocks are not on the device: such a read goes read's way (hitRead.readHit), which reads
	// only the blocks the slot holds. So does a read of part of a block: its sum is the whole
	// block's.
	st := c.ssd.st
	if !noZeros || s.lo%blockSize != 0 || s.hi%blockSize != 0 && (s.hi != s.n || !st.contiguous()) {
		return false
	}
	if st.contiguous() && c.ram.usable() && c.ram.admits(c.promotion(s)) && c.promoteAsync(start, s, h.src, h.p, h.finish) {
		return true
	}
	// The bytes as they are on the device: a slot's, or on a packed tier blocks stored as they
	// are, one after another.
	at, ok := st.span(slot, s.lo, s.hi, onRing)
	if !ok {
		return false
	}
	if start(h.p, at, h.read) {
		return true
	}
	st.endSpan()
	return false
}

// read ends an asynchronous read of the hit from the device (of a span of the store's).
func (h *hitRead) read(err error) {
	c, s, slot := h.c, h.pieces[0], h.src.slot
	c.ssd.st.endSpan()
	if err == nil {
		err = c.ssd.verify(s.line, slot, h.p, s.lo)
	}
	if err != nil { // as readHit does, off the device's goroutine
		go func() {
			c.ssd.ioError(s.line, slot, err)
			c.ssd.unpin(slot)
			h.fallback()
		}()
		return
	}
	c.ssd.hitBytes.Add(uint64(len(h.p)))
	c.ssd.unpin(slot)
	h.finish(nil)
}

// readHit serves the read as read does (Cache.readHit); readAsync runs it on a goroutine of its
// own.
func (h *hitRead) readHit() {
	if h.c.readHit(h.pieces[0], h.src, h.p, false) {
		h.finish(nil)
		return
	}
	h.fallback()
}

// readRAMNow serves a RAM-tier hit of piece s at once, if its line is free and RAM still holds
// the blocks it touches; done is called before it returns. Otherwise it does nothing and counts
// nothing, for ReadAt to serve the read.
func (c *Cache) readRAMNow(s piece, p []byte, off int64, done func(error)) bool {
	if !c.locks.TryLock(s.line) {
		return false
	}
	t0 := time.Now()
	ok := c.ram.copyHit(s.line, s.touched(), p, s.lo)
	c.locks.Unlock(s.line, s.line)
	if !ok {
		return false
	}
	if c.wb != nil {
		c.wb.lastIO.Store(t0.UnixNano())
	}
	c.endRead(nil, off, len(p), t0, done)
	return true
}

// promoteAsync is promote started on the SSD device (by start), of a store of slots (contiguous):
// the blocks p touches are read into a RAM slot, then copied to p, and finish is called. It
// reports false, having done nothing, where RAM has no slot to spare, the blocks to read are not
// one run or the device will not start the read: the caller then reads the SSD tier alone.
func (c *Cache) promoteAsync(start readStart, s piece, src source, p []byte, finish func(error)) bool {
	g := c.ram.acquire(s.line)
	if !g.ok {
		return false
	}
	slot, missing := g.slot, s.touched().AndNot(g.valid)
	runs, lo, hi := 0, int64(0), int64(0)
	missing.Runs(s.blocks(), func(b0, b1 int) {
		runs++
		lo, hi = int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
	})
	mem := c.ram.ramSlot(slot)
	ended := func(err error) {
		if err == nil {
			err = c.ssd.verify(s.line, src.slot, mem[lo:hi], lo)
		}
		if err != nil { // as promote does, off the device's goroutine
			go func() {
				c.ram.unpin(slot)
				c.ssd.ioError(s.line, src.slot, err)
				c.ssd.unpin(src.slot)
				finish(c.readMiss([]piece{s}, p, false))
			}()
			return
		}
		copy(p, mem[s.lo:])
		c.ram.markValid(s.line, slot, missing, false, lineBits{})
		c.ssd.hitBytes.Add(uint64(len(p)))
		c.ssd.unpin(src.slot)
		finish(nil)
	}
	switch {
	case runs == 0: // another request promoted the blocks meanwhile
		ended(nil)
		return true
	case runs == 1 && start(mem[lo:hi], int64(src.slot)*c.line+lo, ended):
		return true
	}
	c.ram.unpin(slot)
	return false
}
