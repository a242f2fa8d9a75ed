package cache

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
)

// Ghosts: in FLUSH order, a write over a dirty block of an older epoch, one the backend does not
// have yet, would destroy the block's bytes that epoch's write back must send (the backend must
// hold epoch k whole before any of epoch k+1). Rather than wait until that epoch and every one
// before it are on the backend, the write keeps those bytes first: a ghost, the block's older
// version, committed durably to the metadata store (meta.Ghost) before the block is written
// over, and held in memory for the write back. The block itself joins the open epoch; its epoch's
// write back sends the ghost in its place, and then deletes it, durably, before any later epoch
// is written back (so that a restart never sends an older version over a newer one the backend
// has). Ghosts live in the store, not on the SSD tier: they need no slot, no index and no
// eviction, and a few of them at a time (at most maxGhostBytes) cost little there.
//
// A write over a block being written back with its line let go (epochs.unlocked) waits until that
// write back has ended, and is tried again. One waits as before (orderWait) where it cannot keep
// a ghost: a store that fails, or ghosts already holding maxGhostBytes.
//
// A write over a lost block (a dirty block that failed its sum with no other copy, check.go) goes
// on too: the block's epoch can never be whole on the backend, and has stopped the write back
// (epochs.broken). Its ghost is a lost one, with no bytes: it keeps that stop across restarts,
// where the block itself, written over, no longer shows the damage. The write back never reaches
// a lost ghost's epoch (destageOnce refuses one all the same); a restart in address order deletes
// it with the rest.
//
// At a restart, each ghost (line L, block B, epoch e) is checked against the record of L the
// restart loaded (loadGhosts):
//   - B dirty in an epoch after e: the write over it reached the record; the ghost is kept, for
//     epoch e's write back (a lost one stops the write back before e again);
//   - B dirty in epoch e: the write over it never reached a record (no FLUSH covered it, or that
//     FLUSH was never answered), but it may have reached the slot, in place: the ghost's bytes are
//     written back into B, which then holds epoch e's version again, and the ghost is deleted;
//   - otherwise B's epoch e is gone (written back, or never committed): the ghost is deleted.
// A restart in address order deletes every ghost: it writes back the newest data of each block.

// maxGhostBytes bounds the bytes of the ghosts held (Cache.MemoryPlan counts them).
const maxGhostBytes = 16 << 20

// ghost is a block's older version, block of its line, with its sum (blockSum) and its bytes (nil:
// a zero block), or a lost one (lost: no bytes, sum lostGhostSum).
type ghost struct {
	block int
	sum   uint32
	data  []byte
	lost  bool
}

// lostGhostSum is the sum the store keeps for a lost ghost of the block at backend block number
// addr: one no zero block's ghost has there (blockSum of no bytes), so that a lost ghost needs no
// field of its own in the store's format.
func lostGhostSum(addr uint64) uint32 { return ^blockSum(addr, nil) }

// hasLost reports whether a ghost among gs is a lost one.
func hasLost(gs []ghost) bool { return slices.ContainsFunc(gs, func(g ghost) bool { return g.lost }) }

// lineEpoch keys the ghosts of a line's epoch.
type lineEpoch struct{ line, epoch uint64 }

// addGhost makes g a dirty block of epoch ep for line's write back, in the place of block g.block of
// slot, which joins the open epoch. The caller holds the tier's mu.
func (e *epochs) addGhost(line uint64, slot uint32, ep uint64, g ghost) {
	key := lineEpoch{line, ep}
	e.ghosts[key] = append(e.ghosts[key], g)
	e.ghostBytes += int64(len(g.data))
	p := e.pendingOf(ep)
	p.blocks++
	p.lines = append(p.lines, line)
	p.sorted = false
	if slot == noSlot {
		return // loaded: the block's own epoch is already its record's
	}
	one := linebits.Range(g.block, g.block+1)
	e.remove(slot, one)
	e.update(line, slot, lineBits{}, one)
}

