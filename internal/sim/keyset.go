package sim

import (
	"math/bits"

	"github.com/tierblk/tierblk/internal/policy"
)

// keySet counts distinct keys. It is an open-addressing hash set because counting the distinct keys
// of a multi-million-request trace with a Go map took most of the time of loading it.
type keySet struct {
	slots   []policy.Key // 0 marks an empty slot; key 0 itself is kept in hasZero
	shift   uint
	n       int
	hasZero bool
}

func newKeySet() *keySet {
	const initial = 1 << 10
	return &keySet{slots: make([]policy.Key, initial), shift: uint(64 - bits.TrailingZeros(initial))}
}

// add inserts k.
func (s *keySet) add(k policy.Key) {
	if k == 0 {
		if !s.hasZero {
			s.hasZero = true
			s.n++
		}
		return
	}
	if s.insert(k) {
		s.n++
		if s.n*2 > len(s.slots) {
			s.grow()
		}
	}
}

// insert places k by linear probing from its Fibonacci hash and reports whether it was new.
func (s *keySet) insert(k policy.Key) bool {
	mask := len(s.slots) - 1
	for i := int((uint64(k) * 0x9E3779B97F4A7C15) >> s.shift); ; i = (i + 1) & mask {
		switch s.slots[i] {
		case 0:
			s.slots[i] = k
			return true
		case k:
			return false
		}
	}
}

func (s *keySet) grow() {
	old := s.slots
	s.slots = make([]policy.Key, 2*len(old))
	s.shift--
	for _, k := range old {
		if k != 0 {
			s.insert(k)
		}
	}
}

func (s *keySet) len() int { return s.n }
