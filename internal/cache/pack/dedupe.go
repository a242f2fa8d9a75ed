package pack

import "hash/maphash"

// Dedupe is the table of content hashes of a packed tier with reduction dedupe: it names, for a
// hash, a live unit that may hold a block's bytes. A hash only names a candidate: the cache reads
// and compares its bytes before it shares the unit, so that a collision costs a read, never
// another block's data.
//
// The table must never name a unit that is not live: the cache takes a unit out when it dies
// (Forget) and points it at reclaim's copy of one (Moved). It is not persisted, so its hashes need
// not be stable across processes.
//
// A Dedupe is not safe for concurrent use: the cache guards it with the tier's mu.
type Dedupe struct {
	byHash map[uint64]uint64 // content hash → location word of a live unit with those bytes
	byUnit map[uint64]uint64 // the other way, so that a unit that dies leaves the table
	max    int
	Hash   func([]byte) uint64 // the content hash of a block: blockHash, or a test's, to force collisions
}

// NewDedupe returns an empty table of at most max entries. A full table forgets an entry at random
// for each new one, so that it remembers the units stored last.
func NewDedupe(max int) *Dedupe {
	return &Dedupe{byHash: map[uint64]uint64{}, byUnit: map[uint64]uint64{}, max: max, Hash: blockHash}
}

// blockHash is the content hash of a 4 KiB block.
func blockHash(b []byte) uint64 { return maphash.Bytes(hashSeed, b) }

// hashSeed is per process: the table is never persisted, so its hashes need not be stable.
var hashSeed = maphash.MakeSeed()

// Lookup returns a live unit whose bytes may be those of a block with hash h, or 0.
func (d *Dedupe) Lookup(h uint64) uint64 { return d.byHash[h] }

// Remember notes that the new unit l holds bytes with hash h, unless the table names a unit for h
// already (the older one is as good, and other blocks share it).
func (d *Dedupe) Remember(h, l uint64) {
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

// Forget takes unit l, which died, out of the table.
func (d *Dedupe) Forget(l uint64) {
	if h, ok := d.byUnit[l]; ok {
		delete(d.byUnit, l)
		delete(d.byHash, h)
	}
}

// Moved points the table at unit nl, reclaim's copy of unit l.
func (d *Dedupe) Moved(l, nl uint64) {
	if h, ok := d.byUnit[l]; ok {
		delete(d.byUnit, l)
		d.byHash[h] = nl
		d.byUnit[nl] = h
	}
}
