package cache

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
)

// Checksums of the SSD tier (docs/architecture.md, "What is checked"). Every block the tier stores
// has a CRC32C of its bytes, seeded with the block's address on the backend, so that a block read
// from another block's place (a misdirected write, a slot that another program wrote) fails as
// damaged bytes do. The sums live in memory, one a block of each slot, and in the line's record;
// every read of a stored block checks its sum: hits, promotions to RAM, destage reads, the rest of
// a block a write covers in part, reclaim's copies and scrub. A block that fails is never served
// or written back: a clean one is read from the backend again and dropped from the tier, a dirty
// one (the only copy of acknowledged writes) is lost, its range reads as an I/O error until it is
// written again (lost.go).
//
// A block written in place over data a record already claims (a dirty block rewritten) changes
// its sum before its bytes, under inplace held shared, which a checkpoint takes alone to snapshot
// the records, so that no committed record has a sum whose bytes were not written yet. A tier of
// slots can only rewrite in place, and records the new sums only with the line's next record or at
// its close (resummedLocked): after any stop that was not a close, it takes its dirty blocks as
// they are ("Adopted blocks" below), since one rewritten since its last record may hold new bytes,
// or a torn mix of sectors, that no committed record has the sum of. A packed tier writes in place
// only two kinds of units (pack_write.go, inPlace): fresh ones, which no committed record finds, whose
// record with the new sum is queued (and logged) first, so that after a kill the run log's records
// give each such block the sums it may hold (the old and the new, journal.load); and mutable ones,
// born for a rewrite of a dirty block, whose sums are recorded as a slot's are, and whose dirty
// blocks are taken as they are after a stop that was not a close. Every other unit is never
// written in place: its committed sum stays true whatever the stop.

// blockSum returns the checksum of block b, the bytes stored for the backend's block number addr
// (its byte offset / blockSize). The address seeds the CRC: the same bytes at another address
// have another sum.
func blockSum(addr uint64, b []byte) uint32 {
	return crc32c.Update(uint32(addr*0x9e3779b97f4a7c15>>32), b)
}

// damageError is a read of the SSD tier that found blocks whose bytes do not match their sums.
type damageError struct {
	line uint64   // the first line with a damaged block
	bits lineBits // its damaged blocks
}

func (e *damageError) Error() string {
	return fmt.Sprintf("SSD tier: line %d: %d blocks fail their checksums", e.line, e.bits.Count())
}

// asDamage returns err's damageError, if it is one.
func asDamage(err error) (*damageError, bool) {
	if err == nil {
		return nil, false
	}
	var d *damageError
	ok := errors.As(err, &d)
	return d, ok
}

// sumsOf returns the sums of slot's blocks.
func (t *tier) sumsOf(slot uint32) []atomic.Uint32 {
	return t.sums[int(slot)*t.blocks : int(slot+1)*t.blocks]
}

// lineBytes returns how many bytes of line are on the backend: a line size, less for the last line
// of a backend whose size is not a multiple of it.
func (t *tier) lineBytes(line uint64) int64 {
	return min(t.lineSize, t.size-int64(line)*t.lineSize)
}

// wholeBlocks widens p, bytes [off, off+len(p)) of a run of lines from the start of line, to whole
// blocks [lo, hi), short of where the backend ends: buf is p itself when it is whole blocks
// already, else a buffer for them, which done gives back.
func (t *tier) wholeBlocks(line uint64, p []byte, off int64) (lo, hi int64, buf []byte, done func()) {
	lo = off &^ (blockSize - 1)
	hi = (off + int64(len(p)) + blockSize - 1) &^ (blockSize - 1)
	hi = min(hi, t.size-int64(line)*t.lineSize)
	if lo == off && hi == off+int64(len(p)) {
		return lo, hi, p, func() {}
	}
	bp := bufpool.Get(int(hi - lo))
	return lo, hi, *bp, func() { bufpool.Put(bp) }
}

