package sim

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/klauspost/compress/s2"
)

// reductionBlock is the unit whose reduction is measured: the cache's 4 KiB block, the smallest
// thing the SSD tier holds or elides.
const reductionBlock = 4096

// Reduction is what a data file measures of the SSD tier's data reduction: how many of its 4 KiB
// blocks are zeros (which the tier stores as a bit, no space), and what S2 makes of the others
// compressed a block at a time.
type Reduction struct {
	Blocks     int64 // 4 KiB blocks read (a short last one counts as one)
	ZeroBlocks int64
	Bytes      int64 // bytes of the non-zero blocks
	Compressed int64 // those blocks compressed with S2, each no larger than it was
}

// MeasureReduction reads r to its end.
func MeasureReduction(r io.Reader) (Reduction, error) {
	var m Reduction
	buf := make([]byte, reductionBlock)
	dst := make([]byte, s2.MaxEncodedLen(reductionBlock))
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			b := buf[:n]
			m.Blocks++
			if allZero(b) {
				m.ZeroBlocks++
			} else {
				m.Bytes += int64(n)
				// A block that does not shrink is stored as it is.
				m.Compressed += int64(min(len(s2.Encode(dst, b)), n))
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return m, nil
		}
		if err != nil {
			return m, err
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Ratio is logical bytes over the bytes the SSD tier stores: with compress, zero blocks elided and
// the rest compressed; without, zero blocks elided only (reduction: zero). It fails for data that
// is all zeros, which reduces to nothing.
func (m Reduction) Ratio(compress bool) (float64, error) {
	stored := m.Bytes
	if compress {
		stored = m.Compressed
	}
	if stored == 0 {
		return 0, errors.New("holds no block that is not zeros, so it measures no ratio: give one with --reduction")
	}
	return float64(m.Blocks*reductionBlock) / float64(stored), nil
}

// String says what was measured.
func (m Reduction) String() string {
	if m.Blocks == 0 {
		return "no data"
	}
	s := fmt.Sprintf("%d blocks of 4 KiB, %.1f %% zeros", m.Blocks, 100*float64(m.ZeroBlocks)/float64(m.Blocks))
	if z, err := m.Ratio(false); err == nil {
		c, _ := m.Ratio(true)
		s += fmt.Sprintf("; %.2f:1 with zero blocks elided, %.2f:1 with the rest compressed (S2, per block)", z, c)
	}
	return s
}

// ParseRatio parses a reduction ratio: 2, 2.5 or 2.5:1, at least 1.
func ParseRatio(s string) (float64, error) {
	x, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), ":1"), 64)
	if err != nil || !(x >= 1) || x > 1000 {
		return 0, fmt.Errorf("%q: give a ratio of logical to stored bytes from 1 to 1000, as 2 or 2.5:1", s)
	}
	return x, nil
}

// Reduce is the capacity in keys of a cache of keys keys whose data reduces ratio:1: what an SSD
// of that size holds.
func Reduce(keys int, ratio float64) int { return max(1, int(float64(keys)*ratio)) }
