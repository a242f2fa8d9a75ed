package cache

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring/uringtest"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// asyncRead reads p at off without a goroutine of its caller's, where the cache can, and reports
// whether it started, and the read's error.
type asyncRead func(t *testing.T, c *Cache, p []byte, off int64) (started bool, err error)

// asyncReads are the two ways a server starts such a read: ReadAtAsync (the NBD server) and
// ReadAtOn, on the server's own ring (a ublk queue's loop), where the kernel has io_uring. Each
// test of them runs with both.
func asyncReads(t *testing.T) map[string]asyncRead {
	reads := map[string]asyncRead{"ReadAtAsync": readAtAsync}
	loop := uringtest.New(t, 4)
	if loop == nil {
		testenv.Without(t, testenv.IOUring, "ReadAtOn left out: no ring to read on")
		return reads
	}
	reads["ReadAtOn"] = func(_ *testing.T, c *Cache, p []byte, off int64) (bool, error) {
		return readAtOn(loop, c, p, off)
	}
	return reads
}

// readAtOn is an asyncRead with ReadAtOn on loop's ring.
func readAtOn(loop *uringtest.Loop, c *Cache, p []byte, off int64) (bool, error) {
	return loop.Do(func(r backend.Ring, done func(error)) bool { return c.ReadAtOn(r, p, off, done) })
}

// readAtAsync is an asyncRead with ReadAtAsync.
func readAtAsync(_ *testing.T, c *Cache, p []byte, off int64) (bool, error) {
	ended := make(chan error, 1)
	if !c.ReadAtAsync(p, off, func(err error) { ended <- err }) {
		return false, nil
	}
	return true, <-ended
}

// eachAsyncRead runs test with each of asyncReads; onRing is set for the one that serves RAM-tier
// hits at once (ReadAtOn).
func eachAsyncRead(t *testing.T, test func(t *testing.T, readAsync asyncRead, onRing bool)) {
	for name, read := range asyncReads(t) {
		t.Run(name, func(t *testing.T) { test(t, read, name == "ReadAtOn") })
	}
}

// asyncSetup returns a backend of lines lines holding want, and an SSD file of ssdLines lines that
// reads asynchronously (or skips the test where it cannot).
func asyncSetup(t *testing.T, line, lines, ssdLines int64) (want []byte, b, ssd backend.Backend) {
	t.Helper()
	want = make([]byte, lines*line)
	for i := range want {
		want[i] = byte(i*13 + i/4096)
	}
	b = mem.New(lines * line)
	_, err := b.WriteAt(want, 0)
	require.NoError(t, err)
	ssd = fileSSD(t, ssdLines*line, false)
	if _, ok := ssd.(backend.AsyncReader); !ok {
		testenv.Skip(t, testenv.IOUring, "the SSD file reads synchronously")
	}
	return want, b, ssd
}

