package cache

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
)

// The packed layout of the SSD tier (reduction: compress, and dedupe, dedupe.go). Each 4 KiB block
// a line holds is a *unit*: the block compressed with S2, or the block as it is when S2 does not
// bring it under 7/8 of its size or a sample of its bytes looks random (pack.Encode,
// pack.Incompressible, which spares the failed compression); such a unit is read back without
// decoding. Units are appended to the open *segment* of the device, in the order they are written,
// and a per-block location word (pack.Loc: segment offset, length, codec) says where each is: room
// is allocated by size, not a line's worth per slot. Slots stay the unit of the index, the policies
// and the journal, but they are only numbers: the tier has packedSlotsPerLine of them per line of
// room, and when room runs short, reclaim frees whole segments instead (the segments whose emptying
// copies the fewest bytes first: their clean lines are dropped, as CacheLib's BlockCache drops a
// region's items, but for lines hit since they were stored, which are copied, as are dirty blocks).
//
// A block written again goes to a new unit, and the old one stays as it was until no record can
// find it (but for a dirty block stored as it is in a unit born fresh or mutable, which
// incompressible data rewrites in place, as a slot: inPlace). That keeps the journal's rules as
// they are for slots, with units in their place: a unit's room is released only after a
// checkpoint has committed every record that stopped pointing at it (dead, swapped out at the
// snapshot as freeAfterCommit is), and segments are reused only once all their units are released.
// A record in the store may so find an older unit of a dirty block than the tier holds, which is
// what the durability contract allows of a write not flushed yet; the destager has the store catch
// up before it writes such a block back (journal.settleClaims), as for zero blocks.
//
// Reads take io shared while they read units; freeing segments takes it exclusively, so a read
// that found a unit before it died finishes before its room can be written again.
//
// The packed type is the tier's store (store.go) in this layout. The code is in rooms: this file
// holds the packed type, the bookkeeping of units by slot and the hooks of the tier's slots and
// checkpoints; pack_seg.go the segment allocator and a restart's load; pack_read.go, pack_write.go
// and pack_reclaim.go the read path, the write path and reclaim; package pack the location words,
// the codec and dedupe's table, which need nothing of the tier.
//
// Lock order. The tier's inplace (held shared by a write, which may read a unit it merges) comes
// before io; io comes before the tier's mu; mu (the segments') comes after the tier's mu, never
// before it. Release, which takes io exclusively, runs without the tier's mu (a checkpoint calls
// it once its records are committed), since reads holding io shared wait for the tier's mu.

// layoutOf is the superblock's layout of an SSD tier with reduction r.
func layoutOf(r Reduction) string {
	if r >= ReductionCompress {
		return meta.LayoutPacked
	}
	return ""
}

// packedSlotsPerLine is how many lines a packed tier indexes per line of room: the most it can hold
// when data compresses that well (the system image of bench cache --parts reduction comes close,
// with zero blocks). Its cost is the index's RAM for the extra lines (TestIndexBytesPerLine).
const packedSlotsPerLine = 3

// PackedLinesPerLine is packedSlotsPerLine for a model of the tier (tierblk sim): the most lines a
// tier with reduction compress or dedupe holds per line of room, whatever its data's ratio. A tier
// with reduction off or zero holds one line a line of room (a line's zero blocks take no write,
// but the line takes its slot).
const PackedLinesPerLine = packedSlotsPerLine

// errNoRoom is a packed tier with no free room for a write now: reclaim frees some soon. The
// caller does not cache the data (a fill) or sends it to the backend (a write-back write).
var errNoRoom = errors.New("the SSD tier has no free room now")

// packed is the store of a tier in the packed layout, and its state.
type packed struct {
	t       *tier // the tier it stores the blocks of
	dev     backend.Backend
	blocks  int
	segSize int64

	// Guarded by the tier's mu:
	locs      []uint64         // by slot*blocks + block: 0 where the block has no unit
	refs      map[uint64]int32 // by unit: its references beyond the first (shared units only)
	dead      []uint64         // units no record will find once the next checkpoint has committed
	liveBytes int64            // bytes of the live units: the tier's physical bytes
	hot       []uint64         // by slot, a bit: the line was hit since its units were last reclaimed
	// by slot, odd while a unit of the slot is written in place, counting such writes (a seqlock
	// that reclaim reads around its copies)
	gen []uint32
	dd  *dedupe // the content hashes of units (reduction dedupe); nil otherwise
	// fresh holds the units born since the last checkpoint's snapshot: no committed record, and
	// none the checkpoint under way commits, can find them (inPlace).
	fresh map[uint64]struct{}
	// claimed holds the units that the records a restart loaded so far claim, so that a unit
	// claimed twice is shared (claimUnits); nil but during the load.
	claimed map[uint64]bool

	// io guards no field: it keeps the room of units from being released (releaseUnits holds it alone)
	// while a read found them and reads them (read, rawSum, span until the asynchronous read
	// ends: endSpan), or reclaim picks them and copies them (shared). Taken after line locks,
	// checkpointMu and the tier's inplace, before the tier's mu.
	io sync.RWMutex

	// mu guards used, free, open and at (the segments' state, pack_seg.go; reserve, low and
	// target are set once). It is taken after the tier's mu (reclaim's victims) and io (releaseUnits),
	// never before them; nothing is taken under it.
	mu      sync.Mutex
	used    []int64 // by segment: bytes of its units not released
	free    []int32 // segments with no unit, the lowest last
	open    int32   // the segment units are appended to; -1 for none
	at      int64   // where the next unit goes in open
	reserve int     // free segments that only reclaim's copies may take
	low     int     // reclaim starts below this many free segments
	target  int     // and frees segments up to this many
}

