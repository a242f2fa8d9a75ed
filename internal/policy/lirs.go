package policy

// LIRS is Low Inter-reference Recency Set replacement. Keys with a short reuse distance (the number
// of distinct keys between two accesses) are LIR and stay cached; the others are HIR, and only a few
// of them (1 % of the capacity) are cached, in a queue Q. A stack S orders recently accessed keys by
// recency, including HIR keys no longer cached (non-resident), so that an HIR key accessed again
// while S still holds it has proved a short reuse distance and becomes LIR, the LIR key at the
// bottom of S taking its place in Q. S is pruned so its bottom is always LIR. Jiang and Zhang,
// "LIRS: An Efficient Low Inter-reference Recency Set Replacement Policy to Improve Buffer Cache
// Performance", SIGMETRICS 2002.
//
// It follows libCacheSim's LIRS (cache/eviction/LIRS.c): Q holds max(1, floor(0.01 x capacity))
// keys, the LIR set the rest; S is kept within twice the capacity by forgetting the non-resident
// keys that left the cache first; while the LIR set is not full every new key is LIR. Its quirk is
// kept, since it shapes its miss ratios: a hit on a key in Q that S does not hold demotes the bottom
// LIR key into Q although the hit key stays HIR, leaving Q one key over its share. libCacheSim
// evicts Q's oldest key right there, on the hit (the very key hit, when Q holds one key); here Get
// never evicts, and the next Insert evicts Q's oldest key instead, which is the same key unless an
// access in between moved it. The miss ratios on the shared traces are libCacheSim's to the fourth
// decimal (2 of 113,872 accesses differ on cloudPhysicsIO at 48 keys, where libCacheSim later counts
// a hit on a key it evicted that way).
//
// libCacheSim caches nothing at capacity 1 (its LIR set would be empty); NewLIRS returns an LRU of
// one key there.
type LIRS struct {
	base
	// s is the stack S, q the queue Q of resident HIR keys, nr the non-resident keys of S in the
	// order they left the cache (the order in which S forgets them). Each is an arena of its own, as
	// a key may be in S, Q and nr at once.
	s                  arena[lirsMeta]
	q, nr              arena[struct{}]
	sl, ql, nrl        list
	lirLimit, hirLimit int
	lirCount           int
}

// lirsMeta is the state of a key in S. Keys in Q are always resident and HIR.
type lirsMeta struct {
	lir      bool
	resident bool // cached: true for LIR keys, and for HIR keys in Q
}

// lirsHIRRatio is libCacheSim's share of the capacity for resident HIR keys.
const lirsHIRRatio = 0.01

// NewLIRS builds a LIRS policy.
func NewLIRS(cfg Config) Eviction {
	if cfg.Capacity < 2 {
		return NewLRU(cfg)
	}
	p := &LIRS{base: newBase(cfg), sl: newList(), ql: newList(), nrl: newList()}
	p.hirLimit = max(1, int(lirsHIRRatio*float64(p.capacity)))
	p.lirLimit = p.capacity - p.hirLimit
	// S holds at most 2 x capacity keys but for the one an access adds before limitStack trims it;
	// Q its share and the key a hit may demote into it; nr the keys of S that are not LIR, of which
	// there are at most 2 x capacity + 1 - lirLimit once the LIR set is full (invalidations can
	// empty the LIR set, and a preallocated arena then grows).
	p.s = newArena[lirsMeta](2*p.capacity+2, cfg.Preallocate)
	p.q = newArena[struct{}](p.hirLimit+2, cfg.Preallocate)
	p.nr = newArena[struct{}](p.capacity+p.hirLimit+2, cfg.Preallocate)
	return p
}

// Get reports whether k is cached. Like libCacheSim's lookup, it moves k to the top of S whether
// or not it hits. (libCacheSim also moves a resident HIR key to Q's head before taking it out of Q;
// only a key that stays in Q needs that.)
func (p *LIRS) Get(k Key) bool {
	if si, inS := p.s.lookup(k); inS {
		p.s.moveToFront(&p.sl, si)
		m := p.s.at(si).meta
		switch {
		case m.lir:
			p.prune()
		case m.resident:
			// A resident HIR key in S (and so in Q): its reuse distance is short, it becomes LIR.
			qi, _ := p.q.lookup(k)
			p.q.remove(&p.ql, qi)
			for p.lirCount >= p.lirLimit {
				p.demoteLIR()
			}
			p.s.at(si).meta.lir = true
			p.lirCount++
		default:
			return false // non-resident
		}
	} else if qi, inQ := p.q.lookup(k); inQ {
		// libCacheSim demotes an LIR key here although k stays HIR (see LIRS).
		p.q.moveToFront(&p.ql, qi)
		for p.lirCount >= p.lirLimit {
			p.demoteLIR()
		}
		i := p.s.alloc(k)
		p.s.at(i).meta = lirsMeta{resident: true}
		p.s.pushFront(&p.sl, i)
	} else {
		return false
	}
	p.limitStack()
	return true
}

