package cache

import (
	"errors"
	"fmt"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/pkg/backend"
)

// writeBackPieces writes a request to the SSD tier as dirty data; the backend gets it later. The
// caller holds the line locks. A line the SSD tier cannot take now goes to the backend, after the
// dirty data it overlaps: no write fails for lack of room.
//
// What a write-back write waits for, in the order it takes them (docs/architecture.md, "When the
// SSD tier has no room"), so that no cycle of waits can form:
//  1. room below the maximum of dirty lines (admitDirty), before any line lock: the destager,
//     which needs line locks to make that room, wakes it after each attempt;
//  2. its line locks, in ascending order (lockPieces), as the destager and FlushAll take theirs;
//  3. under them, checkpointMu: a checkpoint for evicted slots (checkpointForSlots), reclaim and a
//     checkpoint for room (makeRoom), a checkpoint for FUA (durable). A checkpoint waits for the
//     devices and the metadata store, never for a line lock or a writer; reclaim takes the tier's
//     locks (io shared, mu, pk.mu), never a line lock, and releases room (io exclusive) only
//     after it returned;
//  4. the backend, for the dirty data of its own locked lines (destageTouched) and for what goes
//     around the tier (retryBackend: while it fails with an error that may pass, up to
//     backendWait).
//
// A writer so never waits for room while holding what the room's maker needs: past its
// throttle it makes room itself, by a checkpoint or by writing its own lines back.
func (c *Cache) writeBackPieces(pieces []piece, p []byte, fua bool) error {
	if err := c.keepOverwritten(pieces); err != nil {
		return err
	}
	if err := c.invalidateOverwritten(pieces); err != nil {
		return err
	}
	var whichBuf [2]int
	which := whichBuf[:0]
	for i := range pieces {
		which = append(which, i)
	}
	var grantBuf [2]grant
	grants := c.acquirePieces(c.ssd, pieces, which, grantBuf[:0])
	tries := slotTries
	for i, s := range pieces {
		err := c.writeBackPiece(s, grants[i], p, &tries)
		if _, ok := asDamage(err); ok {
			// The rest of a block the write covers in part failed its checksum: dealt with
			// (ioError: a dirty block is lost, a clean one dropped), the block is no longer in
			// the slot, and the write takes the rest from the backend.
			err = c.writeBackPiece(s, c.ssd.acquire(s.line), p, &tries)
		}
		if errors.Is(err, errDirtyNoRoom) {
			// The SSD tier has no room for this line's new data, and holds the only copy of
			// older writes to it: those go to the backend first, with the dirty data of every
			// line the request has still to write (one backend flush for them all, not one a
			// line), and then the write, over clean data now, is stored or goes around. That
			// clean data the store may call valid, as it may the blocks above: it is invalidated
			// first too, or a crash would leave a record calling the old data clean while the
			// backend has this write once the destager took it (TestCrashRestart, write-back
			// with a full packed tier). The slots of the lines still to write are let go for it
			// (an invalidation may drop a line) and taken again.
			if err = c.orderCheck(pieces[i:], true); err == nil {
				err = c.retryBackend(func() error { return c.destageTouched(pieces[i:]) })
			}
			if err == nil {
				for _, g := range grants[i+1:] {
					if g.ok {
						c.ssd.unpin(g.slot)
					}
				}
				grants = grants[:i+1]
				if err = c.invalidateOverwritten(pieces[i:]); err == nil {
					grants = c.acquirePieces(c.ssd, pieces, which[i+1:], grants)
					err = c.writeBackPiece(s, c.ssd.acquire(s.line), p, &tries)
				}
			}
		}
		if err != nil {
			for _, g := range grants[i+1:] {
				if g.ok {
					c.ssd.unpin(g.slot)
				}
			}
			return err
		}
	}
	if fua {
		// A write that went around the tier is durable once the backend is flushed, which the
		// checkpoint does: it waits for a backend down for a while as the write did.
		if err := c.retryBackend(c.ssd.j.durable); err != nil && !c.ssd.usable() {
			return fmt.Errorf("%w: %w", errDurableElsewhere, err)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// invalidateOverwritten invalidates durably the clean cached blocks that pieces are about to write
// over (and drops them from the RAM tier): a crash in the middle must not leave a record calling a
// half-new block clean (the backend has the old one). The caller holds the pieces' line locks,
// so no destage cleans a block of theirs after this.
func (c *Cache) invalidateOverwritten(pieces []piece) error {
	var spanBuf [2]span // most requests touch one or two lines: no allocation
	spans := spanBuf[:0]
	for _, s := range pieces {
		v, d := c.ssd.bits(s.line)
		if b := s.touched().And(v).AndNot(d); !b.IsZero() {
			spans = append(spans, span{s.line, b})
		}
		if c.ram != nil {
			c.ram.invalidate(s.line, s.touched())
		}
	}
	if len(spans) == 0 {
		return nil
	}
	if err := c.ssd.j.invalidateDurably(spans, false); err != nil {
		// As in write-through (invalidate): the store may still call the old data valid, so
		// the write must not happen, and the tier is bypassed until the store works again.
		c.ssd.fail(fmt.Sprintf("metadata commit: %v", err))
		return fmt.Errorf("cache metadata: cannot invalidate the SSD tier's copy before the write: %w", err)
	}
	return nil
}

// errDirtyNoRoom is a write-back piece that found no room on a packed SSD tier (errNoRoom) over
// dirty blocks, which writeBackPieces writes back so that the piece can go around the tier.
var errDirtyNoRoom = errors.New("cache: the SSD tier has no room for a write over dirty data")

// backendWait is how long a write-back write that the SSD tier cannot take (no room for it, or
// for the dirty data it overlaps) waits for a backend that fails with an error that may pass (an
// NBD server restarting, an iSCSI link logging in again) before it fails: less than the kernel's
// NBD device waits for tierblk itself by default (config.DefaultNBDDeviceTimeout).
const backendWait = time.Minute

// retryBackend runs op, and again while it fails with an error that may pass (backend.IsRetryable)
// for up to backendWait, with backoff, while the SSD tier stays in service and the cache open. A
// write-back write whose data must go to the backend now (around a full SSD tier, or the dirty
// data before it) so waits for a backend that is down for a while, as the destager does, rather
// than fail the client's write (TestWriteBackFullTierBackendDown).
func (c *Cache) retryBackend(op func() error) error {
	deadline := time.Now().Add(backendWait)
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		err := op()
		if err == nil || !backend.IsRetryable(err) || !c.ssd.usable() || c.closed.Load() ||
			time.Now().Add(backoff).After(deadline) {
			return err
		}
		c.wb.backendWaits.Add(1)
		time.Sleep(backoff)
	}
}

// errDurableElsewhere is a FUA write in write-back that the SSD tier took but could not make
// durable, the tier failing meanwhile: the write is durable once written back, which the caller
// has done by a Flush, outside the write's line locks (Flush writes back every dirty line).
var errDurableElsewhere = errors.New("the SSD tier failed to make a FUA write durable")

// writeBackPiece writes a piece to the SSD tier as dirty data, in the slot g acquired for its line
// if it got one. *tries is how many checkpoints it may run for a slot or room: a request whose
// piece found neither after them all (a write larger than the tier's free room) sends the rest
// of its pieces the backend's way at once, rather than run checkpoints for each line.
func (c *Cache) writeBackPiece(s piece, g grant, p []byte, tries *int) error {
	data := p[s.pOff : s.pOff+s.hi-s.lo]
	// Evicted slots are reused once a checkpoint has committed their deletion: waiting for one
	// costs a flush of the SSD and frees them all, where writing around costs a write to the slow
	// disk, one request after another (a burst past the SSD tier would run at the slow disk's
	// speed, not the destager's: bench writeback's burst row). Other writers may take the freed
	// slots first: a few tries.
	for try := 0; !g.ok && try < *tries; try++ {
		if err := c.ssd.j.checkpointForSlots(); err != nil {
			break
		}
		g = c.ssd.acquire(s.line)
	}
	slot := g.slot
	if !g.ok {
		*tries = 0
		// No slot still (the tier failed, or its evicted slots are busy): write through.
		return c.writeAroundPiece(s, data)
	}
	// A block the write covers in part needs the rest of its bytes: from the slot when it holds
	// them (the file's direct I/O merges in place), zeros for a zero block (the slot does not
	// hold it), else from the backend.
	lo, hi := s.lo, s.hi
	touched, full := s.touched(), s.full()
	inSlot := g.valid.AndNot(g.zero)
	b0, b1 := int(lo/blockSize), int((hi+blockSize-1)/blockSize)-1
	headRMW := !full.Has(b0) && !inSlot.Has(b0)
	tailRMW := !full.Has(b1) && !inSlot.Has(b1)
	if headRMW {
		lo = int64(b0) * blockSize
	}
	if tailRMW {
		hi = min(int64(b1+1)*blockSize, s.n)
	}
	buf := data
	if headRMW || tailRMW {
		bufp := bufpool.Get(int(hi - lo))
		defer bufpool.Put(bufp)
		buf = *bufp
		for _, b := range []struct {
			rmw bool
			blk int
		}{{headRMW, b0}, {tailRMW, b1}} {
			if !b.rmw {
				continue
			}
			bl, bh := int64(b.blk)*blockSize, min(int64(b.blk+1)*blockSize, s.n)
			if g.zero.Has(b.blk) {
				clear(buf[bl-lo : bh-lo])
				continue
			}
			if err := c.retryBackend(func() error { return c.backendRead(buf[bl-lo:bh-lo], s.start+bl) }); err != nil {
				c.ssd.unpin(slot)
				return err
			}
		}
		copy(buf[s.lo-lo:], data)
	}
	seen := c.ssd.j.roomMade.Load()
	zeros, err := c.ssd.writeBlocks(s.line, slot, buf, lo, s.n)
	for try := 0; errors.Is(err, errNoRoom) && try < *tries; try++ {
		// A packed tier short of room (pack.go): reclaim frees some at the checkpoint it runs.
		if err = c.ssd.j.makeRoom(seen); err == nil {
			seen = c.ssd.j.roomMade.Load()
			zeros, err = c.ssd.writeBlocks(s.line, slot, buf, lo, s.n)
		}
	}
	if errors.Is(err, errNoRoom) {
		*tries = 0
		if _, dirty := c.ssd.bits(s.line); !dirty.And(touched).IsZero() {
			// The only copy of older writes to these blocks is on the SSD tier: they go to the
			// backend before this write may go around the tier (writeBackPieces).
			c.ssd.unpin(slot)
			return errDirtyNoRoom
		}
		c.ssd.noRoom(s.line, slot)
		return c.writeAroundPiece(s, data)
	}
	if err != nil {
		c.ssd.unpin(slot)
		c.ssd.ioError(s.line, slot, err)
		if _, ok := asDamage(err); ok {
			return err // writeBackPieces writes the piece again
		}
		return fmt.Errorf("cache: SSD tier write failed: %w", err)
	}
	if !c.ssd.markValid(s.line, slot, touched, true, zeros) {
		// The line was evicted while its data was written: the backend takes the write instead.
		return c.writeAroundPiece(s, data)
	}
	// A write of a whole line stays on the SSD tier only: streams (copies, backups, logs) would
	// otherwise push what is read out of the RAM tier, and cost a copy each. A read promotes it.
	if c.ram.usable() && full != linebits.Range(0, s.blocks()) && c.storesWrite(c.ram, s) {
		g := c.ram.acquire(s.line)
		if bits, zeros, ok := c.writeTier(c.ram, s, g, p); ok {
			c.ram.markValid(s.line, g.slot, bits, false, zeros)
		}
	}
	return nil
}

// slotTries bounds how many checkpoints a write-back write waits for to get a slot or room.
const slotTries = 4

// writeAroundPiece sends a write-back piece the SSD tier could not take to the backend. The line
// is not cached, but the store may still hold a record of it whose deletion has not landed yet
// (an eviction waiting for a checkpoint): that record is deleted first, or a crash would bring the
// old data back; synced, so that a power cut does not either (syncInvalidations).
func (c *Cache) writeAroundPiece(s piece, data []byte) error {
	if err := c.orderCheck([]piece{s}, true); err != nil {
		return err
	}
	if err := c.ssd.j.invalidateDurably([]span{{s.line, s.touched()}}, true); err != nil {
		return fmt.Errorf("cache metadata: %w", err)
	}
	return c.retryBackend(func() error { return c.backendWrite(data, s.start+s.lo, false) })
}
