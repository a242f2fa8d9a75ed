package policy

// ARC is the Adaptive Replacement Cache: two LRU lists of cached keys, T1 (seen once recently) and
// T2 (seen at least twice), each followed by a ghost list of keys recently evicted from it, B1 and
// B2. A miss that hits a ghost list moves the target size p of T1 towards the list that would have
// kept it (up after a B1 hit, down after a B2 hit, by the ratio of the ghost lists' sizes, at least
// 1), and the key enters T2. REPLACE evicts T1's LRU key into B1 when T1 is over p (or at p when the
// incoming key was in B2), else T2's LRU key into B2. Megiddo and Modha, "ARC: A Self-Tuning, Low
// Overhead Replacement Cache", FAST 2003.
//
// It behaves as libCacheSim's ARC (cache/eviction/ARC.c): p is a float, eviction happens only when
// the cache is full (case IV's directory trimming included), and REPLACE also evicts from T1 when T2
// is empty. As there, REPLACE looks at the incoming key (was it in B2?), so Insert does the ghost
// bookkeeping that libCacheSim does on the lookup that missed; a miss that is not inserted leaves
// the ghost lists and p alone.
type ARC struct {
	base
	a              arena[uint8] // payload: the list that holds the key (arcT1 ...)
	t1, t2, b1, b2 list
	p              float64 // target size of T1
}

const (
	arcT1 uint8 = iota
	arcT2
	arcB1
	arcB2
)

// NewARC builds an ARC policy.
func NewARC(cfg Config) Eviction {
	p := &ARC{base: newBase(cfg), t1: newList(), t2: newList(), b1: newList(), b2: newList()}
	p.a = newArena[uint8](2*p.capacity+1, cfg.Preallocate)
	return p
}

func (p *ARC) queue(where uint8) *list {
	switch where {
	case arcT1:
		return &p.t1
	case arcT2:
		return &p.t2
	case arcB1:
		return &p.b1
	default:
		return &p.b2
	}
}

// Get reports whether k is cached; a hit moves k to the head of T2. A ghost entry is not a hit.
func (p *ARC) Get(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	switch p.a.at(i).meta {
	case arcT1:
		p.a.unlink(&p.t1, i)
		p.a.at(i).meta = arcT2
		p.a.pushFront(&p.t2, i)
	case arcT2:
		p.a.moveToFront(&p.t2, i)
	default:
		return false
	}
	return true
}

// Insert caches k: into T2 if a ghost list remembers it (after adapting p), else into T1.
func (p *ARC) Insert(k Key) {
	ghost, inB2 := false, false
	if i, ok := p.a.lookup(k); ok {
		c := float64(p.capacity)
		b1, b2 := float64(p.b1.len), float64(p.b2.len)
		switch p.a.at(i).meta {
		case arcB1:
			p.p = min(p.p+max(b2/b1, 1), c)
			p.a.remove(&p.b1, i)
		case arcB2:
			p.p = max(p.p-max(b1/b2, 1), 0)
			p.a.remove(&p.b2, i)
			inB2 = true
		default:
			return
		}
		ghost = true
	}
	for p.Len() >= p.capacity {
		if ghost {
			p.replace(inB2)
		} else {
			p.evictMiss()
		}
	}
	i := p.a.alloc(k)
	if ghost {
		p.a.at(i).meta = arcT2
		p.a.pushFront(&p.t2, i)
	} else {
		p.a.pushFront(&p.t1, i)
	}
}

// evictMiss makes room for a key in no list (the paper's case IV).
func (p *ARC) evictMiss() {
	c := p.capacity
	if p.t1.len+p.b1.len >= c {
		// L1 = T1 ∪ B1 is full: drop B1's LRU and REPLACE, or if B1 is empty, T1's LRU for good.
		if p.b1.len > 0 {
			p.a.remove(&p.b1, p.b1.tail)
			p.replace(false)
		} else {
			p.evicted(p.a.remove(&p.t1, p.t1.tail))
		}
		return
	}
	if p.t1.len+p.b1.len+p.t2.len+p.b2.len >= 2*c && p.b2.len > 0 {
		p.a.remove(&p.b2, p.b2.tail)
	}
	p.replace(false)
}

// replace is the paper's REPLACE: evict the LRU key of T1 or T2 into its ghost list.
func (p *ARC) replace(inB2 bool) {
	t1 := float64(p.t1.len)
	from, where := &p.t2, arcB2
	if (p.t1.len > 0 && (t1 > p.p || (t1 == p.p && inB2))) || p.t2.len == 0 {
		from, where = &p.t1, arcB1
	}
	i := from.tail
	p.a.unlink(from, i)
	n := p.a.at(i)
	n.meta = where
	p.a.pushFront(p.queue(where), i)
	p.evicted(n.key)
}

// Remove drops k, and any ghost entry of it.
func (p *ARC) Remove(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	where := p.a.at(i).meta
	p.a.remove(p.queue(where), i)
	return where == arcT1 || where == arcT2
}

// Len is the number of cached keys (ghost entries are not cached).
func (p *ARC) Len() int { return p.t1.len + p.t2.len }
