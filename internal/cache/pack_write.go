package cache

import (
	"bytes"
	"slices"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/cache/pack"
)

// write is store.write on a packed tier: it stores the blocks of p (the line's bytes from off) as
// new units, or as references to units with the same bytes (reduction dedupe), and points slot's
// locations at them, if slot is still line's. A block p covers in part takes the rest of its bytes
// from its unit (the caller merged zero blocks and blocks the tier does not hold already). The
// line's record is queued with the new locations, so that a checkpoint commits them; the units they
// replace lose a reference.
//
// It goes in steps: gather encodes each block (or finds it a unit to share, or its own to write
// over in place), store takes room for the new units and writes them, and place, under the tier's
// mu, points the slot at them.
func (pk *packed) write(line uint64, slot uint32, p []byte, off int64) error {
	t := pk.t
	t.inplace.RLock() // for the blocks written in place (inPlace)
	defer t.inplace.RUnlock()
	b0, b1 := int(off/blockSize), int((off+int64(len(p))+blockSize-1)/blockSize)
	nb := b1 - b0
	// Arrays for the blocks of a line of up to 16 blocks, on the stack: a write of more grows
	// them (TestPackedLargeLines).
	var blockBuf [16]packBlock
	var sizeBuf [16]int
	var unitBuf [16]uint64
	w := packWriter{
		line: line, slot: slot, off: off, b0: b0,
		blocks: slices.Grow(blockBuf[:0], nb)[:nb],
		sizes:  slices.Grow(sizeBuf[:0], nb)[:nb],
		units:  slices.Grow(unitBuf[:0], nb)[:nb],
	}
	defer w.finish(pk)
	outp := bufpool.Get(nb * blockSize)
	defer bufpool.Put(outp)
	out, err := w.gather(pk, p, (*outp)[:0])
	if err != nil {
		return err
	}
	if err := w.store(pk, out); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	w.place(pk)
	return nil
}

// packBlock is what a packed write knows of one block of its write.
type packBlock struct {
	loc     uint64 // its unit: a shared one, or its new one once stored
	hash    uint64 // its content hash (dedupe)
	sum     uint32 // its checksum
	twin    int    // 1 + an earlier block of the write with its bytes (dedupe)
	codec   int    // its new unit's codec
	fresh   bool   // its unit is new
	same    bool   // written in place, in the unit it had
	mutable bool   // its new unit is born mutable (inPlace)
}

// packWriter is one packed write's state, on its stack. It points at nothing but write's arrays,
// and its methods set their elements, never its slices: escape analysis does not tell a struct's
// fields apart, so the store, a buffer the device writes or a slice appended to here would take the
// arrays to the heap with it (go build -gcflags=-m says so). The store and the buffers are
// parameters instead.
type packWriter struct {
	line   uint64
	slot   uint32
	off    int64       // where p starts in the line
	b0     int         // p's first block
	blocks []packBlock // by block, from b0
	sizes  []int       // by new unit: its size
	units  []uint64    // by new unit: its location word, once its room is taken
	n      int         // new units so far
	// Until the blocks are placed, shared units hold a reference taken for them
	// (dedupeCandidate). Writes in place end with the call.
	placed, inPlace bool
}

// gather goes over the blocks of p: each gets its sum, and a unit to share (dedupe), its own to
// write over in place, or a new one, appended to out, which it returns.
func (w *packWriter) gather(pk *packed, p, out []byte) ([]byte, error) {
	blk := bufpool.Get(blockSize)
	defer bufpool.Put(blk)
	scratch := bufpool.Get(pack.ScratchSize())
	defer bufpool.Put(scratch)
	for i := range w.blocks {
		b := w.b0 + i
		src, err := w.whole(pk, p, b, *blk)
		if err != nil {
			return out, err
		}
		w.blocks[i].sum = blockSum(w.line*uint64(pk.blocks)+uint64(b), src)
		if pk.dd != nil && w.shared(pk, p, i, src, *scratch) {
			continue
		}
		if out, err = w.unit(pk, out, i, src, *scratch); err != nil {
			return out, err
		}
	}
	return out, nil
}

// whole returns the bytes of block b: p's, or for a block p covers in part, blk holding them,
// with the rest of its bytes from its unit.
func (w *packWriter) whole(pk *packed, p []byte, b int, blk []byte) ([]byte, error) {
	lo, hi := blockPart(b, w.off, len(p))
	src := p[lo:hi]
	if hi-lo == blockSize {
		return src, nil
	}
	clear(blk)
	if pk.hasUnit(w.slot, b) {
		if err := pk.read(w.line, w.slot, blk, int64(b)*blockSize, false); err != nil {
			return nil, err
		}
	}
	copy(blk[max(w.off-int64(b)*blockSize, 0):], src)
	return blk, nil
}

