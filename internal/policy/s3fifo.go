package policy

// S3FIFO is S3-FIFO: three FIFO queues. New keys enter a small queue (10 % of the capacity); a key
// leaving the small queue moves to the main queue (the rest) if it was hit at least twice there, and
// otherwise is evicted, its key remembered in a ghost queue (of 90 % of the capacity, keys only). A
// missed key found in the ghost queue enters the main queue directly. The main queue is a Clock with
// a 2-bit frequency: a key at its tail with frequency f > 0 goes back to the head with f-1.
// Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023.
//
// It behaves as libCacheSim's S3FIFO with its defaults (cache/eviction/S3FIFO.c,
// "fifo-size-ratio=0.10,ghost-size-ratio=0.90,move-to-main-threshold=2"): the queue sizes are
// floor(capacity x ratio); eviction takes from the small queue unless the main queue is over its
// share or the small queue is empty; evicting from the small queue moves keys to main until one key
// actually leaves. Two deliberate differences, neither of which shows at libCacheSim's sizes:
//   - libCacheSim caches nothing in the small queue when it is smaller than two keys (capacity
//     below 20); here it holds at least one key, so every capacity works;
//   - libCacheSim consumes a ghost entry when the miss is looked up, here when the key is inserted,
//     so a miss that the admission policy turns away keeps its ghost entry.
type S3FIFO struct {
	base
	a                  arena[s3Meta]
	small, main, ghost list
	smallCap, ghostCap int
	mainCap            int
}

// s3Meta is an S3-FIFO entry's payload: the queue that holds it and its access count.
type s3Meta struct {
	queue uint8
	freq  uint8 // saturates at s3MaxFreq: libCacheSim counts higher but only compares with 2 and 3
}

const (
	s3Small uint8 = iota
	s3Main
	s3Ghost
)

const (
	s3SmallRatio   = 0.10
	s3GhostRatio   = 0.90
	s3MoveToMain   = 2 // hits in the small queue that earn a key a place in main
	s3MaxFreq      = 3 // the 2-bit counter of the main queue
	s3SmallMinimum = 1
)

// NewS3FIFO builds an S3-FIFO policy.
func NewS3FIFO(cfg Config) Eviction {
	p := &S3FIFO{base: newBase(cfg), small: newList(), main: newList(), ghost: newList()}
	p.smallCap = max(int(float64(p.capacity)*s3SmallRatio), s3SmallMinimum)
	p.mainCap = p.capacity - p.smallCap
	p.ghostCap = int(float64(p.capacity) * s3GhostRatio)
	p.a = newArena[s3Meta](p.capacity+p.ghostCap+1, cfg.Preallocate)
	return p
}

// Get reports whether k is cached and counts the hit; a ghost entry is not a hit.
func (p *S3FIFO) Get(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	m := &p.a.at(i).meta
	if m.queue == s3Ghost {
		return false
	}
	if m.freq < s3MaxFreq {
		m.freq++
	}
	return true
}

// Insert caches k: in the main queue if the ghost queue remembers it, else in the small queue.
func (p *S3FIFO) Insert(k Key) {
	toMain := false
	if i, ok := p.a.lookup(k); ok {
		if p.a.at(i).meta.queue != s3Ghost {
			return
		}
		p.a.remove(&p.ghost, i)
		toMain = true
	}
	for p.Len() >= p.capacity {
		if p.main.len > p.mainCap || p.small.len == 0 {
			p.evictMain()
		} else {
			p.evictSmall()
		}
	}
	i := p.a.alloc(k)
	if toMain {
		p.a.at(i).meta.queue = s3Main
		p.a.pushFront(&p.main, i)
	} else {
		p.a.pushFront(&p.small, i)
	}
}

// evictSmall empties the small queue from its tail until one key leaves the cache: keys hit often
// enough move to main (which may then exceed its share; the next eviction takes from it).
func (p *S3FIFO) evictSmall() {
	for p.small.len > 0 {
		t := p.small.tail
		n := p.a.at(t)
		if n.meta.freq >= s3MoveToMain {
			p.a.unlink(&p.small, t)
			n.meta = s3Meta{queue: s3Main}
			p.a.pushFront(&p.main, t)
			continue
		}
		k := n.key
		if p.ghostCap > 0 {
			p.a.unlink(&p.small, t)
			n.meta = s3Meta{queue: s3Ghost}
			p.a.pushFront(&p.ghost, t)
			if p.ghost.len > p.ghostCap {
				p.a.remove(&p.ghost, p.ghost.tail)
			}
		} else {
			p.a.remove(&p.small, t)
		}
		p.evicted(k)
		return
	}
}

// evictMain evicts the first key at the tail of main with a zero count, sending keys with a count
// back to the head with one less.
func (p *S3FIFO) evictMain() {
	for {
		t := p.main.tail
		n := p.a.at(t)
		if n.meta.freq == 0 {
			p.evicted(p.a.remove(&p.main, t))
			return
		}
		n.meta.freq--
		p.a.moveToFront(&p.main, t)
	}
}

// Remove drops k, and any ghost entry of it.
func (p *S3FIFO) Remove(k Key) bool {
	i, ok := p.a.lookup(k)
	if !ok {
		return false
	}
	switch p.a.at(i).meta.queue {
	case s3Small:
		p.a.remove(&p.small, i)
	case s3Main:
		p.a.remove(&p.main, i)
	default:
		p.a.remove(&p.ghost, i)
		return false
	}
	return true
}

// Len is the number of cached keys (ghost entries are not cached).
func (p *S3FIFO) Len() int { return p.small.len + p.main.len }
