package cache

import "sync"

// What a read miss fetches from the backend. A miss that some tier will cache fetches the blocks it
// asked for, rounded out to whole 4 KiB blocks (the unit of the valid bits), and more of the line
// only where it is likely to be read soon: a read that continues a sequential stream fetches on to
// the line's end (its reader asks for that next), a prefetch (NBD_CMD_CACHE) the whole line.
// Fetching every missed line whole made a random 4 KiB read cost 16 times its bytes with 64 KiB
// lines, which on a backend behind a network link made the cache ten times slower than no cache
// (TestMissRange, TestMissCounters). Blocks fetched later fill the line in as they are read.

// reach is how much of a line a miss fetches beyond the blocks it touches.
type reach int

const (
	reachBlocks reach = iota // the touched blocks
	reachAhead               // from the first touched block to the line's end: a sequential reader
	reachLine                // the whole line: a prefetch
)

// missRange returns the bytes of the line that a miss on segment s fetches: [s.lo, s.hi) as asked
// when no tier caches it, else as r says.
func missRange(s seg, cached bool, r reach) (lo, hi int64) {
	switch {
	case !cached:
		return s.lo, s.hi
	case r == reachLine:
		return 0, s.n
	case r == reachAhead:
		return s.lo / blockSize * blockSize, s.n
	default:
		return s.lo / blockSize * blockSize, min((s.hi+blockSize-1)/blockSize*blockSize, s.n)
	}
}

// blocksIn returns the blocks of [lo, hi), which are block-aligned but for the end of a short last
// line.
func blocksIn(lo, hi int64) lineBits {
	return rangeBits(int(lo/blockSize), int((hi+blockSize-1)/blockSize))
}

// streamSlots is how many sequential readers are followed at once.
const streamSlots = 16

// streams remembers where the latest misses of recent readers ended, so that a miss starting there
// is known to continue a sequential read. A miss that fetched its whole line records the line's end:
// the reader's next requests within the line hit, and its next miss starts there.
type streams struct {
	mu   sync.Mutex
	ends [streamSlots]int64 // 0: free (no stream ends at the device's start)
	next int                // the slot a new stream takes, round robin
}

// follow reports whether a miss at off continues a stream, and records where the miss now ends,
// which end computes from that answer: the reader's next miss continues the stream there.
func (s *streams) follow(off int64, end func(seq bool) int64) bool {
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
