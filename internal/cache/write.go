package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

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

func (c *Cache) write(p []byte, off int64, fua bool) (err error) {
	t0 := time.Now()
	defer func() { c.writeLat.observe(time.Since(t0)) }()
	if err := c.check(off, int64(len(p))); err != nil {
		return err
	}
	defer func() {
		if err == nil { // what it wrote is no longer lost (lost.go)
			err = c.lost.clear(off, int64(len(p)))
		}
	}()
	if len(p) == 0 {
		return nil
	}
	var pieceBuf [2]piece
	pieces := c.split(pieceBuf[:0], off, int64(len(p)))
	mode := c.Mode()
	if c.wb != nil {
		c.wb.lastIO.Store(time.Now().UnixNano())
	}
	if mode == WriteBack && c.ssd.usable() {
		// Throttled before the line locks are taken: the destager needs them to make room.
		if err := c.admitDirty(len(pieces), touchedBlocks(pieces)); err != nil {
			return err
		}
		defer c.releaseDirty(len(pieces))
		// The mode again, under the mode lock held shared until the lines are dirty: SetMode
		// changes the mode holding it alone, so the flush after a switch finds what this write
		// dirtied, and a switch while the write was throttled sends it the new mode's way (as a
		// tier bypassed meanwhile sends it through).
		c.wb.modeMu.RLock()
		if mode = c.Mode(); mode == WriteBack && c.ssd.usable() {
			var err error
			for again := true; again; {
				c.lockPieces(pieces)
				err = c.writeBackPieces(pieces, p, fua)
				c.unlockPieces(pieces)
				again, err = c.waitIfOrdered(err)
			}
			if err == nil && fua && c.ordered() {
				c.ssd.ep.next() // a FUA write ends its epoch
			}
			c.wb.modeMu.RUnlock()
			if errors.Is(err, errDurableElsewhere) {
				return c.Flush() // the bypassed tier's way to durability
			}
			return err
		}
		c.wb.modeMu.RUnlock()
	}
	for again := true; again; {
		c.lockPieces(pieces)
		err = c.writeOtherLocked(mode, pieces, p, off, fua)
		c.unlockPieces(pieces)
		again, err = c.waitIfOrdered(err)
	}
	return err
}

// writeOtherLocked is a write that is not write-back's (another mode, or a bypassed SSD tier),
// under the pieces' line locks: the dirty data it overlaps goes to the backend first.
func (c *Cache) writeOtherLocked(mode Mode, pieces []piece, p []byte, off int64, fua bool) error {
	if err := c.orderCheck(pieces, true); err != nil {
		return err
	}
	if err := c.destageTouched(pieces); err != nil {
		return err
	}
	// In write-back (the SSD tier bypassed) the invalidation is synced, as write-back's others
	// are (syncInvalidations): after a power cut the cache and the backend agree.
	if err := c.invalidate(pieces, fua || mode == WriteBack); err != nil {
		return err
	}
	if mode != WriteThrough && mode != WriteBack {
		return c.backendWrite(p, off, fua)
	}
	return c.writeThrough(pieces, p, off, fua)
}

// writeThrough writes RAM, the SSD and then the backend; the cached blocks become valid only once
// the backend has the data. The SSD's writes go to the page cache (see daemon.openSSD), a memory
// copy, cheaper than handing them to another goroutine. The caller holds the line locks.
func (c *Cache) writeThrough(pieces []piece, p []byte, off int64, fua bool) error {
	type filled struct {
		t           *tier
		line        uint64
		slot        uint32
		bits, zeros lineBits
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
		for i, s := range pieces {
			if c.storesWrite(t, s) {
				which = append(which, i)
			}
		}
		for k, g := range c.acquirePieces(t, pieces, which, grantBuf[:0]) {
			s := pieces[which[k]]
			if bits, zeros, ok := c.writeTier(t, s, g, p); ok {
				done = append(done, filled{t, s.line, g.slot, bits, zeros})
			}
		}
	}
	err := c.backendWrite(p, off, fua)
	for _, f := range done {
		if err != nil {
			f.t.unpin(f.slot)
			continue
		}
		f.t.markValid(f.line, f.slot, f.bits, false, f.zeros)
	}
	return err
}

