package cache

import (
	"errors"
	"fmt"

	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
)

// The segment allocator of the packed layout (pack.go): units are appended to the open segment,
// and a segment is free again once all its units are released. Its state is guarded by packed.mu.

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

// askReclaim asks the journal's loop for reclaim (a tier without a journal has none: the tests').
func (pk *packed) askReclaim() {
	if j := pk.t.j; j != nil {
		j.askCheckpoint()
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

// releaseUnits frees the room of units no record finds any more, once reads that found them are done.
func (pk *packed) releaseUnits(units []uint64) {
	if len(units) == 0 {
		return
	}
	pk.io.Lock()
	pk.mu.Lock()
	for _, l := range units {
		pk.releaseLocked(pack.Off(l), pack.Len(l))
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

// probe writes a block to free room, not to slot (slots are not places on a packed tier), and
// reads it back.
func (pk *packed) probe(_ uint32, w, r []byte) error {
	var off [1]int64
	if err := pk.alloc([]int{len(w)}, off[:], true); err != nil {
		return errors.New("probe of the SSD tier: no free room to write to")
	}
	defer pk.releaseUnits([]uint64{pack.Loc(off[0], len(w), pack.Raw)})
	if _, err := pk.dev.WriteAt(w, off[0]); err != nil {
		return fmt.Errorf("probe write to the SSD tier: %w", err)
	}
	if _, err := pk.dev.ReadAt(r, off[0]); err != nil {
		return fmt.Errorf("probe read from the SSD tier: %w", err)
	}
	return nil
}

// claimUnits checks the unit locations of record r (a restart's load) and claims its units. A live
// record's are copied into its slot's locations; the units of a record the run log replaced die at
// the first checkpoint.
func (pk *packed) claimUnits(r meta.Line, live bool) error {
	stored := linebits.FromWords(r.Valid).AndNot(linebits.FromWords(r.Zero))
	if !stored.IsZero() && len(r.Loc) != pk.blocks {
		return fmt.Errorf("line %d: %d unit locations for a line of %d blocks", r.Line, len(r.Loc), pk.blocks)
	}
	if pk.claimed == nil {
		pk.claimed = map[uint64]bool{}
	}
	for b, loc := range r.Loc {
		if (loc != 0) != stored.Has(b) {
			return fmt.Errorf("line %d: block %d has a unit location %#x that its valid and zero bits do not allow", r.Line, b, loc)
		}
		if loc == 0 {
			continue
		}
		if pk.claimed[loc] {
			// Claimed before: by a live record (they all come first), which shares it with
			// this one (dedupe) if this one is live too.
			if live {
				pk.shareLocked(loc)
			}
			continue
		}
		if !pk.claim(loc) {
			return fmt.Errorf("line %d: block %d's unit %#x is outside the SSD tier", r.Line, b, loc)
		}
		pk.claimed[loc] = true
		if live {
			pk.bornLocked(loc)
		} else { // a record the run log replaced: its units die at the first checkpoint
			pk.dead = append(pk.dead, loc)
		}
	}
	if live {
		copy(pk.slotLocs(r.Slot, 0, pk.blocks), r.Loc)
	}
	return nil
}

// claim counts unit l as live (a restart's load): false if it is out of the device's range.
func (pk *packed) claim(l uint64) bool {
	s := pack.Off(l) / pk.segSize
	if l == 0 || s >= int64(len(pk.used)) || pack.Off(l)%pk.segSize+int64(pack.Len(l)) > pk.segSize ||
		pack.Len(l) > blockSize || pack.Codec(l) > pack.S2 ||
		pack.IsMutable(l) && (pack.Codec(l) != pack.Raw || pack.Len(l) != blockSize) {
		return false
	}
	pk.used[s] += int64(pack.Len(l))
	return true
}

// loadedLocked ends a restart's load: it claims the units of the store's records that the run log
// replaced (replaced), which they keep until the checkpoint that the load runs first has committed
// the log's records, and makes the segments with no unit claimed free.
func (pk *packed) loadedLocked(replaced map[uint64]meta.Op) error {
	for _, op := range replaced {
		if op.Delete {
			continue
		}
		if err := pk.claimUnits(op.Rec, false); err != nil {
			return err
		}
	}
	pk.claimed = nil
	clear(pk.fresh) // the units records found: none is fresh
	pk.free = pk.free[:0]
	for s := len(pk.used) - 1; s >= 0; s-- {
		if pk.used[s] == 0 {
			pk.free = append(pk.free, int32(s))
		}
	}
	return nil
}
