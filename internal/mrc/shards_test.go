package mrc

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/policy"
)

// exactLRU is the miss ratio of the policy package's LRU, the simulator's, at each size.
func exactLRU(t *testing.T, keys []policy.Key, sizes []int) []float64 {
	t.Helper()
	out := make([]float64, len(sizes))
	for i, c := range sizes {
		ev, err := policy.NewEviction("lru", policy.Config{Capacity: c})
		require.NoError(t, err)
		misses := 0
		for _, k := range keys {
			if !ev.Get(k) {
				misses++
				ev.Insert(k)
			}
		}
		out[i] = float64(misses) / float64(len(keys))
	}
	return out
}

func estimate(t *testing.T, c Config, keys []policy.Key, sizes []int) []float64 {
	t.Helper()
	s, err := NewSHARDS(c)
	require.NoError(t, err)
	for _, k := range keys {
		s.Access(k, 4096)
	}
	var out []float64
	for _, p := range s.Curve(sizes) {
		require.Equal(t, p.MissRatio, p.ByteMissRatio, "accesses of equal bytes")
		out = append(out, p.MissRatio)
	}
	return out
}

func meanAbsError(a, b []float64) float64 {
	sum := 0.0
	for i := range a {
		d := a[i] - b[i]
		if d < 0 {
			d = -d
		}
		sum += d
	}
	return sum / float64(len(a))
}

// zipf draws n accesses of keys 0..keys-1 with Zipf's law of exponent s, from a fixed seed.
func zipf(n, keys int, s float64, seed uint64) []policy.Key {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, 1)), s, 1, uint64(keys-1))
	out := make([]policy.Key, n)
	for i := range out {
		out[i] = policy.Key(z.Uint64())
	}
	return out
}

// loop accesses keys 0..k-1 in turn, n times over.
func loop(k, n int) []policy.Key {
	var out []policy.Key
	for range n {
		for i := range k {
			out = append(out, policy.Key(i))
		}
	}
	return out
}

// Sampling every key, the estimate is LRU's exact curve at every size where the histogram's
// buckets are exact (below 256) or begin (powers of two): reuse distances are LRU's hits.
func TestSHARDSExactAtRateOne(t *testing.T) {
	keys := zipf(50_000, 5_000, 1.1, 1)
	sizes := []int{1, 2, 10, 100, 255, 256, 512, 1024, 4096, 8192}
	require.Equal(t, exactLRU(t, keys, sizes), estimate(t, Config{}, keys, sizes))
	// A budget larger than the keys never lowers the rate: the same curve.
	require.Equal(t, exactLRU(t, keys, sizes), estimate(t, Config{MaxKeys: 5_000}, keys, sizes))
}

// Synthetic traces whose curves are known or replayed exactly, estimated at a fixed rate and with
// a fixed budget of keys. The goal (issue 49): a mean absolute error of at most 0.002 for LRU.
// That takes a sample of thousands of keys (SHARDS' error shrinks with the sampled keys, not with
// the rate), and sizes of at least about 100/R keys, below which a sampled distance of one key
// stands for more of the size than the goal allows: so 8,192 keys of these small traces (R from
// 0.16 to 0.4), and sizes from 1,000 keys. A Zipf trace of exponent 1 over 20,000 keys misses
// the goal (its hottest keys take a tenth of the accesses each, which the sample holds or not):
// its limit is what the estimate reaches, so that it can only get better.
func TestSHARDSAccuracy(t *testing.T) {
	sizes := []int{1000, 1500, 2000, 3000, 5000, 8000, 12000, 16000}
	for _, tc := range []struct {
		name string
		keys []policy.Key
		cfg  Config
		// want, if set, is the known curve; else LRU's exact replay is.
		want []float64
		// limit is the most mean absolute error allowed: the goal's 0.002 where it is met.
		limit float64
	}{
		// A loop over 10,000 keys misses every access below 10,000 keys and only the first pass
		// above it (all but one of the 10 passes hit).
		{"loop, 10% rate", loop(10_000, 10), Config{Rate: 0.1}, knownLoop(sizes, 10_000, 10), 0.002},
		{"loop, 2048 keys", loop(10_000, 10), Config{MaxKeys: 2048}, knownLoop(sizes, 10_000, 10), 0.002},
		{"zipf 1.0001, 40% rate", zipf(300_000, 20_000, 1.0001, 2), Config{Rate: 0.4}, nil, 0.008},
		{"zipf 1.0001, 8192 keys", zipf(300_000, 20_000, 1.0001, 2), Config{MaxKeys: 8192}, nil, 0.004},
		{"zipf 1.2, 8192 keys", zipf(300_000, 50_000, 1.2, 3), Config{MaxKeys: 8192}, nil, 0.002},
		// A scan of distinct keys misses everything: the estimate too, once SHARDS-adj puts the
		// sample's shortfall or excess at distance 0.
		{"scan, 1% rate", loop(200_000, 1), Config{Rate: 0.01}, knownLoop(sizes, 200_000, 1), 0.002},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil {
				want = exactLRU(t, tc.keys, sizes)
			}
			got := estimate(t, tc.cfg, tc.keys, sizes)
			mae := meanAbsError(want, got)
			t.Logf("mean absolute error %.5f", mae)
			require.LessOrEqual(t, mae, tc.limit, "want %v\ngot  %v", want, got)
		})
	}
}

