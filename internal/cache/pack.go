package cache

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/klauspost/compress/s2"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/pkg/backend"
)

// The packed layout of the SSD tier (reduction: compress, and dedupe, dedupe.go). Each 4 KiB block
// a line holds is a *unit*: the block compressed with S2, or the block as it is when S2 does not
// bring it under 7/8 of its size or a sample of its bytes looks random (incompressible, which
// spares the failed compression); such a unit is read back without decoding. Units are appended to the open *segment* of the device, in the order they
// are written, and a per-block location word (segment offset, length, codec) says where each is:
// room is allocated by size, not a line's worth per slot. Slots stay the unit of the index, the
// policies and the journal, but they are only numbers: the tier has packedSlotsPerLine of them per
// line of room, and when room runs short, reclaim frees whole segments instead (the segments whose
// emptying copies the fewest bytes first: their clean lines are dropped, as CacheLib's BlockCache
// drops a region's items, but for lines hit since they were stored, which are copied, as are
// dirty blocks).
//
// A block written again goes to a new unit, and the old one stays as it was until no record can
// find it (but for a dirty block stored as it is in a unit born fresh or mutable, which
// incompressible data rewrites in place, as a slot: inPlace). That keeps the journal's rules as
// they are for slots, with units in their place: a unit's room is released only after a
// checkpoint has committed every record that stopped pointing at it (dead, swapped out at the
// snapshot as freeAfterCommit is), and segments are reused only once all their units are released. A record in the store may so find
// an older unit of a dirty block than the tier holds, which is what the durability contract allows
// of a write not flushed yet; the destager has the store catch up before it writes such a block
// back (journal.settleClaims), as for zero blocks.
//
// Reads take io shared while they read units; freeing segments takes it exclusively, so a read
// that found a unit before it died finishes before its room can be written again.

// Location words: the unit's byte offset on the device, its codec, whether it is mutable (inPlace)
// and its length (1 to 4096). A unit keeps its word for its life: the word names it (refs, fresh,
// dead).
const (
	locLenMask    = 1<<16 - 1
	locCodecShift = 16
	locMutable    = 1 << 19
	locOffShift   = 20
	codecRaw      = 0
	codecS2       = 1
)

func makeLoc(off int64, n, codec int) uint64 {
	return uint64(off)<<locOffShift | uint64(codec)<<locCodecShift | uint64(n)
}
func locOff(l uint64) int64      { return int64(l >> locOffShift) }
func locLen(l uint64) int        { return int(l & locLenMask) }
func locCodec(l uint64) int      { return int(l >> locCodecShift & 0x7) }
func locIsMutable(l uint64) bool { return l&locMutable != 0 }

// layoutOf is the superblock's layout of an SSD tier with reduction r.
func layoutOf(r Reduction) string {
	if r >= ReductionCompress {
		return meta.LayoutPacked
	}
	return ""
}

// packedSlotsPerLine is how many lines a packed tier indexes per line of room: the most it can hold
// when data compresses that well (the system image of bench cache --parts reduction does about
// 2.5:1 with zero blocks). Its cost is the index's RAM for the extra lines (TestIndexBytesPerLine).
const packedSlotsPerLine = 3

// PackedLinesPerLine is packedSlotsPerLine for a model of the tier (tierblk sim): the most lines a
// tier with reduction compress or dedupe holds per line of room, whatever its data's ratio. A tier
// with reduction off or zero holds one line a line of room (a line's zero blocks take no write,
// but the line takes its slot).
const PackedLinesPerLine = packedSlotsPerLine

// compressedMax is the largest a compressed unit may be: one larger is stored as it is.
const compressedMax = blockSize * 7 / 8

// errNoRoom is a packed tier with no free room for a write now: reclaim frees some soon. The
// caller does not cache the data (a fill) or sends it to the backend (a write-back write).
var errNoRoom = errors.New("the SSD tier has no free room now")

// packed is the packed layout's state. locs, refs, dead, stored, hot and dd are guarded by the
// tier's mu; the segments' state by mu, which is taken after the tier's mu, never before it.
type packed struct {
	dev     backend.Backend
	blocks  int
	segSize int64

	locs   []uint64         // by slot*blocks + block: 0 where the block has no unit
	refs   map[uint64]int32 // by unit: its references beyond the first (shared units only)
	dead   []uint64         // units no record will find once the next checkpoint has committed
	stored int64            // bytes of the live units: the tier's physical bytes
	hot    []uint64         // by slot, a bit: the line was hit since its units were last reclaimed
	// by slot, odd while a unit of the slot is written in place, counting such writes (a seqlock
	// that reclaim reads around its copies)
	gen []uint32
	dd  *dedupe // the content hashes of units (reduction dedupe); nil otherwise
	// fresh holds the units born since the last checkpoint's snapshot: no committed record, and
	// none the checkpoint under way commits, can find them (inPlace).
	fresh map[uint64]struct{}

	// io guards no field: it keeps the room of units from being released (release holds it alone)
	// while a read found them and reads them (packRead, rawSum, rawSpan until the asynchronous
	// read ends), or reclaim picks them and copies them (shared). Taken after line locks,
	// checkpointMu and the tier's inplace, before the tier's mu.
	io sync.RWMutex

	// mu guards used, free, open and at (the segments' state; reserve, low and target are set
	// once). It is taken after the tier's mu (reclaim's victims) and io (release), never before
	// them; nothing is taken under it.
	mu      sync.Mutex
	used    []int64 // by segment: bytes of its units not released
	free    []int32 // segments with no unit, the lowest last
	open    int32   // the segment units are appended to; -1 for none
	at      int64   // where the next unit goes in open
	reserve int     // free segments that only reclaim's copies may take
	low     int     // reclaim starts below this many free segments
	target  int     // and frees segments up to this many
	kick    func()  // asks for reclaim (the journal's loop)
}