// TestReadAtAsync: on an SSD tier on a file (direct reads through io_uring), a read within one line
// that the SSD tier holds, and the RAM tier does not, is started asynchronously and counts as a hit;
// a miss, a read across lines and a read of a line another request holds are left to ReadAt and
// count nothing; a RAM-tier hit is served at once on a ring (ReadAtOn), else left to ReadAt; an
// SSD read that fails is served from the backend.
func TestReadAtAsync(t *testing.T) {
	eachAsyncRead(t, func(t *testing.T, readAsync asyncRead, onRing bool) {
		const line = 64 << 10
		want, b, dev := asyncSetup(t, line, 64, 16)
		ssd := fault.New(dev, fault.Options{})
		c := newCache(t, b, layout{line: line, ram: 2, ssd: 16, mode: WriteThrough, admission: "nhit:3"}, nil, ssd)
		defer c.Close()
		buf := make([]byte, 8192)
		ssdStats := func() TierStats { return c.Stats().Tiers[1] }

		started, _ := readAsync(t, c, buf, 3*line)
		require.False(t, started, "a miss")
		require.Zero(t, ssdStats().Misses, "a miss left to ReadAt is not counted")
		require.NoError(t, c.Prefetch(3*line, line)) // the line on both tiers
		ramHits := c.Stats().Tiers[0].Hits
		started, err := readAsync(t, c, buf, 3*line+4096)
		require.Equal(t, onRing, started, "a RAM-tier hit")
		if onRing {
			require.NoError(t, err)
			require.Equal(t, want[3*line+4096:3*line+12288], buf)
			require.Equal(t, ramHits+1, c.Stats().Tiers[0].Hits)
			c.locks.Lock(3, 3)
			started, _ = readAsync(t, c, buf, 3*line)
			c.locks.Unlock(3, 3)
			require.False(t, started, "a RAM-tier hit on a line another request holds")
		}

		require.NoError(t, c.Prefetch(4*line, 2*line))
		for l := uint64(4); l < 6; l++ { // the lines on the SSD tier alone
			c.ram.invalidate(l, linebits.Range(0, line/blockSize))
		}
		before := ssdStats()
		started, err = readAsync(t, c, buf, 4*line+8192)
		require.True(t, started, "an SSD-tier hit")
		require.NoError(t, err)
		require.Equal(t, want[4*line+8192:4*line+16384], buf)
		after := ssdStats()
		require.Equal(t, before.Hits+1, after.Hits)
		require.Equal(t, before.HitBytes+8192, after.HitBytes)

		started, _ = readAsync(t, c, buf, 5*line-4096)
		require.False(t, started, "a read across two lines")

		c.locks.Lock(4, 4)
		started, _ = readAsync(t, c, buf, 4*line)
		c.locks.Unlock(4, 4)
		require.False(t, started, "a line another request holds")

		ssd.SetFailing(true)
		started, err = readAsync(t, c, buf, 5*line)
		require.True(t, started)
		require.NoError(t, err, "a failed SSD read is served from the backend")
		require.Equal(t, want[5*line:5*line+8192], buf)
		require.Equal(t, before.Errors+1, ssdStats().Errors)
		ssd.SetFailing(false)

		// Every read that started asynchronously has ended and let go of its line.
		require.True(t, c.locks.TryLock(4) && c.locks.TryLock(5))
		c.locks.Unlock(4, 5)
	})
}

// TestReadAtAsyncPromotes: where the RAM tier admits the line, an asynchronous SSD-tier hit reads
// the blocks it touches into RAM, which then holds them.
func TestReadAtAsyncPromotes(t *testing.T) {
	eachAsyncRead(t, func(t *testing.T, readAsync asyncRead, onRing bool) {
		const line = 16 << 10
		want, b, dev := asyncSetup(t, line, 32, 8)
		c := newCache(t, b, layout{line: line, ram: 2, ssd: 8, mode: WriteThrough, admission: "always"}, nil, dev)
		defer c.Close()
		require.NoError(t, c.Prefetch(2*line, line))
		c.ram.invalidate(2, linebits.Range(0, line/blockSize))
		buf := make([]byte, 4096)
		started, err := readAsync(t, c, buf, 2*line+8192)
		require.True(t, started)
		require.NoError(t, err)
		require.Equal(t, want[2*line+8192:2*line+12288], buf)
		require.True(t, c.ram.holds(2, linebits.Range(2, 3)), "the block read is in RAM")
		require.False(t, c.ram.holds(2, linebits.Range(0, 1)), "a block not read is not")
		st := c.Stats()
		require.Equal(t, uint64(1), st.Tiers[1].Hits)
		started, _ = readAsync(t, c, buf, 2*line+8192)
		require.Equal(t, onRing, started, "the block is a RAM-tier hit now")
	})
}

// TestReadAtOnRAMOnly: without an SSD tier, ReadAtOn serves RAM-tier hits at once and leaves the
// rest to ReadAt.
func TestReadAtOnRAMOnly(t *testing.T) {
	loop := uringtest.New(t, 4)
	if loop == nil {
		testenv.Skip(t, testenv.IOUring, "no ring to read on")
	}
	const line = 16 << 10
	want := bytes.Repeat([]byte("ram only"), 16*line/8)
	b := mem.New(16 * line)
	_, err := b.WriteAt(want, 0)
	require.NoError(t, err)
	c := newCache(t, b, layout{line: line, ram: 4, mode: WriteThrough, admission: "always"}, nil, nil)
	defer c.Close()
	buf := make([]byte, 4096)
	started, _ := readAtOn(loop, c, buf, 5*line)
	require.False(t, started, "a miss")
	require.NoError(t, c.Prefetch(5*line, line))
	started, err = readAtOn(loop, c, buf, 5*line+4096)
	require.True(t, started, "a RAM-tier hit")
	require.NoError(t, err)
	require.Equal(t, want[5*line+4096:5*line+8192], buf)
}

