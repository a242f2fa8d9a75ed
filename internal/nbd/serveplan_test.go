package nbd

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A plan driven by a device model: what each request takes inline and handed off. It returns
// how many requests the reader served itself and how many of those were probes.
func runPlan(p *servePlan, n int, inlineTook, handedTook time.Duration) (inline, probes int) {
	for range n {
		in, probe, gen := p.next()
		if in {
			inline++
			if probe {
				probes++
			}
			p.observe(inlineTook, gen, probe)
			continue
		}
		p.observe(handedTook, gen, false)
	}
	return inline, probes
}

func TestServePlan(t *testing.T) {
	const us = time.Microsecond
	for _, tc := range []struct {
		name string
		// before the run: one request served inline that took first (0: none), or a rescue
		first   time.Duration
		rescue  bool
		n       int
		inline  time.Duration // what a request takes served by the reader
		handed  time.Duration // and served by a worker
		wantIn  int
		wantPrb int
	}{
		{name: "fast device: all inline", n: 5000, inline: 30 * us, handed: 30 * us, wantIn: 5000},
		{name: "slow device: a probe every slowSpell handoffs", first: 5 * time.Millisecond,
			n: 3 * (slowSpell + 1), inline: 5 * time.Millisecond, handed: 5 * time.Millisecond,
			wantIn: 3, wantPrb: 3},
		// A device that serves one request at a time looks slow to 32 workers that queue for it:
		// the probe sees it fast and the reader keeps serving.
		{name: "serializing device: back inline after one probe", rescue: true,
			n: slowSpell + 1 + 4000, inline: 30 * us, handed: 500 * us,
			wantIn: 4001, wantPrb: 1},
		// One slow request among fast ones: workers' fast samples bring the average (625 µs after
		// it) under the bound in 15 requests, long before a probe is due.
		{name: "one slow request: back inline as the average falls", first: 5 * time.Millisecond,
			n: 1000, inline: 10 * us, handed: 10 * us, wantIn: 1000 - 15, wantPrb: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p servePlan
			if tc.first > 0 {
				in, probe, gen := p.next()
				require.True(t, in)
				p.observe(tc.first, gen, probe)
			}
			if tc.rescue {
				p.rescued(watchdogTick)
			}
			in, probes := runPlan(&p, tc.n, tc.inline, tc.handed)
			require.Equal(t, tc.wantIn, in, "requests served inline")
			require.Equal(t, tc.wantPrb, probes, "probes")
		})
	}
}

// Samples of requests handed off before a probe do not undo what the probe found.
func TestServePlanStaleSamples(t *testing.T) {
	var p servePlan
	p.rescued(watchdogTick)
	var gens []uint64
	for range slowSpell {
		in, _, gen := p.next()
		require.False(t, in)
		gens = append(gens, gen)
	}
	in, probe, gen := p.next()
	require.True(t, in)
	require.True(t, probe)
	p.observe(20*time.Microsecond, gen, true)
	for _, g := range gens[len(gens)-32:] { // the workers still busy finish, slowly
		p.observe(600*time.Microsecond, g, false)
	}
	in, probe, _ = p.next()
	require.True(t, in, "the probe's latency stands")
	require.False(t, probe)
}
