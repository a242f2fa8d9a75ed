// Package sim replays block traces through the cache policies of internal/policy: one cache per
// (policy, size), run in parallel on a worker pool, reporting miss ratios as libCacheSim does, in
// tables, CSV, JSON and miss-ratio-curve plots.
//
// It drives the very policy code the daemon runs and must never reimplement a policy or count a
// hit differently from the engine: a hit is a key the eviction policy holds when it is requested.
package sim

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/trace"
)

// LoadOptions say how requests become keys.
type LoadOptions struct {
	// BlockSize splits each request into BlockSize-byte blocks, one key each; 0 gives one key per
	// request (the trace's own id, as libCacheSim does).
	BlockSize int64
	// ReadsOnly drops every request that is not a read.
	ReadsOnly bool
	// CountDistinct counts the distinct keys, which fractional cache sizes need. It is optional
	// because on a multi-million-request trace it costs about as much as reading the file.
	CountDistinct bool
	// Progress, if not nil, receives a line now and then while loading a long trace.
	Progress io.Writer
}

// Workload is a trace turned into the key sequence every simulated cache replays. It is read-only
// once loaded, so many caches replay it at once.
type Workload struct {
	Keys []policy.Key
	// Starts[i] is the index in Keys of request i's first key; Starts has one extra entry at the end.
	Starts []uint32
	Reqs   []Req
	// Distinct is the number of distinct keys, the base of fractional cache sizes; 0 unless
	// LoadOptions.CountDistinct.
	Distinct  int
	BlockSize int64
}

// Req is what admission policies and byte counts need of a request.
type Req struct {
	Offset, Length int64
	Write          bool
}

// maxKeys bounds a workload so that a tiny --block-size on a huge trace fails clearly instead of
// exhausting memory.
const maxKeys = 1 << 31

// volumeShift places the volume number in a key's top bits so that the disks of a multi-volume
// trace never share keys.
const volumeShift = 48

// Load reads every request of r.
func Load(r trace.Reader, o LoadOptions) (*Workload, error) {
	w := &Workload{BlockSize: o.BlockSize}
	var seen *keySet
	if o.CountDistinct {
		seen = newKeySet()
	}
	next := time.Now().Add(time.Second)
	for {
		req, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if o.ReadsOnly && req.Op != trace.OpRead {
			continue
		}
		w.Starts = append(w.Starts, uint32(len(w.Keys)))
		w.Reqs = append(w.Reqs, Req{Offset: req.Offset, Length: req.Length, Write: req.Op == trace.OpWrite})
		vol := policy.Key(req.Volume) << volumeShift
		if o.BlockSize == 0 {
			w.Keys = append(w.Keys, vol^policy.Key(req.ID))
		} else {
			first := req.Offset / o.BlockSize
			last := first
			if req.Length > 0 {
				last = (req.Offset + req.Length - 1) / o.BlockSize
			}
			for b := first; b <= last; b++ {
				w.Keys = append(w.Keys, vol^policy.Key(b))
			}
		}
		if len(w.Keys) > maxKeys {
			return nil, fmt.Errorf("more than %d keys: use a larger --block-size", maxKeys)
		}
		if seen != nil {
			for _, k := range w.Keys[w.Starts[len(w.Starts)-1]:] {
				seen.add(k)
			}
		}
		if o.Progress != nil && len(w.Reqs)%65536 == 0 && time.Now().After(next) {
			fmt.Fprintf(o.Progress, "\rloading: %d requests", len(w.Reqs))
			next = time.Now().Add(time.Second)
		}
	}
	if seen != nil {
		w.Distinct = seen.len()
	}
	if o.Progress != nil && len(w.Reqs) >= 65536 {
		fmt.Fprintf(o.Progress, "\rloaded: %d requests, %d keys\n", len(w.Reqs), len(w.Keys))
	}
	w.Starts = append(w.Starts, uint32(len(w.Keys)))
	if len(w.Reqs) == 0 {
		return nil, errors.New("the trace has no requests to simulate")
	}
	return w, nil
}

// Requests is the number of requests.
func (w *Workload) Requests() int { return len(w.Reqs) }

// keyBytes is the size a key of request i stands for: a block, or the whole request.
func (w *Workload) keyBytes(i int) int64 {
	if w.BlockSize > 0 {
		return w.BlockSize
	}
	return w.Reqs[i].Length
}
