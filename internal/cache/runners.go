package cache

import (
	"sync"
	"sync/atomic"
)

// runners runs short tasks off the caller's goroutine (the fills of misses on a ring, the
// destager's writes to the backend) on goroutines that ran earlier ones, where one waits for work:
// a new goroutine per task would grow its stack to what the task needs (the tier's write, its
// records, the backend's) each time, and end, which emulation makes dear (bench kernel --profile,
// the zipf and hits rows: runtime.newstack, goexit0). At most runnersIdle wait; the rest end with
// their task.
type runners struct {
	mu     sync.RWMutex // held shared to hand work over, alone to close work
	closed bool
	work   chan func()
	idle   atomic.Int32
}

// runnersIdle bounds the goroutines kept waiting: about the misses a few ublk queues have in
// flight, or the destager's writes (destageWritesInFlight).
const runnersIdle = 64

func newRunners() *runners { return &runners{work: make(chan func())} }

// run runs fn on a waiting goroutine, or a new one.
func (r *runners) run(fn func()) {
	r.mu.RLock()
	if !r.closed {
		select {
		case r.work <- fn:
			r.mu.RUnlock()
			return
		default:
		}
	}
	r.mu.RUnlock()
	go r.serve(fn)
}

// serve runs fn, then waits for more while fewer than runnersIdle wait, until close.
func (r *runners) serve(fn func()) {
	for {
		fn()
		if r.idle.Add(1) > runnersIdle {
			r.idle.Add(-1)
			return
		}
		var ok bool
		fn, ok = <-r.work
		r.idle.Add(-1)
		if !ok {
			return
		}
	}
}

// close lets the waiting goroutines end; later tasks run on goroutines of their own.
func (r *runners) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.work)
	}
}
