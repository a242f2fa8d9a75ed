package sim

import (
	"context"
	"time"

	"github.com/tierblk/tierblk/internal/fetch"
	"github.com/tierblk/tierblk/internal/policy"
)

// maxLine is the largest line the daemon has, and so the largest block size the line model takes.
const maxLine = 1 << 20

// lineBlocks holds one bit per 4 KiB block of a line, as the daemon's valid bits do.
type lineBlocks [maxLine / fetch.BlockSize / 64]uint64

func blockRange(lo, hi int64) lineBlocks {
	var b lineBlocks
	for i := lo / fetch.BlockSize; i < (hi+fetch.BlockSize-1)/fetch.BlockSize; i++ {
		b[i/64] |= 1 << (i % 64)
	}
	return b
}

func (b lineBlocks) covers(o lineBlocks) bool {
	for i := range b {
		if o[i]&^b[i] != 0 {
			return false
		}
	}
	return true
}

func (b *lineBlocks) add(o lineBlocks) {
	for i := range b {
		b[i] |= o[i]
	}
}

// keyBlock is the block (line) number of a key, without its volume.
func keyBlock(k policy.Key) int64 { return int64(k & (1<<volumeShift - 1)) }

// span returns the bytes [from, to) of key k's line that request r touches.
func (w *Workload) span(r *Req, k policy.Key) (from, to int64) {
	start := keyBlock(k) * w.BlockSize
	return max(r.Offset, start) - start, min(r.Offset+r.Length, start+w.BlockSize) - start
}

// fetchedWhole is what a miss of key k by read r fetches in the whole-object model: the key, if
// the admission policy took it, else the part of it r asked for.
func (w *Workload) fetchedWhole(r *Req, k policy.Key, admitted bool) int64 {
	if w.BlockSize == 0 {
		return r.Length
	}
	if admitted {
		return w.BlockSize
	}
	from, to := w.span(r, k)
	return to - from
}

// replayBlocks runs one cache over the workload as the daemon's lines behave (RunOptions.Blocks):
// a line holds the blocks fetched or written into it; a read is a hit where its line holds every
// block it touches; the missed lines of a read are decided by the admission policy, then fetched as
// package fetch says, a sequential stream being followed as the daemon follows it; a write makes
// the whole blocks it covers valid in a line the cache holds or admits, and fetches nothing.
//
// The daemon follows streams per run of adjacent missed lines; here per read, which is the same
// for the reads that touch one or two lines.
func replayBlocks(ctx context.Context, w *Workload, j Job, warmup int) (Result, error) {
	held := map[policy.Key]lineBlocks{}
	c, err := newCacheEvicting(j, func(k policy.Key) { delete(held, k) })
	if err != nil {
		return Result{}, err
	}
	streams := map[policy.Key]*fetch.Streams{} // by volume
	type seg struct {
		k        policy.Key
		from, to int64
		hit      bool
		cached   bool // held, or admitted now
	}
	var segs []seg
	var n counts
	start := time.Now()
	for i := range w.Reqs {
		if i&0xffff == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		counted := i >= warmup
		r := &w.Reqs[i]
		keys := w.Keys[w.Starts[i]:w.Starts[i+1]]
		if counted && !r.Write {
			n.asked += r.Length
		}
		segs = segs[:0]
		missed := false
		for _, k := range keys {
			from, to := w.span(r, k)
			have, ok := held[k]
			hit := ok && (r.Write || have.covers(blockRange(from, to)))
			if hit {
				c.ev.Get(k)
				c.hit()
			} else {
				missed = true
			}
			segs = append(segs, seg{k: k, from: from, to: to, hit: hit, cached: ok})
			if counted {
				n.accesses++
				n.bytes += w.BlockSize
				if !hit {
					n.misses++
					n.missBytes += w.BlockSize
				}
			}
		}
		if r.Write {
			for _, s := range segs {
				// Whole blocks only: a write never reads the backend to complete a block.
				lo, hi := (s.from+fetch.BlockSize-1)/fetch.BlockSize*fetch.BlockSize, s.to/fetch.BlockSize*fetch.BlockSize
				if s.to == w.BlockSize {
					hi = s.to
				}
				if !s.hit && c.adm.Admit(policy.Access{Key: s.k, Offset: r.Offset, Length: r.Length, Write: true}) {
					c.ev.Insert(s.k)
					held[s.k] = lineBlocks{}
				}
				if have, ok := held[s.k]; ok && hi > lo {
					have.add(blockRange(lo, hi))
					held[s.k] = have
				}
			}
			continue
		}
		if !missed {
			continue
		}
		vol := keys[0] >> volumeShift
		st := streams[vol]
		if st == nil {
			st = &fetch.Streams{}
			streams[vol] = st
		}
		first, last := -1, -1
		for x, s := range segs {
			if !s.hit {
				if first < 0 {
					first = x
				}
				last = x
			}
		}
		lineStart := func(s seg) int64 { return keyBlock(s.k) * w.BlockSize }
		st.Follow(lineStart(segs[first])+segs[first].from, func(seq bool) int64 {
			for x := range segs {
				s := &segs[x]
				if !s.hit && c.adm.Admit(policy.Access{Key: s.k, Offset: r.Offset, Length: r.Length, Sequential: seq || len(segs) > 1}) {
					s.cached = true
				}
			}
			reach := fetch.Blocks
			if seq {
				reach = fetch.Ahead
			}
			_, hi := fetch.Range(segs[last].from, segs[last].to, w.BlockSize, segs[last].cached, reach)
			for x := first; x <= last; x++ {
				s := segs[x]
				if s.hit {
					continue
				}
				lo, hi := fetch.Range(s.from, s.to, w.BlockSize, s.cached, reach)
				if counted {
					n.fetched += hi - lo
				}
				if !s.cached {
					continue
				}
				have, ok := held[s.k]
				if !ok {
					c.ev.Insert(s.k)
				}
				have.add(blockRange(lo, hi))
				held[s.k] = have
			}
			return lineStart(segs[last]) + hi
		})
	}
	return n.result(j, w.Requests()-warmup, w.Requests(), time.Since(start)), nil
}
