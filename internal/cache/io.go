package cache

import (
	"math/bits"
	"sync"
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

// bufPool recycles aligned buffers for backend fetches, by power-of-two size class from 4 KiB, so
// that a line fetched from the backend goes to the SSD by direct I/O without a bounce copy.
type bufPool struct {
	classes [16]sync.Pool // 4 KiB << 0..15: up to 128 MiB
}

func bufClass(n int) int { return bits.Len(uint((n - 1) / blockSize)) }

func (b *bufPool) get(n int) []byte {
	c := bufClass(n)
	if c >= len(b.classes) {
		return alignedAlloc(n)
	}
	if p, ok := b.classes[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return alignedAlloc(blockSize << c)[:n]
}

func (b *bufPool) put(p []byte) {
	c := bufClass(cap(p))
	if c < len(b.classes) && cap(p) == blockSize<<c {
		p = p[:cap(p)]
		b.classes[c].Put(&p)
	}
}
