package policy

// Sieve is SIEVE: keys sit in a FIFO queue with a visited bit, set by a hit; a hand walks from the
// tail towards the head, clearing visited bits, and evicts the first unvisited key, then stays where
// it stopped; it wraps to the tail after the head. Unlike Clock, a visited key stays in place, so new
// keys (at the head) and old survivors (behind the hand) are sifted apart. Zhang et al., "SIEVE is
// Simpler than LRU: an Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI 2024. It behaves
// as libCacheSim's SIEVE (cache/eviction/Sieve.c).
type Sieve struct {
	base
	a    arena[bool] // payload: the visited bit
	q    list
	hand int32 // the next key the hand looks at; none means the tail
}

// NewSieve builds a SIEVE policy.
func NewSieve(cfg Config) Eviction {
	p := &Sieve{base: newBase(cfg), q: newList(), hand: none}
	p.a = newArena[bool](p.capacity, cfg.Preallocate)
	return p
}

// Get reports whether k is cached and marks it visited.
func (p *Sieve) Get(k Key) bool {
	i, ok := p.a.lookup(k)
	if ok {
		p.a.at(i).meta = true
	}
	return ok
}

// Insert evicts until k fits, then caches k at the head, unvisited.
func (p *Sieve) Insert(k Key) {
	if _, ok := p.a.lookup(k); ok {
		return
	}
	for p.q.len >= p.capacity {
		p.evict()
	}
	p.a.pushFront(&p.q, p.a.alloc(k))
}

func (p *Sieve) evict() {
	i := p.hand
	if i == none {
		i = p.q.tail
	}
	for p.a.at(i).meta {
		n := p.a.at(i)
		n.meta = false
		i = n.prev
		if i == none {
			i = p.q.tail
		}
	}
	p.hand = p.a.at(i).prev
	p.evicted(p.a.remove(&p.q, i))
}

// Remove drops k; the hand steps over it if it pointed there.
func (p *Sieve) Remove(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	if i == p.hand {
		p.hand = p.a.at(i).prev
	}
	p.a.remove(&p.q, i)
	return true
}

// Len is the number of cached keys.
func (p *Sieve) Len() int { return p.q.len }