// shared finds block i (bytes src) a unit with its bytes (reduction dedupe): an earlier block's of
// the write, or one the tier holds. False: the block needs a unit of its own.
func (w *packWriter) shared(pk *packed, p []byte, i int, src, scratch []byte) bool {
	dd, pb := pk.dd, &w.blocks[i]
	pb.hash = dd.Hash(src)
	if j := w.twinOf(p, i, src); j >= 0 {
		pb.twin = j + 1
		dd.shared.Add(1)
		return true
	}
	if l := pk.dedupeCandidate(src, pb.hash, scratch[:blockSize]); l != 0 {
		pb.loc = l
		return true
	}
	return false
}

// twinOf returns the index of an earlier block of p than i that gets a new unit and holds src
// (block i's bytes, with their hash), or -1: blocks alike in one write are stored once, as they
// would be one write after the other. Only whole blocks of p qualify as the earlier one (a block p
// covers in part is merged in a buffer that the next one reuses).
func (w *packWriter) twinOf(p []byte, i int, src []byte) int {
	h := w.blocks[i].hash
	for j := range i {
		if !w.blocks[j].fresh || w.blocks[j].hash != h {
			continue
		}
		if jl, jh := blockPart(w.b0+j, w.off, len(p)); jh-jl == blockSize && bytes.Equal(p[jl:jh], src) {
			return j
		}
	}
	return -1
}

// unit gives block i (bytes src) a new unit, appended to out, or writes it over its own unit in
// place (inPlace).
func (w *packWriter) unit(pk *packed, out []byte, i int, src, scratch []byte) ([]byte, error) {
	pb, b := &w.blocks[i], w.b0+i
	enc, codec := pack.Encode(scratch, src)
	if codec == pack.Raw {
		l, ok, rewrite := pk.inPlace(w.line, w.slot, b, pb.sum, &w.inPlace)
		if ok {
			pb.same = true
			if _, err := pk.dev.WriteAt(src, pack.Off(l)); err != nil {
				pk.t.resettle(w.line, w.slot, b)
				return out, err
			}
			return out, nil
		}
		pb.mutable = rewrite
	}
	pb.codec, pb.fresh = codec, true
	w.sizes[w.n] = len(enc)
	w.n++
	return append(out, enc...), nil
}

// store takes room for the new units, out, and writes them. Units whose write failed are dead at
// once.
func (w *packWriter) store(pk *packed, out []byte) error {
	var offBuf [16]int64
	offs := slices.Grow(offBuf[:0], w.n)[:w.n]
	sizes, units := w.sizes[:w.n], w.units[:w.n]
	if err := pk.alloc(sizes, offs, false); err != nil {
		return err
	}
	k := 0
	for i := range w.blocks {
		if pb := &w.blocks[i]; pb.fresh {
			pb.loc = pack.Loc(offs[k], sizes[k], pb.codec)
			if pb.mutable {
				pb.loc |= pack.Mutable
			}
			units[k] = pb.loc
			k++
		}
	}
	if err := pk.writeUnits(out, units); err != nil {
		pk.t.mu.Lock()
		pk.dead = append(pk.dead, units...) // never live: not in stored either
		pk.t.mu.Unlock()
		return err
	}
	return nil
}

// place points the slot's locations at the blocks' units, and queues the line's record with them,
// if slot is still line's; else the new units are dead at once. The caller holds the tier's mu.
func (w *packWriter) place(pk *packed) {
	t := pk.t
	if s, ok := t.slotOf(w.line); !ok || s != w.slot {
		pk.dead = append(pk.dead, w.units[:w.n]...)
		return // evicted meanwhile: markValid says so to the caller (finish lets go of shared units)
	}
	w.placed = true
	rewrite := w.changesRecord(t)
	if rewrite {
		t.j.keepStoredLocked(w.line, w.slot)
	}
	b1 := w.b0 + len(w.blocks)
	dst := pk.slotLocs(w.slot, w.b0, b1)
	sumDst := t.sumsOf(w.slot)[w.b0:b1]
	for i := range w.blocks {
		pb := &w.blocks[i]
		if pb.same {
			continue
		}
		sumDst[i].Store(pb.sum)
		t.trusted(w.slot, w.b0+i)
		if pb.twin > 0 {
			pb.loc = w.blocks[pb.twin-1].loc // placed, and so live, just before
			pk.shareLocked(pb.loc)
		}
		if old := dst[i]; old != 0 {
			pk.deadLocked(old)
		}
		dst[i] = pb.loc
		if pb.fresh {
			pk.bornLocked(pb.loc)
			if pk.dd != nil {
				pk.dd.Remember(pb.hash, pb.loc)
			}
		}
	}
	if rewrite {
		t.j.record(t.recordLocked(w.line, w.slot))
	}
}

