// Package ratemeter measures how fast a counter grows, over about the last second, from samples its
// user takes. It only keeps samples: it must never read the counter itself, start a goroutine or
// take another lock under its own.
package ratemeter

import (
	"sync"
	"time"
)

// Meter measures how fast a counter grows, from samples its user takes at least every 100 ms
// (rateEvery apart), over about the last second. The zero value is ready.
type Meter struct {
	mu      sync.Mutex // guards samples and n; nothing is taken under it
	samples [rateSamples]rateSample
	n       int // samples taken; the newest is samples[(n-1)%rateSamples]
}

type rateSample struct {
	at time.Time
	v  uint64
}

const (
	rateSamples = 12
	rateEvery   = 100 * time.Millisecond
	rateWindow  = time.Second
)

// Sample records v at now, unless the newest sample is less than rateEvery old.
func (m *Meter) Sample(now time.Time, v uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n > 0 && now.Sub(m.samples[(m.n-1)%rateSamples].at) < rateEvery {
		return
	}
	m.samples[m.n%rateSamples] = rateSample{now, v}
	m.n++
}

// Rate is the growth per second to v at now from the newest sample at least rateWindow old, or
// the oldest one kept if none is that old (a stalled sampler just widens the window).
func (m *Meter) Rate(now time.Time, v uint64) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return 0
	}
	var from rateSample
	for i := m.n - 1; i >= max(0, m.n-rateSamples); i-- {
		if from = m.samples[i%rateSamples]; now.Sub(from.at) >= rateWindow {
			break
		}
	}
	dt := now.Sub(from.at).Seconds()
	if dt <= 0 || v < from.v {
		return 0
	}
	return float64(v-from.v) / dt
}
