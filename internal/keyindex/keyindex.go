// Package keyindex is a compact hash index from 64-bit keys to non-negative int32 values, shared by
// the eviction policies (key to node) and the cache engine (line to slot), where it is most of the
// RAM a cached line costs. It is not safe for concurrent use and never allocates per lookup.
package keyindex

import "iter"

// Index maps keys to values (node or slot numbers, at least 0). It is an open-addressing hash table with linear probing and
// backward-shift deletion (no tombstones, so a replay of millions of inserts and deletes never
// degrades it). Against a Go map it saves a third of the time of an access (BenchmarkEviction): a
// lookup mostly reads one cache line, which holds the key, so a hit need not read the node.
//
// A slot is 12 bytes: the key, as two 32-bit halves so that the slot is aligned to 4 bytes, and the
// node's index. A lazy table is a power of two, kept at most half full; a preallocated one is sized
// to be at most four fifths full at the hint, any length. The home slot is the top 32 bits of the
// key's Fibonacci hash scaled to the length (Lemire's fastrange), which for a power of two is the
// hash's top bits, as Fibonacci hashing takes them.
type Index struct {
	slots []slot
	n     int
	limit int  // the most entries before the table grows
	dense bool // preallocated: four fifths full at most, else half
}

type slot struct {
	lo, hi uint32 // the key
	node   uint32 // the node's index + 1; 0 marks an empty slot
}

func (s *slot) key() uint64 { return uint64(s.hi)<<32 | uint64(s.lo) }

// minSlots keeps the smallest table with room to probe.
const minSlots = 8

// New returns an index for about hint keys. With prealloc the table is sized once for hint keys
// (four fifths full); without, it starts small and doubles as keys arrive.
func New(hint int, prealloc bool) Index {
	if prealloc {
		// ceil(5 hint / 4) slots hold hint entries at four fifths full.
		return makeIndex(max((5*hint+3)/4, minSlots), true)
	}
	size := minSlots
	for size < 2*hint {
		size *= 2
	}
	return makeIndex(size, false)
}

func makeIndex(size int, dense bool) Index {
	limit := size / 2
	if dense {
		limit = size * 4 / 5
	}
	return Index{slots: make([]slot, size), limit: limit, dense: dense}
}

// home is k's preferred slot: the top half of k times 2^64/φ, which spreads the runs of consecutive
// block numbers that traces are made of, scaled to the table's length.
func (x *Index) home(k uint64) int {
	h := k * 0x9E3779B97F4A7C15 >> 32
	return int(h * uint64(len(x.slots)) >> 32)
}

// next is the slot after i, wrapping at the end of the table.
func (x *Index) next(i int) int {
	if i++; i == len(x.slots) {
		return 0
	}
	return i
}

// Get returns the value of k; ok is false (and the value -1) if k is absent.
func (x *Index) Get(k uint64) (v int32, ok bool) {
	for i := x.home(k); ; i = x.next(i) {
		s := &x.slots[i]
		if s.node == 0 {
			return -1, false
		}
		if s.key() == k {
			return int32(s.node - 1), true
		}
	}
}

// Put adds k with value v >= 0; k must be absent.
func (x *Index) Put(k uint64, v int32) {
	if x.n >= x.limit {
		x.grow()
	}
	i := x.home(k)
	for x.slots[i].node != 0 {
		i = x.next(i)
	}
	x.slots[i] = slot{lo: uint32(k), hi: uint32(k >> 32), node: uint32(v) + 1}
	x.n++
}

// grow doubles the table, keeping its maximum load.
func (x *Index) grow() {
	old := x.slots
	*x = makeIndex(2*len(old), x.dense)
	for i := range old {
		if s := &old[i]; s.node != 0 {
			x.Put(s.key(), int32(s.node-1))
		}
	}
}

// Delete removes k, which must be present, and shifts back the entries of its probe run that
// the empty slot would otherwise cut off from their home.
func (x *Index) Delete(k uint64) {
	i := x.home(k)
	for x.slots[i].node == 0 || x.slots[i].key() != k {
		i = x.next(i)
	}
	for j := x.next(i); x.slots[j].node != 0; j = x.next(j) {
		// The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
		if x.distance(x.home(x.slots[j].key()), j) >= x.distance(i, j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = slot{}
	x.n--
}

// Len is the number of keys.
func (x *Index) Len() int { return x.n }

// distance is how many steps of next lead from slot from to slot to.
func (x *Index) distance(from, to int) int {
	if d := to - from; d >= 0 {
		return d
	}
	return to - from + len(x.slots)
}

// All yields every key and its value, in table order. The index must not change meanwhile.
func (x *Index) All() iter.Seq2[uint64, int32] {
	return func(yield func(uint64, int32) bool) {
		for i := range x.slots {
			if s := &x.slots[i]; s.node != 0 && !yield(s.key(), int32(s.node-1)) {
				return
			}
		}
	}
}
