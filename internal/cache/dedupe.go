package cache

import (
	"bytes"
	"hash/maphash"
	"sync/atomic"
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
// The table must never name a unit that is not live: a unit leaves it when it dies (forget), and a
// write that takes a candidate holds a reference to it until the block is placed or turned down, so
// the room it compares with cannot be released meanwhile.

// dedupeMaxEntries bounds the table: about 16 GiB of unique 4 KiB blocks, at the RAM per entry
// TestDedupeTableBytesPerEntry measures. A tier that holds more units remembers the ones stored
// last (a full table forgets an entry at random).
const dedupeMaxEntries = 1 << 22

// blockHash is the content hash of a 4 KiB block.
func blockHash(b []byte) uint64 { return maphash.Bytes(hashSeed, b) }

// hashSeed is per process: the table is never persisted, so its hashes need not be stable.
var hashSeed = maphash.MakeSeed()

// dedupe is the table of a packed tier with reduction dedupe, guarded by the tier's mu.
type dedupe struct {
	byHash map[uint64]uint64 // content hash → location word of a live unit with those bytes
	byUnit map[uint64]uint64 // the other way, so that a unit that dies leaves the table
	max    int
	hash   func([]byte) uint64 // blockHash, or a test's, to force collisions

	shared     atomic.Uint64 // blocks stored as another reference to a unit
	collisions atomic.Uint64 // candidates whose bytes were not the block's
}

func newDedupe(max int) *dedupe {
	return &dedupe{byHash: map[uint64]uint64{}, byUnit: map[uint64]uint64{}, max: max, hash: blockHash}
}

// lookupLocked returns a live unit whose bytes may be those of a block with hash h, or 0.
func (d *dedupe) lookupLocked(h uint64) uint64 { return d.byHash[h] }

// rememberLocked notes that the new unit l holds bytes with hash h, unless the table names a unit
// for h already (the older one is as good, and other blocks share it).
func (d *dedupe) rememberLocked(h, l uint64) {
	if _, ok := d.byHash[h]; ok {
		return
	}
	if len(d.byHash) >= d.max {
		for oh, ol := range d.byHash { // map order: an entry at random
			delete(d.byHash, oh)
			delete(d.byUnit, ol)
			break
		}
	}
	d.byHash[h] = l
	d.byUnit[l] = h
}

// forgetLocked takes unit l, which died, out of the table.
func (d *dedupe) forgetLocked(l uint64) {
	if h, ok := d.byUnit[l]; ok {
		delete(d.byUnit, l)
		delete(d.byHash, h)
	}
}

// movedLocked points the table at unit nl, reclaim's copy of unit l.
func (d *dedupe) movedLocked(l, nl uint64) {
	if h, ok := d.byUnit[l]; ok {
		delete(d.byUnit, l)
		d.byHash[h] = nl
		d.byUnit[nl] = h
	}
}

// dedupeCandidate returns a live unit of the tier that holds the bytes of block src (a whole
// block) with hash h, with a reference taken for the caller, or 0 when there is none. The caller
// either places the unit in a slot's locations or lets go of the reference with deadLocked.
func (t *tier) dedupeCandidate(src []byte, h uint64, scratch []byte) uint64 {
	pk := t.pk
	t.mu.Lock()
	l := pk.dd.lookupLocked(h)
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
		if err := decodeUnit(scratch, unit, l); err != nil {
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