// newPacked lays out a device of size bytes for a tier of slots slots of blocks blocks.
func newPacked(dev backend.Backend, size int64, slots, blocks int) (*packed, error) {
	// Segments of up to 4 MiB, at least 128 of them where the tier is large enough; a tiny tier
	// (the tests') gets segments of one block.
	seg := int64(blockSize)
	for seg < 4<<20 && seg*128 < size {
		seg *= 2
	}
	n := int(size / seg)
	if n < 4 {
		return nil, fmt.Errorf("the SSD tier of %d bytes is too small for reduction compress: it needs 4 segments of %d bytes", size, seg)
	}
	pk := &packed{
		dev: dev, blocks: blocks, segSize: seg,
		locs:  make([]uint64, slots*blocks),
		refs:  map[uint64]int32{},
		hot:   make([]uint64, (slots+63)/64),
		gen:   make([]uint32, slots),
		fresh: map[uint64]struct{}{},
		used:  make([]int64, n),
		open:  -1,
	}
	pk.reserve = max(1, n/64)
	pk.low = max(pk.reserve+1, n/32)
	pk.target = max(pk.low+1, n/16)
	for s := n - 1; s >= 0; s-- {
		pk.free = append(pk.free, int32(s))
	}
	return pk, nil
}

// alloc gives each unit of sizes its offset in offs, appended one after another; a unit of a whole
// block (one stored as it is) starts on a 4 KiB boundary, so that reading or writing it is one
// page, not parts of two (the bytes skipped are never used). Only reclaim (relocating) may take
// the reserve, so that it can always move the blocks it must keep.
func (pk *packed) alloc(sizes []int, offs []int64, relocating bool) error {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	keep := pk.reserve
	if relocating {
		keep = 0
	}
	for i, n := range sizes {
		if n == blockSize {
			pk.at = (pk.at + blockSize - 1) &^ (blockSize - 1)
		}
		if pk.open < 0 || pk.at+int64(n) > pk.segSize {
			if len(pk.free) <= keep {
				for k := range i {
					pk.releaseLocked(offs[k], sizes[k])
				}
				pk.askReclaim()
				return errNoRoom
			}
			pk.sealLocked()
			pk.open, pk.free = pk.free[len(pk.free)-1], pk.free[:len(pk.free)-1]
			pk.at = 0
		}
		offs[i] = int64(pk.open)*pk.segSize + pk.at
		pk.at += int64(n)
		pk.used[pk.open] += int64(n)
	}
	if len(pk.free) < pk.low {
		pk.askReclaim()
	}
	return nil
}

// dirtyRoomKept is how many lines of room (of line bytes) the tier keeps from dirty data, which
// reclaim can only copy: the segments that reclaim keeps free, and a line's worth for the writes
// under way, whose new units take room before the ones they replace are freed. On a tier of any
// size this is below what the write-back maximum keeps anyway; on a tiny one (the tests') it is
// what lets writes over incompressible dirty data go on.
func (pk *packed) dirtyRoomKept(line int64) int {
	return int((int64(pk.low)*pk.segSize+line-1)/line) + 1
}

func (pk *packed) askReclaim() {
	if pk.kick != nil {
		pk.kick()
	}
}

// sealLocked closes the open segment; one that holds no live unit is free again.
func (pk *packed) sealLocked() {
	if s := pk.open; s >= 0 {
		pk.open = -1
		if pk.used[s] == 0 {
			pk.free = append(pk.free, s)
		}
	}
}

func (pk *packed) releaseLocked(off int64, n int) {
	s := int32(off / pk.segSize)
	if pk.used[s] -= int64(n); pk.used[s] == 0 && s != pk.open {
		pk.free = append(pk.free, s)
	}
}

// release frees the room of units no record finds any more, once reads that found them are done.
func (pk *packed) release(units []uint64) {
	if len(units) == 0 {
		return
	}
	pk.io.Lock()
	pk.mu.Lock()
	for _, l := range units {
		pk.releaseLocked(locOff(l), locLen(l))
	}
	pk.mu.Unlock()
	pk.io.Unlock()
}

// short reports whether reclaim should free segments.
func (pk *packed) short() bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return len(pk.free) < pk.low
}

// maxReclaimMoves bounds the block references one reclaim copies or drops, whatever the tier's
// size: a tier of a TiB short of room would otherwise list a sixteenth of its blocks at once. Its
// lists of moves and drops, its map of copies and the copies' room take 120 bytes a reference at
// most (a move of 40, a map entry of 16 in a table at least half full, and 41 for the unit's
// copy: its old and new location words, its size twice, its offset and whether it was made),
// which MemoryPlan counts. A pass that
// reaches the bound frees fewer segments, and the next pass (room is still short) goes on.
var maxReclaimMoves = 8 << 10 // a variable for TestReclaimListsBounded

// reclaimPicked, when set, runs between reclaim's choice of what to copy (units) and its taking
// the room for it: TestReclaimTakesItsRoomAtOnce takes room there, as writers may.
var reclaimPicked func(units []uint64)

