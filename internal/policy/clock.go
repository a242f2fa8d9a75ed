package policy

// Clock is the second-chance policy: keys sit in a FIFO queue with one reference bit, set by a hit
// and clear on insertion. Eviction looks at the oldest key: if its bit is set, the bit is cleared and
// the key goes back to the head (its second chance); the first key found with a clear bit leaves.
// Corbató, "A paging experiment with the Multics system", MIT Project MAC MAC-M-384, 1968. It
// behaves as libCacheSim's Clock with its default one-bit counter (cache/eviction/Clock.c,
// "n-bit-counter=1"), which keeps the queue as a list and moves a referenced key to the head
// instead of advancing a hand over a ring: the same order of keys, so the same evictions.
type Clock struct {
	base
	a arena[bool] // payload: the reference bit
	q list
}

// NewClock builds a Clock policy.
func NewClock(cfg Config) Eviction {
	p := &Clock{base: newBase(cfg), q: newList()}
	p.a = newArena[bool](p.capacity, cfg.Preallocate)
	return p
}

// Get reports whether k is cached and sets its reference bit.
func (p *Clock) Get(k Key) bool {
	i, ok := p.a.lookup(k)
	if ok {
		p.a.at(i).meta = true
	}
	return ok
}

// Insert evicts until k fits, then caches k at the head with a clear bit.
func (p *Clock) Insert(k Key) {
	if _, ok := p.a.lookup(k); ok {
		return
	}
	for p.q.len >= p.capacity {
		t := p.q.tail
		for p.a.at(t).meta {
			p.a.at(t).meta = false
			p.a.moveToFront(&p.q, t)
			t = p.q.tail
		}
		p.evicted(p.a.remove(&p.q, t))
	}
	p.a.pushFront(&p.q, p.a.alloc(k))
}

// Remove drops k.
func (p *Clock) Remove(k Key) bool { return p.a.removeKey(&p.q, k) }

// Len is the number of cached keys.
func (p *Clock) Len() int { return p.q.len }
