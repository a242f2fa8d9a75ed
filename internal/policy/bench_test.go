package policy

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The benchmark stream: 1M accesses drawn from a Zipf distribution (s = 1.1) over 1M keys, the
// skewed popularity of block traces, replayed with always-admit at a cache of 64Ki keys (about a
// third of the distinct keys the stream touches). ns/op is the cost of one access in wall time;
// cpu-ns/op is in the benchmark thread's CPU time, which other load on a shared machine disturbs less.
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
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPU(b)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := keys[i&(benchAccesses-1)]
				if !p.Get(k) {
					misses++
					p.Insert(k)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(threadCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(misses)/float64(b.N), "miss/op")
		})
	}
}

// threadCPU is the CPU time the calling OS thread has used.
func threadCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
