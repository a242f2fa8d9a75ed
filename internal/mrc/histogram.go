package mrc

import (
	"math"
	"math/bits"
)

// histogram counts weighted accesses by reuse distance, in buckets that are exact below
// 2×subBuckets and then split each power of two into subBuckets: a distance's bucket is within
// 1/subBuckets of it, and the whole histogram never exceeds 64×subBuckets buckets, however far
// the distances reach (a sample of 10 million keys scales to distances of 10 million).
type histogram struct {
	refs, bytes         []float64
	coldRefs, coldBytes float64
}

// subBuckets: 128 keeps a bucket within 0.8 % of its distance, finer than sizes are chosen.
const (
	subBits    = 7
	subBuckets = 1 << subBits
)

// bucket is the index of distance d's bucket.
func bucket(d uint64) int {
	if d < 2*subBuckets {
		return int(d)
	}
	shift := bits.Len64(d) - (subBits + 1)
	return 2*subBuckets + (shift-1)*subBuckets + int(d>>shift) - subBuckets
}

// bounds are the distances [lo, hi) of bucket i.
func bounds(i int) (lo, hi float64) {
	if i < 2*subBuckets {
		return float64(i), float64(i + 1)
	}
	shift := (i-2*subBuckets)/subBuckets + 1
	m := uint64((i-2*subBuckets)%subBuckets + subBuckets)
	return float64(m << shift), float64((m + 1) << shift)
}

// add counts an access at distance d (scaled, so not whole) of weight w and bytes b.
func (h *histogram) add(d, w, b float64) {
	i := bucket(uint64(math.Min(d, math.MaxUint64/2)))
	if i >= len(h.refs) {
		n := max(i+1, 2*len(h.refs))
		h.refs = append(h.refs, make([]float64, n-len(h.refs))...)
		h.bytes = append(h.bytes, make([]float64, n-len(h.bytes))...)
	}
	h.refs[i] += w
	h.bytes[i] += b
}

// cold counts a first access, a miss at every size.
func (h *histogram) cold(w, b float64) {
	h.coldRefs += w
	h.coldBytes += b
}

// misses is the weight and bytes of the accesses an LRU cache of size keys misses: those at a
// distance of size or more, and the cold ones. A bucket that straddles size counts in proportion.
func (h *histogram) misses(size float64) (refs, bytes float64) {
	refs, bytes = h.coldRefs, h.coldBytes
	for i := range h.refs {
		lo, hi := bounds(i)
		switch {
		case lo >= size:
			refs += h.refs[i]
			bytes += h.bytes[i]
		case hi > size:
			f := (hi - size) / (hi - lo)
			refs += f * h.refs[i]
			bytes += f * h.bytes[i]
		}
	}
	return refs, bytes
}
