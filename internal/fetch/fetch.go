// Package fetch is the rule of what a read miss fetches from the backend: the blocks it asked for,
// and more of the cache line only where that is likely to pay. The cache engine and the simulator
// both use it, so that `tierblk sim` counts the bytes the daemon would fetch.
//
// It sees offsets and lengths, never data, and must not depend on the engine or the simulator.
//
// A miss that some tier will cache fetches the blocks it touches, rounded out to whole blocks (4
// KiB, the unit of the cache's valid bits); a read that continues a sequential stream fetches on to
// the line's end, since its reader asks for that next; a prefetch (NBD_CMD_CACHE) fetches the whole
// line. Fetching every missed line whole made a random 4 KiB read cost 16 times its bytes with 64
// KiB lines, which on a backend behind a network link made the cache ten times slower than no cache
// (docs/cache-policy.md).
package fetch

import "sync"

// BlockSize is the unit of a line's valid bits: a miss fetches whole blocks.
const BlockSize = 4096

// Reach is how much of a line a miss fetches beyond the blocks it touches.
type Reach int

const (
	Blocks Reach = iota // the touched blocks
	Ahead               // from the first touched block to the line's end: a sequential reader
	Line                // the whole line: a prefetch
)

// Range returns the bytes [lo, hi) of a line of n bytes that a miss on the line's bytes [from, to)
// fetches: exactly those when no tier caches the line, else as r says.
func Range(from, to, n int64, cached bool, r Reach) (lo, hi int64) {
	switch {
	case !cached:
		return from, to
	case r == Line:
		return 0, n
	case r == Ahead:
		return from / BlockSize * BlockSize, n
	default:
		return from / BlockSize * BlockSize, min((to+BlockSize-1)/BlockSize*BlockSize, n)
	}
}

// streamSlots is how many sequential readers are followed at once.
const streamSlots = 16

// Streams remembers where the latest misses of recent readers ended, so that a miss starting there
// is known to continue a sequential read. A miss that fetched on to its line's end records that
// end: the reader's next requests within the line hit, and its next miss starts there. Its methods
// are safe for concurrent use; the zero value is ready.
type Streams struct {
	mu   sync.Mutex
	ends [streamSlots]int64 // 0: free (no stream ends at the device's start)
	next int                // the slot a new stream takes, round robin
}

// Follow reports whether a miss at off continues a stream, and records where the miss now ends,
// which end computes from that answer: the reader's next miss continues the stream there.
func (s *Streams) Follow(off int64, end func(seq bool) int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range s.ends {
		if e == off && off > 0 {
			s.ends[i] = end(true)
			return true
		}
	}
	s.ends[s.next] = end(false)
	s.next = (s.next + 1) % streamSlots
	return false
}
