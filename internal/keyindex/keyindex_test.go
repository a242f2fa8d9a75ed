package keyindex

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestAgainstMap checks the index against a Go map on random puts and deletes, in lazy and
// preallocated tables that start small and grow. Keys are few and include neighbours and extremes,
// so probe runs collide, wrap around the table's end, and deletion shifts entries back.
func TestAgainstMap(t *testing.T) {
	keys := []uint64{0, 1, 2, 3, 5, 8, 13, 1 << 32, 1<<32 + 1, ^uint64(0), ^uint64(0) - 1}
	rapid.Check(t, func(t *rapid.T) {
		x := New(rapid.IntRange(0, 8).Draw(t, "hint"), rapid.Bool().Draw(t, "prealloc"))
		model := map[uint64]int32{}
		keyGen := rapid.SampledFrom(keys)
		for step := range rapid.IntRange(1, 200).Draw(t, "steps") {
			k := keyGen.Draw(t, "key")
			if _, ok := model[k]; ok {
				x.Delete(k)
				delete(model, k)
			} else {
				x.Put(k, int32(step))
				model[k] = int32(step)
			}
			require.Equal(t, len(model), x.Len())
			for _, k := range append(keys, 42) {
				v, ok := x.Get(k)
				want, present := model[k]
				require.Equal(t, present, ok, "key %#x", k)
				if present {
					require.Equal(t, want, v, "key %#x", k)
				} else {
					require.Equal(t, int32(-1), v)
				}
			}
			all := map[uint64]int32{}
			for k, v := range x.All() {
				all[k] = v
			}
			require.Equal(t, model, all)
		}
	})
}