// reclaimBytes is the most memory a reclaim's lists take: maxReclaimMoves references, and one
// line's blocks past them (a line is listed whole).
func reclaimBytes() uint64 { return uint64(maxReclaimMoves+MaxLineSize/blockSize) * 120 }

// victims returns the segments reclaim empties, as many as it takes to reach target free
// segments: those whose emptying copies the fewest bytes (copy, by segment: the bytes of its units
// that reclaim must keep), then the fewest live ones; but no more than copy at most
// maxReclaimMoves block references (refs, by segment, as copy; the first victim whatever its
// count: reclaim lists no more than that many, and the next goes on). secondChance is false when
// copying what it would keep does not fit the free room: hot clean lines are dropped too.
func (pk *packed) victims(copy, hot []int64, copyRefs, hotRefs []int32) (victims []int32, secondChance bool) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	want := pk.target - len(pk.free)
	if want <= 0 {
		return nil, true
	}
	isFree := make([]bool, len(pk.used))
	for _, s := range pk.free {
		isFree[s] = true
	}
	var full []int32
	for s := range pk.used {
		if !isFree[s] && int32(s) != pk.open {
			full = append(full, int32(s))
		}
	}
	room := int64(len(pk.free)) * pk.segSize
	if pk.open >= 0 {
		room += pk.segSize - pk.at
	}
	for _, secondChance = range []bool{true, false} {
		keep := func(s int32) int64 {
			if secondChance {
				return copy[s] + hot[s]
			}
			return copy[s]
		}
		slices.SortFunc(full, func(a, b int32) int {
			return cmp.Or(cmp.Compare(keep(a), keep(b)), cmp.Compare(pk.used[a], pk.used[b]))
		})
		victims = full[:min(want, len(full))]
		var copied int64
		refs := 0
		for i, s := range victims {
			r := int(copyRefs[s])
			if secondChance {
				r += int(hotRefs[s])
			}
			if i > 0 && refs+r > maxReclaimMoves {
				victims = victims[:i]
				break
			}
			refs += r
			copied += keep(s)
		}
		// Each copy may waste up to a block aligning a unit stored as it is.
		if copied+int64(len(victims))*blockSize <= room {
			break
		}
	}
	return victims, secondChance
}

// slotLocs returns the location words of slot's blocks [b0, b1) in the tier's locs.
func (pk *packed) slotLocs(slot uint32, b0, b1 int) []uint64 {
	base := int(slot) * pk.blocks
	return pk.locs[base+b0 : base+b1]
}

// bornLocked counts a new unit l as live, with one reference.
func (pk *packed) bornLocked(l uint64) {
	pk.stored += int64(locLen(l))
	pk.fresh[l] = struct{}{}
}

// shareLocked takes one more reference to the live unit l.
func (pk *packed) shareLocked(l uint64) { pk.refs[l]++ }

// deadLocked lets go of a reference to unit l (a block's location that no longer finds it, or a
// reference taken for a moment). With the last one, l dies: its room is freed after the next
// checkpoint.
func (pk *packed) deadLocked(l uint64) {
	if n := pk.refs[l]; n > 0 {
		if n == 1 {
			delete(pk.refs, l)
		} else {
			pk.refs[l] = n - 1
		}
		return
	}
	pk.dead = append(pk.dead, l)
	pk.stored -= int64(locLen(l))
	if pk.dd != nil {
		pk.dd.forgetLocked(l)
	}
}

// dropBlocksLocked takes the units of slot's blocks gone out of locs.
func (pk *packed) dropBlocksLocked(slot uint32, gone lineBits) {
	if gone.isZero() {
		return
	}
	locs := pk.slotLocs(slot, 0, pk.blocks)
	for b, l := range locs {
		if l != 0 && gone.has(b) {
			pk.deadLocked(l)
			locs[b] = 0
		}
	}
}

// releaseSlotLocked takes every unit of a slot being released.
func (pk *packed) releaseSlotLocked(slot uint32) {
	pk.dropBlocksLocked(slot, rangeBits(0, pk.blocks))
	pk.hot[slot/64] &^= 1 << (slot % 64)
}

func (pk *packed) setHotLocked(slot uint32) { pk.hot[slot/64] |= 1 << (slot % 64) }

func (pk *packed) isHotLocked(slot uint32) bool { return pk.hot[slot/64]>>(slot%64)&1 != 0 }

// unitsOf returns the locations of slot's units among the blocks keep, 0 elsewhere: what a record
// of the slot says (nil when none has a unit).
func (pk *packed) unitsOf(slot uint32, keep lineBits) []uint64 {
	var out []uint64
	for b, l := range pk.slotLocs(slot, 0, pk.blocks) {
		if l != 0 && keep.has(b) {
			if out == nil {
				out = make([]uint64, pk.blocks)
			}
			out[b] = l
		}
	}
	return out
}

// readUnits reads the units locs (of consecutive blocks; 0 for none) and calls fn with each one's
// stored bytes, reading units stored one after another at once. cached reads through the SSD's
// page cache (the destager's, of data written a moment ago).
func (pk *packed) readUnits(locs []uint64, cached bool, fn func(i int, unit []byte) error) error {
	for i := 0; i < len(locs); {
		if locs[i] == 0 {
			i++
			continue
		}
		start := locOff(locs[i])
		end, j := start+int64(locLen(locs[i])), i+1
		for j < len(locs) && locs[j] != 0 && locOff(locs[j]) == end {
			end += int64(locLen(locs[j]))
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
			o := locOff(locs[k]) - w0
			err = fn(k, (*bp)[o:o+int64(locLen(locs[k]))])
		}
		bufpool.Put(bp)
		if err != nil {
			return err
		}
		i = j
	}
	return nil
}

