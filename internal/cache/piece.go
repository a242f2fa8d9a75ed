package cache

import (
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/pkg/backend"
)

// piece is the part of a request that falls in one line.
type piece struct {
	line   uint64
	start  int64 // device offset of the line
	n      int64 // bytes of the line (the last line may be short)
	lo, hi int64 // the request's bytes within the line
	pOff   int64 // where they are in the request's buffer
}

func (s piece) blocks() int { return int((s.n + blockSize - 1) / blockSize) }

// touchedBlocks counts the blocks a request's pieces touch.
func touchedBlocks(pieces []piece) int {
	n := 0
	for _, s := range pieces {
		n += int((s.hi+blockSize-1)/blockSize - s.lo/blockSize)
	}
	return n
}

// touched are the blocks the request touches; full those it covers entirely.
func (s piece) touched() lineBits {
	return linebits.Range(int(s.lo/blockSize), int((s.hi+blockSize-1)/blockSize))
}

func (s piece) full() lineBits {
	end := s.hi / blockSize
	if s.hi == s.n {
		end = int64(s.blocks())
	}
	return linebits.Range(int((s.lo+blockSize-1)/blockSize), int(end))
}

// split splits a request by line, appending its pieces to pieces (a caller's small array keeps the
// common one-line request from allocating).
func (c *Cache) split(pieces []piece, off, length int64) []piece {
	first, last := off/c.line, (off+length-1)/c.line
	for line := first; line <= last; line++ {
		start := line * c.line
		s := piece{line: uint64(line), start: start, n: min(c.line, c.size-start)}
		s.lo = max(off, start) - start
		s.hi = min(off+length, start+s.n) - start
		s.pOff = start + s.lo - off
		pieces = append(pieces, s)
	}
	return pieces
}

func (c *Cache) lockPieces(pieces []piece) {
	c.locks.Lock(pieces[0].line, pieces[len(pieces)-1].line)
}

func (c *Cache) unlockPieces(pieces []piece) {
	c.locks.Unlock(pieces[0].line, pieces[len(pieces)-1].line)
}

// lockLines locks each of lines (ascending) alone: lines written back together may lie far apart,
// and the lines between them are no business of the write back.
func (c *Cache) lockLines(lines []uint64) {
	for _, l := range lines {
		c.locks.Lock(l, l)
	}
}

func (c *Cache) unlockLines(lines []uint64) {
	for _, l := range lines {
		c.locks.Unlock(l, l)
	}
}

// check refuses a request on a closed cache or outside the device.
func (c *Cache) check(off, length int64) error {
	if c.closed.Load() {
		return backend.ErrClosed
	}
	return backend.CheckRange(off, length, c.size)
}
