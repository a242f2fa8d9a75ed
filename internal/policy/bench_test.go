package policy

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// The benchmark stream: 1M accesses drawn from a Zipf distribution (s = 1.1) over 1M keys, the
// skewed popularity of block traces, replayed with always-admit at a cache of 64Ki keys (about a
// third of the distinct keys the stream touches). ns/op is the cost of one access.
const (
	benchAccesses = 1 << 20
	benchKeySpace = 1 << 20
	benchCapacity = 1 << 16
)

var benchStream = sync.OnceValue(func() []Key {
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.1, 1, benchKeySpace-1)
	keys := make([]Key, benchAccesses)
	for i := range keys {
		// Scatter the ranks so that popular keys are not small neighbouring numbers.
		keys[i] = Key(z.Uint64() * 0x9E3779B97F4A7C15)
	}
	return keys
})

func BenchmarkEviction(b *testing.B) {
	keys := benchStream()
	for _, name := range EvictionNames() {
		b.Run(name, func(b *testing.B) {
			p, err := NewEviction(name, Config{Capacity: benchCapacity})
			if err != nil {
				b.Fatal(err)
			}
			// Warm the cache with one pass, so that the timed loop sees the steady state.
			for _, k := range keys {
				if !p.Get(k) {
					p.Insert(k)
				}
			}
			misses := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := keys[i&(benchAccesses-1)]
				if !p.Get(k) {
					misses++
					p.Insert(k)
				}
			}
			b.ReportMetric(float64(misses)/float64(b.N), "miss/op")
		})
	}
}
