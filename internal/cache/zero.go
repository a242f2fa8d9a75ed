package cache

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/tierblk/tierblk/internal/linebits"
)

// Data reduction on the SSD tier, its first step: zero blocks. A 4 KiB block of zeros that a write
// or a fill would store on the SSD tier is not written there: the line's zero bit says the block
// holds zeros, a read of it is served without SSD I/O, and the record that persists the valid and
// dirty bits persists the zero bits with them (meta.Line.Zero), so that crash recovery, the run log
// and a warm restart bring them back as they bring the valid bits. A dirty zero block is written
// back as a WRITE_ZEROES where the backend has one. The slot keeps its room for the line: zero
// blocks save SSD writes and reads, not yet SSD space (that needs allocation by size, see
// docs/architecture.md).
//
// Zero bits are a subset of the valid bits. A zero block's bytes in the slot are whatever was
// there before: nothing reads them, and a write that covers part of a zero block writes the whole
// block (its other bytes as zeros). Since a zero bit is not in the slot, a write in place no longer
// makes an older stored record of a dirty block find the newest data: the destager has the store
// catch up (a checkpoint) before it writes such blocks back (journal.settleClaims).
//
// Every path writes a tier's blocks through this file: writeBlocks (a line's bytes, zero blocks
// left out), and storesWrite and writeTier (the whole blocks of a request's piece).

// Reduction is how much an SSD tier reduces what it stores. Each level includes the ones before.
type Reduction int

const (
	// ReductionOff stores every block as it is. Zero bits a store already holds (written with
	// reduction on) are still honoured: they are what the slot does not hold.
	ReductionOff Reduction = iota
	// ReductionZero stores no block of zeros: a bit in the line's state stands for it.
	ReductionZero
	// ReductionCompress also compresses every other block, in the packed layout (pack.go).
	ReductionCompress
	// ReductionDedupe also stores a block written with the bytes of a block the tier holds as a
	// second reference to that block's unit (dedupe.go).
	ReductionDedupe
)

// DefaultReduction is the SSD tier's reduction unless the config names one: compress. The tier
// holds more lines in the same room (up to packedSlotsPerLine times as many), at the cost of a
// larger index per line; its hits and write-back writes run about as fast as with reduction off
// (docs/benchmarks.md, bench cache --parts reduction). A tier made with the slot layout before
// keeps it (Config.ReductionDefault).
const DefaultReduction = ReductionCompress

var reductionNames = []string{"off", "zero", "compress", "dedupe"}

func (r Reduction) String() string { return reductionNames[r] }

// ParseReduction parses a reduction name.
func ParseReduction(s string) (Reduction, error) {
	for i, n := range reductionNames {
		if s == n {
			return Reduction(i), nil
		}
	}
	return 0, fmt.Errorf("unknown reduction %q; use off, zero, compress or dedupe", s)
}

// zeroes is a run of zero bytes, never written: the data of WriteZeroes through the write path,
// and what zero detection compares blocks with.
var zeroes [maxZeroWrite]byte

// maxZeroWrite is the largest WriteZeroes that write-back takes as a write of zeros (dirty zero
// blocks on the SSD tier): a larger one (a file system zeroing a whole disk) would push the tier's
// lines out for lines of nothing, and goes to the backend as other modes send it.
const maxZeroWrite = 1 << 20

