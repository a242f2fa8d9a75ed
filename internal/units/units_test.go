package units

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "4096", want: 4096},
		{in: "64KiB", want: 64 << 10},
		{in: "64kib", want: 64 << 10},
		{in: "1GiB", want: 1 << 30},
		{in: "1.5GiB", want: 3 << 29},
		{in: "10G", want: 10 << 30},
		{in: "2TiB", want: 2 << 40},
		{in: " 8 MiB ", want: 8 << 20},
		{in: "", bad: true},
		{in: "-1", bad: true},
		{in: "1XB", bad: true},
		{in: "0.3B", bad: true},
		{in: "99999999999TiB", bad: true},
		{in: "NaN", bad: true},
		{in: "NaNGB", bad: true},
		{in: "-1GB", bad: true},
	} {
		got, err := ParseSize(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseSize(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

// Decimal units are refused, never read as 10^n nor guessed to be binary: the error names the
// binary size the user probably meant, and both byte counts.
func TestParseSizeRefusesDecimalUnits(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"1GB", `size "1GB": decimal units are not accepted (1GB would be 1000000000 bytes); write 1GiB (1073741824 bytes), or a number of bytes`},
		{"64MB", `size "64MB": decimal units are not accepted (64MB would be 64000000 bytes); write 64MiB (67108864 bytes), or a number of bytes`},
		{"2TB", `size "2TB": decimal units are not accepted (2TB would be 2000000000000 bytes); write 2TiB (2199023255552 bytes), or a number of bytes`},
		{"4kb", `size "4kb": decimal units are not accepted (4kb would be 4000 bytes); write 4KiB (4096 bytes), or a number of bytes`},
		{" 1.5 GB ", `size " 1.5 GB ": decimal units are not accepted (1.5GB would be 1500000000 bytes); write 1.5GiB (1610612736 bytes), or a number of bytes`},
		// 0.3KiB is no whole number of bytes, so it is not offered.
		{"0.3KB", `size "0.3KB": decimal units are not accepted (0.3KB would be 300 bytes); write a size in KiB, MiB, GiB or TiB, or a number of bytes`},
	} {
		got, err := ParseSize(tc.in)
		if err == nil || err.Error() != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v;\nwant error %s", tc.in, got, err, tc.want)
		}
	}
}

func TestNearest(t *testing.T) {
	for _, tc := range []struct {
		n, unit int64
		want    string
	}{
		{1e9, 4096, "976560KiB (999997440 bytes) or 976564KiB (1000001536 bytes)"},
		{100e6, 64 << 10, "97600KiB (99942400 bytes) or 97664KiB (100007936 bytes)"},
		{1000, 4096, "4KiB (4096 bytes)"},
		{1<<63 - 1, 4096, "9007199254740988KiB (9223372036854771712 bytes)"},
	} {
		if got := Nearest(tc.n, tc.unit); got != tc.want {
			t.Errorf("Nearest(%d, %d) = %q, want %q", tc.n, tc.unit, got, tc.want)
		}
	}
}

func TestApprox(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 1000: "1000", 1024: "1KiB", 12800: "12.5KiB",
		991936 << 10: "969MiB", 2304 << 20: "2.25GiB", 3 << 39: "1.5TiB", 5 << 40: "5TiB", 100 << 20: "100MiB"} {
		if got := Approx(in); got != want {
			t.Errorf("Approx(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 4096: "4KiB", 1 << 30: "1GiB", 1000: "1000", 3 << 39: "1536GiB"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
		if in == 0 {
			continue
		}
		if back, err := ParseSize(FormatSize(in)); err != nil || back != in {
			t.Errorf("round trip of %d gave %d, %v", in, back, err)
		}
	}
}

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  string // what the error must contain; empty: no error
	}{
		{in: "0", want: 0},
		{in: "64MiB", want: 64 << 20},
		{in: "64MiB/s", want: 64 << 20},
		{in: " 100M/s ", want: 100 << 20},
		{in: "1.5GiB/s", want: 3 << 29},
		{in: "4096", want: 4096},
		{in: "", bad: "is not a size a second"},
		{in: "/s", bad: "is not a size a second"},
		{in: "-1MiB/s", bad: "is not a size a second"},
		{in: "fast", bad: "is not a size a second"},
		{in: "64MiB/min", bad: "is not a size a second"},
		{in: "1GB/s", bad: "rate \"1GB/s\": decimal units are not accepted (1GB/s would be 1000000000 bytes a second); write 1GiB/s (1073741824 bytes a second), or a number of bytes a second"},
		{in: "100MB", bad: "rate \"100MB\": decimal units are not accepted (100MB would be 100000000 bytes a second); write 100MiB (104857600 bytes a second), or a number of bytes a second"},
	} {
		got, err := ParseRate(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("ParseRate(%q) = %d, %v; want an error with %q", tc.in, got, err, tc.bad)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

// FuzzParseSize: any text gets a size or an error, never a panic; a size is never negative, and
// what FormatSize prints of it parses back to it.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"4096", "64KiB", "1.5GiB", "10G", "1GB", "0.5K", "-1", "9223372036854775807", "1e3", "  2 MiB "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		back, err := ParseSize(FormatSize(n))
		if err != nil || back != n {
			t.Fatalf("ParseSize(%q) = %d, printed %q, read back %d, %v", s, n, FormatSize(n), back, err)
		}
	})
}
