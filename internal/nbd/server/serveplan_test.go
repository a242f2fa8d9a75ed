package server

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/volume"
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

// waitingDevice takes spin of CPU time a read and, with waits, reports each read as one that
// waited (backend.Waiter), as a remote backend that answers fast would.
type waitingDevice struct {
	*hookDevice
	waits atomic.Uint64
}

func (d *waitingDevice) Waits() uint64 { return d.waits.Load() }

// TestWaitingDeviceGoesToWorkers: a device whose requests are fast but wait (on a network, a disk)
// must have them served by workers, several at once, rather than one at a time by the reader,
// which is what the same device gets when it does not say that it waits (served inline while
// its requests take less than inlineLatency: TestServePlan).
func TestWaitingDeviceGoesToWorkers(t *testing.T) {
	vol, _ := nbdtest.NewVolume(1<<20, 0x22, volume.Options{})
	var active, peak atomic.Int32
	d := &waitingDevice{}
	d.hookDevice = &hookDevice{Device: vol, onRead: func(int64) {
		n := active.Add(1)
		defer active.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		d.waits.Add(1)
		for start := time.Now(); time.Since(start) < 10*time.Microsecond; {
		}
	}}
	ts := startServer(t, Config{Exports: []Export{{Device: d}}})
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", true)
	const reads = 3000
	for round := range 2 { // the first settles the plan (its first requests are slow: cold code)
		peak.Store(0)
		go func() {
			for i := range uint64(reads) {
				c.Request(proto.Request{Type: proto.CmdRead, Cookie: i, Offset: 4096 * (i % 256), Length: 4096}, nil)
			}
		}()
		for range reads {
			require.Zero(t, c.Reply().Errno)
		}
		if round == 1 {
			require.Greater(t, peak.Load(), int32(1), "reads in the device at once")
		}
	}
}
