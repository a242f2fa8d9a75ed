package cache

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/meta"
)

// ErrLost is what a read of a lost range returns (wrapped): the range held dirty data that the SSD
// tier damaged before it was written back (sum.go). The backend keeps its older data, which is not
// served either; a write of the range clears it.
var ErrLost = errors.New("the data of this range was lost: the SSD tier damaged it before it was written back")

// lostSet holds the lost ranges: byte ranges of the device, sorted, apart, each a run of whole
// sectors. It is kept in the SSD tier's superblock, so that a restart finds it (a lost block is
// dropped from the tier once it is recorded here, and the backend's older data must not be served
// in its place after a restart either).
type lostSet struct {
	// mu guards ranges (and n's changes). It is held while persist stores the ranges, which
	// takes the journal's sbMu; it is taken with no lock held but line locks.
	mu     sync.Mutex
	ranges []meta.Range
	n      atomic.Int64 // len(ranges): reads look without the mutex when it is 0
	// persist stores the ranges durably (nil without an SSD tier's store).
	persist func([]meta.Range) error
}

// overlaps reports whether [off, off+n) overlaps a lost range.
func (l *lostSet) overlaps(off, n int64) bool {
	if l.n.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overlapsLocked(off, n)
}

func (l *lostSet) overlapsLocked(off, n int64) bool {
	i, _ := slices.BinarySearchFunc(l.ranges, off, func(r meta.Range, off int64) int {
		if r.Off+r.Len <= off {
			return -1
		}
		return 1
	})
	return i < len(l.ranges) && l.ranges[i].Off < off+n
}

// check returns an error wrapping ErrLost if [off, off+n) overlaps a lost range.
func (l *lostSet) check(off, n int64) error {
	if l.overlaps(off, n) {
		return fmt.Errorf("cache: read at offset %d: %w", off, ErrLost)
	}
	return nil
}

// add records [off, off+n) as lost, durably before it returns; if it cannot be stored, it is lost
// in memory all the same (reads of it fail) and add says why.
func (l *lostSet) add(off, n int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ranges = mergeRange(l.ranges, meta.Range{Off: off, Len: n})
	l.n.Store(int64(len(l.ranges)))
	return l.store(l.ranges)
}

// clear takes [off, off+n) out of the lost ranges (it was written), durably before it returns.
func (l *lostSet) clear(off, n int64) error {
	if l.n.Load() == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.overlapsLocked(off, n) {
		return nil
	}
	next := cutRange(l.ranges, meta.Range{Off: off, Len: n})
	if err := l.store(next); err != nil {
		return err
	}
	l.ranges = next
	l.n.Store(int64(len(next)))
	return nil
}

// list returns the lost ranges.
func (l *lostSet) list() []meta.Range {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ranges)
}

// load sets the ranges a restart found.
func (l *lostSet) load(rs []meta.Range) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ranges = nil
	for _, r := range rs {
		if r.Len > 0 {
			l.ranges = mergeRange(l.ranges, r)
		}
	}
	l.n.Store(int64(len(l.ranges)))
}

func (l *lostSet) store(rs []meta.Range) error {
	if l.persist == nil {
		return nil
	}
	if err := l.persist(slices.Clone(rs)); err != nil {
		return fmt.Errorf("cache metadata: recording the lost ranges: %w", err)
	}
	return nil
}

// mergeRange returns rs (sorted, apart) with r added, joined with the ranges it touches.
func mergeRange(rs []meta.Range, r meta.Range) []meta.Range {
	out := make([]meta.Range, 0, len(rs)+1)
	lo, hi := r.Off, r.Off+r.Len
	placed := false
	for _, x := range rs {
		switch {
		case placed || x.Off+x.Len < lo:
			out = append(out, x)
		case x.Off > hi:
			out = append(out, meta.Range{Off: lo, Len: hi - lo}, x)
			placed = true
		default:
			lo, hi = min(lo, x.Off), max(hi, x.Off+x.Len)
		}
	}
	if !placed {
		out = append(out, meta.Range{Off: lo, Len: hi - lo})
	}
	return out
}

// cutRange returns rs without the bytes of r.
func cutRange(rs []meta.Range, r meta.Range) []meta.Range {
	out := make([]meta.Range, 0, len(rs)+1)
	lo, hi := r.Off, r.Off+r.Len
	for _, x := range rs {
		xe := x.Off + x.Len
		if xe <= lo || x.Off >= hi {
			out = append(out, x)
			continue
		}
		if x.Off < lo {
			out = append(out, meta.Range{Off: x.Off, Len: lo - x.Off})
		}
		if xe > hi {
			out = append(out, meta.Range{Off: hi, Len: xe - hi})
		}
	}
	return out
}
