// Package sim replays block traces through the cache policies of internal/policy, reporting miss
// ratios as libCacheSim does, in tables, CSV, JSON and miss-ratio-curve plots.
//
// A trace is streamed, never held: one goroutine decodes it into batches of requests already
// split into keys, and every simulated cache (one per policy and size) is fed each batch in turn,
// the caches shared out among worker goroutines. So one read of the trace serves every cache, and
// the memory is the caches' own plus a fixed pool of batches, whatever the trace's length.
//
// It drives the very policy code the daemon runs and must never reimplement a policy or count a
// hit differently from the engine: a hit is a key the eviction policy holds when it is requested.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/fetch"
	"github.com/tierblk/tierblk/internal/mrc"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/trace"
)

// Options say how requests become keys and how a pass runs.
type Options struct {
	// BlockSize splits each request into BlockSize-byte blocks, one key each; 0 gives one key per
	// request (the trace's own id, as libCacheSim does).
	BlockSize int64
	// ReadsOnly drops every request that is not a read.
	ReadsOnly bool
	// Warmup requests are replayed but not counted.
	Warmup int64
	// Workers feed the caches in parallel, each owning a share of them; 0 means 1.
	Workers int
	// Blocks models the daemon's cache lines (keys of BlockSize bytes, a multiple of 4 KiB): each
	// line holds the 4 KiB blocks fetched into it, a request is a hit only where its line holds
	// every block it touches, and a miss fetches what package fetch's rule says. Without it, a key
	// is a whole object (libCacheSim's model): held or not, and fetched whole.
	Blocks bool
	// Progress, if not nil, receives a progress line every second: requests done, rate, and the
	// time left where the trace's size is known.
	Progress io.Writer
	// Sample, if set, estimates the results from a sample of the keys instead of replaying them
	// all: far faster, and the results are estimates (Result.Estimate says how they were made).
	Sample Sampling
}

// Sampling says how to estimate the results from a spatial sample of the keys (package mrc): the
// keys whose seeded hash falls below a threshold, each followed through all of its accesses.
type Sampling struct {
	// Rate, from above 0 to 1, runs a miniature simulation of each cache (Waldspurger et al.,
	// ATC'17): the same policy at Rate times the size, fed only the keys sampled at Rate. Any
	// policy, admission and model; in the lines model the keys are the lines, so a line's blocks
	// stay together.
	Rate float64
	// Keys, if above 0, estimates LRU's curve with fixed-size SHARDS (Waldspurger et al., FAST'15):
	// one estimator for every size, holding at most Keys keys however many the trace has. Every
	// job must be lru with admission always in the object model (reuse distances know nothing of
	// admission or of a line's blocks). It estimates the miss ratios only: a result's fetch ratio,
	// held and evicted keys stay 0.
	Keys int
	// Seed seeds the hash that picks the keys; 0 means mrc.DefaultSeed.
	Seed uint64
}

// String says how results were estimated, for reports: empty for an exact replay.
func (s Sampling) String() string {
	switch {
	case s.Keys > 0:
		return fmt.Sprintf("SHARDS, at most %d sampled keys", s.Keys)
	case s.Rate > 0:
		return fmt.Sprintf("sampled at %.4g%%", 100*s.Rate)
	}
	return ""
}

// Check reports options that no trace can satisfy.
func (o Options) Check() error {
	if o.Warmup < 0 {
		return fmt.Errorf("--warmup %d must be at least 0", o.Warmup)
	}
	if o.Sample.Rate != 0 && o.Sample.Keys != 0 {
		return errors.New("sample either at a rate or with a budget of keys, not both")
	}
	if o.Sample.Rate != 0 {
		if _, err := mrc.NewSampler(o.Sample.Rate, o.Sample.Seed); err != nil {
			return err
		}
	}
	if o.Sample.Keys < 0 {
		return fmt.Errorf("a sample of %d keys: give at least 1", o.Sample.Keys)
	}
	if o.Sample.Keys > 0 && o.Blocks {
		return errors.New("a sample of a number of keys (SHARDS) estimates LRU in the object model only: give a rate for the lines model")
	}
	if o.Blocks && (o.BlockSize < fetch.BlockSize || o.BlockSize%fetch.BlockSize != 0 || o.BlockSize > maxLine) {
		return fmt.Errorf("modelling the daemon's lines needs a block size (the line size) that is a multiple of 4KiB, up to 1MiB; it is %d", o.BlockSize)
	}
	return nil
}