// TestReadAtAsyncShared: without a RAM tier an asynchronous SSD-tier hit holds its line shared: it
// starts while another such read holds the line, not while a request holds it exclusively, and one
// that the SSD fails is read again from the backend, after which the line is free.
func TestReadAtAsyncShared(t *testing.T) {
	eachAsyncRead(t, func(t *testing.T, readAsync asyncRead, onRing bool) {
		const line = 16 << 10
		want, b, dev := asyncSetup(t, line, 32, 8)
		ssd := fault.New(dev, fault.Options{})
		c := newCache(t, b, layout{line: line, ssd: 8, mode: WriteThrough, admission: "always"}, nil, ssd)
		defer c.Close()
		require.NoError(t, c.Prefetch(2*line, line))
		buf := make([]byte, 4096)

		require.True(t, c.locks.TryRLock(2), "another hit holds the line")
		started, err := readAsync(t, c, buf, 2*line+4096)
		require.True(t, started, "a hit beside it")
		require.NoError(t, err)
		require.Equal(t, want[2*line+4096:2*line+8192], buf)
		c.locks.RUnlock(2)

		c.locks.Lock(2, 2)
		started, _ = readAsync(t, c, buf, 2*line)
		c.locks.Unlock(2, 2)
		require.False(t, started, "a request holds the line exclusively")

		ssd.SetFailing(true)
		started, err = readAsync(t, c, buf, 2*line+8192)
		ssd.SetFailing(false)
		require.True(t, started)
		require.NoError(t, err, "served from the backend")
		require.Equal(t, want[2*line+8192:2*line+12288], buf)
		require.True(t, c.locks.TryLock(2), "the line is free")
		c.locks.Unlock(2, 2)
	})
}

// TestReadAtOnNeverWaits: on a packed tier an SSD-tier hit read on a ring holds the tier's read
// lock until the ring's owner reaps it. While a reclaim waits for that lock exclusively, new
// readers of it wait too; ReadAtOn, called by that same owner, must not: it leaves the read to a
// goroutine of its own, or to ReadAt, and returns, else the owner would never reap the read that
// holds the lock.
func TestReadAtOnNeverWaits(t *testing.T) {
	const line = 16 << 10
	_, b, dev := asyncSetup(t, line, 32, 8)
	loop := uringtest.New(t, 4)
	if loop == nil {
		testenv.Skip(t, testenv.IOUring, "no ring to read on")
	}
	want := make([]byte, 2*line) // incompressible: stored as it is, read straight from the device
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	_, err := b.WriteAt(want, 2*line)
	require.NoError(t, err)
	c := newCache(t, b, layout{line: line, ssd: 8, mode: WriteThrough, admission: "always", reduction: ReductionCompress}, nil, dev)
	defer c.Close()
	require.NotNil(t, packedOf(c.ssd), "a packed tier")
	require.NoError(t, c.Prefetch(2*line, 2*line))
	buf, other := bufpool.Aligned(4096), bufpool.Aligned(4096)
	first, started, err := loop.Begin(func(r backend.Ring, done func(error)) bool { return c.ReadAtOn(r, buf, 2*line, done) })
	require.NoError(t, err)
	require.True(t, started)
	require.Equal(t, 1, loop.InFlight(), "a hit, its read in flight on the ring")

	pk := packedOf(c.ssd)
	locked := make(chan struct{})
	go func() { pk.io.Lock(); close(locked) }() // as a reclaim does
	for pk.io.TryRLock() {                      // until the writer waits
		pk.io.RUnlock()
		runtime.Gosched()
	}
	type begun struct {
		ended   <-chan error
		started bool
	}
	returned := make(chan begun)
	go func() {
		ended, started, _ := loop.Begin(func(r backend.Ring, done func(error)) bool { return c.ReadAtOn(r, other, 3*line, done) })
		returned <- begun{ended, started}
	}()
	var second begun
	select {
	case second = <-returned:
	case <-time.After(time.Minute):
		// Everything let go first, so that the failure is reported, not a Close waiting on them.
		require.NoError(t, loop.End(first))
		<-locked
		pk.io.Unlock()
		if second = <-returned; second.started {
			require.NoError(t, loop.End(second.ended))
		}
		t.Fatal("ReadAtOn waited for the tier's read lock, held by a read on its own ring")
	}
	require.Equal(t, 1, loop.InFlight(), "no second read on the ring")
	require.NoError(t, loop.End(first))
	require.Equal(t, want[:4096], buf)
	<-locked
	pk.io.Unlock()
	if second.started {
		require.NoError(t, loop.End(second.ended))
		require.Equal(t, want[line:line+4096], other)
	}
}
