// Package rangelock lets the clients of a test run requests at once on a device, each on a byte
// range no other request in flight overlaps, so that a model of the device knows what every read
// must return while the server sees concurrent requests of any size. It is for tests: the data
// path must never use it (the cache engine locks lines, internal/linelock).
package rangelock

import "sync"

// Locks is a set of held ranges; the zero value is not ready: use New.
type Locks struct {
	mu   sync.Mutex
	cond *sync.Cond
	held map[[2]int64]int // [lo, hi) -> holders: more than one only for an empty range
}

// New returns an empty set.
func New() *Locks {
	l := &Locks{held: map[[2]int64]int{}}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// Lock waits until no held range overlaps [lo, hi), then holds it.
func (l *Locks) Lock(lo, hi int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.overlaps(lo, hi) {
		l.cond.Wait()
	}
	l.held[[2]int64{lo, hi}]++
}

func (l *Locks) overlaps(lo, hi int64) bool {
	for r := range l.held {
		if lo < r[1] && r[0] < hi {
			return true
		}
	}
	return false
}

// Unlock lets go of [lo, hi), which Lock held.
func (l *Locks) Unlock(lo, hi int64) {
	l.mu.Lock()
	k := [2]int64{lo, hi}
	if l.held[k]--; l.held[k] <= 0 {
		delete(l.held, k)
	}
	l.mu.Unlock()
	l.cond.Broadcast()
}
