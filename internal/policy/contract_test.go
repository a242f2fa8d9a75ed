package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestEvictionContract checks the Eviction interface on random operation sequences against a model
// of the resident set, for every registered policy: Get hits exactly the keys inserted and not yet
// evicted or removed, OnEvict reports exactly the keys that leave (resident ones, each once, only
// from Insert, and only when the cache is full), Remove reports residency, and Len <= Capacity.
func TestEvictionContract(t *testing.T) {
	for _, name := range EvictionNames() {
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) { checkContract(t, name) })
		})
	}
}

func checkContract(t *rapid.T, name string) {
	capacity := rapid.IntRange(1, 8).Draw(t, "capacity")
	var evicted []Key
	p, err := NewEviction(name, Config{Capacity: capacity, OnEvict: func(k Key) { evicted = append(evicted, k) }})
	require.NoError(t, err)
	require.Equal(t, capacity, p.Capacity())
	resident := map[Key]bool{}
	// Few distinct keys, so that keys come back while cached, after eviction and from ghost lists.
	keyGen := rapid.Custom(func(t *rapid.T) Key { return Key(rapid.IntRange(0, 3*capacity).Draw(t, "key")) })
	steps := rapid.IntRange(1, 300).Draw(t, "steps")
	for range steps {
		k := keyGen.Draw(t, "k")
		evicted = evicted[:0]
		switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
		case op < 7: // a cache access: Get, and Insert on a miss
			require.Equal(t, resident[k], p.Get(k), "Get(%d)", k)
			require.Empty(t, evicted, "Get evicts nothing")
			if resident[k] {
				break
			}
			full := len(resident) == capacity
			p.Insert(k)
			if full {
				require.NotEmpty(t, evicted, "Insert(%d) into a full cache evicts", k)
			} else {
				require.Empty(t, evicted, "Insert(%d) into a cache with room evicts nothing", k)
			}
			for _, e := range evicted {
				require.True(t, resident[e], "evicted %d was not cached", e)
				delete(resident, e)
			}
			resident[k] = true
		case op < 8: // a miss that admission turns away: Get only
			if !resident[k] {
				require.False(t, p.Get(k))
			}
		default:
			require.Equal(t, resident[k], p.Remove(k), "Remove(%d)", k)
			require.Empty(t, evicted, "Remove does not call OnEvict")
			delete(resident, k)
		}
		require.Equal(t, len(resident), p.Len())
		require.LessOrEqual(t, p.Len(), p.Capacity())
	}
}

func TestNewEviction(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		err      string
	}{
		{"lru", 1, ""},
		{"LRU", 4, ""},
		{"lru", 0, "capacity 0 must be at least 1"},
		{"nosuch", 4, `unknown eviction policy "nosuch"`},
	}
	for _, tt := range tests {
		p, err := NewEviction(tt.name, Config{Capacity: tt.capacity})
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tt.capacity, p.Capacity())
		require.Zero(t, p.Len())
	}
}