// changesRecord reports whether placing the write changes the line's record. A record finds units
// of valid blocks only (recordLocked): new units of blocks not valid yet change no record before
// markValid marks them, but a valid block written again does. Blocks written in place change no
// record.
func (w *packWriter) changesRecord(t *tier) bool {
	var moved lineBits
	for i := range w.blocks {
		if b := w.b0 + i; !w.blocks[i].same {
			moved[b/64] |= 1 << (b % 64)
		}
	}
	return t.j != nil && !t.valid.Get(w.slot).AndNot(t.zeroAt(w.slot)).And(moved).IsZero()
}

// finish lets go of the references taken for shared units that were not placed, and ends the
// writes in place (the slot's gen is even again).
func (w *packWriter) finish(pk *packed) {
	if w.placed && !w.inPlace {
		return
	}
	t := pk.t
	t.mu.Lock()
	for i := range w.blocks {
		if l := w.blocks[i].loc; l != 0 && !w.blocks[i].fresh && !w.placed {
			pk.deadLocked(l) // a shared unit's reference
		}
	}
	if w.inPlace {
		pk.gen[w.slot]++
	}
	t.mu.Unlock()
}

// inPlace returns the unit of block b of slot if an incompressible block may be written over it in
// place, as a slot is, sparing the new unit and the room reclaim would later free (its record
// changes only its sum): a dirty block's unit stored as it is (a whole, aligned block) that no
// other block shares, and that is either
//   - fresh, born since the last checkpoint's snapshot: no record the store holds or is committing
//     finds it, the block's own or another line's that shared it once (dedupe). The record with the
//     block's new sum is logged before its bytes are written, so after a kill the run log gives the
//     block each sum it may hold (journal.load), and after a power cut no committed record finds it.
//   - or mutable (pack.Mutable): born for a rewrite of the block while it was dirty, on a tier
//     without dedupe, where no other line's record ever finds it. Its new sum is recorded as a
//     tier of slots records one, with the line's next record or at the close (resummed): after a
//     stop that was not a close the block is taken as it is if it fails its sum (adoptDirtyLocked),
//     as a dirty block of a slot is. So only data rewritten while dirty is written in place over
//     what a committed record claims; a block written once keeps the sum it was written with.
//
// rewrite reports whether a new unit for the block should be born mutable: the block is dirty on
// a tier without dedupe. The caller holds the line's lock, so no read or destage of the block
// runs; only reclaim reads units without it, and the slot's gen (odd from the first such write on,
// *started, until write ends) has it drop the copy of a unit written meanwhile. With dedupe,
// the unit leaves the table, which names it by its old bytes.
func (pk *packed) inPlace(line uint64, slot uint32, b int, sum uint32, started *bool) (l uint64, ok, rewrite bool) {
	t := pk.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.dirtyAt(slot).Has(b) {
		return 0, false, false
	}
	rewrite = pk.dd == nil
	l = pk.slotLocs(slot, b, b+1)[0]
	if l == 0 || pack.Codec(l) != pack.Raw || pack.Len(l) != blockSize || pk.refs[l] > 0 || t.zeroAt(slot).Has(b) {
		return 0, false, rewrite
	}
	mutable := pack.IsMutable(l)
	if !mutable {
		if _, ok := pk.fresh[l]; !ok {
			return 0, false, rewrite
		}
	}
	if pk.dd != nil {
		pk.dd.Forget(l)
	}
	if !*started {
		*started = true
		pk.gen[slot]++
	}
	// A fresh unit's record with the block's new sum goes first (under inplace, which the caller
	// holds): see sum.go.
	t.sumsOf(slot)[b].Store(sum)
	t.trusted(slot, b)
	if s, ok := t.slotOf(line); ok && s == slot && t.j != nil {
		t.j.resummedLocked(line, slot, b)
	}
	return l, true, rewrite
}

// writeUnits writes out, the units locs in order, with one write for each run of them stored one
// after another.
func (pk *packed) writeUnits(out []byte, locs []uint64) error {
	pos := 0
	for i := 0; i < len(locs); {
		start, n, j := pack.Off(locs[i]), pack.Len(locs[i]), i+1
		for j < len(locs) && pack.Off(locs[j]) == start+int64(n) {
			n += pack.Len(locs[j])
			j++
		}
		if _, err := pk.dev.WriteAt(out[pos:pos+n], start); err != nil {
			return err
		}
		pos += n
		i = j
	}
	return nil
}