// decodeUnit writes the block unit l holds into dst (a whole block).
func decodeUnit(dst, unit []byte, l uint64) error {
	if locCodec(l) == codecRaw {
		copy(dst, unit)
		return nil
	}
	n, err := s2.DecodedLen(unit)
	if err == nil && n != len(dst) {
		err = fmt.Errorf("%d bytes, want %d", n, len(dst))
	}
	if err == nil {
		_, err = s2.Decode(dst, unit)
	}
	if err != nil {
		return fmt.Errorf("SSD tier: a compressed block at %d does not decode: %w", locOff(l), err)
	}
	return nil
}

// packRead is readSlot on a packed tier: the line's bytes [off, off+len(p)) of slot. A block
// without a unit reads as zeros (a zero block; the caller reads no block that is not valid). Each
// unit read is decoded whole and checked against its block's sum (sum.go); a unit that does not
// decode is damaged too. Whole blocks of p stored as they are, one after another on the device
// (all a line filled with incompressible data holds), are read straight into p and checked there:
// the copy out of a buffer that decodeUnit would make costs a 1 MiB hit about what its sums do
// (BenchmarkHits1M).
func (t *tier) packRead(line uint64, slot uint32, p []byte, off int64, cached bool) error {
	pk := t.pk
	b0, b1 := int(off/blockSize), int((off+int64(len(p))+blockSize-1)/blockSize)
	var buf [16]uint64
	pk.io.RLock()
	defer pk.io.RUnlock()
	t.mu.RLock()
	locs := append(buf[:0], pk.slotLocs(slot, b0, b1)...)
	t.mu.RUnlock()
	sums := t.sumsOf(slot)
	var tmp *[]byte
	defer func() {
		if tmp != nil {
			bufpool.Put(tmp)
		}
	}()
	for i, l := range locs {
		if l == 0 {
			lo, hi := blockPart(b0+i, off, len(p))
			clear(p[lo:hi])
		}
	}
	var dmg *damageError
	// check checks blk, block b's bytes (nil for a unit that did not decode), against its sum.
	check := func(b int, blk []byte) bool {
		if sum := blockSum(line*uint64(t.blocks)+uint64(b), blk); blk == nil || sum != sums[b].Load() && !t.tryAdopt(line, slot, b, sum) {
			if dmg == nil {
				dmg = &damageError{line: line}
			}
			dmg.bits[b/64] |= 1 << (b % 64)
			return false
		}
		return true
	}
	// direct reports whether block b0+i is read straight into p: a unit stored as it is, that p
	// holds whole.
	direct := func(i int) bool {
		lo, hi := blockPart(b0+i, off, len(p))
		return locs[i] != 0 && locCodec(locs[i]) == codecRaw && locLen(locs[i]) == blockSize && hi-lo == blockSize
	}
	unit := func(i int, unit []byte) error {
		b := b0 + i
		lo, hi := blockPart(b, off, len(p))
		blk := p[lo:hi]
		if hi-lo != blockSize {
			if tmp == nil {
				tmp = bufpool.Get(blockSize)
			}
			blk = *tmp
		}
		if decodeUnit(blk, unit, locs[i]) != nil {
			blk = nil
		}
		if check(b, blk) && hi-lo != blockSize {
			bo := int64(b)*blockSize - off // where the block starts relative to p (may be < 0)
			copy(p[lo:hi], blk[int64(lo)-bo:])
		}
		return nil
	}
	for i := 0; i < len(locs); {
		if locs[i] == 0 {
			i++
			continue
		}
		j := i + 1
		if !direct(i) {
			for j < len(locs) && !direct(j) {
				j++
			}
			if err := pk.readUnits(locs[i:j], cached, func(k int, u []byte) error { return unit(i+k, u) }); err != nil {
				return err
			}
			i = j
			continue
		}
		for j < len(locs) && direct(j) && locOff(locs[j]) == locOff(locs[i])+int64(j-i)*blockSize {
			j++
		}
		lo, _ := blockPart(b0+i, off, len(p))
		_, hi := blockPart(b0+j-1, off, len(p))
		var err error
		if cr, ok := pk.dev.(backend.CachedReader); cached && ok {
			_, err = cr.ReadAtCached(p[lo:hi], locOff(locs[i]))
		} else {
			_, err = pk.dev.ReadAt(p[lo:hi], locOff(locs[i]))
		}
		if err != nil {
			return err
		}
		for k := i; k < j; k++ {
			blo, bhi := blockPart(b0+k, off, len(p))
			check(b0+k, p[blo:bhi])
		}
		i = j
	}
	if dmg != nil {
		t.sumErrs.Add(uint64(dmg.bits.count()))
		return dmg
	}
	return nil
}

// rawSpan returns where on the device the line's bytes [lo, hi) of slot are, if their blocks are
// units stored as they are, one after another: such a read goes to the device as on a slot
// (read_async.go). When ok, the caller holds io shared, and lets go of it once the read is done.
// With try it does not wait for io: where another holds it exclusively, or waits to, it reports
// false.
func (t *tier) rawSpan(slot uint32, lo, hi int64, try bool) (at int64, ok bool) {
	pk := t.pk
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
		if l == 0 || locCodec(l) != codecRaw || locOff(l) != locOff(locs[0])+int64(i)*blockSize {
			ok = false
			break
		}
	}
	at = locOff(locs[0]) + lo - int64(b0)*blockSize
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

