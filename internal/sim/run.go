package sim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/fetch"
	"github.com/tierblk/tierblk/internal/policy"
)

// Job is one simulated cache.
type Job struct {
	Policy string
	// Admission is an admission spec ("always", "nhit:2", "seqcutoff:4MiB"); empty means always.
	Admission string
	// Size is the capacity in keys.
	Size int
	// Label is the size as the user wrote it, for reports.
	Label string
}

// Result is what one simulated cache measured.
type Result struct {
	Policy    string `json:"policy"`
	Admission string `json:"admission,omitempty"`
	CacheSize int    `json:"cache_size"`
	SizeLabel string `json:"size_label,omitempty"`
	// Requests counted (after warm-up); Accesses is the keys they touched.
	Requests int64 `json:"requests"`
	Accesses int64 `json:"accesses"`
	// MissRatio is the fraction of key accesses that missed; ByteMissRatio weighs each by its bytes.
	MissRatio      float64 `json:"miss_ratio"`
	ByteMissRatio  float64 `json:"byte_miss_ratio"`
	ThroughputMQPS float64 `json:"throughput_mqps"`
	// FetchRatio is the bytes read misses fetched from the backend over the bytes read (the read
	// amplification of the daemon's stats): a whole key per admitted miss, or with RunOptions.Blocks
	// what package fetch's rule says; a miss not admitted fetches only what it asked for.
	FetchRatio float64 `json:"fetch_ratio"`
}

// RunOptions control a sweep.
type RunOptions struct {
	// Warmup requests are replayed but not counted.
	Warmup int
	// Workers run jobs in parallel; 0 means 1.
	Workers int
	// Progress, if not nil, receives a progress bar.
	Progress io.Writer
	// Blocks models the daemon's cache lines (keys of Workload.BlockSize bytes, a multiple of 4 KiB):
	// each line holds the 4 KiB blocks fetched into it, a request is a hit only where its line holds
	// every block it touches, and a miss fetches what package fetch's rule says. Without it, a key
	// is a whole object (libCacheSim's model): held or not, and fetched whole.
	Blocks bool
}

// Run replays w through every job and returns the results in job order.
func Run(ctx context.Context, w *Workload, jobs []Job, o RunOptions) ([]Result, error) {
	if o.Warmup < 0 || o.Warmup >= w.Requests() {
		return nil, fmt.Errorf("--warmup %d must be at least 0 and below the %d requests of the trace", o.Warmup, w.Requests())
	}
	if o.Blocks && (w.BlockSize < fetch.BlockSize || w.BlockSize%fetch.BlockSize != 0 || w.BlockSize > maxLine) {
		return nil, fmt.Errorf("modelling the daemon's lines needs a block size (the line size) that is a multiple of 4KiB, up to 1MiB; it is %d", w.BlockSize)
	}
	// Build every policy first so that a bad name fails before hours of replay.
	for _, j := range jobs {
		if _, err := newCache(j); err != nil {
			return nil, err
		}
	}
	workers := max(o.Workers, 1)
	results := make([]Result, len(jobs))
	errs := make([]error, len(jobs))
	var done atomic.Int64
	todo := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range todo {
				if o.Blocks {
					results[i], errs[i] = replayBlocks(ctx, w, jobs[i], o.Warmup)
				} else {
					results[i], errs[i] = replay(ctx, w, jobs[i], o.Warmup)
				}
				n := done.Add(1)
				if o.Progress != nil {
					bar(o.Progress, int(n), len(jobs))
				}
			}
		}()
	}
	for i := range jobs {
		if ctx.Err() != nil {
			break
		}
		todo <- i
	}
	close(todo)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}

type cache struct {
	ev   policy.Eviction
	adm  policy.Admission
	seen policy.HitObserver // adm, if it wants to hear of hits
}

// hit tells the admission policy of a hit, if it wants to know.
func (c *cache) hit() {
	if c.seen != nil {
		c.seen.ObserveHits(1)
	}
}

func newCache(j Job) (cache, error) { return newCacheEvicting(j, nil) }

// newCacheEvicting is newCache with a callback for each key the policy evicts.
func newCacheEvicting(j Job, onEvict func(policy.Key)) (cache, error) {
	ev, err := policy.NewEviction(j.Policy, policy.Config{Capacity: j.Size, OnEvict: onEvict})
	if err != nil {
		return cache{}, err
	}
	spec := j.Admission
	if spec == "" {
		spec = "always"
	}
	adm, err := policy.NewAdmission(spec)
	if err != nil {
		return cache{}, err
	}
	seen, _ := adm.(policy.HitObserver)
	return cache{ev: ev, adm: adm, seen: seen}, nil
}

// replay runs one cache over the whole workload. This loop is the simulator's speed: keep it free
// of allocation and indirection beyond the policy calls.
func replay(ctx context.Context, w *Workload, j Job, warmup int) (Result, error) {
	c, err := newCache(j)
	if err != nil {
		return Result{}, err
	}
	var n counts
	start := time.Now()
	for i := range w.Reqs {
		if i&0xffff == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		counted := i >= warmup
		r := &w.Reqs[i]
		kb := w.keyBytes(i)
		if counted && !r.Write {
			n.asked += r.Length
		}
		for _, k := range w.Keys[w.Starts[i]:w.Starts[i+1]] {
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
				n.accesses++
				n.bytes += kb
				if !hit {
					n.misses++
					n.missBytes += kb
					if !r.Write {
						n.fetched += w.fetchedWhole(r, k, admitted)
					}
				}
			}
		}
	}
	return n.result(j, w.Requests()-warmup, w.Requests(), time.Since(start)), nil
}

// counts are what a replay counts once warm-up is over.
type counts struct {
	accesses, misses, bytes, missBytes int64
	asked, fetched                     int64
}

func (n counts) result(j Job, counted, replayed int, elapsed time.Duration) Result {
	res := Result{
		Policy: j.Policy, Admission: j.Admission, CacheSize: j.Size, SizeLabel: j.Label,
		Requests: int64(counted), Accesses: n.accesses,
	}
	if n.accesses > 0 {
		res.MissRatio = float64(n.misses) / float64(n.accesses)
	}
	if n.bytes > 0 {
		res.ByteMissRatio = float64(n.missBytes) / float64(n.bytes)
	}
	if n.asked > 0 {
		res.FetchRatio = float64(n.fetched) / float64(n.asked)
	}
	if s := elapsed.Seconds(); s > 0 {
		res.ThroughputMQPS = float64(replayed) / s / 1e6
	}
	return res
}

func bar(w io.Writer, done, total int) {
	const width = 30
	n := done * width / total
	fmt.Fprintf(w, "\r[%-*s] %d/%d caches", width, strings.Repeat("#", n), done, total)
	if done == total {
		fmt.Fprintln(w)
	}
}
