package server

import (
	"runtime"
	"time"
)

// watchdogTick is how long a reader may be stuck serving a request itself before another
// goroutine takes over its reading.
const watchdogTick = 5 * time.Millisecond

// minProcsToHoldOne is the fewest Ps with which the watchdog keeps one busy while it sleeps; the
// daemon runs with 32.
const minProcsToHoldOne = 8

// watch starts the watchdog unless it runs. It runs while there are connections.
func (s *Server) watch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.watching {
		s.watching = true
		go s.watchdog()
	}
}

// watchdog rescues connections whose reader has been serving a request itself for a whole tick:
// it starts a new reader for them.
//
// It also keeps the runtime's monitor (sysmon) from polling. Sysmon sleeps deeply while every P is
// idle, and when a goroutine then enters a system call (the SSD tier's pwrite, an O_DIRECT read:
// the socket calls that cannot block are raw for this reason, see sock.go) it wakes and polls every
// 20 µs for a millisecond and more. A server whose reader waits for the client between batches
// makes every P idle thousands of times a second, and sysmon's wake-ups take the core from the
// server and the client (a CPU profile of bench writeback's 8K 80/20 row shows it). So, while there
// are connections and Ps to spare, the watchdog sleeps its ticks in a raw system call (rawSleep),
// during which the runtime counts its P as busy: sysmon never sleeps deeply and keeps to its normal
// backoff of up to 10 ms. With few Ps (GOMAXPROCS set low by hand) holding one would cost
// real capacity, so the watchdog then sleeps as any goroutine does.
func (s *Server) watchdog() {
	sleep := time.Sleep
	if runtime.GOMAXPROCS(0) >= minProcsToHoldOne {
		sleep = rawSleep
	}
	for {
		sleep(watchdogTick)
		s.mu.Lock()
		if len(s.conns) == 0 {
			s.watching = false
			s.mu.Unlock()
			return
		}
		for c := range s.conns {
			v := c.inline.Load()
			if v&1 == 1 && v == c.seen && c.inline.CompareAndSwap(v, v+1) {
				c.workers.Add(1)
				go c.takeOver()
			}
			c.seen = v
		}
		s.mu.Unlock()
	}
}
