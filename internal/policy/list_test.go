package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestIndexAgainstMap checks the open-addressing index against a Go map on random puts and deletes.
// Keys are drawn from a small set that includes values colliding on the home slot, so that probe
// runs wrap around the table's end and backward-shift deletion has entries to move and to leave.
func TestIndexAgainstMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := newIndex(rapid.IntRange(0, 8).Draw(t, "hint"))
		model := map[Key]int32{}
		// Multiples of 2^61 all hash to slot 0 or a few slots of a small table: long runs.
		keyGen := rapid.SampledFrom([]Key{0, 1, 2, 3, 5, 8, 1 << 61, 2 << 61, 3 << 61, 4 << 61, 5 << 61, 7 << 61, ^Key(0)})
		for i := range rapid.IntRange(1, 200).Draw(t, "steps") {
			k := keyGen.Draw(t, "key")
			if _, ok := model[k]; ok {
				x.delete(k)
				delete(model, k)
			} else {
				x.put(k, int32(i))
				model[k] = int32(i)
			}
			require.Equal(t, len(model), x.n)
			for _, k := range []Key{0, 1, 2, 3, 5, 8, 1 << 61, 2 << 61, 3 << 61, 4 << 61, 5 << 61, 7 << 61, ^Key(0), 42} {
				node, ok := x.get(k)
				want, present := model[k]
				require.Equal(t, present, ok, "key %#x", k)
				if present {
					require.Equal(t, want, node, "key %#x", k)
				}
			}
		}
	})
}

// TestArenaReusesNodes checks that freed nodes are reused, so that a steady replay does not grow the
// arena, and that list operations keep both directions of the links consistent.
func TestArenaReusesNodes(t *testing.T) {
	a := newArena[struct{}](4)
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
