package sim

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/trace"
)

// Job is one simulated cache.
type Job struct {
	Policy string
	// Admission is an admission spec ("always", "nhit:2", "seqcutoff:4MiB"); empty means always.
	Admission string
	// Size is the capacity in keys.
	Size int
	// Label is the size as the user wrote it, for reports; Bytes is that size in bytes where it
	// was given in bytes (0 where it was a number of keys or a fraction), for plots.
	Label string
	Bytes int64
}

// Result is what one simulated cache measured.
type Result struct {
	Policy    string `json:"policy"`
	Admission string `json:"admission,omitempty"`
	CacheSize int    `json:"cache_size"`
	SizeLabel string `json:"size_label,omitempty"`
	SizeBytes int64  `json:"size_bytes,omitempty"`
	// Requests counted (after warm-up); Accesses is the keys they touched.
	Requests int64 `json:"requests"`
	Accesses int64 `json:"accesses"`
	// MissRatio is the fraction of key accesses that missed; ByteMissRatio weighs each by its bytes.
	MissRatio     float64 `json:"miss_ratio"`
	ByteMissRatio float64 `json:"byte_miss_ratio"`
	// ThroughputMQPS is the requests replayed over the time this cache spent replaying them.
	ThroughputMQPS float64 `json:"throughput_mqps"`
	// FetchRatio is the bytes read misses fetched from the backend over the bytes read (the read
	// amplification of the daemon's stats): a whole key per admitted miss, or with Options.Blocks
	// what package fetch's rule says; a miss not admitted fetches only what it asked for.
	FetchRatio float64 `json:"fetch_ratio"`
	// Held is the keys the cache held at the end, Evicted the keys its policy evicted over the
	// whole replay (warm-up included). A cache that evicted none never had to choose: any larger
	// one gives the same figures, and its misses are cold misses or misses its admission policy
	// turned away. Under Options.Sample they are the miniature cache's (and 0 for SHARDS).
	Held    int   `json:"held"`
	Evicted int64 `json:"evicted"`
	// Estimate says how the figures were estimated (Options.Sample); empty for an exact replay.
	// Under sampling Accesses counts the sampled keys' accesses (SHARDS: every key's).
	Estimate string `json:"estimate,omitempty"`
}

// simulator is one simulated cache, fed the batches of a pass in order.
type simulator interface {
	feed(b *batch)
	// result reports what the cache counted over a pass of total requests; pop is every key's
	// share of them under a sampling rate (nil otherwise).
	result(total int64, pop *population) Result
}

// Run reads r once and replays every request through every job's cache, and returns the results
// in job order with the number of requests. The caches are shared out among o.Workers goroutines,
// each feeding every batch to each of its caches in turn, so the results are those of replaying
// each job alone.
func Run(ctx context.Context, r trace.Reader, jobs []Job, o Options) (Summary, error) {
	if err := o.Check(); err != nil {
		return Summary{}, err
	}
	// Build every cache first so that a bad name fails before hours of replay.
	sims := make([]simulator, len(jobs))
	var est *shardsSim // under Sample.Keys, the one estimator of every job
	for i, j := range jobs {
		var err error
		switch {
		case o.Sample.Keys > 0:
			feeds := est == nil
			if feeds {
				if est, err = newShardsSim(o); err != nil {
					return Summary{}, err
				}
			}
			sims[i], err = est.job(j, feeds)
		case o.Blocks:
			sims[i], err = newLineSim(j, o)
		default:
			sims[i], err = newObjectSim(j, o)
		}
		if err != nil {
			return Summary{}, err
		}
	}
	workers := min(max(o.Workers, 1), max(len(jobs), 1))
	outs, free := pool(workers)
	var done atomic.Int64
	stop := startProgress(o.Progress, fmt.Sprintf("%d caches", len(jobs)), r, &done)
	var wg sync.WaitGroup
	for w := range workers {
		// Worker w owns jobs w, w+workers, ...: policy-major job lists give each a mix of costs.
		var own []simulator
		for i := w; i < len(sims); i += workers {
			own = append(own, sims[i])
		}
		wg.Go(func() {
			for b := range outs[w] {
				if ctx.Err() == nil {
					for _, s := range own {
						s.feed(b)
					}
				}
				release(b, free)
			}
		})
	}
	var pop *population
	if o.Sample.Rate > 0 {
		pop = &population{rate: o.Sample.Rate}
	}
	n, err := stream(ctx, r, o, outs, free, &done, pop)
	wg.Wait()
	stop(n)
	if err != nil {
		return Summary{}, err
	}
	if err := ctx.Err(); err != nil {
		return Summary{}, err
	}
	if n == 0 {
		return Summary{}, errNoRequests
	}
	if o.Warmup >= n {
		return Summary{}, fmt.Errorf("%w: --warmup %d must be below the %d requests of the trace", ErrWarmup, o.Warmup, n)
	}
	res := make([]Result, len(sims))
	for i, s := range sims {
		res[i] = s.result(n, pop)
		res[i].Estimate = o.Sample.String()
	}
	return Summary{Requests: n, Results: res}, nil
}

type cache struct {
	ev   policy.Eviction
	adm  policy.Admission
	seen policy.HitObserver // adm, if it wants to hear of hits
	// evicted counts the keys ev evicted (through its OnEvict hook).
	evicted *int64
}

// hit tells the admission policy of a hit, if it wants to know.
func (c *cache) hit() {
	if c.seen != nil {
		c.seen.ObserveHits(1)
	}
}

// newCache builds job j's cache as o says: of j.Size keys, or in miniature under sampling
// (Options.capacity), its admission's history scaled alike.
func newCache(j Job, o Options) (cache, error) { return newCacheEvicting(j, o, nil) }

