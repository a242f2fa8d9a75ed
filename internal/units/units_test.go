package units

import "testing"

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
		{in: "1GB", want: 1e9},
		{in: " 8 MiB ", want: 8 << 20},
		{in: "", bad: true},
		{in: "-1", bad: true},
		{in: "1XB", bad: true},
		{in: "0.3B", bad: true},
		{in: "99999999999TiB", bad: true},
		{in: "NaN", bad: true},
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
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "64MiB", want: 64 << 20},
		{in: "64MiB/s", want: 64 << 20},
		{in: " 100M/s ", want: 100 << 20},
		{in: "1.5GiB/s", want: 3 << 29},
		{in: "4096", want: 4096},
		{in: "", bad: true},
		{in: "/s", bad: true},
		{in: "-1MiB/s", bad: true},
		{in: "fast", bad: true},
		{in: "64MiB/min", bad: true},
	} {
		got, err := ParseRate(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseRate(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}
