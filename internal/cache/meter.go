package cache

import (
	"time"
)

// Meter keeps the statistics of an export served without a cache, in a cache's shape (Stats with
// mode "none" and no tiers): the backend's requests, bytes and errors and the clients' request
// latencies, so that monitoring sees every export, the uncached ones (a remote backend, the most
// likely to fail) too. A volume records into it (volume.Options.Meter); its zero value is ready.
type Meter struct {
	backend  ioCounters
	readLat  histogram
	writeLat histogram
}

// StatsModeNone is the mode Meter's statistics report: no cache.
const StatsModeNone = "none"

// Read records a read of n bytes that took d.
func (m *Meter) Read(n int, d time.Duration, err error) {
	m.backend.read(n, err)
	m.readLat.observe(d)
}

// Write records a write of n bytes that took d.
func (m *Meter) Write(n int, d time.Duration, err error) {
	m.backend.write(n, err)
	m.writeLat.observe(d)
}

// Failed records the error of another request (a flush, a trim, a write of zeroes), which the
// backend's errors count.
func (m *Meter) Failed(err error) {
	if err != nil {
		m.backend.errors.Add(1)
	}
}

// Stats returns a snapshot.
func (m *Meter) Stats() Stats {
	b := m.backend.snapshot()
	return Stats{Mode: StatsModeNone, Tiers: []TierStats{}, Backend: b, ReadBytes: b.ReadBytes, FetchedBytes: b.ReadBytes,
		ReadLatency: m.readLat.snapshot(), WriteLatency: m.writeLat.snapshot()}
}
