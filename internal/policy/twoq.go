package policy

// TwoQ is 2Q: a missed key enters A1in, a FIFO of keys seen once; a key pushed out of A1in is
// evicted but remembered in A1out, a FIFO of keys only; a missed key that A1out remembers has been
// seen twice in a short time and enters Am, an LRU of the keys worth keeping. Scans pass through
// A1in without disturbing Am. Johnson and Shasha, "2Q: A Low Overhead High Performance Buffer
// Management Replacement Algorithm", VLDB 1994 (the "full version" with Kin and Kout).
//
// It behaves as libCacheSim's TwoQ (cache/eviction/TwoQ.c) with its defaults
// "Ain-size-ratio=0.25,Aout-size-ratio=0.5": Kin = floor(0.25 x capacity) and A1out holds
// floor(0.5 x capacity) keys. As there:
//   - a hit in A1in changes nothing (FIFO); a hit in Am moves the key to Am's head;
//   - when the cache is full, eviction takes A1in's oldest key (into A1out) while A1in holds more
//     than Kin keys, else Am's least recently used key;
//   - A1in may grow past Kin while Am has room: a cold cache fills A1in first.
//
// Two differences, neither of which changes a miss ratio on the shared traces: libCacheSim consumes
// the A1out entry on the lookup that missed, here Insert does it, before evicting, so the eviction
// sees the same A1out (a miss that the admission policy turns away keeps its A1out entry); and
// libCacheSim keeps Am within capacity - Kin by evicting from it even when the cache has room (A1in
// below Kin), which here only the cache's capacity limits, so that a cache with room never evicts.
type TwoQ struct {
	base
	a arena[uint8] // payload: the list that holds the key (twoqIn ...)
	// in is A1in (resident, FIFO), main is Am (resident, LRU), out is A1out (ghost keys, FIFO).
	in, main, out list
	inCap, outCap int
}

const (
	twoqIn uint8 = iota
	twoqMain
	twoqOut
)

// libCacheSim's TwoQ defaults.
const (
	twoqInRatio  = 0.25
	twoqOutRatio = 0.5
)

// NewTwoQ builds a 2Q policy.
func NewTwoQ(cfg Config) Eviction {
	p := &TwoQ{base: newBase(cfg), in: newList(), main: newList(), out: newList()}
	p.inCap = int(float64(p.capacity) * twoqInRatio)
	p.outCap = int(float64(p.capacity) * twoqOutRatio)
	p.a = newArena[uint8](p.capacity+p.outCap+1, cfg.Preallocate)
	return p
}

// Get reports whether k is cached; a hit in Am makes k its most recently used key. An A1out entry
// is not a hit.
func (p *TwoQ) Get(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	switch p.a.at(i).meta {
	case twoqIn:
		return true
	case twoqMain:
		p.a.moveToFront(&p.main, i)
		return true
	}
	return false
}

// Insert caches k: into Am if A1out remembers it, else into A1in.
func (p *TwoQ) Insert(k Key) {
	seenTwice := false
	if i, ok := p.a.lookup(k); ok {
		if p.a.at(i).meta != twoqOut {
			return
		}
		p.a.remove(&p.out, i)
		seenTwice = true
	}
	for p.Len() >= p.capacity {
		if p.in.len > p.inCap {
			p.demote()
		} else {
			p.evicted(p.a.remove(&p.main, p.main.tail))
		}
	}
	if seenTwice {
		i := p.a.alloc(k)
		p.a.at(i).meta = twoqMain
		p.a.pushFront(&p.main, i)
		return
	}
	p.a.pushFront(&p.in, p.a.alloc(k))
}

// demote evicts A1in's oldest key and remembers it at the head of A1out, which forgets its own
// oldest key when full (an A1out of zero keys, at capacity 1, remembers nothing).
func (p *TwoQ) demote() {
	i := p.in.tail
	k := p.a.at(i).key
	if p.outCap == 0 {
		p.a.remove(&p.in, i)
	} else {
		for p.out.len >= p.outCap {
			p.a.remove(&p.out, p.out.tail)
		}
		p.a.unlink(&p.in, i)
		p.a.at(i).meta = twoqOut
		p.a.pushFront(&p.out, i)
	}
	p.evicted(k)
}

// Remove drops k, and its A1out entry if that is all there is (an invalidated key's history is
// stale).
func (p *TwoQ) Remove(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	switch p.a.at(i).meta {
	case twoqIn:
		p.a.remove(&p.in, i)
		return true
	case twoqMain:
		p.a.remove(&p.main, i)
		return true
	}
	p.a.remove(&p.out, i)
	return false
}

// Len is the number of cached keys (A1in and Am; A1out holds none).
func (p *TwoQ) Len() int { return p.in.len + p.main.len }
