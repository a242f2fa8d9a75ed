// Package units parses and prints byte sizes as users write them in flags and configs ("64KiB",
// "1GiB", "512"). It must never guess: an unknown suffix is an error, not bytes.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var suffixes = []struct {
	name string
	mult int64
}{
	// Longest first, so "KiB" is matched before "B".
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

// ParseSize parses a size such as "4096", "64KiB", "1.5GiB" or "10G" (single letters are binary
// units, as in dd and qemu-img). The result must be a whole number of bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size; write a number of bytes or use KiB, MiB, GiB, TiB")
	}
	mult := int64(1)
	for _, suf := range suffixes {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(suf.name)) {
			mult = suf.mult
			t = strings.TrimSpace(t[:len(t)-len(suf.name)])
			break
		}
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("size %q is negative", s)
		}
		if n > math.MaxInt64/mult {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q is not a number with an optional unit (KiB, MiB, GiB, TiB)", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	v := f * float64(mult)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	return int64(v), nil
}

// FormatSize prints n with the largest binary unit that divides it exactly ("64KiB", "1GiB"), or in
// bytes.
func FormatSize(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// ParseRate parses a rate in bytes a second, written as a size ("64MiB", ParseSize) with or
// without "/s" ("64MiB/s"); "0" is 0, which callers take as no limit.
func ParseRate(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if r, ok := strings.CutSuffix(t, "/s"); ok {
		t = r
	}
	n, err := ParseSize(t)
	if err != nil {
		return 0, fmt.Errorf("rate %q is not a size a second (%v); write e.g. 64MiB/s, or 0 for no limit", s, err)
	}
	return n, nil
}
