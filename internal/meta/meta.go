// Package meta is the persistent metadata of the cache's SSD tier: a superblock that says which
// backend and layout the tier belongs to, and one record per cached line (its slot on the SSD, its
// per-4 KiB valid and dirty bits, and where needed the blocks' locations and checksums), and, in
// write back in FLUSH order, the ghosts: older versions of dirty blocks that writes replaced
// before the backend had them.
//
// The engine keeps its working state in memory and writes records here so that a restart finds the
// tier warm and a crash never makes it trust data that might be stale. Store implementations must
// never reorder commits: a record committed after another is never visible without it.
package meta

import (
	"errors"
	"fmt"
)

// FormatVersion is the on-disk layout version this binary writes and accepts.
const FormatVersion = 1

// Superblock identifies what an SSD tier caches. A cache whose superblock does not match the
// configured backend and layout must be refused, never silently reused.
type Superblock struct {
	Version     uint32 `json:"version"`
	LineSize    uint32 `json:"line_size"`
	Backend     string `json:"backend"`      // the backend's identity (its URL)
	BackendSize int64  `json:"backend_size"` // bytes
	Slots       uint32 `json:"slots"`        // lines the SSD tier holds
	// ID names this SSD tier, random, from its creation on; Epoch counts the runs that opened it.
	// Together they say which run wrote a run log (internal/runlog), so that a log is replayed
	// only on the store it was written beside, before any other run changed the store. Neither
	// is compared by Mismatch.
	ID    string `json:"id,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
	// Layout is how the tier stores a line's blocks on the SSD: "" in a slot of its own, at the
	// block's offset in it; LayoutPacked compressed, wherever Line.Loc says. Neither layout can
	// read the other's data.
	Layout string `json:"layout,omitempty"`
	// Lost are the byte ranges of the backend whose dirty data the SSD tier damaged before it was
	// written back: reads of them fail until they are written again. Sorted, apart.
	Lost []Range `json:"lost,omitempty"`
	// Open is set while a run has the tier open, and cleared when it closes the tier after its
	// last checkpoint: a start that finds it set follows a stop that was not a close (a kill, a
	// power cut), whose last writes in place the records may not have the checksums of.
	Open bool `json:"open,omitempty"`
}

// Range is a byte range of the backend.
type Range struct {
	Off int64 `json:"offset"`
	Len int64 `json:"length"`
}

// LayoutPacked is the Superblock.Layout of a tier whose lines' blocks are stored compressed in
// log-structured segments, each found through its Line.Loc word.
const LayoutPacked = "packed"

// layoutName names a layout by the data reduction settings that choose it, which is what a user
// configures.
func layoutName(layout string) string {
	switch layout {
	case "":
		return "slots (reduction off or zero)"
	case LayoutPacked:
		return "packed (reduction compress or dedupe)"
	}
	return fmt.Sprintf("%q", layout)
}

// Mismatch describes how a stored superblock differs from want, or returns nil when they match.
func (sb Superblock) Mismatch(want Superblock) error {
	var errs []error
	if sb.Version != want.Version {
		errs = append(errs, fmt.Errorf("format version %d, this tierblk writes %d", sb.Version, want.Version))
	}
	if sb.LineSize != want.LineSize {
		errs = append(errs, fmt.Errorf("line size %d, configured %d", sb.LineSize, want.LineSize))
	}
	if sb.Backend != want.Backend {
		errs = append(errs, fmt.Errorf("backend %q, configured %q", sb.Backend, want.Backend))
	}
	if sb.BackendSize != want.BackendSize {
		errs = append(errs, fmt.Errorf("backend size %d, now %d", sb.BackendSize, want.BackendSize))
	}
	if sb.Slots != want.Slots {
		errs = append(errs, fmt.Errorf("%d lines, configured %d", sb.Slots, want.Slots))
	}
	if sb.Layout != want.Layout {
		errs = append(errs, fmt.Errorf("SSD tier layout %s, configured %s", layoutName(sb.Layout), layoutName(want.Layout)))
	}
	return errors.Join(errs...)
}

// Line is the record of one line held on the SSD tier. Bitmaps have one bit per 4 KiB block of the
// line, block i at Valid[i/64] bit i%64; Dirty is a subset of Valid. Zero, also a subset of Valid,
// marks the blocks that hold zeros: they were never written to the slot (data reduction), and
// read back as zeros whatever the slot holds there.
//
// Loc is nil in the slot layout. In the packed layout (Superblock.Layout) it has one word per
// block of the line, saying where the block's bytes are on the SSD; the word's meaning is the
// cache's, except that 0 means no bytes are stored: Loc[i] != 0 exactly for the blocks that are
// valid and not zero.
//
// Sum has one CRC32C (Castagnoli) checksum per block of the line, Sum[i] that of block i's bytes
// as stored on the SSD tier (after any compression), so that a read can tell a block the SSD
// damaged from the data it was given. It is meaningful only for the blocks that are valid and not
// zero, and 0 for every other block. It is nil in a record without checksums: one written by a
// tierblk from before them, or one that stores no block.
//
// Epoch has, in write-back in FLUSH order, one word per block of the line: for a dirty block, the
// epoch (the writes between two FLUSHes) it was dirtied in, which the next run writes it back in
// the order of; 0 for every other block. It is nil in address order, and in a record without
// dirty blocks.
type Line struct {
	Line  uint64   `json:"line"` // line number: byte offset / line size
	Slot  uint32   `json:"slot"`
	Valid []uint64 `json:"valid"`
	Dirty []uint64 `json:"dirty,omitempty"`
	Zero  []uint64 `json:"zero,omitempty"`
	Loc   []uint64 `json:"loc,omitempty"`
	Sum   []uint32 `json:"sum,omitempty"`
	Epoch []uint64 `json:"epoch,omitempty"`
}

// Ghost is the older version of one block of a line that a write replaced while the epoch the
// block was dirty in was not yet written back (write back in FLUSH order): the backend still
// needs it. Keyed by (Epoch, Line, Block).
//
// A ghost lives in a keyspace of its own, beside the line records: Lines never returns one, and
// Ghosts returns nothing else. The store checks nothing of a ghost but the length of its data.
type Ghost struct {
	Line  uint64
	Block uint32 // the block's index within the line
	Epoch uint64
	Sum   uint32 // the block's checksum, the cache's own (the store keeps it, never checks it)
	Data  []byte // the block's bytes, 1 to MaxGhostData of them; nil or empty: a zero block
}

// MaxGhostData is the most bytes of data a ghost holds: a block.
const MaxGhostData = 4096

// Op is one change in a commit: Put stores (or replaces) the record of Rec.Line, Delete drops it.
//
// An op with Ghost set is a ghost op instead, and Rec is ignored: it stores (or replaces) the
// ghost of *Ghost's (Epoch, Line, Block), or with Delete drops the ghost of that key (Sum and
// Data ignored; dropping one that is not there does nothing). Ghost ops mix freely with line ops
// in a commit, applied atomically and in order with them; they count as ops towards a store's
// limit (ErrTooBig), and a ghost's bytes count in the free space a commit needs.
type Op struct {
	Delete bool
	Rec    Line
	Ghost  *Ghost
	// Invalidates marks an op that only takes back what the stored record claims (fewer valid
	// blocks, or none): a commit of such ops alone may use the room a store keeps for them when
	// others may not (Badger: it commits them down to ReserveFree), so that writes, which must
	// invalidate before they change the backend, go on after a full disk has stopped the rest.
	// A ghost delete may carry it too; a ghost put, which stores data, never counts as one,
	// whatever it says.
	Invalidates bool
}

// Store holds the metadata. Its methods are safe for concurrent use; after Close they return
// ErrClosed. Mem and Badger implement it.
type Store interface {
	// Superblock returns the stored superblock; ok is false for a new, empty store.
	Superblock() (sb Superblock, ok bool, err error)
	// SetSuperblock stores sb durably (synced) before it returns.
	SetSuperblock(sb Superblock) error
	// Commit applies ops atomically, in order. Concurrent commits are grouped so that many callers
	// share one write (and, with sync, one sync). Without sync the commit survives a crash of the
	// process (kill -9) when Commit returns; with sync it also survives power loss. A commit with a
	// record whose dirty or zero bits are not all valid, whose location words are not set
	// exactly for its valid blocks that are not zero, or that has a checksum for a block that is
	// not valid or is a zero block, is rejected whole; so is a commit with a ghost put whose Data
	// is longer than MaxGhostData. Ghost ops (Op.Ghost) are committed with the line ops, in the
	// same order, grouping and sync; after a crash, a commit's ghost ops are there exactly when
	// its line ops are.
	Commit(ops []Op, sync bool) error
	// Sync makes every commit that returned before the call survive power loss.
	Sync() error
	// Lines calls fn for every stored line record, in line order, stopping at fn's first error,
	// which it returns as is. Empty bitmaps, and an empty Loc or Sum, read back as nil. Records
	// are read from a snapshot taken when Lines starts; fn may Commit, but must not Close the
	// store.
	Lines(fn func(Line) error) error
	// Ghosts calls fn for every stored ghost, in (Epoch, Line, Block) order, stopping at fn's
	// first error, which it returns as is. A zero block's Data reads back as nil, and Data never
	// shares memory with the store. Ghosts are read from a snapshot taken when Ghosts starts; fn
	// may Commit, but must not Close the store.
	Ghosts(fn func(Ghost) error) error
	// Close releases the store; commits that returned stay committed.
	Close() error
}