// Req is what admission policies and byte counts need of a request.
type Req struct {
	Offset, Length int64
	Write          bool
}

// A batch is a run of consecutive requests, already split into keys. Batches are recycled: the
// decoder fills one, every worker reads it, and the last to finish hands it back.
type batch struct {
	// The first warm requests are warm-up's: replayed, not counted.
	warm int
	reqs []Req
	// starts[i] is the index in keys of request i's first key; it has one extra entry at the end.
	starts []uint32
	keys   []policy.Key
	// pending counts the workers that have not finished with the batch.
	pending atomic.Int32
}

const (
	// batchRequests is the most requests a batch holds: enough that handing a batch over costs
	// nothing next to replaying it, few enough that it stays in the CPU's cache while each of a
	// worker's caches replays it.
	batchRequests = 4096
	// batchKeys ends a batch early when requests split into many blocks.
	batchKeys = 1 << 16
	// poolBatches is the number of batches in flight per worker (and at least minPoolBatches in
	// all): with the read-ahead of package trace, the whole of the memory a pass needs beside its
	// caches.
	poolBatches    = 4
	minPoolBatches = 8
	// maxRequestKeys bounds the keys of one request, so that a corrupt length or a tiny
	// --block-size fails clearly rather than exhausting memory.
	maxRequestKeys = 1 << 24
)

// volumeShift places the volume number in a key's top bits so that the disks of a multi-volume
// trace never share keys.
const volumeShift = 48

// add appends req, the n-th simulated request (from 0), to the batch, with those of its keys that
// sp takes (all of them if sp is nil). It reports whether the request was added: not if sp took
// none of its keys. If pop is not nil, it adds all the request's keys to it, sampled or not.
func (b *batch) add(req *trace.Request, n, blockSize int64, sp *mrc.Sampler, pop *population) (bool, error) {
	vol := policy.Key(req.Volume) << volumeShift
	from := len(b.keys)
	// The request's keys and the bytes of each, sampled or not.
	keys, size := int64(1), req.Length
	if blockSize == 0 {
		if k := vol ^ policy.Key(req.ID); sp == nil || sp.Take(k) {
			b.keys = append(b.keys, k)
		}
	} else {
		first := req.Offset / blockSize
		last := first
		if req.Length > 0 {
			last = (req.Offset + req.Length - 1) / blockSize
		}
		if last-first >= maxRequestKeys {
			return false, fmt.Errorf("request %d touches %d blocks of %d bytes: use a larger --block-size", n, last-first+1, blockSize)
		}
		for x := first; x <= last; x++ {
			if k := vol ^ policy.Key(x); sp == nil || sp.Take(k) {
				b.keys = append(b.keys, k)
			}
		}
		keys, size = last-first+1, blockSize
	}
	if pop != nil {
		pop.accesses += keys
		pop.bytes += keys * size
		if req.Op != trace.OpWrite { // as the caches count reads (Req.Write)
			pop.asked += req.Length
		}
	}
	if sp != nil && len(b.keys) == from {
		return false, nil
	}
	b.reqs = append(b.reqs, Req{Offset: req.Offset, Length: req.Length, Write: req.Op == trace.OpWrite})
	b.starts = append(b.starts, uint32(len(b.keys)))
	return true, nil
}

func (b *batch) reset() {
	b.warm = 0
	b.reqs = b.reqs[:0]
	b.keys = b.keys[:0]
	b.starts = append(b.starts[:0], 0)
}

