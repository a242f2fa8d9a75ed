package linebits

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSet checks the set against a map: across words and summary words, with fixed edge cases and
// seeded random operations.
func TestSet(t *testing.T) {
	const n = 3*4096 + 100 // three full summary words and part of a fourth
	s := NewSet(n)
	in := map[uint64]bool{}
	check := func(step string) {
		t.Helper()
		for _, from := range []uint64{0, 1, 63, 64, 65, 4095, 4096, 4097, 8191, 8192, n - 1, n, n + 64} {
			var want uint64
			found := false
			for l := from; l < n; l++ {
				if in[l] {
					want, found = l, true
					break
				}
			}
			got, ok := s.Next(from)
			if ok != found || (ok && got != want) {
				t.Fatalf("%s: next(%d) = %d, %v; want %d, %v", step, from, got, ok, want, found)
			}
		}
	}
	check("empty")
	edges := []uint64{0, 63, 64, 127, 4095, 4096, 4160, 8191, 12287, 12288, n - 1}
	for _, l := range edges {
		s.Add(l)
		in[l] = true
		check(fmt.Sprintf("add %d", l))
	}
	// Walk the whole set with next: every member once, in order.
	var walked []uint64
	for l, ok := s.Next(0); ok; l, ok = s.Next(l + 1) {
		walked = append(walked, l)
	}
	if !slices.Equal(walked, edges) {
		t.Fatalf("walk = %v, want %v", walked, edges)
	}
	for _, l := range []uint64{64, 4095, 0, 12288, 127} {
		s.Remove(l)
		delete(in, l)
		check(fmt.Sprintf("remove %d", l))
	}
	rng := rand.New(rand.NewPCG(1, 7))
	for i := range 2000 {
		// Cluster around word and summary boundaries half of the time.
		l := rng.Uint64N(n)
		if rng.IntN(2) == 0 {
			l = min(n-1, uint64(rng.IntN(4))*4096+uint64(rng.IntN(3))*64+uint64(rng.IntN(3))-1+64)
		}
		if rng.IntN(2) == 0 {
			s.Add(l)
			in[l] = true
		} else {
			s.Remove(l)
			delete(in, l)
		}
		if i%50 == 0 {
			check(fmt.Sprintf("random op %d", i))
		}
	}
	check("random ops")
}
