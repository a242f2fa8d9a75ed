package sim

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/tierblk/tierblk/internal/policy"
)

// TestKeySetCountsLikeAMap checks the set against Go's map, with key 0 and colliding keys.
func TestKeySetCountsLikeAMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		keys := rapid.SliceOf(rapid.OneOf(
			rapid.Uint64Range(0, 50),
			rapid.Uint64(),
			rapid.Map(rapid.Uint64Range(0, 50), func(x uint64) uint64 { return x << 48 }),
		)).Draw(t, "keys")
		s := newKeySet()
		m := map[policy.Key]bool{}
		for _, k := range keys {
			s.add(policy.Key(k))
			m[policy.Key(k)] = true
			if s.len() != len(m) {
				t.Fatalf("after %d: set has %d keys, map %d", k, s.len(), len(m))
			}
		}
	})
	s := newKeySet()
	for k := range 100000 {
		s.add(policy.Key(k % 30000))
	}
	if s.len() != 30000 {
		t.Fatalf("30000 distinct keys counted as %d", s.len())
	}
}
