package cache

import "math/bits"

// blockSize is the unit of the valid and dirty bits: a write that covers whole 4 KiB blocks never
// needs a read from the backend.
const blockSize = 4096

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
