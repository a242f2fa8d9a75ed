package policy

import (
	"math"
	"math/bits"
)

// WTinyLFU is W-TinyLFU: new keys enter a small LRU window (1 % of the capacity); a key leaving the
// window enters the main cache, a segmented LRU, if the main cache has room or if a frequency sketch
// says it was accessed more often than the main cache's victim, and is evicted otherwise. The window
// absorbs bursts; the frequency filter keeps one-hit wonders and scans out of the main cache.
// Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM
// Transactions on Storage 13(4), 2017.
//
// It follows libCacheSim's WTinyLFU (cache/eviction/WTinyLFU.c) with its defaults
// "main-cache=SLRU,window-size=0.01":
//   - the window holds floor(0.01 x capacity) keys; the main cache, the rest, is an SLRU of a
//     probationary segment of floor(0.2 x main) keys and a protected one of the rest (libCacheSim's
//     SLRU "seg-size=1:4"). A key enters main in the probationary segment, or in the protected one
//     when the probationary one is full; a hit in the probationary segment moves the key into the
//     protected one, whose least recently used key, if that leaves it over its share, goes back to
//     the probationary segment's head;
//   - eviction takes the window's oldest key: into main while main has room, else against main's
//     victim (the probationary segment's tail, or the protected one's when it is empty): the window
//     key replaces the victim if its estimate is strictly higher, else it is the key evicted. A cold
//     cache fills the window past its share, so the first eviction moves window keys to main until
//     main is full;
//   - the frequency sketch is a counting Bloom filter sized for the main cache's keys at a 0.1 %
//     error (14.4 counters a key, 10 hashes); an access increments all of a key's counters, the
//     estimate is their minimum. It counts inserts, hits in main (not in the window) and every window
//     key that leaves the window, and all counters halve after 32 x main hits in main. It is
//     allocated up front, about 29 bytes per key of capacity.
//
// Differences: the sketch hashes keys with its own mixer (libCacheSim uses xxHash), its counters are
// 16 bits wide and saturate (libCacheSim's are 32 bits), to halve its memory, and it is sized for at
// least 64 keys (a smaller one counts mostly collisions; libCacheSim caches nothing below 100 keys).
// After a window key has replaced main's victim, libCacheSim goes on with the next window key, or,
// the window being empty, evicts main's next victim, often the key just admitted; here that
// eviction is done (on the shared traces the miss ratios differ by less than 0.001). libCacheSim sizes
// the protected segment floor(0.8 x main), so the segments may add up to a key less than main; its
// probationary segment then takes the spare key, and a hit there may evict (a key comes back from
// the protected segment into a full one), which an engine could not use: here the protected segment
// takes the rest, and a hit never evicts. Where libCacheSim caches nothing (a window below one key,
// capacity < 100, or a probationary segment below one key, main < 5) the window and the
// probationary segment hold at least one key here; at capacity 1 NewWTinyLFU returns an LRU of one
// key.
type WTinyLFU struct {
	base
	a                          arena[uint8] // payload: the list that holds the key (wtWindow ...)
	window, probation, protect list
	mainCap                    int
	probationCap, protectCap   int
	sketch                     freqSketch
	mainHits, decayEvery       int
}

const (
	wtWindow uint8 = iota
	wtProbation
	wtProtected
)

// libCacheSim's WTinyLFU defaults.
const (
	wtWindowRatio    = 0.01
	wtProbationShare = 0.2   // seg-size=1:4
	wtDecaySamples   = 32    // main hits between two halvings, per key of main
	wtSketchError    = 0.001 // the sketch's false positive rate at the main cache's key count
	wtSketchMinKeys  = 64
)

// NewWTinyLFU builds a W-TinyLFU policy.
func NewWTinyLFU(cfg Config) Eviction {
	if cfg.Capacity < 2 {
		return NewLRU(cfg)
	}
	p := &WTinyLFU{base: newBase(cfg), window: newList(), probation: newList(), protect: newList()}
	windowCap := max(1, int(float64(p.capacity)*wtWindowRatio))
	p.mainCap = p.capacity - windowCap
	p.probationCap = max(1, int(wtProbationShare*float64(p.mainCap)))
	p.protectCap = p.mainCap - p.probationCap
	p.sketch = newFreqSketch(max(p.mainCap, wtSketchMinKeys), wtSketchError)
	p.decayEvery = wtDecaySamples * p.mainCap
	p.a = newArena[uint8](p.capacity+1, cfg.Preallocate)
	return p
}

// Get reports whether k is cached. A hit in the window moves k to the window's head; a hit in main
// is counted in the sketch and moves k to the protected segment's head.
func (p *WTinyLFU) Get(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	switch p.a.at(i).meta {
	case wtWindow:
		p.a.moveToFront(&p.window, i)
		return true
	case wtProtected:
		p.a.moveToFront(&p.protect, i)
	case wtProbation:
		p.a.unlink(&p.probation, i)
		p.a.at(i).meta = wtProtected
		p.a.pushFront(&p.protect, i)
		if p.protect.len > p.protectCap {
			t := p.protect.tail
			p.a.unlink(&p.protect, t)
			p.a.at(t).meta = wtProbation
			p.a.pushFront(&p.probation, t)
		}
	}
	p.sketch.add(k)
	if p.mainHits++; p.mainHits >= p.decayEvery {
		p.mainHits = 0
		p.sketch.halve()
	}
	return true
}

