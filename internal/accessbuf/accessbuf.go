// Package accessbuf buffers the hits a cache records while it holds its own lock shared, until the
// next holder of that lock alone hands them to the eviction policy. It only buffers line numbers:
// it must never call the policy or block a recorder for longer than one stripe's short lock, and
// nothing may be locked under a stripe's lock.
package accessbuf

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Buffer holds hits recorded without the user's exclusive lock until its next holder gives them to
// the eviction policy, as Caffeine's read buffers do: a hit then costs a short lock of one of
// several stripes, not the user's. The zero value is ready. It is lossy: a hit that finds its
// stripe full is dropped, which only makes the policy's idea of recency a little older.
type Buffer struct {
	stripes [accessStripes]accessStripe
	pending atomic.Int32 // hits recorded and not drained: a drain of an empty buffer takes no lock
}

const (
	// accessStripes spreads concurrent hits over that many locks (a power of two).
	accessStripes = 16
	// accessStripeLen is how many hits a stripe holds; a full stripe asks for a drain.
	accessStripeLen = 64
)

type accessStripe struct {
	// mu guards n and keys. Record takes it under the user's lock held shared, Drain under it held
	// exclusively; nothing is taken under it.
	mu   sync.Mutex
	n    int
	keys [accessStripeLen]uint64
	_    [64]byte // keeps neighbouring stripes' locks off one cache line
}

// Record notes a hit on line in a stripe chosen at random (hits on one hot line spread too). It
// reports true when that stripe is full: the caller should drain the buffer if it can.
func (b *Buffer) Record(line uint64) (full bool) {
	s := &b.stripes[rand.Uint32()&(accessStripes-1)]
	s.mu.Lock()
	if s.n < accessStripeLen {
		s.keys[s.n] = line
		s.n++
		b.pending.Add(1)
	}
	full = s.n == accessStripeLen
	s.mu.Unlock()
	return full
}

// Drain calls fn on every recorded hit and empties the buffer.
func (b *Buffer) Drain(fn func(line uint64)) {
	if b.pending.Load() == 0 {
		return
	}
	for i := range b.stripes {
		s := &b.stripes[i]
		s.mu.Lock()
		for _, k := range s.keys[:s.n] {
			fn(k)
		}
		b.pending.Add(-int32(s.n))
		s.n = 0
		s.mu.Unlock()
	}
}
