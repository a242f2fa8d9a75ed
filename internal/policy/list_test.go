package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestIndexAgainstMap checks an arena's index against a Go map on random allocs and releases, in
// lazy (power-of-two) and preallocated (any length) tables that start small and grow. The keys
// include ones whose hashes collide (the same home at any length) and ones whose homes are the
// first or the last slot, so that probe runs wrap around the table's end and
// backward-shift deletion has entries to move and to leave.
func TestIndexAgainstMap(t *testing.T) {
	keys := []Key{0, 1, 2, 3, 5, 8, ^Key(0)}
	for _, h := range []uint64{0, 0, 0, 1, 1 << 31, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFE} {
		keys = append(keys, keyWithHash(uint32(h), uint32(len(keys))))
	}
	rapid.Check(t, func(t *rapid.T) {
		a := newArena[struct{}](rapid.IntRange(0, 8).Draw(t, "hint"), rapid.Bool().Draw(t, "prealloc"))
		model := map[Key]int32{}
		keyGen := rapid.SampledFrom(keys)
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			k := keyGen.Draw(t, "key")
			if i, ok := model[k]; ok {
				a.release(i)
				delete(model, k)
			} else {
				model[k] = a.alloc(k)
			}
			require.Equal(t, len(model), a.index.Len())
			for _, k := range append(keys, 42) {
				node, ok := a.lookup(k)
				want, present := model[k]
				require.Equal(t, present, ok, "key %#x", k)
				if present {
					require.Equal(t, want, node, "key %#x", k)
				}
			}
		}
	})
}

// keyWithHash returns a key whose hash (the top half of its product with index's multiplier) is h,
// told apart from others of that hash by low.
func keyWithHash(h, low uint32) Key {
	// The inverse of the odd multiplier modulo 2^64, by Newton's iteration (each step doubles the
	// correct low bits).
	const phi = 0x9E3779B97F4A7C15
	inv := uint64(phi)
	for range 6 {
		inv *= 2 - phi*inv
	}
	k := Key((uint64(h)<<32 | uint64(low)) * inv)
	if uint32(uint64(k)*phi>>32) != h {
		panic("keyWithHash: bad inverse")
	}
	return k
}

// TestArenaReusesNodes checks that freed nodes are reused, so that a steady replay does not grow the
// arena, and that list operations keep both directions of the links consistent.
func TestArenaReusesNodes(t *testing.T) {
	a := newArena[struct{}](4, false)
	l := newList()
	for k := range Key(4) {
		a.pushFront(&l, a.alloc(k))
	}
	for k := Key(4); k < 100; k++ {
		a.remove(&l, l.tail)
		a.pushFront(&l, a.alloc(k))
	}
	require.Len(t, a.nodes, 4)
	a.moveToFront(&l, l.tail)
	var fwd, back []Key
	for i := l.head; i != none; i = a.at(i).next {
		fwd = append(fwd, a.at(i).key)
	}
	for i := l.tail; i != none; i = a.at(i).prev {
		back = append([]Key{a.at(i).key}, back...)
	}
	require.Equal(t, []Key{96, 99, 98, 97}, fwd)
	require.Equal(t, fwd, back)
	require.Equal(t, 4, l.len)
	require.True(t, a.removeKey(&l, 98))
	require.False(t, a.removeKey(&l, 98))
	require.Equal(t, 3, l.len)
}
