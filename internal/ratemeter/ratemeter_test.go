package ratemeter

import (
	"math"
	"testing"
	"time"
)

func TestMeter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type sample struct {
		ms int
		v  uint64
	}
	every := func(from, to, step int, perMs uint64) []sample {
		var s []sample
		for ms := from; ms <= to; ms += step {
			s = append(s, sample{ms, uint64(ms) * perMs})
		}
		return s
	}
	cases := []struct {
		name    string
		samples []sample
		nowMs   int
		v       uint64
		want    float64
	}{
		{"no samples", nil, 1000, 100, 0},
		{"steady, over the last second", every(0, 2000, 100, 1000), 2000, 2_000_000, 1e6},
		{"a sample too soon after another is not taken", []sample{{0, 0}, {50, 999_999}}, 100, 100_000, 1e6},
		{"a stalled sampler: a wider window", []sample{{0, 0}}, 5000, 1_000_000, 2e5},
		{"less than a window kept: from the oldest", []sample{{0, 0}, {400, 400}}, 500, 1000, 2000},
		{"nothing written back", every(0, 1000, 100, 0), 1000, 0, 0},
		{"the ring wraps", every(0, 2900, 100, 2000), 2900, 2900 * 2000, 2e6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m Meter
			for _, s := range tc.samples {
				m.Sample(t0.Add(time.Duration(s.ms)*time.Millisecond), s.v)
			}
			got := m.Rate(t0.Add(time.Duration(tc.nowMs)*time.Millisecond), tc.v)
			if math.Abs(got-tc.want) > 1e-6*max(1, tc.want) {
				t.Fatalf("rate %.1f, want %.1f", got, tc.want)
			}
		})
	}
}