// verify checks p, the whole blocks of a run of lines (line's slot and the slots after it) from
// byte off of line, against their sums.
func (t *tier) verify(line uint64, slot uint32, p []byte, off int64) error {
	first := int(off / blockSize)
	var dmg *damageError
	for k := 0; k*blockSize < len(p); k++ {
		b := first + k
		i := int(slot)*t.blocks + b
		blk := p[k*blockSize : min((k+1)*blockSize, len(p))]
		sum := blockSum(line*uint64(t.blocks)+uint64(b), blk)
		l := line + uint64(b/t.blocks)
		if sum == t.sums[i].Load() || t.tryAdopt(l, slot+uint32(b/t.blocks), b%t.blocks, sum) {
			continue
		}
		if dmg == nil {
			dmg = &damageError{line: l}
		}
		if l == dmg.line {
			dmg.bits[(b%t.blocks)/64] |= 1 << ((b % t.blocks) % 64)
		}
	}
	if dmg != nil {
		t.sumErrs.Add(uint64(dmg.bits.Count()))
		return dmg
	}
	return nil
}

// setSums computes the sums of p, whole blocks of line from byte off, into sums.
func (t *tier) setSums(line uint64, p []byte, off int64, sums []uint32) []uint32 {
	first := int(off / blockSize)
	for k := 0; k*blockSize < len(p); k++ {
		sums = append(sums, blockSum(line*uint64(t.blocks)+uint64(first+k), p[k*blockSize:min((k+1)*blockSize, len(p))]))
	}
	return sums
}

// writeSums sets the sums of slot's blocks from b0 on and then runs write, which writes their
// bytes. Where a block is one a record claims already (valid, not a zero block: a write in place),
// the line's record with the new sums is queued first, and inplace is held shared until the bytes
// are written: a checkpoint never commits a sum before its bytes reach the SSD.
func (t *tier) writeSums(line uint64, slot uint32, b0 int, sums []uint32, write func() error) error {
	t.inplace.RLock()
	defer t.inplace.RUnlock()
	t.mu.Lock()
	dst := t.sumsOf(slot)[b0:]
	changed := false
	for i, s := range sums {
		t.trusted(slot, b0+i)
		if dst[i].Load() != s {
			dst[i].Store(s)
			changed = true
		}
	}
	if cur, ok := t.slotOf(line); changed && ok && cur == slot && t.j != nil &&
		!t.valid.Get(slot).AndNot(t.zeroAt(slot)).And(linebits.Range(b0, b0+len(sums))).IsZero() {
		t.j.resummedLocked(line, slot, b0)
	}
	t.mu.Unlock()
	err := write()
	if err != nil {
		for i := range sums {
			t.resettle(line, slot, b0+i)
		}
	}
	return err
}

// Adopted blocks. A block whose bytes may be other than its sum's without damage takes the sum of
// what it holds when read: a dirty block of a tier of slots after a stop that was not a close
// (adoptDirtyLocked), and a block whose write failed and cannot be read back (resettle), which may
// hold the old bytes, the new or a mix, as a disk's would. adopt holds a bit for each block of each
// slot (by slot*blocks + block); adopting says any is set.

// adoptDirtyLocked makes every dirty block that a write in place may have changed adoptable (of a
// packed tier, those in mutable units), after a restart that found no record of the last run's
// writes in place. The caller holds the tier's mutex.
func (t *tier) adoptDirtyLocked() {
	for _, s := range t.index.All() {
		slot := uint32(s)
		d := t.dirtyAt(slot).AndNot(t.zeroAt(slot))
		for b := range t.blocks {
			if d.Has(b) && t.st.mutable(slot, b) {
				t.setAdoptable(slot, b)
			}
		}
	}
}

func (t *tier) setAdoptable(slot uint32, b int) {
	if t.adopt == nil {
		t.adopt = make([]atomic.Uint64, (len(t.sums)+63)/64)
	}
	i := int(slot)*t.blocks + b
	t.adopt[i/64].Or(1 << (i % 64))
	t.adopting.Store(true)
}