// knownLoop is the curve of passes over k keys: every access missed below k, the first pass only
// from k.
func knownLoop(sizes []int, k, passes int) []float64 {
	out := make([]float64, len(sizes))
	for i, c := range sizes {
		out[i] = 1
		if c >= k {
			out[i] = 1 / float64(passes)
		}
	}
	return out
}

// The fixed-size estimator never holds more than its budget of keys (nor more slots or heap
// entries than it sizes for it), however many distinct keys it sees.
func TestSHARDSBoundedMemory(t *testing.T) {
	n := 10_000_000
	if testing.Short() {
		n = 1_000_000
	}
	const budget = 8192
	s, err := NewSHARDS(Config{MaxKeys: budget})
	require.NoError(t, err)
	slots := len(s.slotKey)
	for i := range n {
		s.Access(policy.Key(i), 4096)
		if s.Len() > budget {
			require.LessOrEqual(t, s.Len(), budget, "after %d keys", i+1)
		}
	}
	require.Equal(t, budget, s.Len())
	require.Equal(t, budget, len(s.largest))
	require.Equal(t, slots, len(s.slotKey), "the access order never grew")
	require.InDelta(t, float64(budget)/float64(n), s.Rate(), 0.1*float64(budget)/float64(n), "the rate fell to the budget's share of the keys")
	for _, p := range s.Curve([]int{10, 1000, 1_000_000}) {
		// Every key new, a scan: all misses, within the error of the sampled keys' count.
		require.InDelta(t, 1, p.MissRatio, 0.05)
	}
}

// The sample is a hash's, so reproducible, and a different seed draws a different one; a rate
// takes its share of the keys.
func TestSampler(t *testing.T) {
	a, err := NewSampler(0.1, 1)
	require.NoError(t, err)
	b, _ := NewSampler(0.1, 2)
	taken, same := 0, 0
	const n = 1_000_000
	for k := range policy.Key(n) {
		if a.Take(k) {
			taken++
			if b.Take(k) {
				same++
			}
		}
	}
	require.InDelta(t, 0.1, float64(taken)/n, 0.002)
	require.InDelta(t, 0.1, float64(same)/float64(taken), 0.01, "another seed, another sample")
	require.InDelta(t, 0.1, a.Rate(), 1e-12)
	all, err := NewSampler(1, 0)
	require.NoError(t, err)
	require.True(t, all.Take(12345))
	for _, bad := range []float64{0, -0.5, 1.5, 1e-30} {
		_, err := NewSampler(bad, 1)
		require.Error(t, err, "%g", bad)
	}
	_, err = NewSHARDS(Config{MaxKeys: -1})
	require.Error(t, err)
}

// Buckets tile the distances: each holds the distances it says, and each ends where the next
// begins.
func TestHistogramBuckets(t *testing.T) {
	for i := range 64 * subBuckets {
		lo, hi := bounds(i)
		require.Equal(t, i, bucket(uint64(lo)), "bucket %d", i)
		require.Equal(t, i, bucket(uint64(hi)-1), "bucket %d", i)
		if i > 0 {
			_, prev := bounds(i - 1)
			require.Equal(t, prev, lo, "bucket %d", i)
		}
		if hi >= 1<<62 {
			break
		}
		if i < 2*subBuckets {
			continue // exact: one distance each
		}
		require.LessOrEqual(t, (hi-lo)/lo, 1.0/subBuckets+1e-12, "bucket %d is within 1/%d of its distances", i, subBuckets)
	}
}
