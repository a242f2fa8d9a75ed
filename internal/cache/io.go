package cache

import (
	"sync/atomic"
)

// ioCounters count requests to the backend.
type ioCounters struct {
	reads, writes, readBytes, writeBytes, errors atomic.Uint64
}

func (c *ioCounters) read(n int, err error) {
	c.reads.Add(1)
	c.readBytes.Add(uint64(n))
	if err != nil {
		c.errors.Add(1)
	}
}

func (c *ioCounters) write(n int, err error) {
	c.writes.Add(1)
	c.writeBytes.Add(uint64(n))
	if err != nil {
		c.errors.Add(1)
	}
}

func (c *ioCounters) snapshot() IOStats {
	return IOStats{Reads: c.reads.Load(), Writes: c.writes.Load(), ReadBytes: c.readBytes.Load(),
		WriteBytes: c.writeBytes.Load(), Errors: c.errors.Load()}
}