// invalidate drops the cached blocks a change is about to touch: in RAM at once, on the SSD with a
// metadata commit, so that no crash can leave a record calling the old data valid.
func (c *Cache) invalidate(pieces []piece, sync bool) error {
	for _, s := range pieces {
		if c.ram != nil {
			c.ram.invalidate(s.line, s.touched())
		}
	}
	if c.ssd == nil {
		return nil
	}
	spans := make([]span, len(pieces))
	for i, s := range pieces {
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

// Trim implements backend.Trimmer: the cached copies go, then the backend trims. What the backend
// reads back after a trim is its own affair (zeros, or the old data), so the cache marks nothing
// zero for it.
func (c *Cache) Trim(off, length int64) error {
	if c.trim == nil {
		return backend.ErrNotSupported
	}
	return c.change(off, length, false, func() error { return c.trim.Trim(off, length) })
}

// WriteZeroes implements backend.ZeroWriter. In write-back, on an SSD tier that stores no zero
// block, a small one is a write of zeros: dirty zero blocks, written neither to the SSD nor yet to
// the backend, which the destager sends as a WRITE_ZEROES. Otherwise the backend zeroes the range
// now, and the lines the SSD tier holds mark its whole blocks zero.
func (c *Cache) WriteZeroes(off, length int64, mayUnmap bool) error {
	if c.zero == nil {
		return backend.ErrNotSupported
	}
	if length > 0 && length <= maxZeroWrite && c.Mode() == WriteBack && c.ssd.usable() && c.ssd.reduce {
		return c.write(zeroes[:length], off, false)
	}
	return c.change(off, length, true, func() error { return c.zero.WriteZeroes(off, length, mayUnmap) })
}

// change runs a backend operation that changes data without passing it through the cache; zeroing
// says the range reads as zeros once it succeeded.
func (c *Cache) change(off, length int64, zeroing bool, op func() error) error {
	if err := c.check(off, length); err != nil {
		return err
	}
	if length == 0 {
		return op()
	}
	var pieceBuf [2]piece
	pieces := c.split(pieceBuf[:0], off, length)
	var err error
	for again := true; again; {
		c.lockPieces(pieces)
		err = c.changeLocked(pieces, off, length, zeroing, op)
		c.unlockPieces(pieces)
		again, err = c.waitIfOrdered(err)
	}
	return err
}

// changeLocked is change under the pieces' line locks.
func (c *Cache) changeLocked(pieces []piece, off, length int64, zeroing bool, op func() error) error {
	if err := c.orderCheck(pieces, true); err != nil {
		return err
	}
	if err := c.destageTouched(pieces); err != nil {
		return err
	}
	var held []piece
	if zeroing {
		held = c.heldPieces(pieces)
	}
	// In write-back the invalidation is synced: a power cut must not bring back the old bytes as
	// clean while the backend holds the change (syncInvalidations says why).
	if err := c.invalidate(pieces, c.Mode() == WriteBack); err != nil {
		return err
	}
	err := op()
	// Counted before zeroHeld records anything: a checkpoint that commits those records flushes
	// the backend first, so that a power loss cannot keep the zero bits and lose the zeroing.
	c.backendChanges.Add(1)
	if err == nil {
		c.zeroHeld(held)
		err = c.lost.clear(off, length)
	}
	return err
}

// heldPieces returns the pieces of pieces with whole blocks whose lines the SSD tier holds, if the
// tier reduces: after a zeroing, zeroHeld marks those blocks zero.
func (c *Cache) heldPieces(pieces []piece) []piece {
	if !c.ssd.usable() || !c.ssd.reduce {
		return nil
	}
	var held []piece
	for _, s := range pieces {
		if v, _ := c.ssd.bits(s.line); !v.IsZero() && !s.full().IsZero() {
			held = append(held, s)
		}
	}
	return held
}

// zeroHeld marks the whole blocks of pieces valid zero blocks on the SSD tier, after the backend
// zeroed them (the caller holds the line locks): reads of them are then hits that need no SSD I/O.
// The lines were on the tier before the zeroing invalidated them (heldPieces); lines that were not
// are not brought in: a zeroing of a whole disk would push out every line for lines of nothing.
func (c *Cache) zeroHeld(pieces []piece) {
	if len(pieces) == 0 || !c.ssd.usable() {
		return
	}
	for _, s := range pieces {
		if g := c.ssd.acquire(s.line); g.ok {
			c.ssd.markValid(s.line, g.slot, s.full(), false, s.full())
		}
	}
}
