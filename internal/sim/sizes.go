package sim

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tierblk/tierblk/internal/units"
)

// Size is a cache size as the user wrote it: a fraction of the distinct keys, a number of keys,
// or bytes.
type Size struct {
	Label    string
	fraction float64
	keys     int
	bytes    int64
}

// ParseSizes parses a comma-separated list such as "0.01,0.1", "1000,5000" or "1GiB,4GiB".
func ParseSizes(list string) ([]Size, error) {
	var out []Size
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		s := Size{Label: f}
		if n, err := strconv.Atoi(f); err == nil {
			if n < 1 {
				return nil, fmt.Errorf("size %q: a number of objects must be at least 1", f)
			}
			s.keys = n
		} else if x, err := strconv.ParseFloat(f, 64); err == nil {
			if !(x > 0 && x < 1) {
				return nil, fmt.Errorf("size %q: a fraction of the distinct keys must be between 0 and 1", f)
			}
			s.fraction = x
		} else if b, err := units.ParseSize(f); err == nil && b > 0 {
			s.bytes = b
		} else if err != nil && f[0] >= '0' && f[0] <= '9' && strings.ContainsAny(f[len(f)-1:], "KMGTBkmgtb") {
			return nil, err // a size with a unit: units says what is wrong with it (1GB: decimal)
		} else {
			return nil, fmt.Errorf("size %q is neither a fraction (0.01), a number of objects (5000) nor bytes (1GiB)", f)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no cache size given; e.g. --size 0.01,0.05,0.1")
	}
	return out, nil
}

// Bytes is the size in bytes where it was given in bytes, else 0.
func (s Size) Bytes() int64 { return s.bytes }

// Fractional reports whether the size depends on the number of distinct keys.
func (s Size) Fractional() bool { return s.fraction > 0 }

// Keys resolves the size against a workload: floor(fraction x distinct), as libCacheSim counts it,
// or bytes / block size.
func (s Size) Keys(distinct int, blockSize int64) (int, error) {
	switch {
	case s.keys > 0:
		return s.keys, nil
	case s.fraction > 0:
		n := int(math.Floor(s.fraction * float64(distinct)))
		if n < 1 {
			return 0, fmt.Errorf("size %s of %d distinct keys is less than one object", s.Label, distinct)
		}
		return n, nil
	default:
		if blockSize == 0 {
			return 0, fmt.Errorf("size %s is in bytes, which needs --block-size (with --block-size 0 give a fraction or a number of objects)", s.Label)
		}
		n := s.bytes / blockSize
		if n < 1 {
			return 0, fmt.Errorf("size %s is smaller than one %d-byte block", s.Label, blockSize)
		}
		return int(n), nil
	}
}
