// Package pack holds the parts of the SSD tier's packed layout (internal/cache, pack.go) that need
// nothing of the tier: the location words that say where a block's unit is, the codec that makes a
// unit of a block and a block of a unit, and dedupe's table of content hashes.
//
// It is leaves only. It must never do I/O, take a lock, or decide whether a unit is live: the cache
// owns the device, the slots, the journal and the lives of units (their references, and the
// checkpoint after which a dead unit's room is released), and it guards what it keeps here with
// its own locks. What pack decides stays decided the same way for the life of a tier: a location
// word's bits and a unit's encoding are on the device and in the journal's records.
package pack

import "github.com/tierblk/tierblk/internal/fetch"

// blockSize is the tier's block: the most bytes a unit holds once decoded.
const blockSize = fetch.BlockSize

// Location words: the unit's byte offset on the device, its codec, whether it is mutable (written
// in place, see the cache's inPlace) and its length (1 to 4096). A unit keeps its word for its
// life: the word names it (the cache's refs, fresh, dead, and Dedupe). Words are stored in the
// journal's records, so the layout of their bits never changes.
const (
	lenMask    = 1<<16 - 1
	codecShift = 16
	// Mutable is the bit of a unit born for a rewrite of a dirty block, which later rewrites of
	// the block may write over in place.
	Mutable  = 1 << 19
	offShift = 20
)

// The codecs of units.
const (
	Raw = 0 // the block as it is
	S2  = 1 // the block compressed with S2
)

// Loc is the location word of a unit of n bytes at off on the device, stored with codec.
func Loc(off int64, n, codec int) uint64 {
	return uint64(off)<<offShift | uint64(codec)<<codecShift | uint64(n)
}

// Off is the device offset of unit l.
func Off(l uint64) int64 { return int64(l >> offShift) }

// Len is the length of unit l in bytes.
func Len(l uint64) int { return int(l & lenMask) }

// Codec is the codec of unit l (Raw or S2).
func Codec(l uint64) int { return int(l >> codecShift & 0x7) }

// IsMutable reports whether unit l may be written over in place (Mutable).
func IsMutable(l uint64) bool { return l&Mutable != 0 }
