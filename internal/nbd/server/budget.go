package server

import (
	"sync"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/bufpool"
)

// payloadBudget caps a connection's budget of payload buffers (the WRITE payloads it has read and
// the READ replies it has not yet written), which is otherwise its share of the server's
// (connShare): one request of the largest payload, whatever a Config.PayloadBytes set above it.
const payloadBudget = maxPayload

// DefaultPayloadBytes is the default of Config.PayloadBytes: the payload bytes all connections
// hold at once. It is what keeps the daemon's memory bounded under any number of clients
// (docs/operations.md, "How much RAM"). A connection may hold three quarters of it (connShare):
// eight requests of 1 MiB, or 32 of 256 KiB.
const DefaultPayloadBytes = 12 << 20

// connShare is the part of the server's payload budget one connection may hold: a client that does
// not take its replies leaves the rest to the others.
func connShare(server int64) int64 { return server * 3 / 4 }

// budget counts a connection's payload bytes. A request waits while its buffer would take the
// count over max, unless nothing is held (so one request larger than the rest always goes). The
// count is an atomic, taken and given back without a lock on the hit path (every request takes a
// buffer); only a request that must wait, and whoever then gives bytes back, take the lock.
type budget struct {
	used    atomic.Int64
	max     int64
	waiting atomic.Int32
	mu      sync.Mutex // guards no field: a waiter's look at used against release's Broadcast
	cond    sync.Cond  // L is mu; broadcast by release while some wait
}

func newBudget(max int64) *budget {
	b := &budget{max: max}
	b.cond.L = &b.mu
	return b
}

func (b *budget) tryAcquire(n int64) bool {
	for {
		u := b.used.Load()
		if u > 0 && u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// acquire takes n bytes, waiting for them while they would take the count over max; before it
// waits it calls beforeWait, if set.
func (b *budget) acquire(n int, beforeWait func()) {
	if b.tryAcquire(int64(n)) {
		return
	}
	if beforeWait != nil {
		beforeWait()
	}
	b.mu.Lock()
	b.waiting.Add(1) // before the next look: a release after it then takes the lock to wake us
	for !b.tryAcquire(int64(n)) {
		b.cond.Wait()
	}
	b.waiting.Add(-1)
	b.mu.Unlock()
}

func (b *budget) release(n int) {
	b.used.Add(-int64(n))
	if b.waiting.Load() > 0 {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	}
}

// getBuf takes a payload buffer of n bytes from the pool, within the connection's budget and then
// the server's: it waits for room while the connection, or all of them, hold too much. Give it
// back with putBuf.
//
// Waiting for the server's budget cannot deadlock: every holder of its bytes is a request being
// served (the reader takes a request's slot before its payload), which gives them back once it is
// answered, without waiting for more.
func (c *conn) getBuf(n int) *[]byte {
	c.budget.acquire(bufpool.Size(n), nil)
	c.s.payloads.acquire(bufpool.Size(n), nil)
	return bufpool.Get(n)
}

// readerBuf is getBuf on the reader, which sends the requests it holds plugged before it waits:
// their ends may be what gives the bytes back.
func (c *conn) readerBuf(n int) *[]byte {
	c.budget.acquire(bufpool.Size(n), c.unplug)
	c.s.payloads.acquire(bufpool.Size(n), c.unplug)
	return bufpool.Get(n)
}

// tryPrefetch takes n bytes of the server's prefetch budget (Server.prefetch) without waiting, or
// reports false. A reader holds its prefetch buffer while it waits for the client's next request,
// which may never come: were that buffer in the payloads' budget, idle connections could hold all
// of it while a request of another connection, one the client waits for, waits for room.
func (b *budget) tryPrefetch(n int) bool {
	return int64(n) <= b.max && b.tryAcquire(int64(n))
}

// putPrefetched gives back a buffer readHeader read ahead into that no WRITE took.
func (c *conn) putPrefetched(bp *[]byte) {
	c.s.prefetch.release(cap(*bp))
	bufpool.Put(bp)
}

// payloadOf makes a buffer readHeader read ahead into the payload of the WRITE it was read for:
// it moves from the prefetch budget to the connection's and the server's.
func (c *conn) payloadOf(bp *[]byte) *[]byte {
	c.budget.acquire(cap(*bp), c.unplug)
	c.s.payloads.acquire(cap(*bp), c.unplug)
	c.s.prefetch.release(cap(*bp))
	return bp
}

// putBuf gives back a buffer from getBuf.
func (c *conn) putBuf(bp *[]byte) {
	c.budget.release(cap(*bp))
	c.s.payloads.release(cap(*bp))
	bufpool.Put(bp)
}