// noSlot is addGhost's slot for a ghost whose block is already tagged as it should be.
const noSlot = ^uint32(0)

// ghostsOf returns the ghosts of line's epoch ep.
func (e *epochs) ghostsOf(line, ep uint64) []ghost { return e.ghosts[lineEpoch{line, ep}] }

// dropGhosts forgets the ghosts of line's epoch ep, written back (or deleted).
func (e *epochs) dropGhosts(line, ep uint64) {
	key := lineEpoch{line, ep}
	gs := e.ghosts[key]
	if len(gs) == 0 {
		return
	}
	delete(e.ghosts, key)
	for _, g := range gs {
		e.ghostBytes -= int64(len(g.data))
	}
	e.uncount(ep, len(gs))
	e.dropDone()
}

// ghostOps are the store's deletions of ghosts gs of line's epoch ep.
func ghostOps(line, ep uint64, gs []ghost) []meta.Op {
	ops := make([]meta.Op, 0, len(gs))
	for _, g := range gs {
		ops = append(ops, meta.Op{Delete: true, Ghost: &meta.Ghost{Line: line, Block: uint32(g.block), Epoch: ep}})
	}
	return ops
}

// keepOverwritten lets a write-back write over dirty blocks of epochs older than the open one go
// on at once: it keeps their bytes as ghosts, durably, and moves the blocks to the open epoch.
// Where it cannot, it returns an *orderWait, for the write to wait until those epochs are on the
// backend (waitIfOrdered). The caller holds the pieces' line locks.
func (c *Cache) keepOverwritten(pieces []piece) error {
	if !c.ordered() {
		return nil
	}
	t := c.ssd
	type older struct {
		s          piece
		slot       uint32
		bits, zero lineBits // the blocks of older epochs the piece writes over; the slot's zero blocks
		eps        []uint64 // each block's epoch
	}
	var olds []older
	var need uint64 // the newest of their epochs
	stay := false   // a block is being written back with its line let go: that must end first
	t.mu.RLock()
	cur := t.ep.cur.Load()
	for _, s := range pieces {
		slot, ok := t.slotOf(s.line)
		if !ok {
			continue
		}
		dirty := t.dirtyAt(slot).And(s.touched())
		lo, hi, ok := t.ep.of(slot, dirty)
		if !ok || lo >= cur {
			continue
		}
		need = max(need, min(hi, cur-1))
		o := older{s: s, slot: slot, zero: t.zeroAt(slot), eps: t.ep.blockEpochs(slot, t.blocks)}
		dirty.Runs(t.blocks, func(b0, b1 int) {
			for b := b0; b < b1; b++ {
				if o.eps[b] < cur {
					o.bits = o.bits.Or(linebits.Range(b, b+1))
				}
			}
		})
		if u := t.unlockedLocked(s.line, slot); u != nil && !u.bits.And(o.bits).IsZero() {
			stay = true
		}
		olds = append(olds, o)
	}
	var blocks int
	for _, o := range olds {
		blocks += o.bits.Count()
	}
	full := t.ep.ghostBytes+int64(blocks)*blockSize > maxGhostBytes
	t.mu.RUnlock()
	if len(olds) == 0 {
		return nil
	}
	if stay {
		return &orderWait{writeBack: true}
	}
	if full {
		return &orderWait{epoch: need}
	}
	// The blocks' bytes as they are now: the line locks keep them so until the write.
	ops := make([]meta.Op, 0, blocks)
	kept := make([][]ghost, len(olds))
	for i, o := range olds {
		start := int64(o.s.line) * c.line
		n := min(c.line, c.size-start)
		var err error
		o.bits.Runs(t.blocks, func(b0, b1 int) {
			for b := b0; b < b1 && err == nil; b++ {
				lo, hi := int64(b)*blockSize, min(int64(b+1)*blockSize, n)
				addr := uint64(start+lo) / blockSize
				g := ghost{block: b}
				switch {
				case c.lost.overlaps(start+lo, hi-lo):
					g.lost = true // lost before (its epoch stopped the write back): nothing to read
				case !o.zero.Has(b):
					g.data = make([]byte, hi-lo)
					err = t.readBlocks(o.s.line, o.slot, g.data, lo, o.zero)
					if err != nil && c.lost.overlaps(start+lo, hi-lo) {
						g.data, g.lost, err = nil, true, nil // damaged, and lost now (check.go dealt with it)
					}
				}
				if g.lost {
					g.sum = lostGhostSum(addr)
				} else {
					g.sum = blockSum(addr, g.data)
				}
				kept[i] = append(kept[i], g)
				ops = append(ops, meta.Op{Ghost: &meta.Ghost{Line: o.s.line, Block: uint32(b), Epoch: o.eps[b], Sum: g.sum, Data: g.data}})
			}
		})
		if err != nil {
			// Damaged but not lost (check.go dealt with it as for any read: a copy in the RAM
			// tier repaired it), or an I/O error: the write waits for the block's epoch, as
			// its write back finds the same.
			return &orderWait{epoch: need}
		}
	}
	if err := meta.CommitParts(t.j.store, ops, true, nil); err != nil {
		// Parts of it may have landed. They are taken back: kept, a restart would find them
		// beside blocks of later epochs (loadGhosts keeps such ghosts) after their own epoch was
		// written back, and send an older version over a newer one.
		undo := make([]meta.Op, len(ops))
		for i, op := range ops {
			undo[i] = meta.Op{Delete: true, Ghost: &meta.Ghost{Line: op.Ghost.Line, Block: op.Ghost.Block, Epoch: op.Ghost.Epoch}}
		}
		if uerr := meta.CommitParts(t.j.store, undo, true, nil); uerr != nil {
			t.fail(fmt.Sprintf("metadata commit: %v", uerr))
			return fmt.Errorf("cache metadata: cannot take back the older versions of blocks a write replaces: %w", uerr)
		}
		if c.damageLog.allow(c.log) {
			c.log.Warn("SSD tier: cannot keep the older version of dirty data that a write replaces; the write waits for its epoch's write back", "err", err)
		}
		return &orderWait{epoch: need}
	}
	t.mu.Lock()
	for i, o := range olds {
		// The blocks' new epochs are recorded (the run log has them at once) before their bytes
		// change: a write over a dirty block in place records no new record of its own
		// (journal.resummedLocked), and a restart that found the older epoch on record would
		// take the ghost's bytes back in the block (loadGhosts).
		t.j.keepStoredLocked(o.s.line, o.slot)
		for _, g := range kept[i] {
			t.ep.addGhost(o.s.line, o.slot, o.eps[g.block], g)
		}
		t.j.record(t.recordLocked(o.s.line, o.slot))
	}
	t.mu.Unlock()
	c.wb.ghosts.Add(uint64(len(ops)))
	return nil
}

