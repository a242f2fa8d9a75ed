package sim

import (
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

// span returns the bytes [from, to) of key k's block (of blockSize bytes) that request r touches.
func span(r *Req, k policy.Key, blockSize int64) (from, to int64) {
	start := keyBlock(k) * blockSize
	return max(r.Offset, start) - start, min(r.Offset+r.Length, start+blockSize) - start
}

// asked is the bytes of key k that request r reads: all of r with one key per request, else the
// part of k's block it touches. The keys of a request ask for the whole of it between them.
func asked(r *Req, k policy.Key, blockSize int64) int64 {
	if blockSize == 0 {
		return r.Length
	}
	from, to := span(r, k, blockSize)
	return to - from
}

// fetchedWhole is what a miss of key k by read r fetches in the whole-object model: the key, if
// the admission policy took it, else the part of it r asked for.
func fetchedWhole(r *Req, k policy.Key, blockSize int64, admitted bool) int64 {
	if blockSize == 0 {
		return r.Length
	}
	if admitted {
		return blockSize
	}
	from, to := span(r, k, blockSize)
	return to - from
}

// lineSim is a cache of the daemon's lines (Options.Blocks): a line holds the blocks fetched or
// written into it; a read is a hit where its line holds every block it touches; the missed lines
// of a read are decided by the admission policy, then fetched as package fetch says, a sequential
// stream being followed as the daemon follows it; a write makes the whole blocks it covers valid
// in a line the cache holds or admits, and fetches nothing.
//
// The daemon follows streams per run of adjacent missed lines; here per read, which is the same
// for the reads that touch one or two lines.
type lineSim struct {
	job      Job
	c        cache
	held     map[policy.Key]lineBlocks
	streams  map[policy.Key]*fetch.Streams // by volume
	segs     []seg
	n        counts
	warmup   int64
	lineSize int64
	busy     time.Duration
}

// seg is the part of one line that a request touches.
type seg struct {
	k        policy.Key
	from, to int64
	hit      bool
	cached   bool // held, or admitted now
}

func newLineSim(j Job, o Options) (*lineSim, error) {
	s := &lineSim{job: j, held: map[policy.Key]lineBlocks{}, streams: map[policy.Key]*fetch.Streams{}, warmup: o.Warmup, lineSize: o.BlockSize}
	c, err := newCacheEvicting(j, o, func(k policy.Key) { delete(s.held, k) })
	if err != nil {
		return nil, err
	}
	s.c = c
	return s, nil
}

func (s *lineSim) result(total int64, pop *population) Result {
	return s.c.result(s.n, s.job, total-s.warmup, total, s.busy, pop)
}

func (s *lineSim) feed(b *batch) {
	start := time.Now()
	for i := range b.reqs {
		s.request(&b.reqs[i], b.keys[b.starts[i]:b.starts[i+1]], i >= b.warm)
	}
	s.busy += time.Since(start)
}

// request replays one request, whose lines are keys.
func (s *lineSim) request(r *Req, keys []policy.Key, counted bool) {
	c, n, held, size := &s.c, &s.n, s.held, s.lineSize
	segs := s.segs[:0]
	missed := false
	for _, k := range keys {
		from, to := span(r, k, size)
		if counted && !r.Write {
			// Per line, so that under sampling only the sampled lines' bytes count.
			n.asked += to - from
		}
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
			n.access(size, hit)
		}
	}
	s.segs = segs
	if r.Write {
		for _, sg := range segs {
			// Whole blocks only: a write never reads the backend to complete a block.
			lo, hi := (sg.from+fetch.BlockSize-1)/fetch.BlockSize*fetch.BlockSize, sg.to/fetch.BlockSize*fetch.BlockSize
			if sg.to == size {
				hi = sg.to
			}
			if !sg.hit && c.adm.Admit(policy.Access{Key: sg.k, Offset: r.Offset, Length: r.Length, Write: true}) {
				c.ev.Insert(sg.k)
				held[sg.k] = lineBlocks{}
			}
			if have, ok := held[sg.k]; ok && hi > lo {
				have.add(blockRange(lo, hi))
				held[sg.k] = have
			}
		}
		return
	}
	if !missed {
		return
	}
	vol := keys[0] >> volumeShift
	st := s.streams[vol]
	if st == nil {
		st = &fetch.Streams{}
		s.streams[vol] = st
	}
	first, last := -1, -1
	for x, sg := range segs {
		if !sg.hit {
			if first < 0 {
				first = x
			}
			last = x
		}
	}
	lineStart := func(sg seg) int64 { return keyBlock(sg.k) * size }
	st.Follow(lineStart(segs[first])+segs[first].from, func(seq bool) int64 {
		for x := range segs {
			sg := &segs[x]
			if !sg.hit && c.adm.Admit(policy.Access{Key: sg.k, Offset: r.Offset, Length: r.Length, Sequential: seq || len(segs) > 1}) {
				sg.cached = true
			}
		}
		reach := fetch.Blocks
		if seq {
			reach = fetch.Ahead
		}
		_, hi := fetch.Range(segs[last].from, segs[last].to, size, segs[last].cached, reach)
		for x := first; x <= last; x++ {
			sg := segs[x]
			if sg.hit {
				continue
			}
			lo, hi := fetch.Range(sg.from, sg.to, size, sg.cached, reach)
			if counted {
				n.fetched += hi - lo
			}
			if !sg.cached {
				continue
			}
			have, ok := held[sg.k]
			if !ok {
				c.ev.Insert(sg.k)
			}
			have.add(blockRange(lo, hi))
			held[sg.k] = have
		}
		return lineStart(segs[last]) + hi
	})
}