// trusted notes that block b of slot has a sum it was just given (a write): not adoptable. The
// caller holds the tier's mutex.
func (t *tier) trusted(slot uint32, b int) {
	if t.adopting.Load() {
		i := int(slot)*t.blocks + b
		t.adopt[i/64].And(^uint64(1 << (i % 64)))
	}
}

// tryAdopt gives block b of line (in slot) sum, what it holds, if it is adoptable and dirty,
// and reports whether it did. Called for a block that failed its sum, without the tier's mutex.
func (t *tier) tryAdopt(line uint64, slot uint32, b int, sum uint32) bool {
	if !t.adopting.Load() {
		return false
	}
	i := int(slot)*t.blocks + b
	if t.adopt[i/64].Load()&(1<<(i%64)) == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, ok := t.slotOf(line)
	if !ok || cur != slot || !t.dirtyAt(slot).Has(b) {
		return false
	}
	t.adopt[i/64].And(^uint64(1 << (i % 64)))
	t.sumsOf(slot)[b].Store(sum)
	if t.j != nil {
		t.j.resummedLocked(line, slot, b)
	}
	if t.adopted.Add(1) == 1 {
		t.log.Warn("SSD tier: dirty data written in place before an unclean stop holds other bytes than its checksum, as a write may leave them; taken as it is",
			"tier", t.name, "line", line, "block", b)
	}
	return true
}

// resettle sets the sum of block b of line, in slot, to what the block holds after a write of it
// failed (read back); if that read fails too, the block is adoptable.
func (t *tier) resettle(line uint64, slot uint32, b int) {
	sum, err := t.st.rawSum(line, slot, b)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.setAdoptable(slot, b)
		return
	}
	t.sumsOf(slot)[b].Store(sum)
	if cur, ok := t.slotOf(line); ok && cur == slot && t.j != nil &&
		t.valid.Get(slot).AndNot(t.zeroAt(slot)).Has(b) {
		t.j.resummedLocked(line, slot, b)
	}
}

// resummedLocked notes that sums of line's stored blocks changed (a write in place; on a packed
// tier, of block b); the caller holds the tier's mutex. A tier of slots, and a packed tier's
// mutable unit, records no such change before its next record of the line, or its close
// (journal.recordResummed): a record a write each would cost every rewrite of dirty data a
// metadata commit (bench cache --parts checksums, the write-back row), and a stop that is not a
// close has it take such dirty blocks as they are anyway ("Adopted blocks"). A packed tier's fresh
// unit has it recorded at once (resumLocked).
func (j *journal) resummedLocked(line uint64, slot uint32, b int) {
	if !j.t.st.mutable(slot, b) {
		j.resumLocked(line, slot)
		return
	}
	j.resummed.Add(line)
}

// recordResummed records, for the checkpoint of a close, the lines whose sums changed by writes in
// place since their last record.
func (j *journal) recordResummed() {
	t := j.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for line, ok := j.resummed.Next(0); ok; line, ok = j.resummed.Next(line + 1) {
		j.resummed.Remove(line)
		if slot, cached := t.slotOf(line); cached {
			j.keepStoredLocked(line, slot)
			j.record(t.recordLocked(line, slot))
		}
	}
}

// resumLocked records that sums of line's stored blocks changed (a write in place), as record
// does; the caller holds the tier's mutex. A line changed already since the last snapshot has its
// record in changed brought up to date where it is and logged as it is, which allocates nothing
// (a rewrite of dirty data costs no more than its write: TestRewriteOfDirtyDataAllocatesNothing).
func (j *journal) resumLocked(line uint64, slot uint32) {
	t := j.t
	op, ok := j.changed[line]
	if !ok || op.Delete || op.Rec.Slot != slot || len(op.Rec.Sum) != t.blocks {
		j.keepStoredLocked(line, slot)
		j.record(t.recordLocked(line, slot))
		return
	}
	stored := t.valid.Get(slot).AndNot(t.zeroAt(slot))
	sums := t.sumsOf(slot)
	for b := range op.Rec.Sum {
		if stored.Has(b) {
			op.Rec.Sum[b] = sums[b].Load()
		}
	}
	if j.log != nil && j.log.Append(op) {
		j.askCheckpoint()
	}
}