// isZero reports whether p holds only zeros. The comparison is the runtime's vectorised memequal,
// which stops at the first differing word: data that is not zero costs a few bytes' reading.
func isZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroes))
		if !bytes.Equal(p[:n], zeroes[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

// zeroBlocks returns the blocks of a line of n bytes that p, the line's bytes from off, covers
// whole and that hold only zeros (the last block of the backend may be shorter than blockSize).
func zeroBlocks(p []byte, off, n int64) lineBits {
	var z lineBits
	end := off + int64(len(p))
	for b := (off + blockSize - 1) / blockSize; b*blockSize < end; b++ {
		lo, hi := b*blockSize, min((b+1)*blockSize, n)
		if hi > end {
			break
		}
		if isZero(p[lo-off : hi-off]) {
			z[b/64] |= 1 << (b % 64)
		}
	}
	return z
}

// zeroSpans calls fn for each maximal span [lo, hi) of the line's bytes [from, to) whose blocks
// are all zero blocks or all not, stopping at fn's first error.
func zeroSpans(from, to int64, zero lineBits, fn func(lo, hi int64, zero bool) error) error {
	if zero.And(linebits.Range(int(from/blockSize), int((to+blockSize-1)/blockSize))).IsZero() {
		return fn(from, to, false)
	}
	for at := from; at < to; {
		z := zero.Has(int(at / blockSize))
		next := (at/blockSize + 1) * blockSize
		for next < to && zero.Has(int(next/blockSize)) == z {
			next += blockSize
		}
		next = min(next, to)
		if err := fn(at, next, z); err != nil {
			return err
		}
		at = next
	}
	return nil
}

// zeroRuns is zeroSpans over p, the line's bytes from off, giving fn each span's bytes.
func zeroRuns(p []byte, off int64, zero lineBits, fn func(q []byte, at int64, zero bool) error) error {
	return zeroSpans(off, off+int64(len(p)), zero, func(lo, hi int64, z bool) error {
		return fn(p[lo-off:hi-off], lo, z)
	})
}

// readBlocks is store.read for a slot whose zero blocks are zero: those are filled with zeros, not
// read.
func (t *tier) readBlocks(line uint64, slot uint32, p []byte, off int64, zero lineBits) error {
	return zeroRuns(p, off, zero, func(q []byte, at int64, z bool) error {
		if z {
			clear(q)
			return nil
		}
		return t.st.read(line, slot, q, at, false)
	})
}

// writeBlocks is store.write for a line of n bytes on a tier that reduces: the blocks of p that are
// whole and hold only zeros are not written, and returned, for the caller to mark zero when it
// marks them valid. A tier that does not reduce writes p whole and returns none.
func (t *tier) writeBlocks(line uint64, slot uint32, p []byte, off, n int64) (lineBits, error) {
	if !t.reduce {
		return lineBits{}, t.st.write(line, slot, p, off)
	}
	zero := zeroBlocks(p, off, n)
	if zero.IsZero() { // data: written as it is
		return zero, t.st.write(line, slot, p, off)
	}
	return zero, zeroRuns(p, off, zero, func(q []byte, at int64, z bool) error {
		if z {
			return nil
		}
		return t.st.write(line, slot, q, at)
	})
}

// zeroAt returns the zero bits of slot (none on a tier without them: RAM).
func (t *tier) zeroAt(slot uint32) lineBits {
	if t.zero.IsNil() {
		return lineBits{}
	}
	return t.zero.Get(slot)
}

// storesWrite reports whether t stores the write of s: the whole blocks it covers, if t holds the
// line or admits it.
func (c *Cache) storesWrite(t *tier, s piece) bool {
	if s.full().IsZero() {
		return false
	}
	v, _ := t.bits(s.line)
	return !v.IsZero() || t.admits(c.access(s, true))
}

// writeTier stores the whole blocks a write covers in t, in the slot g acquired for the line (if
// any), but for the zero blocks a tier that reduces does not write (zeros). The caller validates
// them once the backend has the data.
func (c *Cache) writeTier(t *tier, s piece, g grant, p []byte) (full, zeros lineBits, ok bool) {
	full = s.full()
	if !g.ok {
		return full, zeros, false
	}
	slot := g.slot
	var err error
	full.Runs(s.blocks(), func(b0, b1 int) {
		if err == nil {
			lo, hi := int64(b0)*blockSize, min(int64(b1)*blockSize, s.n)
			var z lineBits
			z, err = t.writeBlocks(s.line, slot, p[s.pOff+lo-s.lo:s.pOff+hi-s.lo], lo, s.n)
			zeros = zeros.Or(z)
		}
	})
	if errors.Is(err, errNoRoom) {
		t.noRoom(s.line, slot)
		return full, zeros, false
	}
	if err != nil {
		t.unpin(slot)
		t.ioError(s.line, slot, err)
		return full, zeros, false
	}
	return full, zeros, true
}
