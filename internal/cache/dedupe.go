package cache

import (
	"bytes"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/cache/pack"
)

// Dedupe on the packed layout (reduction: dedupe). A block written or filled with the bytes of a
// unit the tier holds is not stored again: its location word is the other block's, and the unit
// counts one more reference (packed.refs). The tier finds such units through a table of content
// hashes of the units it stored most recently; a hash only names a candidate, whose bytes are read
// and compared with the block before it is shared, so that a collision costs a read and stores the
// block as its own unit, never serving another block's data (TestDedupeForcedCollision).
//
// A unit dies when its last reference does, and only then is it dead as packed.dead means: its room
// is released after the checkpoint that follows, which commits every record that stopped pointing
// at it (each stopped before the last one did). A restart counts the references from the records
// (journal.load). The table is not persisted: after a restart it fills again with what is written.
//
// The table must never name a unit that is not live: a unit leaves it when it dies (deadLocked),
// and a write that takes a candidate holds a reference to it until the block is placed or turned
// down, so the room it compares with cannot be released meanwhile.

// dedupeMaxEntries bounds the table, whatever the tier's size, at the RAM per entry
// TestDedupeTableBytesPerEntry measures. A tier that holds more units remembers the ones stored
// last (a full table forgets an entry at random).
const dedupeMaxEntries = 1 << 22

// dedupe is a tier's dedupe: the table (pack.Dedupe, guarded by the tier's mu), and what it
// counted for the tier's stats.
type dedupe struct {
	*pack.Dedupe
	shared     atomic.Uint64 // blocks stored as another reference to a unit
	collisions atomic.Uint64 // candidates whose bytes were not the block's
}

func newDedupe(max int) *dedupe { return &dedupe{Dedupe: pack.NewDedupe(max)} }

// dedupeCandidate returns a live unit of the tier that holds the bytes of block src (a whole
// block) with hash h, with a reference taken for the caller, or 0 when there is none. The caller
// either places the unit in a slot's locations or lets go of the reference with deadLocked.
func (pk *packed) dedupeCandidate(src []byte, h uint64, scratch []byte) uint64 {
	t := pk.t
	t.mu.Lock()
	l := pk.dd.Lookup(h)
	if l != 0 {
		pk.shareLocked(l)
	}
	t.mu.Unlock()
	if l == 0 {
		return 0
	}
	// The reference keeps the unit's room from being released: no lock is needed to read it.
	same := false
	err := pk.readUnits([]uint64{l}, false, func(_ int, unit []byte) error {
		if err := pack.Decode(scratch, unit, l); err != nil {
			return err
		}
		same = bytes.Equal(scratch, src)
		return nil
	})
	if err == nil && same {
		pk.dd.shared.Add(1)
		return l
	}
	if err == nil {
		pk.dd.collisions.Add(1)
	}
	t.mu.Lock()
	pk.deadLocked(l)
	t.mu.Unlock()
	return 0
}
