package sim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
}

// RunOptions control a sweep.
type RunOptions struct {
	// Warmup requests are replayed but not counted.
	Warmup int
	// Workers run jobs in parallel; 0 means 1.
	Workers int
	// Progress, if not nil, receives a progress bar.
	Progress io.Writer
}

// Run replays w through every job and returns the results in job order.
func Run(ctx context.Context, w *Workload, jobs []Job, o RunOptions) ([]Result, error) {
	if o.Warmup < 0 || o.Warmup >= w.Requests() {
		return nil, fmt.Errorf("--warmup %d must be at least 0 and below the %d requests of the trace", o.Warmup, w.Requests())
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
				results[i], errs[i] = replay(ctx, w, jobs[i], o.Warmup)
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
	ev  policy.Eviction
	adm policy.Admission
}

func newCache(j Job) (cache, error) {
	ev, err := policy.NewEviction(j.Policy, policy.Config{Capacity: j.Size})
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
	return cache{ev: ev, adm: adm}, nil
}

// replay runs one cache over the whole workload. This loop is the simulator's speed: keep it free
// of allocation and indirection beyond the policy calls.
func replay(ctx context.Context, w *Workload, j Job, warmup int) (Result, error) {
	c, err := newCache(j)
	if err != nil {
		return Result{}, err
	}
	var accesses, misses, bytes, missBytes int64
	start := time.Now()
	for i := range w.Reqs {
		if i&0xffff == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		counted := i >= warmup
		kb := w.keyBytes(i)
		for _, k := range w.Keys[w.Starts[i]:w.Starts[i+1]] {
			hit := c.ev.Get(k)
			if !hit {
				r := &w.Reqs[i]
				if c.adm.Admit(policy.Access{Key: k, Offset: r.Offset, Length: r.Length, Write: r.Write}) {
					c.ev.Insert(k)
				}
			}
			if counted {
				accesses++
				bytes += kb
				if !hit {
					misses++
					missBytes += kb
				}
			}
		}
	}
	elapsed := time.Since(start).Seconds()
	res := Result{
		Policy: j.Policy, Admission: j.Admission, CacheSize: j.Size, SizeLabel: j.Label,
		Requests: int64(w.Requests() - warmup), Accesses: accesses,
	}
	if accesses > 0 {
		res.MissRatio = float64(misses) / float64(accesses)
	}
	if bytes > 0 {
		res.ByteMissRatio = float64(missBytes) / float64(bytes)
	}
	if elapsed > 0 {
		res.ThroughputMQPS = float64(w.Requests()) / elapsed / 1e6
	}
	return res, nil
}

func bar(w io.Writer, done, total int) {
	const width = 30
	n := done * width / total
	fmt.Fprintf(w, "\r[%-*s] %d/%d caches", width, strings.Repeat("#", n), done, total)
	if done == total {
		fmt.Fprintln(w)
	}
}
