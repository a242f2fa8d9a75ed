// Package congestion judges whether a cache device is congested, from the kernel's counters of its
// requests compared with a threshold and with the backend's reads, so that its user can stop
// filling it while it is. It only judges: it must never refuse a read or a write itself, time a
// device with Go's clock, or block its caller (its lock is only ever tried).
package congestion

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// DefaultThreshold is the congestion threshold unless the user sets one. Below it a device is
// never judged congested, whatever the backend: a fill that costs under 2 ms is worth the hits it
// brings (bcache's congested_read_threshold_us is the same figure).
const DefaultThreshold = 2 * time.Millisecond

const (
	// congestionInterval is how often the device's counters are read: often enough to follow a
	// burst, seldom enough that the kernel's millisecond totals average many requests.
	congestionInterval = 200 * time.Millisecond
	// ProbeEvery is how often a congested device still takes a missed line: one in this many
	// (Refuse returns false), so that it has requests whose time tells when the congestion is
	// over even when nothing else uses it.
	ProbeEvery = 64
)

// Check judges whether a cache device is congested: whether, over the last intervals in which it
// completed requests (congestedIntervals of them in a row), they took longer on average than the
// threshold and than the backend's reads. A congested device is filled with no missed line (but
// probes), since its fill would add to the queue that makes the device slow, and the hits already
// on it slower, while the backend answers faster; reads are served all the same, from the device
// where it holds the line and from the backend otherwise. A nil *Check never refuses.
//
// The device's time is the kernel's (backend.DeviceTimer), never Go's clock around a request: on a
// machine whose CPUs are busy, that measures the wait for a CPU. The backend's read time is Go's
// clock, which can only overstate it and so makes the device take more, not less.
type Check struct {
	dev       backend.DeviceTimer
	threshold time.Duration
	interval  time.Duration // congestionInterval unless SetInterval changed it

	next atomic.Int64 // when to read the counters next (ns since epoch)
	mu   sync.Mutex   // guards last, have and over; only tried, by whoever reads the counters
	last backend.DeviceTime
	have bool // last holds a reading
	over int  // intervals in a row whose requests were slow

	congested   atomic.Bool
	latency     atomic.Int64 // the device's time per request over the last interval with any, ns
	backendRead atomic.Int64 // a moving average of the backend's read time, ns
	asks        atomic.Uint64
	refused     atomic.Uint64
}

// epoch is the origin of Check's monotonic clock.
var epoch = time.Now()

// New returns the congestion check of dev, or nil where there is none: threshold < 0
// turns it off, and a device the kernel cannot time (a file on tmpfs, a fault-injection stand-in)
// is never congested.
func New(dev backend.Backend, threshold time.Duration) *Check {
	timer, ok := dev.(backend.DeviceTimer)
	if threshold < 0 || !ok {
		return nil
	}
	if _, err := timer.DeviceTime(); err != nil {
		return nil
	}
	if threshold == 0 {
		threshold = DefaultThreshold
	}
	return &Check{dev: timer, threshold: threshold, interval: congestionInterval}
}

// SetInterval sets how often the device's counters are read (congestionInterval unless set): 0
// reads them at every Refuse, as tests do. It must be called before the check is used.
func (g *Check) SetInterval(d time.Duration) { g.interval = d }

// Refuse says whether a missed line is turned away because the device is congested.
func (g *Check) Refuse() bool {
	if g == nil {
		return false
	}
	if now := int64(time.Since(epoch)); now >= g.next.Load() && g.mu.TryLock() {
		g.sample(now)
		g.mu.Unlock()
	}
	if !g.congested.Load() || g.asks.Add(1)%ProbeEvery == 0 {
		return false
	}
	g.refused.Add(1)
	return true
}

// sample reads the device's counters and judges the interval since the last reading; g.mu is held.
func (g *Check) sample(now int64) {
	if now < g.next.Load() { // another goroutine sampled meanwhile
		return
	}
	g.next.Store(now + int64(g.interval))
	d, err := g.dev.DeviceTime()
	if err != nil {
		g.have = false
		g.congested.Store(false)
		return
	}
	prev, had := g.last, g.have
	g.last, g.have = d, true
	if !had || d.Reads < prev.Reads || d.Writes < prev.Writes { // a first reading, or counters reset
		return
	}
	bound := max(g.threshold, time.Duration(g.backendRead.Load()))
	switch n := d.Reads - prev.Reads + d.Writes - prev.Writes; {
	case n > 0:
		lat := (d.ReadTime - prev.ReadTime + d.WriteTime - prev.WriteTime) / time.Duration(n)
		g.latency.Store(int64(lat))
		g.judge(lat > bound)
	case d.InFlight > 0:
		// Requests wait, and none completed in a whole interval: the device is stalled.
		g.latency.Store(int64(g.interval))
		g.judge(g.interval > bound)
	}
	// An idle device keeps its judgement: the probes' fills time it again.
}

// congestedIntervals is how many slow intervals in a row make a device congested: one is a blip
// (a flush of other programs' writes, a neighbour's burst on a shared disk) that passes before
// refusing lines would help; one fast interval ends the congestion.
const congestedIntervals = 2

func (g *Check) judge(slow bool) {
	if !slow {
		g.over = 0
		g.congested.Store(false)
		return
	}
	g.over++
	if g.over >= congestedIntervals {
		g.congested.Store(true)
	}
}

// BackendReadTook adds a backend read's time to the moving average the device is compared with.
func (g *Check) BackendReadTook(d time.Duration) {
	if g == nil {
		return
	}
	avg := g.backendRead.Load() // concurrent updates may lose a sample: it is an estimate
	if avg == 0 {
		avg = int64(d)
	}
	g.backendRead.Store(avg + (int64(d)-avg)/8)
}

// Stats returns how many missed lines were refused, whether the device is congested now, and its
// time per request over the last interval with any (all zero for a nil check).
func (g *Check) Stats() (refused uint64, congested bool, latency time.Duration) {
	if g == nil {
		return 0, false, 0
	}
	return g.refused.Load(), g.congested.Load(), time.Duration(g.latency.Load())
}
