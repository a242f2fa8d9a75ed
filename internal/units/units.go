// Package units parses and prints byte sizes as users write them in flags and configs ("64KiB",
// "1GiB", "512"). It must never guess: an unknown suffix is an error, not bytes.
package units

import (
	"errors"
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
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

// decimalUnits are the SI units, which are refused rather than read: "1GB" taken as 10^9 bytes
// makes a size that is no whole number of 4 KiB blocks, and taken as 1 GiB it would be a guess. The
// error names the binary unit the user probably meant.
var decimalUnits = []struct {
	name, binary string
	mult         float64
}{{"TB", "TiB", 1e12}, {"GB", "GiB", 1e9}, {"MB", "MiB", 1e6}, {"KB", "KiB", 1e3}}

// ParseSize parses a size such as "4096", "64KiB", "1.5GiB" or "10G" (single letters are binary
// units, as in dd and qemu-img). The result must be a whole number of bytes. Decimal units ("1GB")
// are refused.
func ParseSize(s string) (int64, error) {
	n, dec, err := parse(s)
	if dec != nil {
		return 0, dec.refuse("size", s, "", "")
	}
	return n, err
}

// decimalSize is a size written with a decimal unit: the number and the unit as written, and the
// unit's factor and binary counterpart.
type decimalSize struct {
	num, unit, binary string
	mult              float64
}

// refuse says what the size would have been and what to write instead; what is "size" or "rate",
// per is what follows a unit ("/s") and perWord what follows "bytes" (" a second") in the message.
func (d *decimalSize) refuse(what, in, per, perWord string) error {
	f, _ := strconv.ParseFloat(d.num, 64) // parse found it a number
	msg := fmt.Sprintf("%s %q: decimal units are not accepted (%s%s%s would be %s bytes%s); ",
		what, in, d.num, d.unit, per, strconv.FormatFloat(f*d.mult, 'f', -1, 64), perWord)
	if b, _, err := parse(d.num + d.binary); err == nil {
		msg += fmt.Sprintf("write %s%s%s (%d bytes%s), or a number of bytes%s", d.num, d.binary, per, b, perWord, perWord)
	} else {
		msg += fmt.Sprintf("write a size in KiB, MiB, GiB or TiB, or a number of bytes%s", perWord)
	}
	return errors.New(msg)
}

// parse is ParseSize, but a size with a decimal unit comes back as dec, for the caller to word.
func parse(s string) (n int64, dec *decimalSize, err error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, nil, fmt.Errorf("empty size; write a number of bytes or use KiB, MiB, GiB, TiB")
	}
	for _, d := range decimalUnits {
		if !strings.HasSuffix(strings.ToUpper(t), d.name) {
			continue
		}
		num := strings.TrimSpace(t[:len(t)-len(d.name)])
		if f, err := strconv.ParseFloat(num, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			if f < 0 {
				return 0, nil, fmt.Errorf("size %q is negative", s)
			}
			return 0, &decimalSize{num: num, unit: t[len(t)-len(d.name):], binary: d.binary, mult: d.mult}, nil
		}
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
			return 0, nil, fmt.Errorf("size %q is negative", s)
		}
		if n > math.MaxInt64/mult {
			return 0, nil, fmt.Errorf("size %q is too large", s)
		}
		return n * mult, nil, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, nil, fmt.Errorf("size %q is not a number with an optional unit (KiB, MiB, GiB, TiB)", s)
	}
	if f < 0 {
		return 0, nil, fmt.Errorf("size %q is negative", s)
	}
	v := f * float64(mult)
	if v >= math.MaxInt64 {
		return 0, nil, fmt.Errorf("size %q is too large", s)
	}
	if v != math.Trunc(v) {
		return 0, nil, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	return int64(v), nil, nil
}

// FormatSize prints n with the largest binary unit that divides it exactly ("64KiB", "1GiB"), or in
// bytes.
func FormatSize(n int64) string {
	for _, u := range binaryUnits {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// binaryUnits are the units FormatSize and Approx print, largest first.
var binaryUnits = []struct {
	name string
	mult int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// Approx prints n to three significant figures in the largest binary unit it holds at least one
// of ("969MiB", "2.25GiB", "12.5KiB", "4KiB"), for sizes that are estimates: an exact
// "991936KiB" says more than is known.
func Approx(n int64) string {
	for _, u := range binaryUnits {
		if n >= u.mult {
			v := float64(n) / float64(u.mult)
			digits := 2
			if v >= 100 {
				digits = 0
			} else if v >= 10 {
				digits = 1
			}
			t := strconv.FormatFloat(v, 'f', digits, 64)
			if digits > 0 {
				t = strings.TrimRight(strings.TrimRight(t, "0"), ".")
			}
			return t + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// Nearest names the multiples of unit nearest to n, for an error about a size that must be one:
// "976560KiB (999997440 bytes) or 976564KiB (1000001536 bytes)"; below one unit, the unit alone.
func Nearest(n, unit int64) string {
	var vals []string
	q := n / unit
	if q > 0 {
		vals = append(vals, fmt.Sprintf("%s (%d bytes)", FormatSize(q*unit), q*unit))
	}
	if q < math.MaxInt64/unit { // else the next multiple is past any size
		vals = append(vals, fmt.Sprintf("%s (%d bytes)", FormatSize((q+1)*unit), (q+1)*unit))
	}
	return strings.Join(vals, " or ")
}

// ParseRate parses a rate in bytes a second, written as a size ("64MiB", ParseSize) with or
// without "/s" ("64MiB/s"); "0" is 0, which callers take as no limit.
func ParseRate(s string) (int64, error) {
	t := strings.TrimSpace(s)
	per := "" // the suggestion is written as the rate was, with or without "/s"
	if r, ok := strings.CutSuffix(t, "/s"); ok {
		t, per = r, "/s"
	}
	n, dec, err := parse(t)
	if dec != nil {
		return 0, dec.refuse("rate", s, per, " a second")
	}
	if err != nil {
		return 0, fmt.Errorf("rate %q is not a size a second (%v); write e.g. 64MiB/s, or 0 for no limit", s, err)
	}
	return n, nil
}
