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
}

// Check reports options that no trace can satisfy.
func (o Options) Check() error {
	if o.Warmup < 0 {
		return fmt.Errorf("--warmup %d must be at least 0", o.Warmup)
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
	// first is the index of reqs[0] among the simulated requests of the trace.
	first int64
	reqs  []Req
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

// add appends req to the batch.
func (b *batch) add(req *trace.Request, blockSize int64) error {
	vol := policy.Key(req.Volume) << volumeShift
	b.reqs = append(b.reqs, Req{Offset: req.Offset, Length: req.Length, Write: req.Op == trace.OpWrite})
	if blockSize == 0 {
		b.keys = append(b.keys, vol^policy.Key(req.ID))
	} else {
		first := req.Offset / blockSize
		last := first
		if req.Length > 0 {
			last = (req.Offset + req.Length - 1) / blockSize
		}
		if last-first >= maxRequestKeys {
			return fmt.Errorf("request %d touches %d blocks of %d bytes: use a larger --block-size", b.first+int64(len(b.reqs)), last-first+1, blockSize)
		}
		for k := first; k <= last; k++ {
			b.keys = append(b.keys, vol^policy.Key(k))
		}
	}
	b.starts = append(b.starts, uint32(len(b.keys)))
	return nil
}

func (b *batch) reset(first int64) {
	b.first = first
	b.reqs = b.reqs[:0]
	b.keys = b.keys[:0]
	b.starts = append(b.starts[:0], 0)
}

// stream decodes r into batches and hands each to every channel of outs, taking empty batches
// from free, which bounds the batches in flight; a consumer returns a batch with release. It
// closes outs when the trace ends, fails or ctx is cancelled, and returns the number of requests
// it handed over.
func stream(ctx context.Context, r trace.Reader, o Options, outs []chan *batch, free chan *batch, done *atomic.Int64) (int64, error) {
	defer func() {
		for _, c := range outs {
			close(c)
		}
	}()
	var n int64
	take := func() (*batch, error) {
		select {
		case b := <-free:
			b.reset(n)
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
		if o.ReadsOnly && req.Op != trace.OpRead {
			// Skipped requests fill no batch, so take never sees a cancellation among them.
			if read%batchRequests == 0 && ctx.Err() != nil {
				return n, ctx.Err()
			}
			continue
		}
		if err := b.add(&req, o.BlockSize); err != nil {
			return n, err
		}
		n++
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
// as fractions. It holds one slot per distinct key (16 to 32 bytes each), never the trace.
func CountKeys(ctx context.Context, r trace.Reader, o Options) (Summary, error) {
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
	n, err := stream(ctx, r, o, outs, free, &done)
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