// newCacheEvicting is newCache with a callback for each key the policy evicts.
func newCacheEvicting(j Job, o Options, onEvict func(policy.Key)) (cache, error) {
	capacity, rate := o.capacity(j.Size), o.Sample.Rate
	if rate == 0 {
		rate = 1
	}
	evicted := new(int64)
	count := func(k policy.Key) {
		*evicted++
		if onEvict != nil {
			onEvict(k)
		}
	}
	ev, err := policy.NewEviction(j.Policy, policy.Config{Capacity: capacity, OnEvict: count})
	if err != nil {
		return cache{}, err
	}
	spec := j.Admission
	if spec == "" {
		spec = "always"
	}
	adm, err := policy.NewMiniatureAdmission(spec, rate)
	if err != nil {
		return cache{}, err
	}
	seen, _ := adm.(policy.HitObserver)
	return cache{ev: ev, adm: adm, seen: seen, evicted: evicted}, nil
}

// capacity is the keys of a cache of size keys: size, or under a sampling rate R the miniature
// cache's round(size×R), at least 1, which fed the keys sampled at R misses as often as the full
// cache fed all of them.
func (o Options) capacity(size int) int {
	if o.Sample.Rate == 0 {
		return size
	}
	return max(1, int(math.Round(float64(size)*o.Sample.Rate)))
}

// result is what the cache counted, with what it holds and evicted.
func (c *cache) result(n counts, j Job, counted, replayed int64, elapsed time.Duration, pop *population) Result {
	res := n.result(j, counted, replayed, elapsed, pop)
	res.Held, res.Evicted = c.ev.Len(), *c.evicted
	return res
}

// objectSim is a cache of whole objects, libCacheSim's model.
type objectSim struct {
	job       Job
	c         cache
	n         counts
	warmup    int64
	blockSize int64
	busy      time.Duration
}

func newObjectSim(j Job, o Options) (*objectSim, error) {
	c, err := newCache(j, o)
	if err != nil {
		return nil, err
	}
	return &objectSim{job: j, c: c, warmup: o.Warmup, blockSize: o.BlockSize}, nil
}

// feed replays a batch. This loop is the simulator's speed: keep it free of allocation and
// indirection beyond the policy calls.
func (s *objectSim) feed(b *batch) {
	start := time.Now()
	c, n := s.c, s.n
	for i := range b.reqs {
		counted := i >= b.warm
		r := &b.reqs[i]
		kb := s.blockSize
		if kb == 0 {
			kb = r.Length
		}
		for _, k := range b.keys[b.starts[i]:b.starts[i+1]] {
			if counted && !r.Write {
				// Per key, so that under sampling only the sampled keys' bytes count.
				n.asked += asked(r, k, s.blockSize)
			}
			hit := c.ev.Get(k)
			admitted := false
			if hit {
				c.hit()
			} else {
				if admitted = c.adm.Admit(policy.Access{Key: k, Offset: r.Offset, Length: r.Length, Write: r.Write}); admitted {
					c.ev.Insert(k)
				}
			}
			if counted {
				n.access(kb, hit)
				if !hit && !r.Write {
					n.fetched += fetchedWhole(r, k, s.blockSize, admitted)
				}
			}
		}
	}
	s.n = n
	s.busy += time.Since(start)
}

func (s *objectSim) result(total int64, pop *population) Result {
	return s.c.result(s.n, s.job, total-s.warmup, total, s.busy, pop)
}

// counts are what a replay counts once warm-up is over.
type counts struct {
	accesses, misses, bytes, missBytes int64
	asked, fetched                     int64
}

// access counts an access of size bytes after warm-up, a hit or a miss.
func (n *counts) access(size int64, hit bool) {
	n.accesses++
	n.bytes += size
	if !hit {
		n.misses++
		n.missBytes += size
	}
}

// population is what every key of the counted requests of a pass adds up to, sampled or not,
// counted as the trace is read: with rate, the denominators of a miniature cache's ratios.
type population struct {
	rate                   float64
	accesses, bytes, asked int64
}

// result reports the counts of a cache that replayed replayed requests, counted of them after
// warm-up, in elapsed time of its own.
//
// A miniature cache's ratios (pop not nil) are over the rate times every key's accesses (bytes,
// bytes read), not over the sampled keys' own: a sample that holds a key hotter or colder than
// its share counts more or fewer accesses than rate times all of them, and the difference is
// counted as hits, as SHARDS-adj does (package mrc). Without it, a hot key left out of the sample
// (a Zipf trace's first) makes every cache of the sample miss more than the full one.
func (n counts) result(j Job, counted, replayed int64, elapsed time.Duration, pop *population) Result {
	res := Result{
		Policy: j.Policy, Admission: j.Admission, CacheSize: j.Size, SizeLabel: j.Label, SizeBytes: j.Bytes,
		Requests: counted, Accesses: n.accesses,
	}
	accesses, bytes, asked := float64(n.accesses), float64(n.bytes), float64(n.asked)
	if pop != nil {
		accesses, bytes, asked = pop.rate*float64(pop.accesses), pop.rate*float64(pop.bytes), pop.rate*float64(pop.asked)
	}
	if accesses > 0 {
		res.MissRatio = min(float64(n.misses)/accesses, 1)
	}
	if bytes > 0 {
		res.ByteMissRatio = min(float64(n.missBytes)/bytes, 1)
	}
	if asked > 0 {
		res.FetchRatio = float64(n.fetched) / asked
	}
	if s := elapsed.Seconds(); s > 0 {
		res.ThroughputMQPS = float64(replayed) / s / 1e6
	}
	return res
}
