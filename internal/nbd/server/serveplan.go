package server

import (
	"sync/atomic"
	"time"
)

// Handing a request to a worker goroutine costs more than serving it on a fast device (a RAM
// tier, a page-cached file). So while the device's recent latency stays under inlineLatency, the
// reader serves requests itself. A request that turns out slow must not hold back the ones behind
// it: the server's watchdog sees the reader stuck and starts a new goroutine that takes over the
// reading (takeOver), which hands requests to workers while the device stays slow. (A timer per
// request would cost more than the handoff it saves.) The bound covers a 64 KiB write into the
// page cache on a slow 2-core VM: served by workers, those cost more CPU a request than served
// inline, the payload crossing cores and each handoff waking an idle one (bench writeback's 64K
// sequential write row, and the CPU a request in paired runs). An O_DIRECT read of the SSD tier
// still goes to a worker.
//
// Time alone cannot tell a request that keeps the CPU busy from one that waits: a remote NBD
// server that answers in 30 µs looks as fast as a write to the page cache, and served one at a
// time it carries 33,000 requests a second whatever its link (bench cold's rows without a cache,
// over nbdkit behind a rate filter, measure it). So a request during which the device waited on a disk or the network
// (backend.Waiter) counts as taking at least waitedLatency: a device that waits goes to workers,
// whose waits overlap, and one whose requests wait only now and then stays inline.
//
// Requests handed off look slower than they are when the device serves them one at a time:
// buffered writes to one file each take its inode lock, so 32 workers each wait for the 31 others
// and the average says many times what one write alone takes. Left to the average, a connection
// that went to workers once (a write stalled in the page cache's throttling) stayed there,
// the workers spinning on the lock. So after slowSpell handoffs in a row the reader serves one
// request itself, a probe, and its latency replaces the average; samples of requests handed off
// before the probe no longer count.
const (
	inlineLatency = 100 * time.Microsecond
	waitedLatency = 10 * inlineLatency
	slowSpell     = 1024
)

// servePlan decides, for each request read, whether the reader serves it itself or hands it to a
// worker. Only the reader calls next and rescued; observe runs on any goroutine.
type servePlan struct {
	latency atomic.Int64  // moving average of the device's service time, in nanoseconds
	gen     atomic.Uint64 // advanced by each probe: older samples are stale
	slowRun int           // handoffs in a row for slowness; only the reader touches it
}

// next reports whether the reader serves the next request itself, and whether that is a probe;
// gen is the generation the request's sample belongs to.
func (p *servePlan) next() (inline, probe bool, gen uint64) {
	if time.Duration(p.latency.Load()) <= inlineLatency {
		p.slowRun = 0
		return true, false, p.gen.Load()
	}
	if p.slowRun < slowSpell {
		p.slowRun++
		return false, false, p.gen.Load()
	}
	p.slowRun = 0
	return true, true, p.gen.Add(1)
}

// observe records that a request of generation gen took d: into the moving average over 8
// requests, or as the average itself for a probe. (Concurrent updates may race and be lost,
// which only makes the average less exact.)
func (p *servePlan) observe(d time.Duration, gen uint64, probe bool) {
	if probe {
		p.latency.Store(int64(d))
		return
	}
	if gen != p.gen.Load() {
		return
	}
	avg := p.latency.Load()
	p.latency.Store(avg + (int64(d)-avg)/8)
}

// rescued records that a request served inline has been stuck for at least d, and that the
// reader now moves on without it.
func (p *servePlan) rescued(d time.Duration) {
	p.latency.Store(max(p.latency.Load(), int64(d)))
	p.slowRun = 0
}
