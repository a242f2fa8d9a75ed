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
// It behaves as libCacheSim's LIRS (cache/eviction/LIRS.c): Q holds max(1, floor(0.01 x capacity))
// keys, the LIR set the rest; S is kept within twice the capacity by dropping the non-resident keys
// that became non-resident first; while the LIR set is not full every new key is LIR. Its quirks
// are kept, since they decide its miss ratios:
//   - a hit on a key in Q that is not in S demotes the bottom LIR key into Q even though the hit key
//     stays HIR, so Q evicts on a hit, and it may evict the very key that was hit (always, when Q
//     holds one key). The hit counts; the key stays in S marked resident, as an orphan that Q does
//     not hold;
//   - an access to such an orphan makes it LIR again, evicting an LIR key into Q as a hit on a
//     resident HIR key would. libCacheSim counts it as a hit although the key's data left the cache;
//     here it is a miss (Get reports false, Insert makes the key LIR), the one difference in what the
//     two report. The states stay the same.
//
// So in LIRS, unlike the other policies, Get may evict (through OnEvict), even the key it reports
// as a hit: a caller serves the hit from data it has already pinned or copied.
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
	resident bool // for an HIR key: cached (or an orphan, see LIRS), not only remembered
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
	p.s = newArena[lirsMeta](2*p.capacity + 2)
	p.q = newArena[struct{}](p.hirLimit + 1)
	p.nr = newArena[struct{}](p.capacity + 1)
	return p
}

// Get reports whether k is cached. Like libCacheSim's lookup, it moves k to the top of S and of Q
// whether or not it hits.
func (p *LIRS) Get(k Key) bool {
	si, inS := p.s.lookup(k)
	if inS {
		p.s.moveToFront(&p.sl, si)
	}
	qi, inQ := p.q.lookup(k)
	if inQ {
		p.q.moveToFront(&p.ql, qi)
	}
	switch {
	case inS && p.s.at(si).meta.lir:
		p.prune()
	case inS && p.s.at(si).meta.resident && inQ:
		p.q.remove(&p.ql, qi)
		p.makeLIR(si)
	case inS:
		return false // non-resident, or an orphan
	case inQ:
		for p.lirCount >= p.lirLimit {
			p.demoteLIR()
		}
		i := p.s.alloc(k)
		p.s.at(i).meta = lirsMeta{resident: true}
		p.s.pushFront(&p.sl, i)
	default:
		return false
	}
	p.limitStack()
	return true
}

// Insert caches k: as LIR if S remembers it or the LIR set has room, else as resident HIR in Q.
func (p *LIRS) Insert(k Key) {
	if _, inQ := p.q.lookup(k); inQ {
		return
	}
	si, inS := p.s.lookup(k)
	switch {
	case !inS:
		if p.lirCount < p.lirLimit {
			i := p.s.alloc(k)
			p.s.at(i).meta = lirsMeta{lir: true, resident: true}
			p.s.pushFront(&p.sl, i)
			p.lirCount++
			break
		}
		for p.ql.len >= p.hirLimit {
			p.evictHIR()
		}
		i := p.s.alloc(k)
		p.s.at(i).meta = lirsMeta{resident: true}
		p.s.pushFront(&p.sl, i)
		p.q.pushFront(&p.ql, p.q.alloc(k))
	case p.s.at(si).meta.lir:
		return
	default:
		// S remembers k: a non-resident key, or an orphan (see LIRS). Get has put it on top of S
		// already; doing it again keeps an Insert without Get right.
		p.s.moveToFront(&p.sl, si)
		p.nr.removeKey(&p.nrl, k)
		p.makeLIR(si)
	}
	p.limitStack()
}

// makeLIR turns the HIR key at the top of S (not in Q) into a resident LIR key, first demoting LIR
// keys until the LIR set has room.
func (p *LIRS) makeLIR(si int32) {
	for p.lirCount >= p.lirLimit {
		p.demoteLIR()
	}
	p.s.at(si).meta = lirsMeta{lir: true, resident: true}
	p.lirCount++
}

// demoteLIR turns the LIR key at the bottom of S into a resident HIR key at the head of Q, making
// room in Q first, and prunes S.
func (p *LIRS) demoteLIR() {
	k := p.s.remove(&p.sl, p.sl.tail)
	p.lirCount--
	for p.ql.len >= p.hirLimit {
		p.evictHIR()
	}
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
