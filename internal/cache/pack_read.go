package cache

import (
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/pkg/backend"
)

// readUnits reads the units locs (of consecutive blocks; 0 for none) and calls fn with each one's
// stored bytes, reading units stored one after another at once. cached reads through the SSD's
// page cache (the destager's, of data written a moment ago).
func (pk *packed) readUnits(locs []uint64, cached bool, fn func(i int, unit []byte) error) error {
	for i := 0; i < len(locs); {
		if locs[i] == 0 {
			i++
			continue
		}
		start := pack.Off(locs[i])
		end, j := start+int64(pack.Len(locs[i])), i+1
		for j < len(locs) && locs[j] != 0 && pack.Off(locs[j]) == end {
			end += int64(pack.Len(locs[j]))
			j++
		}
		w0, w1 := start&^(bufpool.Align-1), (end+bufpool.Align-1)&^(bufpool.Align-1)
		bp := bufpool.Get(int(w1 - w0))
		var err error
		if cr, ok := pk.dev.(backend.CachedReader); cached && ok {
			_, err = cr.ReadAtCached(*bp, w0)
		} else {
			_, err = pk.dev.ReadAt(*bp, w0)
		}
		for k := i; err == nil && k < j; k++ {
			o := pack.Off(locs[k]) - w0
			err = fn(k, (*bp)[o:o+int64(pack.Len(locs[k]))])
		}
		bufpool.Put(bp)
		if err != nil {
			return err
		}
		i = j
	}
	return nil
}

// read is store.read on a packed tier: the line's bytes [off, off+len(p)) of slot. A block
// without a unit reads as zeros (a zero block; the caller reads no block that is not valid). Each
// unit read is decoded whole and checked against its block's sum (sum.go); a unit that does not
// decode is damaged too. Whole blocks of p stored as they are, one after another on the device
// (all a line filled with incompressible data holds), are read straight into p and checked there:
// the copy out of a buffer that pack.Decode would make costs a 1 MiB hit about what its sums do
// (BenchmarkHits1M).
func (pk *packed) read(line uint64, slot uint32, p []byte, off int64, cached bool) error {
	t := pk.t
	b0, b1 := int(off/blockSize), int((off+int64(len(p))+blockSize-1)/blockSize)
	var buf [16]uint64
	pk.io.RLock()
	defer pk.io.RUnlock()
	t.mu.RLock()
	locs := append(buf[:0], pk.slotLocs(slot, b0, b1)...)
	t.mu.RUnlock()
	// locs stays out of r, which holds what escapes (p, the damage found): escape analysis does
	// not tell a struct's fields apart, and buf would go to the heap with them.
	r := packReader{pk: pk, t: t, line: line, slot: slot, p: p, off: off, b0: b0, cached: cached, sums: t.sumsOf(slot)}
	defer r.done()
	for i, l := range locs {
		if l == 0 {
			lo, hi := blockPart(b0+i, off, len(p))
			clear(p[lo:hi])
		}
	}
	for i := 0; i < len(locs); {
		var err error
		switch {
		case locs[i] == 0:
			i++
		case r.direct(locs, i):
			i, err = r.directRun(locs, i)
		default:
			i, err = r.decodeRun(locs, i)
		}
		if err != nil {
			return err
		}
	}
	if r.dmg != nil {
		t.sumErrs.Add(uint64(r.dmg.bits.Count()))
		return r.dmg
	}
	return nil
}

// packReader is one read's state: where its bytes go, and the damage it found.
type packReader struct {
	pk     *packed
	t      *tier
	line   uint64
	slot   uint32
	p      []byte // the line's bytes from off
	off    int64
	b0     int // p's first block
	cached bool
	sums   []atomic.Uint32 // the slot's blocks' sums
	tmp    *[]byte         // a block's buffer, for a unit p holds in part; nil until one needs it
	dmg    *damageError    // the blocks that failed their sums; nil for none
}

func (r *packReader) done() {
	if r.tmp != nil {
		bufpool.Put(r.tmp)
	}
}

// check checks blk, block b's bytes (nil for a unit that did not decode), against its sum.
func (r *packReader) check(b int, blk []byte) bool {
	t := r.t
	if sum := blockSum(r.line*uint64(t.blocks)+uint64(b), blk); blk == nil || sum != r.sums[b].Load() && !t.tryAdopt(r.line, r.slot, b, sum) {
		if r.dmg == nil {
			r.dmg = &damageError{line: r.line}
		}
		r.dmg.bits[b/64] |= 1 << (b % 64)
		return false
	}
	return true
}

// direct reports whether block b0+i, whose unit is locs[i], is read straight into p: a unit
// stored as it is, that p holds whole.
func (r *packReader) direct(locs []uint64, i int) bool {
	lo, hi := blockPart(r.b0+i, r.off, len(r.p))
	return locs[i] != 0 && pack.Codec(locs[i]) == pack.Raw && pack.Len(locs[i]) == blockSize && hi-lo == blockSize
}

