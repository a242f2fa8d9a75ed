package cache

import "time"

// missAsync serves a read miss of piece s (the read p at off, within one line) that neither tier
// holds, with the backend's read started by fetch: on the caller's ring (a ublk queue's, whose
// goroutine reaps it), or by a backend that reads asynchronously (an NBD export), which ends it on
// a goroutine of its own. No goroutine waits for the backend, and where no tier holds any block
// the miss fetches, the read ends on the goroutine that ends the backend's read as soon as the
// bytes are in p. The fill of the tiers follows on a goroutine of its own, which holds the line
// until it is done, as read holds it until its fill is. It reports false, having counted and
// started nothing, where another request holds the line or a tier holds the blocks now: the
// caller reads with ReadAt. locked says that the caller holds the line alone already, which
// missAsync then owns. Nothing here waits for another request (see readAsync).
func (c *Cache) missAsync(fetch readStart, s piece, p []byte, off int64, done func(error), locked bool) bool {
	if !locked && !c.locks.TryLock(s.line) {
		return false
	}
	need := s.touched()
	if c.ram.usable() && c.ram.holds(s.line, need) || c.ssd.holds(s.line, need) {
		c.locks.Unlock(s.line, s.line)
		return false
	}
	r := &asyncMiss{c: c, pieces: [1]piece{s}, p: p, off: off, done: done, t0: time.Now()}
	if c.wb != nil {
		c.wb.lastIO.Store(r.t0.UnixNano())
	}
	// Counted as read's lookups count a miss.
	if c.ram.usable() {
		c.ram.misses.Add(1)
	}
	c.ssd.misses.Add(1)
	r.m = c.planMiss(r.pieces[:], false, p, true)
	c.filling.Add(1)
	r.start = c.backendReadStart()
	if !fetch(r.m.buf(), r.m.from, r.fetched) {
		// The backend will not start it (on a ring: an unaligned end of the device): its own
		// way, on a goroutine.
		c.runners.run(func() {
			_, err := c.b.ReadAt(r.m.buf(), r.m.from)
			r.fetched(err)
		})
	}
	return true
}

// asyncMiss is a read miss that missAsync took on: the line is held, and the miss planned.
type asyncMiss struct {
	c      *Cache
	pieces [1]piece
	m      *miss
	p      []byte
	off    int64
	done   func(error)
	t0     time.Time // when the read was taken on
	start  time.Time // when the backend's read started, if counted (backendReadStart)
}

// fetched goes on once the backend's read ended with err: on the goroutine that ended it, the
// bytes go to p at once, unless the SSD tier holds some of the blocks fetched, which are read from
// it on a goroutine (overlay).
func (r *asyncMiss) fetched(err error) {
	c, m := r.c, r.m
	c.backendReadEnd(r.start, len(m.buf()), err)
	if err == nil && m.overlays() {
		c.runners.run(func() { r.finish(c.serveMiss(m, r.p)) })
		return
	}
	if err == nil {
		err = c.serveMiss(m, r.p)
	}
	r.finish(err)
}

// finish ends the read with err, as ReadAt does, then fills the tiers (after a read that failed,
// or where no tier admitted the line, nothing) and lets go of the line and of what the miss
// pinned.
func (r *asyncMiss) finish(err error) {
	c := r.c
	if err = c.endRead(err, r.off, len(r.p), r.t0, r.done); err != nil || !r.m.fills[0].ram && !r.m.fills[0].ssd {
		r.release()
		return
	}
	// A fill takes slots, which may wait for a checkpoint or for requests on the ring's own
	// goroutine (or the backend's): not on it.
	c.runners.run(r.fill)
}

// fill fills the tiers with what the miss fetched, then lets go as release does.
func (r *asyncMiss) fill() {
	r.c.fillMiss(r.m)
	r.release()
}

func (r *asyncMiss) release() {
	r.m.release()
	r.c.locks.Unlock(r.pieces[0].line, r.pieces[0].line)
	r.c.filling.Done()
}