// packWrite is writeSlot on a packed tier: it stores the blocks of p (the line's bytes from off) as
// new units, or as references to units with the same bytes (reduction dedupe), and points slot's
// locations at them, if slot is still line's. A block p covers in part takes the rest of its bytes
// from its unit (the caller merged zero blocks and blocks the tier does not hold already). The
// line's record is queued with the new locations, so that a checkpoint commits them; the units they
// replace lose a reference.
func (t *tier) packWrite(line uint64, slot uint32, p []byte, off int64) error {
	pk := t.pk
	t.inplace.RLock() // for the blocks written in place (inPlace)
	defer t.inplace.RUnlock()
	b0, b1 := int(off/blockSize), int((off+int64(len(p))+blockSize-1)/blockSize)
	nb := b1 - b0
	outp := bufpool.Get(nb * blockSize)
	defer bufpool.Put(outp)
	blk := bufpool.Get(blockSize)
	defer bufpool.Put(blk)
	scratch := bufpool.Get(s2.MaxEncodedLen(blockSize))
	defer bufpool.Put(scratch)
	var sizeBuf [16]int
	var offBuf [16]int64
	var codecBuf [16]int
	var locBuf, hashBuf [16]uint64
	var newBuf, sameBuf, mutBuf [16]bool
	var twinBuf [16]int
	var sumBuf [16]uint32
	sums := slices.Grow(sumBuf[:0], nb)[:nb] // by block: its checksum
	sizes, offs, codecs := sizeBuf[:0], offBuf[:0], codecBuf[:0]
	locs := slices.Grow(locBuf[:0], nb)[:nb]    // by block: its unit (a shared one, or new)
	hashes := slices.Grow(hashBuf[:0], nb)[:nb] // by block: its content hash (dedupe)
	fresh := slices.Grow(newBuf[:0], nb)[:nb]   // by block: whether its unit is new
	same := slices.Grow(sameBuf[:0], nb)[:nb]   // by block: written in place, in the unit it had
	mutable := slices.Grow(mutBuf[:0], nb)[:nb] // by block: its new unit is born mutable (inPlace)
	twin := slices.Grow(twinBuf[:0], nb)[:nb]   // by block: 1 + an earlier one of p with its bytes (dedupe)
	// Until the blocks are placed, shared units hold a reference taken for them (dedupeCandidate).
	// Writes in place end with the call.
	placed, inPlace := false, false
	defer func() {
		if placed && !inPlace {
			return
		}
		t.mu.Lock()
		for i, l := range locs {
			if l != 0 && !fresh[i] && !placed {
				pk.deadLocked(l) // a shared unit's reference
			}
		}
		if inPlace {
			pk.gen[slot]++
		}
		t.mu.Unlock()
	}()
	out := (*outp)[:0]
	for b := b0; b < b1; b++ {
		lo, hi := blockPart(b, off, len(p))
		src := p[lo:hi]
		if hi-lo < blockSize {
			clear(*blk)
			if t.hasUnit(slot, b) {
				if err := t.packRead(line, slot, *blk, int64(b)*blockSize, false); err != nil {
					return err
				}
			}
			copy((*blk)[max(off-int64(b)*blockSize, 0):], src)
			src = *blk
		}
		sums[b-b0] = blockSum(line*uint64(t.blocks)+uint64(b), src)
		if pk.dd != nil {
			h := pk.dd.hash(src)
			hashes[b-b0] = h
			if j := twinOf(p, off, b0, src, h, hashes[:b-b0], fresh); j >= 0 {
				twin[b-b0] = j + 1
				pk.dd.shared.Add(1)
				continue
			}
			if l := t.dedupeCandidate(src, h, (*scratch)[:blockSize]); l != 0 {
				locs[b-b0] = l
				continue
			}
		}
		enc, codec := src, codecRaw
		if !incompressible(src) {
			if enc = s2.Encode(*scratch, src); len(enc) <= compressedMax {
				codec = codecS2
			} else {
				enc = src
			}
		}
		if codec == codecRaw {
			l, ok, rewrite := t.inPlace(line, slot, b, sums[b-b0], &inPlace)
			if ok {
				same[b-b0] = true
				if _, err := pk.dev.WriteAt(src, locOff(l)); err != nil {
					t.resettle(line, slot, b)
					return err
				}
				continue
			}
			mutable[b-b0] = rewrite
		}
		out = append(out, enc...)
		sizes, codecs = append(sizes, len(enc)), append(codecs, codec)
		fresh[b-b0] = true
	}
	offs = slices.Grow(offs, len(sizes))[:len(sizes)]
	if err := pk.alloc(sizes, offs, false); err != nil {
		return err
	}
	var newLocBuf [16]uint64
	newLocs := slices.Grow(newLocBuf[:0], len(sizes))[:len(sizes)]
	for i, k := 0, 0; i < nb; i++ {
		if fresh[i] {
			locs[i] = makeLoc(offs[k], sizes[k], codecs[k])
			if mutable[i] {
				locs[i] |= locMutable
			}
			newLocs[k] = locs[i]
			k++
		}
	}
	if err := pk.writeRuns(out, newLocs); err != nil {
		t.mu.Lock()
		pk.dead = append(pk.dead, newLocs...) // never live: not in stored either
		t.mu.Unlock()
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.slotOf(line); !ok || s != slot {
		pk.dead = append(pk.dead, newLocs...)
		return nil // evicted meanwhile: validate says so to the caller (the deferred call lets go of shared units)
	}
	placed = true
	// A record finds units of valid blocks only (recordLocked): new units of blocks not valid yet
	// change no record before validate marks them, but a valid block written again does.
	// Blocks written in place change no record.
	var moved lineBits
	for i := range nb {
		if !same[i] {
			moved[(b0+i)/64] |= 1 << ((b0 + i) % 64)
		}
	}
	rewrite := t.j != nil && !t.valid.get(slot).andNot(t.zeroAt(slot)).and(moved).isZero()
	if rewrite {
		t.j.keepStoredLocked(line, slot)
	}
	dst := pk.slotLocs(slot, b0, b1)
	sumDst := t.sumsOf(slot)[b0:b1]
	for i, l := range locs {
		if same[i] {
			continue
		}
		sumDst[i].Store(sums[i])
		t.trusted(slot, b0+i)
		if twin[i] > 0 {
			l = locs[twin[i]-1] // placed, and so live, just before
			locs[i] = l
			pk.shareLocked(l)
		}
		if old := dst[i]; old != 0 {
			pk.deadLocked(old)
		}
		dst[i] = l
		if fresh[i] {
			pk.bornLocked(l)
			if pk.dd != nil {
				pk.dd.rememberLocked(hashes[i], l)
			}
		}
	}
	if rewrite {
		t.j.record(t.recordLocked(line, slot))
	}
	return nil
}

// twinOf returns the index (from b0) of an earlier block of p (the line's bytes from off) that
// gets a new unit and holds src, whose hash is h, or -1: blocks alike in one write are stored
// once, as they would be one write after the other. Only whole blocks of p qualify as the earlier
// one (a block p covers in part is merged in a buffer that the next one reuses).
func twinOf(p []byte, off int64, b0 int, src []byte, h uint64, hashes []uint64, fresh []bool) int {
	for j, hj := range hashes {
		if !fresh[j] || hj != h {
			continue
		}
		if jl, jh := blockPart(b0+j, off, len(p)); jh-jl == blockSize && bytes.Equal(p[jl:jh], src) {
			return j
		}
	}
	return -1
}

// inPlace returns the unit of block b of slot if an incompressible block may be written over it in
// place, as a slot is, sparing the new unit and the room reclaim would later free (its record
// changes only its sum): a dirty block's unit stored as it is (a whole, aligned block) that no
// other block shares, and that is either
//   - fresh, born since the last checkpoint's snapshot: no record the store holds or is committing
//     finds it, the block's own or another line's that shared it once (dedupe). The record with the
//     block's new sum is logged before its bytes are written, so after a kill the run log gives the
//     block each sum it may hold (journal.load), and after a power cut no committed record finds it.
//   - or mutable (locMutable): born for a rewrite of the block while it was dirty, on a tier
//     without dedupe, where no other line's record ever finds it. Its new sum is recorded as a
//     tier of slots records one, with the line's next record or at the close (resummed): after a
//     stop that was not a close the block is taken as it is if it fails its sum (adoptDirtyLocked),
//     as a dirty block of a slot is. So only data rewritten while dirty is written in place over
//     what a committed record claims; a block written once keeps the sum it was written with.
//
// rewrite reports whether a new unit for the block should be born mutable: the block is dirty on
// a tier without dedupe. The caller holds the line's lock, so no read or destage of the block
// runs; only reclaim reads units without it, and the slot's gen (odd from the first such write on,
// *started, until packWrite ends) has it drop the copy of a unit written meanwhile. With dedupe,
// the unit leaves the table, which names it by its old bytes.
func (t *tier) inPlace(line uint64, slot uint32, b int, sum uint32, started *bool) (l uint64, ok, rewrite bool) {
	pk := t.pk
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.dirtyAt(slot).has(b) {
		return 0, false, false
	}
	rewrite = pk.dd == nil
	l = pk.slotLocs(slot, b, b+1)[0]
	if l == 0 || locCodec(l) != codecRaw || locLen(l) != blockSize || pk.refs[l] > 0 || t.zeroAt(slot).has(b) {
		return 0, false, rewrite
	}
	mutable := locIsMutable(l)
	if !mutable {
		if _, ok := pk.fresh[l]; !ok {
			return 0, false, rewrite
		}
	}
	if pk.dd != nil {
		pk.dd.forgetLocked(l)
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

// incompressible reports whether block b looks like random bytes, which S2 would fail to compress:
// sampled 16 bytes in every 256, it has more distinct byte values than data that compresses ever
// shows. Text and code have far fewer; a failed compression costs several times the sampling. The
// samples keep away from the starts of sectors, where file systems put headers and fio its
// offsets (which would make random data look ordered). TestIncompressible checks both ways;
// bench cache --parts reduction's physical bytes show what it gives up on real files.
func incompressible(b []byte) bool {
	var m0, m1 [4]uint64 // two sets, for two independent chains of updates
	for off := 100; off+16 <= len(b); off += 256 {
		x, y := binary.LittleEndian.Uint64(b[off:]), binary.LittleEndian.Uint64(b[off+8:])
		for k := 0; k < 64; k += 8 {
			c, d := byte(x>>k), byte(y>>k)
			m0[c>>6] |= 1 << (c & 63)
			m1[d>>6] |= 1 << (d & 63)
		}
	}
	n := 0
	for i := range m0 {
		n += bits.OnesCount64(m0[i] | m1[i])
	}
	return n > incompressibleDistinct
}

// incompressibleDistinct is the most distinct byte values among the 256 bytes incompressible
// samples of a block that still gets compressed. Random bytes show about 162.
const incompressibleDistinct = 120

// hasUnit reports whether block b of slot has a unit.
func (t *tier) hasUnit(slot uint32, b int) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.pk.slotLocs(slot, b, b+1)[0] != 0
}

// writeRuns writes out, the units locs in order, with one write for each run of them stored one
// after another.
func (pk *packed) writeRuns(out []byte, locs []uint64) error {
	pos := 0
	for i := 0; i < len(locs); {
		start, n, j := locOff(locs[i]), locLen(locs[i]), i+1
		for j < len(locs) && locOff(locs[j]) == start+int64(n) {
			n += locLen(locs[j])
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

// reclaim frees segments of a packed tier that runs short of room: it empties the segments with
// the fewest live bytes, dropping the clean lines with units there but copying the units of dirty
// blocks and of lines hit since their last reclaim (a second chance, which keeps a hot line's
// blocks). The room comes free after the next checkpoint (the caller runs one). It returns how many
// block references it listed to copy or drop.
func (t *tier) reclaim() (listed int) {
	pk := t.pk
	pk.mu.Lock()
	full := len(pk.free) >= pk.target
	pk.mu.Unlock()
	if full {
		return
	}
	type move struct {
		line uint64
		slot uint32
		b    int
		loc  uint64
		gen  uint32 // the slot's: a unit written in place since is not moved
		sum  uint32 // the block's checksum, which the unit's bytes must match to be copied
	}
	var moves []move
	var drops []uint64
	// Held from before the units to move are picked until they are moved: none of them can die
	// and have its room written again (a unit there with the same location word would pass the
	// check below) in between.
	pk.io.RLock()
	defer pk.io.RUnlock()
	t.mu.Lock()
	// What emptying each segment would copy: the units of dirty lines, and of hot ones.
	nseg := len(pk.used)
	copyBytes, hotBytes := make([]int64, nseg), make([]int64, nseg)
	copyRefs, hotRefs := make([]int32, nseg), make([]int32, nseg)
	for _, s := range t.index.All() {
		slot := uint32(s)
		to, refs := hotBytes, hotRefs
		if !t.dirtyAt(slot).isZero() {
			to, refs = copyBytes, copyRefs
		} else if !pk.isHotLocked(slot) {
			continue
		}
		for _, l := range pk.slotLocs(slot, 0, pk.blocks) {
			if l != 0 {
				to[locOff(l)/pk.segSize] += int64(locLen(l))
				refs[locOff(l)/pk.segSize]++
			}
		}
	}
	victims, secondChance := pk.victims(copyBytes, hotBytes, copyRefs, hotRefs)
	if len(victims) == 0 {
		t.mu.Unlock()
		return
	}
	rank := make([]int32, nseg) // a segment's place in victims, -1 for none
	for i := range rank {
		rank[i] = -1
	}
	for i, s := range victims {
		rank[s] = int32(i)
	}
	for line, s := range t.index.All() {
		if len(moves)+len(drops) >= maxReclaimMoves {
			// One victim with more references than that (tiny units, or one shared by many
			// deduplicated lines): the rest stay for the next reclaim, which finds them there.
			break
		}
		slot := uint32(s)
		locs := pk.slotLocs(slot, 0, pk.blocks)
		var there lineBits
		for b, l := range locs {
			if l != 0 && rank[locOff(l)/pk.segSize] >= 0 {
				there[b/64] |= 1 << (b % 64)
			}
		}
		if there.isZero() {
			continue
		}
		hot := pk.isHotLocked(slot) && secondChance
		pk.hot[slot/64] &^= 1 << (slot % 64)
		if !hot && t.dirtyAt(slot).isZero() {
			drops = append(drops, line)
			continue
		}
		if pk.gen[slot]%2 == 1 {
			continue // written in place now: moved by a later reclaim
		}
		// A line with dirty blocks is never dropped: its clean units there are copied too.
		for b := range pk.blocks {
			if there.has(b) {
				moves = append(moves, move{line, slot, b, locs[b], pk.gen[slot], t.sumsOf(slot)[b].Load()})
			}
		}
	}
	listed = len(moves) + len(drops)
	for _, line := range drops {
		t.evict.Remove(policy.Key(line))
		t.evictions.Add(1)
		t.dropLocked(line)
	}
	t.mu.Unlock()

	// A shared unit has a move for each block that finds it: the first copies it, and the others
	// point at the copy. The room of the copies is taken at once, before the first is written, for
	// as many whole victims as it fits (the cheapest first): copies that ran out of room half-way
	// (writers take free segments meanwhile) would leave their victims half full and the room they
	// took lost, until reclaim had none left to copy into at all (TestReclaimTakesItsRoomAtOnce).
	// Each copy holds a reference of reclaim's until the moves are done; a copy never made
	// (damage, an error) is dead at once.
	copies := map[uint64]int{} // a unit's index in units
	var units []uint64         // the units to copy, each once, in the order of moves
	var sizes []int
	for _, m := range moves {
		if _, ok := copies[m.loc]; !ok {
			copies[m.loc] = len(units)
			units = append(units, m.loc)
			sizes = append(sizes, locLen(m.loc))
		}
	}
	if reclaimPicked != nil {
		reclaimPicked(units)
	}
	news := make([]uint64, len(units)) // the copies' location words; 0: not copied this time
	for k := int32(len(victims)); k > 0; k-- {
		var sz []int
		for i, l := range units {
			if rank[locOff(l)/pk.segSize] < k {
				sz = append(sz, sizes[i])
			}
		}
		offs := make([]int64, len(sz))
		if pk.alloc(sz, offs, true) != nil {
			continue
		}
		j := 0
		for i, l := range units {
			if rank[locOff(l)/pk.segSize] < k {
				news[i] = makeLoc(offs[j], sz[j], locCodec(l)) | l&locMutable // the block's, as mutable as it was
				j++
			}
		}
		break
	}
	made := make([]bool, len(units))
	defer func() {
		t.mu.Lock()
		for i, nl := range news {
			switch {
			case made[i]:
				pk.deadLocked(nl)
			case nl != 0:
				pk.dead = append(pk.dead, nl) // never live
			}
		}
		t.mu.Unlock()
	}()
	for _, m := range moves {
		i := copies[m.loc]
		nl := news[i]
		if nl == 0 {
			continue // its segment did not fit: the next reclaim picks again
		}
		if !made[i] {
			if err := t.copyUnit(m.line, m.b, m.loc, nl, m.sum); err != nil {
				if _, ok := asDamage(err); ok {
					// Not copied: the unit stays, and its segment with it, until a check of
					// the line under its lock (which a write to it may be changing) deals
					// with the block.
					t.recheck(m.line)
					continue
				}
				t.log.Warn("cache tier reclaim: copy failed", "tier", t.name, "err", err)
				return
			}
			made[i] = true
			t.mu.Lock()
			pk.bornLocked(nl)
			if pk.dd != nil {
				pk.dd.movedLocked(m.loc, nl)
			}
			t.mu.Unlock()
		}
		t.mu.Lock()
		cur := pk.slotLocs(m.slot, m.b, m.b+1)
		if s, ok := t.slotOf(m.line); ok && s == m.slot && cur[0] == m.loc && pk.gen[m.slot] == m.gen {
			if t.j != nil {
				t.j.keepStoredLocked(m.line, m.slot)
			}
			pk.deadLocked(m.loc)
			cur[0] = nl
			pk.shareLocked(nl)
			if t.j != nil {
				t.j.record(t.recordLocked(m.line, m.slot))
			}
		}
		t.mu.Unlock()
	}
	return listed
}

// copyUnit writes a copy of unit l, block b of line, to nl (room reclaim took for it), if its
// bytes match the block's sum; else it returns a *damageError.
func (t *tier) copyUnit(line uint64, b int, l, nl uint64, sum uint32) error {
	pk := t.pk
	// A pooled buffer: reclaim copies every unit it keeps, and allocating each would make garbage
	// at the rate the tier is written (TestMemoryBoundNBD).
	bp := bufpool.Get(locLen(l))
	defer bufpool.Put(bp)
	unit := *bp
	if err := pk.readUnits([]uint64{l}, false, func(_ int, u []byte) error {
		copy(unit, u)
		return nil
	}); err != nil {
		return err
	}
	if got, err := t.unitSum(line, b, unit, l); err != nil || got != sum {
		return &damageError{line: line, bits: rangeBits(b, b+1)}
	}
	return pk.writeRuns(unit, []uint64{nl})
}

// probe writes a block to free room and reads it back (journal.probe, on a packed tier).
func (pk *packed) probe(w, r []byte) error {
	var off [1]int64
	if err := pk.alloc([]int{len(w)}, off[:], true); err != nil {
		return errors.New("probe of the SSD tier: no free room to write to")
	}
	defer pk.release([]uint64{makeLoc(off[0], len(w), codecRaw)})
	if _, err := pk.dev.WriteAt(w, off[0]); err != nil {
		return fmt.Errorf("probe write to the SSD tier: %w", err)
	}
	if _, err := pk.dev.ReadAt(r, off[0]); err != nil {
		return fmt.Errorf("probe read from the SSD tier: %w", err)
	}
	return nil
}

// staleUnits reports whether locs (a record's) finds another unit than slot has for a block of
// claimed.
func (pk *packed) staleUnits(slot uint32, claimed lineBits, locs []uint64) bool {
	for b, l := range pk.slotLocs(slot, 0, pk.blocks) {
		if claimed.has(b) {
			var rl uint64
			if b < len(locs) {
				rl = locs[b]
			}
			if rl != l {
				return true
			}
		}
	}
	return false
}

// claim counts unit l as live (a restart's load): false if it is out of the device's range.
func (pk *packed) claim(l uint64) bool {
	s := locOff(l) / pk.segSize
	if l == 0 || s >= int64(len(pk.used)) || locOff(l)%pk.segSize+int64(locLen(l)) > pk.segSize ||
		locLen(l) > blockSize || locCodec(l) > codecS2 ||
		locIsMutable(l) && (locCodec(l) != codecRaw || locLen(l) != blockSize) {
		return false
	}
	pk.used[s] += int64(locLen(l))
	return true
}

// loaded makes the segments with no unit claimed free (the last step of a restart's load).
func (pk *packed) loaded() {
	clear(pk.fresh) // the units records found: none is fresh
	pk.free = pk.free[:0]
	for s := len(pk.used) - 1; s >= 0; s-- {
		if pk.used[s] == 0 {
			pk.free = append(pk.free, int32(s))
		}
	}
}