// directRun reads the units from locs[i] on that are read straight into p and lie one after
// another on the device, with one read, and checks them; it returns the index past them.
func (r *packReader) directRun(locs []uint64, i int) (int, error) {
	j := i + 1
	for j < len(locs) && r.direct(locs, j) && pack.Off(locs[j]) == pack.Off(locs[i])+int64(j-i)*blockSize {
		j++
	}
	lo, _ := blockPart(r.b0+i, r.off, len(r.p))
	_, hi := blockPart(r.b0+j-1, r.off, len(r.p))
	var err error
	if cr, ok := r.pk.dev.(backend.CachedReader); r.cached && ok {
		_, err = cr.ReadAtCached(r.p[lo:hi], pack.Off(locs[i]))
	} else {
		_, err = r.pk.dev.ReadAt(r.p[lo:hi], pack.Off(locs[i]))
	}
	if err != nil {
		return j, err
	}
	for k := i; k < j; k++ {
		blo, bhi := blockPart(r.b0+k, r.off, len(r.p))
		r.check(r.b0+k, r.p[blo:bhi])
	}
	return j, nil
}

// decodeRun reads the units from locs[i] up to the next one read straight into p, decodes and
// checks them; it returns the index past them.
func (r *packReader) decodeRun(locs []uint64, i int) (int, error) {
	j := i + 1
	for j < len(locs) && !r.direct(locs, j) {
		j++
	}
	return j, r.pk.readUnits(locs[i:j], r.cached, func(k int, u []byte) error { return r.unit(locs[i+k], i+k, u) })
}

// unit decodes unit l, of block b0+i, into p, checked.
func (r *packReader) unit(l uint64, i int, unit []byte) error {
	b := r.b0 + i
	lo, hi := blockPart(b, r.off, len(r.p))
	blk := r.p[lo:hi]
	if hi-lo != blockSize {
		if r.tmp == nil {
			r.tmp = bufpool.Get(blockSize)
		}
		blk = *r.tmp
	}
	if pack.Decode(blk, unit, l) != nil {
		blk = nil
	}
	if r.check(b, blk) && hi-lo != blockSize {
		bo := int64(b)*blockSize - r.off // where the block starts relative to p (may be < 0)
		copy(r.p[lo:hi], blk[int64(lo)-bo:])
	}
	return nil
}

// span returns where on the device the line's bytes [lo, hi) of slot are, if their blocks are
// units stored as they are, one after another: such a read goes to the device as on a slot
// (read_async.go). When ok, the caller holds io shared, and lets go of it once the read is done
// (endSpan). With try it does not wait for io: where another holds it exclusively, or waits to, it
// reports false.
func (pk *packed) span(slot uint32, lo, hi int64, try bool) (at int64, ok bool) {
	t := pk.t
	b0, b1 := int(lo/blockSize), int((hi+blockSize-1)/blockSize)
	if !try {
		pk.io.RLock()
	} else if !pk.io.TryRLock() {
		return 0, false
	}
	t.mu.RLock()
	locs := pk.slotLocs(slot, b0, b1)
	ok = true
	for i, l := range locs {
		if l == 0 || pack.Codec(l) != pack.Raw || pack.Off(l) != pack.Off(locs[0])+int64(i)*blockSize {
			ok = false
			break
		}
	}
	at = pack.Off(locs[0]) + lo - int64(b0)*blockSize
	t.mu.RUnlock()
	if !ok {
		pk.io.RUnlock()
	}
	return at, ok
}

// blockPart returns the bytes [lo, hi) of p (the line's bytes from off, n of them) in block b.
func blockPart(b int, off int64, n int) (lo, hi int) {
	s, e := int64(b)*blockSize, int64(b+1)*blockSize
	return int(max(s, off) - off), int(min(e, off+int64(n)) - off)
}

// endSpan lets go of io, which span took.
func (pk *packed) endSpan() { pk.io.RUnlock() }

// hasUnit reports whether block b of slot has a unit.
func (pk *packed) hasUnit(slot uint32, b int) bool {
	pk.t.mu.RLock()
	defer pk.t.mu.RUnlock()
	return pk.slotLocs(slot, b, b+1)[0] != 0
}

// rawSum decodes block b of line from its unit in slot, unchecked, and returns its sum.
func (pk *packed) rawSum(line uint64, slot uint32, b int) (uint32, error) {
	t := pk.t
	pk.io.RLock()
	defer pk.io.RUnlock()
	t.mu.RLock()
	l := pk.slotLocs(slot, b, b+1)[0]
	t.mu.RUnlock()
	var sum uint32
	err := pk.readUnits([]uint64{l}, false, func(_ int, unit []byte) error {
		var err error
		sum, err = t.unitSum(line, b, unit, l)
		return err
	})
	return sum, err
}
