package cache

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/fetch"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/policy"
)

// ReadAt implements backend.Backend.
func (c *Cache) ReadAt(p []byte, off int64) (int, error) {
	t0 := time.Now()
	defer func() { c.readLat.observe(time.Since(t0)) }()
	if err := c.readEnd(c.read(p, off, false), off, int64(len(p))); err != nil {
		return 0, err
	}
	c.asked.Add(uint64(len(p)))
	return len(p), nil
}

// readEnd is the outcome of a read of [off, off+n) that returned err: ErrLost if the range
// overlaps a lost one, whatever err is, else err. Looked at after the data was found: a block
// found damaged meanwhile (by this read or another) is lost before it leaves the tier, so a read
// that found it gone sees it lost; in FLUSH order a lost block stays on the tier, and a read
// that finds it fails on its way, as lost too.
func (c *Cache) readEnd(err error, off, n int64) error {
	if lerr := c.lost.check(off, n); lerr != nil {
		return lerr
	}
	return err
}

// Prefetch brings a range into the cache, whatever the admission policies say (NBD_CMD_CACHE).
func (c *Cache) Prefetch(off, length int64) error {
	if err := c.check(off, length); err != nil {
		return err
	}
	bufp := bufpool.Get(int(min(length, 4<<20)))
	defer bufpool.Put(bufp)
	buf := *bufp
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

// source says where a piece's data comes from.
type source struct {
	t      *tier // nil: the backend
	slot   uint32
	valid  lineBits // the slot's valid blocks at lookup
	zero   lineBits // which of them are zero blocks, not in the slot
	served bool     // by the RAM tier, during the lookup
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
	var pieceBuf [2]piece
	var srcBuf [2]source
	pieces := c.split(pieceBuf[:0], off, int64(len(p)))
	c.lockPieces(pieces)
	defer c.unlockPieces(pieces)
	src := srcBuf[:0]
	for i, s := range pieces {
		src = append(src, source{})
		need := s.touched()
		if c.ram.usable() && c.ram.readHit(s.line, need, p[s.pOff:s.pOff+s.hi-s.lo], s.lo) {
			src[i].served = true
			continue
		}
		if c.ssd != nil { // even bypassed: it may hold dirty data
			if g := c.ssd.lookup(s.line, need); g.ok {
				src[i] = source{t: c.ssd, slot: g.slot, valid: g.valid, zero: g.zero}
			}
		}
	}
	c.readHits(pieces, src, p, force)
	for i := 0; i < len(pieces); {
		if src[i].served {
			i++
			continue
		}
		j := i + 1
		for j < len(pieces) && !src[j].served {
			j++
		}
		if err := c.readMiss(pieces[i:j], p, force); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// readHits serves the pieces the SSD tier holds. Pieces whose lines sit in adjacent slots are
// read with one request (a sequential fill stores a run of lines so, see tier.acquireLines), and
// several such runs at once: the device serves them in parallel (bench cache --parts hits, 1M
// reads). Then, if RAM admits them, they are copied into RAM one after the other from what was
// read: promotions at once would pin each other's victims and leave RAM short of full
// (TestCacheAdmin). A single piece promotes as readHit does. A run the SSD fails is read again
// line by line, so that only the lines that fail are dropped; a piece that fails is left to the
// backend: its source is cleared. A piece with zero blocks is read alone (readHit), which reads
// only the blocks the slot holds.
func (c *Cache) readHits(pieces []piece, src []source, p []byte, force bool) {
	promotes := func(s piece) bool {
		return c.ram.usable() && (force || c.ram.admits(c.promotion(s)))
	}
	hit := func(i int, promote bool) {
		if c.readHit(pieces[i], src[i], p, promote) {
			src[i].served = true
		}
		src[i].t = nil // read, or failed: the line goes to the backend
	}
	var runBuf [2][2]int // [first, last] indexes of pieces; most requests touch one or two lines
	runs := runBuf[:0]
	hits := 0
	alone := func(i int) bool { return !src[i].zero.And(pieces[i].touched()).IsZero() }
	for i := range src {
		if src[i].t == nil {
			continue
		}
		hits++
		if n := len(runs); n > 0 && c.ssd.st.contiguous() && runs[n-1][1] == i-1 && src[i].slot == src[i-1].slot+1 && !alone(i) && !alone(i-1) {
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
		hit(i, promotes(pieces[i]))
		return
	}
	readRun := func(r [2]int) {
		if r[0] == r[1] {
			hit(r[0], false)
			return
		}
		a, b := pieces[r[0]], pieces[r[1]]
		err := c.ssd.st.read(a.line, src[r[0]].slot, p[a.pOff:b.pOff+b.hi-b.lo], a.lo, false)
		for i := r[0]; i <= r[1]; i++ {
			if err != nil {
				hit(i, false)
				continue
			}
			c.ssd.unpin(src[i].slot)
			c.ssd.hitBytes.Add(uint64(pieces[i].hi - pieces[i].lo))
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
			if s := pieces[i]; src[i].served && promotes(s) {
				c.fillTier(c.ram, s, c.ram.acquire(s.line), p[s.pOff:s.pOff+s.hi-s.lo], s.lo, s.full())
			}
		}
	}
}

// readHit serves a piece from the SSD tier, promoting the blocks it reads to RAM if promote is
// set. It reports false if the SSD failed the read (the line is dropped and the caller goes to the
// backend).
func (c *Cache) readHit(s piece, src source, p []byte, promote bool) bool {
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
	if err := t.readBlocks(s.line, src.slot, dst, s.lo, src.zero); err != nil {
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
func (c *Cache) promote(s piece, src source, dst []byte) (ok, done bool) {
	g := c.ram.acquire(s.line)
	if !g.ok {
		return false, false
	}
	slot, ssdSlot := g.slot, src.slot
	missing := s.touched().AndNot(g.valid)
	var err error
	missing.Runs(s.blocks(), func(b0, b1 int) {
		if err != nil {
			return
		}
		lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
		err = c.ssd.readBlocks(s.line, ssdSlot, c.ram.ramSlot(slot)[lo:hi], lo, src.zero)
	})
	if err != nil {
		c.ram.unpin(slot)
		c.ssd.ioError(s.line, ssdSlot, err)
		return false, true
	}
	copy(dst, c.ram.ramSlot(slot)[s.lo:])
	c.ram.markValid(s.line, slot, missing, false, lineBits{})
	return true, true
}

func (c *Cache) access(s piece, write bool) policy.Access {
	return policy.Access{Key: policy.Key(s.line), Offset: s.start + s.lo, Length: s.hi - s.lo, Write: write}
}

// promotion is the access of a read that the SSD tier serves, asking RAM to admit it.
func (c *Cache) promotion(s piece) policy.Access {
	a := c.access(s, false)
	a.Promotion = true
	return a
}

// readMiss fetches a run of adjacent missed pieces with one backend read: for a piece that a
// tier admits or already partly holds, what package fetch's rule says; only the requested bytes
// otherwise. Blocks the SSD tier holds are served from it, not from the backend, so
// that every path gives one answer per block: they are never older than the backend, and after a
// power cut they may differ from a backend write that was never flushed. Then it fills the tiers
// with what it fetched.
func (c *Cache) readMiss(pieces []piece, p []byte, force bool) error {
	m := c.planMiss(pieces, force, p, false)
	defer m.release()
	if err := c.backendRead(m.buf(), m.from); err != nil {
		return err
	}
	if err := c.serveMiss(m, p); err != nil {
		return err
	}
	c.fillMiss(m)
	return nil
}

// miss is what a read miss of a run of adjacent pieces fetches (planMiss) and where it goes.
type miss struct {
	pieces   []piece
	fills    []missFill
	from, to int64   // the backend's bytes fetched
	bufp     *[]byte // holds them: a pooled buffer, or the read's own bytes if inPlace
	inPlace  bool
}

// missFill is what a miss does with a piece's fetched bytes: the tiers it fills, and the SSD
// tier's partial copy of the line, which it reads the blocks it holds from.
type missFill struct {
	ram, ssd bool
	held     source // pinned
	lo, hi   int64  // the bytes of the line fetched
}

// cached reports whether a tier fills, or holds part of, f's line.
func (f missFill) cached() bool { return f.ram || f.ssd || f.held.t != nil }

// got returns the blocks of f's line fetched.
func (f missFill) got() lineBits {
	return linebits.Range(int(f.lo/blockSize), int((f.hi+blockSize-1)/blockSize))
}

// planMiss decides what a miss of pieces (of the read p) fetches: each tier's admission, and
// package fetch's reach; it pins the SSD tier's partial copies of the lines, and takes a buffer
// for the bytes. The caller ends with release. fillLater says that the tiers are filled after the
// read has handed p back (missAsync).
//
// Where the miss fetches exactly the bytes the pieces ask for, and p is still the read's while
// the tiers are filled from the fetched bytes (or nothing is filled), they are fetched into p
// itself, and serving them costs no copy: a read that no tier admits (a sequential read while
// the SSD tier is congested, bench kernel's seq row; any read of a cache in write-back that
// admits none) and whole lines that one fills.
func (c *Cache) planMiss(pieces []piece, force bool, p []byte, fillLater bool) *miss {
	n := len(p)
	m := &miss{pieces: pieces, fills: make([]missFill, len(pieces))}
	for i, s := range pieces {
		if c.ssd != nil {
			if g := c.ssd.pin(s.line); g.ok {
				m.fills[i].held = source{t: c.ssd, slot: g.slot, valid: g.valid, zero: g.zero}
			}
		}
	}
	first, last := pieces[0], pieces[len(pieces)-1]
	c.streams.Follow(first.start+first.lo, func(seq bool) int64 {
		for i, s := range pieces {
			a := c.access(s, false)
			a.Sequential = seq || int64(n) > c.line // a request of several lines is a sequential run
			m.fills[i].ssd = c.ssd.usable() && (force || c.ssd.admits(a))
			m.fills[i].ram = c.ram.usable() && (force || c.ram.admits(a))
		}
		r := fetch.Blocks
		switch {
		case force:
			r = fetch.Line
		case seq:
			r = fetch.Ahead
		}
		for i, s := range pieces {
			// The pieces between the first and the last are whole lines already.
			m.fills[i].lo, m.fills[i].hi = fetch.Range(s.lo, s.hi, s.n, m.fills[i].cached(), r)
		}
		m.from, m.to = first.start+m.fills[0].lo, last.start+m.fills[len(m.fills)-1].hi
		return m.to
	})
	fills := false
	for _, f := range m.fills {
		fills = fills || f.ram || f.ssd
	}
	if exact := m.from == first.start+first.lo && m.to == last.start+last.hi; exact && !(fillLater && fills) {
		b := p[first.pOff : first.pOff+m.to-m.from]
		m.bufp, m.inPlace = &b, true
	} else {
		m.bufp = bufpool.Get(int(m.to - m.from))
	}
	return m
}

func (m *miss) buf() []byte { return *m.bufp }

// data returns the fetched bytes of piece i: its line's bytes [lo, hi) of its fill.
func (m *miss) data(i int) []byte {
	s, f := m.pieces[i], m.fills[i]
	return m.buf()[s.start+f.lo-m.from : s.start+f.hi-m.from]
}

// overlays reports whether the SSD tier holds a block the miss fetched, which serveMiss then
// reads from it.
func (m *miss) overlays() bool {
	for _, f := range m.fills {
		if f.held.t != nil && !f.held.valid.And(f.got()).IsZero() {
			return true
		}
	}
	return false
}

// release unpins what planMiss pinned and gives its buffer back.
func (m *miss) release() {
	for _, f := range m.fills {
		if f.held.t != nil {
			f.held.t.unpin(f.held.slot)
		}
	}
	if !m.inPlace {
		bufpool.Put(m.bufp)
	}
}

// serveMiss copies the fetched bytes into p, once the SSD tier's copies of the blocks it holds
// replace the backend's (overlay).
func (c *Cache) serveMiss(m *miss, p []byte) error {
	c.fetched.Add(uint64(m.to - m.from))
	for i, s := range m.pieces {
		f, data := m.fills[i], m.data(i)
		if h := f.held; h.t != nil {
			if err := c.overlay(s, h, data, f.lo, f.got()); err != nil {
				return err
			}
		}
		if !m.inPlace {
			copy(p[s.pOff:s.pOff+s.hi-s.lo], data[s.lo-f.lo:])
		}
	}
	return nil
}

// fillMiss fills the tiers that admitted the pieces with what the miss fetched (serveMiss made
// it the lines' current bytes). The SSD tier's lines are acquired as one run, in adjacent slots
// where it has them.
func (c *Cache) fillMiss(m *miss) {
	var whichBuf [2]int
	which := whichBuf[:0]
	for i, f := range m.fills {
		if f.ssd {
			which = append(which, i)
		}
	}
	var grantBuf [2]grant
	grants := c.acquirePieces(c.ssd, m.pieces, which, grantBuf[:0])
	for i, s := range m.pieces {
		f, data := m.fills[i], m.data(i)
		if f.ssd {
			c.fillTier(c.ssd, s, grants[0], data, f.lo, f.got())
			grants = grants[1:]
		}
		if f.ram {
			c.fillTier(c.ram, s, c.ram.acquire(s.line), data, f.lo, f.got())
		}
	}
}

// overlay replaces the blocks of data (the line's bytes from base, read from the backend; got are
// its blocks) that the SSD slot holds with the SSD's copy. If the SSD fails, the backend's data
// stays for clean blocks, which the backend holds too, and the line is dropped from the tier; a
// dirty block's only copy is the SSD's, so the read fails, as bcache fails it, rather than return
// the backend's older data (TestDirtyReadOnSSDError).
func (c *Cache) overlay(s piece, h source, data []byte, base int64, got lineBits) error {
	var err error
	var copied lineBits
	var overlayRuns func(bits lineBits, again bool)
	overlayRuns = func(bits lineBits, again bool) {
		bits.Runs(s.blocks(), func(b0, b1 int) {
			if err != nil {
				return
			}
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
			tmpp := bufpool.Get(int(hi - lo))
			defer bufpool.Put(tmpp)
			tmp := *tmpp
			if rerr := h.t.readBlocks(s.line, h.slot, tmp, lo, h.zero); rerr != nil {
				_, dirty := h.t.bits(s.line)
				h.t.ioError(s.line, h.slot, rerr)
				if d, ok := asDamage(rerr); ok {
					// The damaged blocks are dealt with (a dirty one is lost: the read fails once
					// it has its data, ReadAt); the others of the run are read again, and, once,
					// damaged ones the tier still holds (repaired from the RAM tier).
					next := linebits.Range(b0, b1).AndNot(d.bits)
					if again {
						v, _ := h.t.bits(s.line)
						next = next.Or(d.bits.And(v))
					}
					overlayRuns(next, false)
					return
				}
				if !dirty.And(linebits.Range(b0, b1)).IsZero() {
					err = fmt.Errorf("cache: the SSD tier failed a read of data not yet written back: %w", rerr)
				}
				return
			}
			copy(data[lo-base:hi-base], tmp)
			copied = copied.Or(linebits.Range(b0, b1))
		})
	}
	overlayRuns(h.valid.And(got), true)
	if err == nil {
		// A dirty block left with the backend's bytes must fail the read: lost (ReadAt), or, if
		// the tier still holds it (damaged again after a repair), here.
		if _, dirty := h.t.bits(s.line); !dirty.And(got).AndNot(copied).IsZero() {
			err = fmt.Errorf("cache: the SSD tier failed a read of data not yet written back: %w",
				&damageError{line: s.line, bits: dirty.And(got).AndNot(copied)})
		}
	}
	return err
}

// fillTier stores the blocks bits of the line in tier t from data, the line's bytes from base,
// skipping blocks t already holds: those are never older than the backend. g is the line's
// acquired slot, if any. A tier that reduces writes no zero block (writeBlocks).
func (c *Cache) fillTier(t *tier, s piece, g grant, data []byte, base int64, bits lineBits) {
	if !g.ok {
		return
	}
	slot, missing := g.slot, bits.AndNot(g.valid)
	var err error
	var zeros lineBits
	missing.Runs(s.blocks(), func(b0, b1 int) {
		if err == nil {
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
			var z lineBits
			z, err = t.writeBlocks(s.line, slot, data[lo-base:hi-base], lo, s.n)
			zeros = zeros.Or(z)
		}
	})
	if errors.Is(err, errNoRoom) {
		t.noRoom(s.line, slot)
		return
	}
	if err != nil {
		t.unpin(slot)
		t.ioError(s.line, slot, err)
		return
	}
	t.markValid(s.line, slot, missing, false, zeros)
}

func (c *Cache) backendRead(p []byte, off int64) error {
	start := c.backendReadStart()
	_, err := c.b.ReadAt(p, off)
	c.backendReadEnd(start, len(p), err)
	return err
}

// backendReadStart and backendReadEnd count a read of the backend of n bytes that ended with
// err: its time, where the SSD tier's congestion bypass wants it, and its bytes.
func (c *Cache) backendReadStart() time.Time {
	if c.ssd != nil && c.ssd.cong != nil {
		return time.Now()
	}
	return time.Time{}
}

func (c *Cache) backendReadEnd(start time.Time, n int, err error) {
	if !start.IsZero() {
		c.ssd.cong.BackendReadTook(time.Since(start))
	}
	c.backendStats.read(n, err)
}
