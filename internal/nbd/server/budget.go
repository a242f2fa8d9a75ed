package server

import (
	"sync"

	"github.com/tierblk/tierblk/internal/bufpool"
)

// payloadBudget bounds the payload buffers one connection holds at once: the WRITE payloads it has
// read and the READ replies it has not yet written. A client that sends requests faster than it
// takes their replies (or never takes them) then stalls only itself, and a connection holds at most
// this much, whatever MaxInFlight is: MaxInFlight requests of the largest payload would be
// gigabytes. One request of the largest payload fits.
const payloadBudget = maxPayload

// budget counts a connection's payload bytes. A request waits while its buffer would take the
// count over max, unless nothing is held (so one request larger than the rest always goes).
type budget struct {
	mu   sync.Mutex
	cond sync.Cond
	used int
	max  int
}

func newBudget(max int) *budget {
	b := &budget{max: max}
	b.cond.L = &b.mu
	return b
}

func (b *budget) acquire(n int) {
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.max {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

func (b *budget) release(n int) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// getBuf takes a payload buffer of n bytes from the pool, within the connection's budget: it waits
// for room while the connection holds too much. Give it back with putBuf.
func (c *conn) getBuf(n int) *[]byte {
	c.budget.acquire(bufpool.Size(n))
	return bufpool.Get(n)
}

// putBuf gives back a buffer from getBuf.
func (c *conn) putBuf(bp *[]byte) {
	c.budget.release(cap(*bp))
	bufpool.Put(bp)
}