// unitSum decodes unit l (stored for block b of line) and returns the block's sum, for reclaim's
// copies, which move units without decoding them. A packed tier's units are whole blocks.
func (t *tier) unitSum(line uint64, b int, unit []byte, l uint64) (uint32, error) {
	bp := bufpool.Get(blockSize)
	defer bufpool.Put(bp)
	if err := pack.Decode(*bp, unit, l); err != nil {
		return 0, err
	}
	return blockSum(line*uint64(t.blocks)+uint64(b), *bp), nil
}

// sumFix is a block a restart reads to know its sum: one of cands, the sums that the records
// after the last checkpoint (and the store's) gave it, for a block a kill may have left with any
// of them (a write in place logs its new sum before its bytes); or, with cands nil, whatever it
// holds, for a dirty block of a record from before checksums (a clean one is dropped instead).
type sumFix struct {
	line  uint64
	b     int
	cands []uint32
}

// logFixes adds to fixes the blocks of r, a record the run log replayed, that its line's records
// give more than one sum: those of the log (logSums) and the store's (stored), of r's slot. The
// caller holds the tier's mutex.
func (j *journal) logFixes(r meta.Line) {
	t := j.t
	stored := linebits.FromWords(r.Valid).AndNot(linebits.FromWords(r.Zero))
	if r.Sum == nil || stored.IsZero() {
		return
	}
	recs := j.logSums[r.Line]
	if b, ok := j.stored[r.Line]; ok && !b.Delete {
		recs = append(recs, b.Rec)
	}
	for b := range t.blocks {
		if !stored.Has(b) {
			continue
		}
		cands := []uint32{r.Sum[b]}
		for _, o := range recs {
			if o.Slot == r.Slot && len(o.Sum) > b && linebits.FromWords(o.Valid).AndNot(linebits.FromWords(o.Zero)).Has(b) &&
				!slices.Contains(cands, o.Sum[b]) {
				cands = append(cands, o.Sum[b])
			}
		}
		if len(cands) > 1 {
			j.fixes = append(j.fixes, sumFix{line: r.Line, b: b, cands: cands})
		}
	}
}

// settleSums reads the blocks of fixes (load's) and sets each one's sum to what it holds where
// that is allowed: one of its candidates, or any for a dirty block of a record from before
// checksums; a clean block of such a record is dropped (the backend has it). A block that matches
// none keeps the last record's sum, and fails it when read: it is damaged. Changed lines are
// recorded for the checkpoint that follows.
func (j *journal) settleSums() {
	t := j.t
	for _, f := range j.fixes {
		t.mu.Lock()
		slot, ok := t.slotOf(f.line)
		stored := t.valid.Get(slot).AndNot(t.zeroAt(slot))
		t.mu.Unlock()
		if !ok || !stored.Has(f.b) {
			continue
		}
		t.mu.RLock()
		dirty := t.dirtyAt(slot).Has(f.b)
		t.mu.RUnlock()
		var sum uint32
		var err error
		if f.cands != nil || dirty {
			sum, err = t.st.rawSum(f.line, slot, f.b)
		}
		t.mu.Lock()
		switch {
		case err != nil:
		case f.cands == nil && dirty, slices.Contains(f.cands, sum):
			if t.sumsOf(slot)[f.b].Load() != sum {
				j.keepStoredLocked(f.line, slot)
				t.sumsOf(slot)[f.b].Store(sum)
				j.record(t.recordLocked(f.line, slot))
			}
		case f.cands == nil:
			j.keepStoredLocked(f.line, slot)
			if op, changed := t.invalidateLocked(f.line, linebits.Range(f.b, f.b+1)); changed {
				j.record(op)
			}
		}
		t.mu.Unlock()
	}
	j.fixes, j.logSums = nil, nil
}