// ghostPieces are the destage pieces of line's ghosts of epoch ep, in block order.
func ghostPieces(line uint64, gs []ghost, n int64) []destagePiece {
	ps := make([]destagePiece, 0, len(gs))
	for _, g := range gs {
		lo, hi := int64(g.block)*blockSize, min(int64(g.block+1)*blockSize, n)
		ps = append(ps, destagePiece{line: line, slot: noSlot, lo: lo, hi: hi, zero: g.data == nil, data: g.data})
	}
	slices.SortFunc(ps, func(a, b destagePiece) int { return cmp.Compare(a.lo, b.lo) })
	return ps
}

// loadGhosts takes in the ghosts the store holds after a restart of tier t (see the rules above):
// those it keeps join their epochs; the rest are deleted, the ones whose bytes go back into their
// block once that write is on the SSD. In address order every ghost is deleted. The caller has
// loaded the tier's records and holds nothing.
func (c *Cache) loadGhosts(t *tier) error {
	var drop []meta.Op
	var restore []meta.Ghost
	err := t.j.store.Ghosts(func(g meta.Ghost) error {
		del := meta.Op{Delete: true, Ghost: &meta.Ghost{Line: g.Line, Block: g.Block, Epoch: g.Epoch}}
		if t.ep == nil {
			drop = append(drop, del)
			return nil
		}
		start := int64(g.Line) * c.line
		b := int(g.Block)
		lo := int64(b) * blockSize
		if t.lines > 0 && g.Line >= t.lines || b >= t.blocks || start+lo >= c.size || len(g.Data) > 0 && int64(len(g.Data)) != min(blockSize, c.size-start-lo) {
			return fmt.Errorf("%w: the older version of block %d of line %d does not fit the cache", ErrCorrupt, b, g.Line)
		}
		addr := uint64(start+lo) / blockSize
		lost := len(g.Data) == 0 && g.Sum == lostGhostSum(addr)
		if !lost && blockSum(addr, g.Data) != g.Sum {
			return fmt.Errorf("%w: the older version of block %d of line %d, kept for epoch %d, fails its checksum", ErrCorrupt, b, g.Line, g.Epoch)
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		slot, ok := t.slotOf(g.Line)
		var ep uint64
		if ok && t.dirtyAt(slot).Has(b) {
			ep = t.ep.blockEpochs(slot, t.blocks)[b]
		}
		switch {
		case ep > g.Epoch:
			t.ep.addGhost(g.Line, noSlot, g.Epoch, ghost{block: b, sum: g.Sum, data: g.Data, lost: lost})
			if lost {
				t.ep.lose(g.Epoch)
			}
		case ep == g.Epoch && g.Data != nil && !t.zeroAt(slot).Has(b):
			restore = append(restore, g)
			drop = append(drop, del)
		default:
			// (A lost ghost of B's own epoch: B's record keeps the sum its bytes failed, and
			// whatever bytes the slot holds now fail it again when read, lost again.)
			drop = append(drop, del)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, g := range restore {
		if err := restoreGhost(t, g); err != nil {
			return err
		}
	}
	if len(restore) > 0 {
		if backendErr, tierErr := t.j.checkpoint(); tierErr != nil || backendErr != nil {
			return fmt.Errorf("SSD tier: committing the blocks restored from their older versions: %w", errors.Join(tierErr, backendErr))
		}
		c.log.Info("SSD tier: dirty blocks written over by writes that no FLUSH covered before the last run stopped hold their older data again", "blocks", len(restore))
	}
	if len(drop) > 0 {
		if err := meta.CommitParts(t.j.store, drop, true, nil); err != nil {
			return fmt.Errorf("SSD tier: deleting older versions of blocks no longer needed: %w", err)
		}
	}
	return nil
}

// restoreGhost writes ghost g's bytes back into its block, whose record still calls it dirty in
// g's epoch with g's sum: the write over it may have reached the block, written in place (a
// slot, a packed tier's mutable unit). A block that holds g's bytes still is left as it is: on a
// packed tier a write over a block not written in place took a new unit, which the crash
// dropped, and writing g's bytes again would take room that a tier full of the dirty data the
// crash left may not have (TestCrashRestart, a full tier in FLUSH order with reduction). One
// written in place takes g's bytes back in place, without room: g's bytes were that unit's.
func restoreGhost(t *tier, g meta.Ghost) error {
	t.mu.RLock()
	slot, ok := t.slotOf(g.Line)
	t.mu.RUnlock()
	if !ok {
		return nil
	}
	if sum, err := t.st.rawSum(g.Line, slot, int(g.Block)); err == nil && sum == g.Sum {
		return nil
	}
	bufp := bufpool.Get(len(g.Data))
	defer bufpool.Put(bufp)
	copy(*bufp, g.Data)
	if err := t.st.write(g.Line, slot, (*bufp)[:len(g.Data)], int64(g.Block)*blockSize); err != nil {
		return fmt.Errorf("SSD tier: restoring block %d of line %d from its older version: %w", g.Block, g.Line, err)
	}
	t.mu.Lock()
	t.j.record(t.recordLocked(g.Line, slot))
	t.mu.Unlock()
	return nil
}
