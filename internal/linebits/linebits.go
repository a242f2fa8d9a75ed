// Package linebits holds bitmaps of blocks and of lines: the bits of one line's blocks (Bits), the
// bits of many equal lines packed (Table), and a set of line numbers that finds the next member
// quickly (Set). They are plain values: the package must never do I/O or take a lock, and its
// users guard them.
package linebits

import (
	"math/bits"
	"slices"
)

// MaxBlocks is the most blocks a line has: 1 MiB lines of 4 KiB blocks.
const MaxBlocks = 256

// Bits holds one bit per block of a line.
type Bits [MaxBlocks / 64]uint64

// Range returns the bits of blocks [b0, b1).
func Range(b0, b1 int) Bits {
	var m Bits
	for b := b0; b < b1; {
		w, o := b/64, b%64
		n := min(64-o, b1-b)
		if n == 64 {
			m[w] = ^uint64(0)
		} else {
			m[w] |= (uint64(1)<<n - 1) << o
		}
		b += n
	}
	return m
}

// And returns the bits set in both m and o.
func (m Bits) And(o Bits) Bits {
	for i := range m {
		m[i] &= o[i]
	}
	return m
}

// Or returns the bits set in m or o.
func (m Bits) Or(o Bits) Bits {
	for i := range m {
		m[i] |= o[i]
	}
	return m
}

// AndNot returns the bits of m not set in o.
func (m Bits) AndNot(o Bits) Bits {
	for i := range m {
		m[i] &^= o[i]
	}
	return m
}

// IsZero reports whether no bit is set.
func (m Bits) IsZero() bool { return m == Bits{} }

// Covers reports whether every bit of o is set in m.
func (m Bits) Covers(o Bits) bool { return o.AndNot(m).IsZero() }

// Has reports whether block b's bit is set.
func (m Bits) Has(b int) bool { return m[b/64]>>(b%64)&1 != 0 }

// Count returns how many bits are set.
func (m Bits) Count() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

// Words returns the bits of a line of blocks blocks as ceil(blocks/64) words, as a store of
// variable-length records keeps them (the inverse of FromWords).
func (m Bits) Words(blocks int) []uint64 {
	w := make([]uint64, (blocks+63)/64)
	copy(w, m[:])
	return w
}

// FromWords returns the bits of words w, as Words gives them.
func FromWords(w []uint64) Bits {
	var m Bits
	copy(m[:], w)
	return m
}

// Runs calls fn for each maximal run [b0, b1) of set bits within [0, blocks).
func (m Bits) Runs(blocks int, fn func(b0, b1 int)) {
	for b := 0; b < blocks; {
		if !m.Has(b) {
			b++
			continue
		}
		e := b + 1
		for e < blocks && m.Has(e) {
			e++
		}
		fn(b, e)
		b = e
	}
}

// Table stores the bits of every slot of a store packed: a line of B blocks takes exactly B bits
// (B is a power of two from 1 to 256), so a store of 64 KiB lines spends 2 bytes a slot per table.
type Table struct {
	words  []uint64
	blocks int // bits per slot
}

// NewTable returns a table of slots lines of blocks blocks each, all bits clear.
func NewTable(slots, blocks int) Table {
	return Table{words: make([]uint64, (slots*blocks+63)/64), blocks: blocks}
}

// IsNil reports whether t was never made by NewTable: its user keeps no such bits.
func (t *Table) IsNil() bool { return t.words == nil }

// Clone returns a copy of t that shares nothing with it.
func (t *Table) Clone() Table { return Table{words: slices.Clone(t.words), blocks: t.blocks} }

// Get returns the bits of slot.
func (t *Table) Get(slot uint32) Bits {
	var m Bits
	if t.blocks >= 64 {
		copy(m[:t.blocks/64], t.words[int(slot)*t.blocks/64:])
		return m
	}
	bit := int(slot) * t.blocks
	m[0] = t.words[bit/64] >> (bit % 64) & (uint64(1)<<t.blocks - 1)
	return m
}

// Set stores m as the bits of slot; bits past the table's blocks are ignored.
func (t *Table) Set(slot uint32, m Bits) {
	if t.blocks >= 64 {
		copy(t.words[int(slot)*t.blocks/64:], m[:t.blocks/64])
		return
	}
	bit := int(slot) * t.blocks
	mask := (uint64(1)<<t.blocks - 1) << (bit % 64)
	t.words[bit/64] = t.words[bit/64]&^mask | m[0]<<(bit%64)&mask
}

// Set is a set of line numbers below a bound, as a bitmap with a summary level, so that its user
// (the destager, for dirty lines) finds the next line after a position in address order quickly:
// one bit per line of the device (a 16 TiB device of 64 KiB lines takes 32 MiB), one summary bit
// per 64 lines.
type Set struct {
	bits, summary []uint64
}

// NewSet returns an empty set of the lines below n.
func NewSet(n uint64) Set {
	words := (n + 63) / 64
	return Set{bits: make([]uint64, words), summary: make([]uint64, (words+63)/64)}
}

// Add puts line in the set.
func (s *Set) Add(line uint64) {
	s.bits[line/64] |= 1 << (line % 64)
	s.summary[line/4096] |= 1 << (line / 64 % 64)
}

// Remove takes line out of the set.
func (s *Set) Remove(line uint64) {
	w := line / 64
	if s.bits[w] &^= 1 << (line % 64); s.bits[w] == 0 {
		s.summary[w/64] &^= 1 << (w % 64)
	}
}

// Next returns the first line in the set at or after from.
func (s *Set) Next(from uint64) (uint64, bool) {
	w := from / 64
	if w >= uint64(len(s.bits)) {
		return 0, false
	}
	if b := s.bits[w] >> (from % 64); b != 0 {
		return from + uint64(bits.TrailingZeros64(b)), true
	}
	// The next non-empty word, through the summary.
	w++
	for sw := w / 64; sw < uint64(len(s.summary)); sw++ {
		m := s.summary[sw]
		if sw == w/64 {
			m &^= 1<<(w%64) - 1
		}
		if m != 0 {
			word := sw*64 + uint64(bits.TrailingZeros64(m))
			return word*64 + uint64(bits.TrailingZeros64(s.bits[word])), true
		}
	}
	return 0, false
}