// Insert caches k: as LIR if S remembers it or the LIR set has room, else as resident HIR in Q.
func (p *LIRS) Insert(k Key) {
	si, inS := p.s.lookup(k)
	switch {
	case inS && p.s.at(si).meta.resident:
		return // cached: LIR, or HIR in Q
	case inS:
		// S remembers the non-resident k: it becomes LIR. Get has put it on top of S already;
		// doing it again keeps an Insert without Get right.
		p.s.moveToFront(&p.sl, si)
		p.nr.removeKey(&p.nrl, k)
		for p.lirCount >= p.lirLimit {
			p.demoteLIR()
		}
		p.makeRoom()
		p.s.at(si).meta = lirsMeta{lir: true, resident: true}
		p.lirCount++
	default:
		if _, inQ := p.q.lookup(k); inQ {
			return
		}
		p.makeRoom()
		i := p.s.alloc(k)
		p.s.pushFront(&p.sl, i)
		if p.lirCount < p.lirLimit {
			p.s.at(i).meta = lirsMeta{lir: true, resident: true}
			p.lirCount++
		} else {
			p.s.at(i).meta = lirsMeta{resident: true}
			p.q.pushFront(&p.ql, p.q.alloc(k))
		}
	}
	p.limitStack()
}

// makeRoom evicts from Q until one more key fits. Evicting Q's oldest key after, not before,
// demoting an LIR key into Q's head picks the same key as libCacheSim does.
func (p *LIRS) makeRoom() {
	for p.Len() >= p.capacity {
		p.evictHIR()
	}
}

// demoteLIR turns the LIR key at the bottom of S into a resident HIR key at the head of Q, and
// prunes S. Q may then hold more than its share until the next Insert makes room.
//
// S's bottom is LIR except when the LIR set has been empty: at capacity 2 its one key can be
// demoted, and a new LIR key then lands on top of HIR keys. libCacheSim demotes S's bottom key
// whatever it is, and corrupts its counts; pruning first finds the LIR key, and changes nothing
// when the bottom is LIR already.
func (p *LIRS) demoteLIR() {
	p.prune()
	k := p.s.remove(&p.sl, p.sl.tail)
	p.lirCount--
	p.q.pushFront(&p.ql, p.q.alloc(k))
	p.prune()
}

// evictHIR evicts the oldest key of Q; if S holds it, it stays there as non-resident.
func (p *LIRS) evictHIR() {
	k := p.q.remove(&p.ql, p.ql.tail)
	if si, ok := p.s.lookup(k); ok {
		p.s.at(si).meta.resident = false
		p.nr.pushFront(&p.nrl, p.nr.alloc(k))
	}
	p.evicted(k)
}

// prune drops HIR keys from the bottom of S until an LIR key is there, never dropping the top.
func (p *LIRS) prune() {
	for p.sl.tail != p.sl.head {
		t := p.s.at(p.sl.tail)
		if t.meta.lir {
			return
		}
		if !t.meta.resident {
			p.nr.removeKey(&p.nrl, t.key)
		}
		p.s.remove(&p.sl, p.sl.tail)
	}
}

// limitStack keeps S within twice the capacity by forgetting the oldest non-resident keys.
func (p *LIRS) limitStack() {
	for p.sl.len > 2*p.capacity && p.nrl.len > 0 {
		k := p.nr.remove(&p.nrl, p.nrl.tail)
		p.s.removeKey(&p.sl, k)
	}
}

// Remove drops k from the cache and from S's memory of it.
func (p *LIRS) Remove(k Key) bool {
	qi, inQ := p.q.lookup(k)
	if inQ {
		p.q.remove(&p.ql, qi)
	}
	si, inS := p.s.lookup(k)
	if !inS {
		return inQ
	}
	m := p.s.at(si).meta
	p.s.remove(&p.sl, si)
	switch {
	case m.lir:
		p.lirCount--
		p.prune()
		return true
	case !m.resident:
		p.nr.removeKey(&p.nrl, k)
	}
	return inQ
}

// Len is the number of cached keys: the LIR keys and Q.
func (p *LIRS) Len() int { return p.lirCount + p.ql.len }
