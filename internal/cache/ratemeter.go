package cache

import (
	"sync"
	"time"
)

// rateMeter measures how fast a counter grows, from samples the destager takes at least every
// 100 ms (rateEvery apart), over about the last second.
type rateMeter struct {
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

// sample records v at now, unless the newest sample is less than rateEvery old.
func (m *rateMeter) sample(now time.Time, v uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n > 0 && now.Sub(m.samples[(m.n-1)%rateSamples].at) < rateEvery {
		return
	}
	m.samples[m.n%rateSamples] = rateSample{now, v}
	m.n++
}

// rate is the growth per second to v at now from the newest sample at least rateWindow old, or
// the oldest one kept if none is that old (a stalled sampler just widens the window).
func (m *rateMeter) rate(now time.Time, v uint64) float64 {
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
