package policy

// LRU evicts the least recently used key: a hit moves the key to the head of one queue, a miss
// inserts it at the head, and eviction takes the tail. The textbook policy (its stack property is in
// Mattson et al., "Evaluation techniques for storage hierarchies", IBM Systems Journal 9(2), 1970);
// it behaves as libCacheSim's LRU (cache/eviction/LRU.c).
type LRU struct {
	base
	a arena[struct{}]
	q list
	// promote is false for FIFO, which shares this type: a hit then leaves the queue alone.
	promote bool
}

// NewLRU builds an LRU policy.
func NewLRU(cfg Config) Eviction { return newQueue(cfg, true) }

func newQueue(cfg Config, promote bool) *LRU {
	p := &LRU{base: newBase(cfg), q: newList(), promote: promote}
	p.a = newArena[struct{}](p.capacity, cfg.Preallocate)
	return p
}

// Get reports whether k is cached and, for LRU, makes it the most recently used.
func (p *LRU) Get(k Key) bool {
	i, ok := p.a.lookup(k)
	if ok && p.promote {
		p.a.moveToFront(&p.q, i)
	}
	return ok
}

// Insert evicts from the tail until k fits, then caches k at the head.
func (p *LRU) Insert(k Key) {
	if _, ok := p.a.lookup(k); ok {
		return
	}
	for p.q.len >= p.capacity {
		p.evicted(p.a.remove(&p.q, p.q.tail))
	}
	p.a.pushFront(&p.q, p.a.alloc(k))
}

// Remove drops k.
func (p *LRU) Remove(k Key) bool { return p.a.removeKey(&p.q, k) }

// Len is the number of cached keys.
func (p *LRU) Len() int { return p.q.len }
