package policy

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMemoryPerKey measures the heap a preallocated policy of 2^20 keys holds once full, ghost
// entries included, against the engine's budget: 64 bytes of index RAM per SSD line in all, of
// which the engine takes about 25, so a policy without ghost entries must stay within 40. The
// policies with ghost entries or a sketch are bounded by what they measure today, with a little
// room (on amd64: 2q 58, arc 78, s3fifo 74, lirs 110, wtinylfu 68 bytes per key; lru and fifo 31,
// clock and sieve 39), so that a change that makes one fatter fails here. It also checks that
// filling a preallocated policy allocates nothing: its state was sized up front, without regrowth.
func TestMemoryPerKey(t *testing.T) {
	const capacity = 1 << 20
	limits := map[string]float64{
		"lru": 40, "fifo": 40, "clock": 40, "sieve": 40,
		"2q": 62, "arc": 82, "s3fifo": 78, "lirs": 114, "wtinylfu": 72,
	}
	require.ElementsMatch(t, EvictionNames(), sortedKeys(limits), "every policy needs a bound")
	for _, name := range EvictionNames() {
		var start, built, full runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&start)
		p, err := NewEviction(name, Config{Capacity: capacity, Preallocate: true})
		require.NoError(t, err)
		runtime.ReadMemStats(&built)
		// 2 x capacity new keys fill the cache and the ghost lists that remember evicted keys
		// (S3-FIFO, 2Q, LIRS); then random reuse over a wider range fills ARC's, which remember
		// only keys that had been hit.
		for k := range Key(2 * capacity) {
			p.Insert(k)
		}
		r := rand.New(rand.NewPCG(1, 2))
		for range 2 * capacity {
			if k := Key(r.IntN(4 * capacity)); !p.Get(k) {
				p.Insert(k)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&full)
		require.Equal(t, capacity, p.Len(), name)
		runtime.KeepAlive(p)
		perKey := float64(full.HeapAlloc-start.HeapAlloc) / capacity
		grown := float64(full.TotalAlloc-built.TotalAlloc) / capacity
		t.Logf("%-8s %5.1f bytes/key (%.2f allocated while filling)", name, perKey, grown)
		require.LessOrEqual(t, perKey, limits[name], "%s: bytes per key", name)
		require.Less(t, grown, 0.01, "%s: bytes per key allocated while filling a preallocated policy", name)
	}
}
