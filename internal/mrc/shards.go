package mrc

import (
	"container/heap"
	"fmt"

	"github.com/tierblk/tierblk/internal/policy"
)

// Config configures a SHARDS estimator.
type Config struct {
	// Rate is the sampling rate, above 0 and at most 1; 0 means 1 (every key, an exact curve). With
	// MaxKeys it is the rate to start at.
	Rate float64
	// MaxKeys, if above 0, is the most keys the estimator holds: past it, the rate is lowered to
	// drop the sampled key with the largest hash (and with it every key above that hash).
	MaxKeys int
	// Seed seeds the hash that chooses the sampled keys; 0 means DefaultSeed.
	Seed uint64
}

// SHARDS estimates LRU's miss-ratio curve from the reuse distances of sampled keys. Not safe for
// concurrent use. Its memory is a map entry, two slots of the access order and (with a budget) a
// heap entry per sampled key, and a histogram of at most 64 KiB.
type SHARDS struct {
	seed uint64
	// threshold: a key is sampled when its hash is below it (all: every key); rate is its share
	// of the hashes, by which distances and counts are scaled.
	threshold uint64
	all       bool
	rate      float64
	maxKeys   int
	// last is each sampled key's last access: its slot in the access order, and its hash.
	last map[policy.Key]entry
	// bySlot marks the slots that are some sampled key's last access, in access order: the keys
	// accessed between two slots are the marks between them (an LRU stack distance). slotKey is
	// the key whose slot it is; next is the slot the next access takes.
	bySlot  fenwick
	slotKey []policy.Key
	next    int
	// largest is a max-heap of the sampled keys by hash, the next to leave when over MaxKeys.
	largest byHash
	hist    histogram
	// refs and bytes are every counted access and its bytes, sampled or not: what the weighted
	// sampled accesses estimate (SHARDS-adj puts the difference at distance 0).
	refs, bytes int64
}

type entry struct {
	slot int
	hash uint64
}

type heapEntry struct {
	hash uint64
	key  policy.Key
}

// minSlots is the fewest slots of the access order: compacting it costs a pass over its live
// slots, so it must hold several times as many accesses as there are live keys.
const minSlots = 1024

// NewSHARDS builds an estimator.
func NewSHARDS(c Config) (*SHARDS, error) {
	if c.Rate == 0 {
		c.Rate = 1
	}
	if c.MaxKeys < 0 {
		return nil, fmt.Errorf("a budget of %d keys: give at least 1, or 0 for none", c.MaxKeys)
	}
	sp, err := NewSampler(c.Rate, c.Seed)
	if err != nil {
		return nil, err
	}
	slots := minSlots
	if c.MaxKeys > 0 {
		slots = max(slots, 2*c.MaxKeys)
	}
	return &SHARDS{
		seed: sp.seed, threshold: sp.threshold, all: sp.all, rate: sp.Rate(), maxKeys: c.MaxKeys,
		last: map[policy.Key]entry{}, bySlot: newFenwick(slots), slotKey: make([]policy.Key, slots),
	}, nil
}

// Access counts an access of k that read or wrote bytes (for the byte miss ratio).
func (s *SHARDS) Access(k policy.Key, bytes int64) { s.access(k, bytes, true) }

// Warm replays an access of k without counting it: a warm-up access, as the simulator's --warmup.
func (s *SHARDS) Warm(k policy.Key) { s.access(k, 0, false) }

func (s *SHARDS) access(k policy.Key, bytes int64, counted bool) {
	if counted {
		s.refs++
		s.bytes += bytes
	}
	h := Hash(k, s.seed)
	if !s.all && h >= s.threshold {
		return
	}
	// Each sampled access stands for 1/rate accesses of keys like it; the rate is the one this
	// access was sampled at (the fixed-size variant's rate only falls).
	w := 1 / s.rate
	if s.next == len(s.slotKey) {
		s.compact()
	}
	e, seen := s.last[k]
	if seen {
		d := s.bySlot.prefix(s.next) - s.bySlot.prefix(e.slot+1)
		s.bySlot.add(e.slot, -1)
		if counted {
			s.hist.add(float64(d)*w, w, float64(bytes)*w)
		}
	} else {
		if counted {
			s.hist.cold(w, float64(bytes)*w)
		}
		if s.maxKeys > 0 {
			s.push(heapEntry{h, k})
		}
	}
	s.last[k] = entry{s.next, h}
	s.slotKey[s.next] = k
	s.bySlot.add(s.next, 1)
	s.next++
	if s.maxKeys > 0 && len(s.last) > s.maxKeys {
		s.lower()
	}
}

