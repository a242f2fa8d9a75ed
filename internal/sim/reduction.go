package sim

import (
	"crypto/sha256"
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

// ReductionMode is what a measured ratio counts, as the SSD tier's reduction of the same name
// stores the data.
type ReductionMode int

const (
	// ReduceZero: zero blocks take no space, the others their 4 KiB (reduction: zero).
	ReduceZero ReductionMode = iota
	// ReduceCompress: and the others compressed with S2, a block at a time (reduction: compress).
	ReduceCompress
	// ReduceDedupe: and a block with the bytes of an earlier one stored once (reduction: dedupe).
	ReduceDedupe
)

var reductionModes = []string{"zero", "compress", "dedupe"}

func (m ReductionMode) String() string { return reductionModes[m] }

// ParseReductionMode parses a reduction mode's name.
func ParseReductionMode(s string) (ReductionMode, error) {
	for i, n := range reductionModes {
		if s == n {
			return ReductionMode(i), nil
		}
	}
	return 0, fmt.Errorf("%q: use zero, compress or dedupe", s)
}

// Reduction is what a data file measures of the SSD tier's data reduction: how many of its 4 KiB
// blocks are zeros (which the tier stores as a bit, no space), what S2 makes of the others
// compressed a block at a time, and, measured for ReduceDedupe, how many of those are unique.
type Reduction struct {
	Blocks     int64 // 4 KiB blocks read (a short last one counts as one)
	ZeroBlocks int64
	Bytes      int64 // bytes of the non-zero blocks
	Compressed int64 // those blocks compressed with S2, each no larger than it was

	// Deduped says that the unique blocks were counted (MeasureReduction with ReduceDedupe).
	Deduped bool
	// UniqueBlocks are the non-zero blocks whose bytes no earlier block had; UniqueCompressed
	// their bytes compressed as Compressed counts them: each unique block stored once.
	UniqueBlocks     int64
	UniqueCompressed int64
}

// blockDigest names a block's bytes: the first 128 bits of its SHA-256. Two different blocks of a
// file of n blocks share one with a probability below n²/2¹²⁹ (under 2⁻⁶⁵ for 16 TiB), far below
// that of a read error, so equal digests are taken as equal bytes without comparing them (which
// would mean holding every unique block). The table costs 24 to 36 bytes of RAM per unique block
// (a Go map of 16-byte keys, as full as it happens to be): about 1 GiB for 128 GiB of unique data.
type blockDigest [16]byte

// MeasureReduction reads r to its end. With ReduceDedupe it also counts the unique blocks, which
// costs a SHA-256 of each non-zero block and a table entry per unique one.
func MeasureReduction(r io.Reader, mode ReductionMode) (Reduction, error) {
	m := Reduction{Deduped: mode == ReduceDedupe}
	var seen map[blockDigest]struct{}
	if m.Deduped {
		seen = map[blockDigest]struct{}{}
	}
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
				c := int64(min(len(s2.Encode(dst, b)), n))
				m.Compressed += c
				if seen != nil {
					sum := sha256.Sum256(b)
					d := blockDigest(sum[:16])
					if _, dup := seen[d]; !dup {
						seen[d] = struct{}{}
						m.UniqueBlocks++
						m.UniqueCompressed += c
					}
				}
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

// Ratio is logical bytes over the bytes the SSD tier stores with reduction mode: zero blocks
// elided (ReduceZero); and the rest compressed (ReduceCompress); and each unique block stored
// once (ReduceDedupe, which needs a measure that counted them). It fails for data that is all
// zeros, which reduces to nothing.
func (m Reduction) Ratio(mode ReductionMode) (float64, error) {
	var stored int64
	switch mode {
	case ReduceZero:
		stored = m.Bytes
	case ReduceCompress:
		stored = m.Compressed
	case ReduceDedupe:
		if !m.Deduped {
			return 0, errors.New("was measured without counting unique blocks")
		}
		stored = m.UniqueCompressed
	default:
		return 0, fmt.Errorf("unknown reduction mode %d", mode)
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
	if z, err := m.Ratio(ReduceZero); err == nil {
		c, _ := m.Ratio(ReduceCompress)
		s += fmt.Sprintf("; %.2f:1 with zero blocks elided, %.2f:1 with the rest compressed (S2, per block)", z, c)
		if d, err := m.Ratio(ReduceDedupe); err == nil {
			nonZero := m.Blocks - m.ZeroBlocks
			s += fmt.Sprintf(", %.2f:1 with duplicates stored once (%d unique of %d non-zero blocks)", d, m.UniqueBlocks, nonZero)
		}
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
