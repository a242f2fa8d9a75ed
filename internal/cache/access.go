package cache

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// accessBuffer holds hits recorded without a tier's exclusive lock until its next holder gives them
// to the eviction policy, as Caffeine's read buffers do: a hit then costs a short lock of one of
// several stripes, not the tier's. It is lossy: a hit that finds its stripe full is dropped, which
// only makes the policy's idea of recency a little older.
type accessBuffer struct {
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
	// mu guards n and keys. record takes it under the tier's mu held shared, drain under it held
	// exclusively; nothing is taken under it.
	mu   sync.Mutex
	n    int
	keys [accessStripeLen]uint64
	_    [64]byte // keeps neighbouring stripes' locks off one cache line
}

// record notes a hit on line in a stripe chosen at random (hits on one hot line spread too). It
// reports true when that stripe is full: the caller should drain the buffer if it can.
func (b *accessBuffer) record(line uint64) (full bool) {
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

// drain calls fn on every recorded hit and empties the buffer.
func (b *accessBuffer) drain(fn func(line uint64)) {
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