// lower drops the sampled key with the largest hash and samples only keys below its hash from now
// on: the fixed-size variant's step, which keeps len(last) at maxKeys.
func (s *SHARDS) lower() {
	top := s.pop()
	s.threshold, s.all = top.hash, false
	s.rate = float64(top.hash) / (1 << 64)
	e := s.last[top.key]
	s.bySlot.add(e.slot, -1)
	delete(s.last, top.key)
}

// compact renumbers the live slots 0, 1, ... in their order, so that the access order takes no
// more room than twice the sampled keys: a pass over the slots, once per as many accesses as
// there are free slots.
func (s *SHARDS) compact() {
	live := 0
	for i := range s.next {
		k := s.slotKey[i]
		if e, ok := s.last[k]; ok && e.slot == i {
			s.slotKey[live] = k
			s.last[k] = entry{live, e.hash}
			live++
		}
	}
	if size := len(s.slotKey); live > size/2 {
		// Only without a budget can the keys outgrow the slots: double them.
		s.slotKey = append(s.slotKey, make([]policy.Key, size)...)
		s.bySlot = newFenwick(len(s.slotKey))
	}
	s.bySlot.fill(live)
	s.next = live
}

// byHash is a max-heap of sampled keys by hash (container/heap).
type byHash []heapEntry

func (h byHash) Len() int           { return len(h) }
func (h byHash) Less(i, j int) bool { return h[i].hash > h[j].hash }
func (h byHash) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *byHash) Push(x any)        { *h = append(*h, x.(heapEntry)) }
func (h *byHash) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (s *SHARDS) push(e heapEntry) { heap.Push(&s.largest, e) }

func (s *SHARDS) pop() heapEntry { return heap.Pop(&s.largest).(heapEntry) }

// Accesses is the number of accesses counted, sampled or not.
func (s *SHARDS) Accesses() int64 { return s.refs }

// Len is the number of keys the estimator holds.
func (s *SHARDS) Len() int { return len(s.last) }

// Rate is the sampling rate now.
func (s *SHARDS) Rate() float64 { return s.rate }

// Limit is the largest hash the estimator samples now (it only falls): a caller that filters keys
// before Access, as a daemon does on its request path, may drop every key whose Hash is above it.
func (s *SHARDS) Limit() uint64 { return limit(s.threshold, s.all) }

// Misses is the weighted accesses counted so far that an LRU cache of size keys misses, cold ones
// included: a count of accesses, not a ratio, so that a caller can difference two readings for a
// window and divide by accesses it counts itself (the SHARDS-adj denominator).
func (s *SHARDS) Misses(size float64) float64 {
	refs, _ := s.hist.misses(size)
	return refs
}

// Point is the estimated miss ratios of an LRU cache of Size keys.
type Point struct {
	Size          int
	MissRatio     float64
	ByteMissRatio float64
}

// Curve estimates LRU's miss ratios at each size (in keys) over the accesses counted so far.
//
// The weighted sampled accesses estimate the accesses of all keys, but a sample that happens to
// hold a key hotter or colder than its share strays from them: SHARDS-adj (the paper's correction)
// counts the difference as accesses at distance 0, hits at every size, so that the curve's
// denominator is the accesses counted, exactly.
func (s *SHARDS) Curve(sizes []int) []Point {
	out := make([]Point, len(sizes))
	for i, c := range sizes {
		refs, bytes := s.hist.misses(float64(c))
		out[i] = Point{Size: c, MissRatio: ratio(refs, float64(s.refs)), ByteMissRatio: ratio(bytes, float64(s.bytes))}
	}
	return out
}

// ratio is part/whole clipped to [0, 1]: a sample can estimate more misses than accesses.
func ratio(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return min(max(part/whole, 0), 1)
}

// fenwick is a binary indexed tree of counts per slot: a count's update and a prefix's sum in
// O(log n).
type fenwick []int32

func newFenwick(n int) fenwick { return make(fenwick, n+1) }

// add adds d to slot i.
func (f fenwick) add(i, d int) {
	for i++; i < len(f); i += i & -i {
		f[i] += int32(d)
	}
}

// prefix is the sum of slots [0, i).
func (f fenwick) prefix(i int) int {
	s := 0
	for ; i > 0; i -= i & -i {
		s += int(f[i])
	}
	return s
}

// fill sets slots [0, n) to 1 in an empty tree, in O(len) rather than O(n log n): node i covers
// the slots (i - lowbit(i), i].
func (f fenwick) fill(n int) {
	for i := 1; i < len(f); i++ {
		lo := i - i&-i
		f[i] = int32(max(0, min(i, n)-lo))
	}
}