// newPacked lays out dev, of size bytes, as the store of tier t.
func newPacked(t *tier, dev backend.Backend, size int64) (*packed, error) {
	slots, blocks := t.slots, t.blocks
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
		t: t, dev: dev, blocks: blocks, segSize: seg,
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

// slotLocs returns the location words of slot's blocks [b0, b1) in the tier's locs.
func (pk *packed) slotLocs(slot uint32, b0, b1 int) []uint64 {
	base := int(slot) * pk.blocks
	return pk.locs[base+b0 : base+b1]
}

// bornLocked counts a new unit l as live, with one reference.
func (pk *packed) bornLocked(l uint64) {
	pk.liveBytes += int64(pack.Len(l))
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
	pk.liveBytes -= int64(pack.Len(l))
	if pk.dd != nil {
		pk.dd.Forget(l)
	}
}

// dropBlocksLocked takes the units of slot's blocks gone out of locs.
func (pk *packed) dropBlocksLocked(slot uint32, gone lineBits) {
	if gone.IsZero() {
		return
	}
	locs := pk.slotLocs(slot, 0, pk.blocks)
	for b, l := range locs {
		if l != 0 && gone.Has(b) {
			pk.deadLocked(l)
			locs[b] = 0
		}
	}
}

// unpinnedLocked takes, at slot's last unpin, the units that setLocked kept for the I/O that pinned
// it, and the units written for blocks that were not validated.
func (pk *packed) unpinnedLocked(slot uint32) {
	t := pk.t
	pk.dropBlocksLocked(slot, linebits.Range(0, pk.blocks).AndNot(t.valid.Get(slot).AndNot(t.zeroAt(slot))))
}

// releaseSlotLocked takes every unit of a slot being released.
func (pk *packed) releaseSlotLocked(slot uint32) {
	pk.dropBlocksLocked(slot, linebits.Range(0, pk.blocks))
	pk.hot[slot/64] &^= 1 << (slot % 64)
}

// hitLocked marks slot hot: reclaim copies its units rather than drop its line.
func (pk *packed) hitLocked(slot uint32) { pk.hot[slot/64] |= 1 << (slot % 64) }

func (pk *packed) isHotLocked(slot uint32) bool { return pk.hot[slot/64]>>(slot%64)&1 != 0 }

// unitsOf returns the locations of slot's units among the blocks keep, 0 elsewhere: what a record
// of the slot says (nil when none has a unit).
func (pk *packed) unitsOf(slot uint32, keep lineBits) []uint64 {
	var out []uint64
	for b, l := range pk.slotLocs(slot, 0, pk.blocks) {
		if l != 0 && keep.Has(b) {
			if out == nil {
				out = make([]uint64, pk.blocks)
			}
			out[b] = l
		}
	}
	return out
}

// staleUnits reports whether locs (a record's) finds another unit than slot has for a block of
// claimed.
func (pk *packed) staleUnits(slot uint32, claimed lineBits, locs []uint64) bool {
	for b, l := range pk.slotLocs(slot, 0, pk.blocks) {
		if claimed.Has(b) {
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

// locWords: a record carries the location word of each block.
func (pk *packed) locWords() int { return pk.blocks }

// contiguous: a slot is only a number; its blocks are where their units are.
func (pk *packed) contiguous() bool { return false }

// mutable: a block is written over in place as a slot's is when its unit is mutable (inPlace).
func (pk *packed) mutable(slot uint32, b int) bool {
	return pack.IsMutable(pk.slotLocs(slot, b, b+1)[0])
}

// indexBytes: a slot's index has each block's location word and the slot's gen besides.
func (pk *packed) indexBytes(blocks int) int { return packedIndexBytesPerLine(blocks) }

// workBytes: reclaim's lists.
func (pk *packed) workBytes() uint64 { return reclaimBytes() }

// physicalBytesLocked: the bytes of the live units, whatever the blocks they store.
func (pk *packed) physicalBytesLocked(int) uint64 { return uint64(pk.liveBytes) }

func (pk *packed) addStats(s *TierStats) {
	if pk.dd != nil {
		s.DedupeHits, s.DedupeCollisions = pk.dd.shared.Load(), pk.dd.collisions.Load()
	}
}

func (pk *packed) hasDeadLocked() bool { return len(pk.dead) > 0 }

// snapshotLocked takes the dead units for the checkpoint whose snapshot is taken: the units born
// since the last one are in it, no longer fresh.
func (pk *packed) snapshotLocked() []uint64 {
	dead := pk.dead
	pk.dead = nil
	clear(pk.fresh)
	return dead
}

func (pk *packed) keepDeadLocked(dead []uint64) { pk.dead = append(pk.dead, dead...) }