// stream decodes r into batches and hands each to every channel of outs, taking empty batches
// from free, which bounds the batches in flight; a consumer returns a batch with release. It
// closes outs when the trace ends, fails or ctx is cancelled, and returns the number of requests
// it handed over.
//
// If pop is not nil, it adds up every key of the requests past warm-up there, sampled or not.
func stream(ctx context.Context, r trace.Reader, o Options, outs []chan *batch, free chan *batch, done *atomic.Int64, pop *population) (int64, error) {
	defer func() {
		for _, c := range outs {
			close(c)
		}
	}()
	var n int64
	take := func() (*batch, error) {
		select {
		case b := <-free:
			b.reset()
			return b, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	send := func(b *batch) {
		b.pending.Store(int32(len(outs)))
		for _, c := range outs {
			c <- b // never blocks: each channel has room for every batch
		}
		done.Store(n)
	}
	// Mini-simulations are fed the sampled keys only, so they are dropped here, once for every
	// cache; SHARDS samples for itself, as it lowers its rate.
	var sp *mrc.Sampler
	if o.Sample.Rate > 0 {
		s, err := mrc.NewSampler(o.Sample.Rate, o.Sample.Seed)
		if err != nil {
			return n, err
		}
		sp = &s
	}
	b, err := take()
	if err != nil {
		return n, err
	}
	for read := 1; ; read++ {
		req, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, err
		}
		added := false
		if !o.ReadsOnly || req.Op == trace.OpRead {
			counted := pop
			if n < o.Warmup {
				counted = nil
			}
			if added, err = b.add(&req, n, o.BlockSize, sp, counted); err != nil {
				return n, err
			}
			n++
		}
		if !added {
			// Requests skipped, or none of whose keys is sampled, fill no batch, so take never
			// sees a cancellation among them.
			if read%batchRequests == 0 && ctx.Err() != nil {
				return n, ctx.Err()
			}
			continue
		}
		if n <= o.Warmup {
			// Warm-up is the trace's first requests, so a batch's are its first.
			b.warm = len(b.reqs)
		}
		if len(b.reqs) == batchRequests || len(b.keys) >= batchKeys {
			send(b)
			if b, err = take(); err != nil {
				return n, err
			}
		}
	}
	if len(b.reqs) > 0 {
		send(b)
	} else {
		free <- b
	}
	return n, nil
}

// pool makes the batches of a pass with consumers readers, and the channels that carry them.
func pool(consumers int) (outs []chan *batch, free chan *batch) {
	size := max(poolBatches*consumers, minPoolBatches)
	free = make(chan *batch, size)
	for range size {
		free <- &batch{}
	}
	outs = make([]chan *batch, consumers)
	for i := range outs {
		outs[i] = make(chan *batch, size)
	}
	return outs, free
}

// release hands b back to free once every consumer is done with it.
func release(b *batch, free chan *batch) {
	if b.pending.Add(-1) == 0 {
		free <- b // never blocks: free has room for every batch
	}
}

// Summary is what one pass over a trace found.
type Summary struct {
	// Requests is the number of simulated requests (all of them, warm-up included).
	Requests int64
	// Distinct is the number of distinct keys; only CountKeys counts them.
	Distinct int64
	// Results are Run's, in job order.
	Results []Result
}

// CountKeys reads r once and counts its requests and distinct keys, the base of cache sizes given
// as fractions. It holds one slot per distinct key (16 to 32 bytes each), never the trace. It
// counts every key, sampled or not (o.Sample is ignored), so that sizes given as fractions are
// those of an exact replay, which an estimate is compared with.
func CountKeys(ctx context.Context, r trace.Reader, o Options) (Summary, error) {
	o.Sample = Sampling{}
	outs, free := pool(1)
	var done atomic.Int64
	stop := startProgress(o.Progress, "counting keys", r, &done)
	seen := newKeySet()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for b := range outs[0] {
			for _, k := range b.keys {
				seen.add(k)
			}
			release(b, free)
		}
	}()
	n, err := stream(ctx, r, o, outs, free, &done, nil)
	<-finished
	stop(n)
	if err != nil {
		return Summary{}, err
	}
	if n == 0 {
		return Summary{}, errNoRequests
	}
	return Summary{Requests: n, Distinct: int64(seen.len())}, nil
}

var errNoRequests = errors.New("the trace has no requests to simulate")

// ErrWarmup is the error of a run whose warm-up is not shorter than the trace: a mistake in the
// command, which a caller reports as such.
var ErrWarmup = errors.New("warm-up past the end of the trace")