// Insert evicts until k fits, then caches k at the window's head and counts it.
func (p *WTinyLFU) Insert(k Key) {
	if _, ok := p.a.lookup(k); ok {
		return
	}
	for p.Len() >= p.capacity {
		p.evict()
	}
	i := p.a.alloc(k)
	p.a.at(i).meta = wtWindow
	p.a.pushFront(&p.window, i)
	p.sketch.add(k)
}

// evict makes room for one key: it moves window keys into main while main has room, then evicts
// the window's oldest key or main's victim, whichever the sketch says is accessed less often. The
// window is never empty here: main holds at most mainCap keys, so a full cache has the rest in the
// window.
func (p *WTinyLFU) evict() {
	for p.mainLen() < p.mainCap {
		w := p.window.tail
		p.a.unlink(&p.window, w)
		p.insertMain(w)
		p.sketch.add(p.a.at(w).key)
	}
	w := p.window.tail
	k := p.a.at(w).key
	if p.sketch.estimate(k) > p.sketch.estimate(p.a.at(p.mainVictim()).key) {
		p.evictMain()
		p.a.unlink(&p.window, w)
		p.insertMain(w)
	} else {
		p.a.remove(&p.window, w)
		p.evicted(k)
	}
	p.sketch.add(k)
}

func (p *WTinyLFU) mainLen() int { return p.probation.len + p.protect.len }

// insertMain links the unlinked node i into the probationary segment, or the protected one when the
// probationary one is full (main has room, so one of them has).
func (p *WTinyLFU) insertMain(i int32) {
	if p.probation.len >= p.probationCap {
		p.a.at(i).meta = wtProtected
		p.a.pushFront(&p.protect, i)
		return
	}
	p.a.at(i).meta = wtProbation
	p.a.pushFront(&p.probation, i)
}

// mainVictim is the node main evicts next: the probationary segment's tail, or the protected
// segment's when the probationary one is empty.
func (p *WTinyLFU) mainVictim() int32 {
	if p.probation.len > 0 {
		return p.probation.tail
	}
	return p.protect.tail
}

func (p *WTinyLFU) evictMain() {
	i := p.mainVictim()
	if p.a.at(i).meta == wtProbation {
		p.evicted(p.a.remove(&p.probation, i))
	} else {
		p.evicted(p.a.remove(&p.protect, i))
	}
}

// Remove drops k.
func (p *WTinyLFU) Remove(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	switch p.a.at(i).meta {
	case wtWindow:
		p.a.remove(&p.window, i)
	case wtProbation:
		p.a.remove(&p.probation, i)
	default:
		p.a.remove(&p.protect, i)
	}
	return true
}

// Len is the number of cached keys.
func (p *WTinyLFU) Len() int { return p.window.len + p.mainLen() }

// freqSketch is a counting Bloom filter: each key maps to hashes counters by double hashing; add
// increments them all, estimate is the smallest. It is the "minimal increment CBF" of libCacheSim
// (dataStructure/minimalIncrementCBF.c), which despite its name increments every counter.
type freqSketch struct {
	counters []uint16
	hashes   uint32
}

// newFreqSketch sizes a sketch for entries keys at a false positive rate errRate, as a Bloom filter
// would be: ln(1/errRate)/ln(2)^2 counters per key and ln(2) times that many hashes.
func newFreqSketch(entries int, errRate float64) freqSketch {
	perKey := -math.Log(errRate) / (math.Ln2 * math.Ln2)
	hashes := int(math.Ceil(math.Ln2 * perKey))
	n := int(min(math.Ceil(perKey*float64(entries)), math.MaxInt32))
	if n < hashes {
		n = 2 * hashes
	}
	return freqSketch{counters: make([]uint16, n), hashes: uint32(hashes)}
}

// slots returns the two hashes of k whose combinations a + i*b pick its counters (Kirsch and
// Mitzenmacher's double hashing); b is odd, so the combinations differ.
func (s *freqSketch) slots(k Key) (a, b uint64) {
	h := mix64(uint64(k))
	return h, bits.RotateLeft64(h, 32) | 1
}

// index maps a hash onto the counters by its top bits (Lemire's multiply-shift), without a division.
func (s *freqSketch) index(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(s.counters)))
	return int(hi)
}

func (s *freqSketch) add(k Key) {
	a, b := s.slots(k)
	for i := range uint64(s.hashes) {
		c := &s.counters[s.index(a+i*b)]
		if *c < math.MaxUint16 {
			*c++
		}
	}
}

func (s *freqSketch) estimate(k Key) uint16 {
	a, b := s.slots(k)
	est := uint16(math.MaxUint16)
	for i := range uint64(s.hashes) {
		est = min(est, s.counters[s.index(a+i*b)])
	}
	return est
}

// halve ages the sketch: old accesses count half as much.
func (s *freqSketch) halve() {
	for i := range s.counters {
		s.counters[i] >>= 1
	}
}

// mix64 is SplitMix64's output function: every bit of x affects every bit of the result, so nearby
// keys (consecutive cache lines) land on unrelated counters, and key 0 does not hash to 0.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
