package cache

import (
	"math/bits"

	"github.com/tierblk/tierblk/internal/fetch"
)

// blockSize is the unit of the valid and dirty bits: a write that covers whole 4 KiB blocks never
// needs a read from the backend.
const blockSize = fetch.BlockSize

// maxBlocks is the most blocks a line has: 1 MiB lines.
const maxBlocks = (1 << 20) / blockSize

// lineBits holds one bit per block of a line.
type lineBits [maxBlocks / 64]uint64

// rangeBits returns the bits of blocks [b0, b1).
func rangeBits(b0, b1 int) lineBits {
	var m lineBits
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

func (m lineBits) and(o lineBits) lineBits {
	for i := range m {
		m[i] &= o[i]
	}
	return m
}

func (m lineBits) or(o lineBits) lineBits {
	for i := range m {
		m[i] |= o[i]
	}
	return m
}

func (m lineBits) andNot(o lineBits) lineBits {
	for i := range m {
		m[i] &^= o[i]
	}
	return m
}

func (m lineBits) isZero() bool { return m == lineBits{} }

// covers reports whether every bit of o is set in m.
func (m lineBits) covers(o lineBits) bool { return o.andNot(m).isZero() }

func (m lineBits) has(b int) bool { return m[b/64]>>(b%64)&1 != 0 }

func (m lineBits) count() int {
	n := 0
	for _, w := range m {
		n += bits.OnesCount64(w)
	}
	return n
}

// words returns the bits as the meta package stores them: ceil(blocks/64) words.
func (m lineBits) words(blocks int) []uint64 {
	w := make([]uint64, (blocks+63)/64)
	copy(w, m[:])
	return w
}

func bitsFromWords(w []uint64) lineBits {
	var m lineBits
	copy(m[:], w)
	return m
}

// runs calls fn for each maximal run [b0, b1) of set bits within [0, blocks).
func (m lineBits) runs(blocks int, fn func(b0, b1 int)) {
	for b := 0; b < blocks; {
		if !m.has(b) {
			b++
			continue
		}
		e := b + 1
		for e < blocks && m.has(e) {
			e++
		}
		fn(b, e)
		b = e
	}
}

// bitTable stores the bits of every slot of a tier packed: a line of B blocks takes exactly B bits
// (B is a power of two from 1 to 256), so a tier of 64 KiB lines spends 2 bytes a slot per table.
type bitTable struct {
	words  []uint64
	blocks int // bits per slot
}

func newBitTable(slots, blocks int) bitTable {
	return bitTable{words: make([]uint64, (slots*blocks+63)/64), blocks: blocks}
}

func (t *bitTable) get(slot uint32) lineBits {
	var m lineBits
	if t.blocks >= 64 {
		copy(m[:t.blocks/64], t.words[int(slot)*t.blocks/64:])
		return m
	}
	bit := int(slot) * t.blocks
	m[0] = t.words[bit/64] >> (bit % 64) & (uint64(1)<<t.blocks - 1)
	return m
}

func (t *bitTable) set(slot uint32, m lineBits) {
	if t.blocks >= 64 {
		copy(t.words[int(slot)*t.blocks/64:], m[:t.blocks/64])
		return
	}
	bit := int(slot) * t.blocks
	mask := (uint64(1)<<t.blocks - 1) << (bit % 64)
	t.words[bit/64] = t.words[bit/64]&^mask | m[0]<<(bit%64)&mask
}

// lineSet is a set of line numbers below a bound, as a bitmap with a summary level, so that the
// destager finds the next dirty line after a position in address order quickly: one bit per line
// of the backend (a 16 TiB backend of 64 KiB lines takes 32 MiB), one summary bit per 64 lines.
type lineSet struct {
	bits, summary []uint64
}

func newLineSet(n uint64) lineSet {
	words := (n + 63) / 64
	return lineSet{bits: make([]uint64, words), summary: make([]uint64, (words+63)/64)}
}

func (s *lineSet) add(line uint64) {
	s.bits[line/64] |= 1 << (line % 64)
	s.summary[line/4096] |= 1 << (line / 64 % 64)
}

func (s *lineSet) remove(line uint64) {
	w := line / 64
	if s.bits[w] &^= 1 << (line % 64); s.bits[w] == 0 {
		s.summary[w/64] &^= 1 << (w % 64)
	}
}

// next returns the first line in the set at or after from.
func (s *lineSet) next(from uint64) (uint64, bool) {
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
