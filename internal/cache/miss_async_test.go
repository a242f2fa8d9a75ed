package cache

import (
	"errors"
	"log/slog"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring/uringtest"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
	nbdbackend "github.com/tierblk/tierblk/pkg/backend/nbd"
)

// startFaults injects faults into a backend's reads that a cache starts without waiting for them
// (on a ring, or asynchronously): they fail (fail) or are refused (refuse); started counts those
// started.
type startFaults struct {
	fail, refuse atomic.Bool
	started      atomic.Int64
}

var errStartedRead = errors.New("injected read failure")

// start starts a read with start, or fails or refuses it as the faults say.
func (f *startFaults) start(start func() bool, done func(error)) bool {
	switch {
	case f.refuse.Load():
		return false
	case f.fail.Load():
		f.started.Add(1)
		done(errStartedRead)
		return true
	}
	if !start() {
		return false
	}
	f.started.Add(1)
	return true
}

// ringBackend is a backend that reads on a caller's ring (a file opened direct), with faults.
type ringBackend struct {
	backend.Backend
	startFaults
}

func (b *ringBackend) ReadAtOn(r backend.Ring, p []byte, off int64, done func(error)) bool {
	return b.start(func() bool {
		rr, ok := b.Backend.(backend.RingReader)
		return ok && rr.ReadAtOn(r, p, off, done)
	}, done)
}

// asyncBackend is a backend that reads asynchronously (an NBD export), with faults.
type asyncBackend struct {
	backend.Backend
	startFaults
}

func (b *asyncBackend) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	return b.start(func() bool {
		a, ok := b.Backend.(backend.AsyncReader)
		return ok && a.ReadAtAsync(p, off, done)
	}, done)
}

// nbdBackend is an NBD export of size bytes of memory, served by tierblk's own server in this
// process, opened as the daemon opens an nbd:// backend: its reads are asynchronous.
func nbdBackend(t *testing.T, size int64) backend.Backend {
	srv, err := server.New(server.Config{Exports: []server.Export{{Name: "disk", Device: volume.New(mem.New(size), volume.Options{})}},
		Logger: nbdtest.Logger(t, slog.LevelWarn)})
	require.NoError(t, err)
	addrs := nbdtest.Serve(t, srv)
	u, err := url.Parse("nbd+unix:///disk?socket=" + url.QueryEscape(addrs.Sock))
	require.NoError(t, err)
	b, err := nbdbackend.Open(u, backend.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

// missAsyncCase is a cache of lines of 16 KiB (an SSD tier of 8, write-back) over a backend of 32
// lines holding want, whose reads can be started without waiting (faults), and read, which reads
// as a server that starts them does.
type missAsyncCase struct {
	c      *Cache
	want   []byte
	faults *startFaults
	read   func(p []byte, off int64) (bool, error)
}

// eachMissAsync runs test with the backend reading each way a cache starts a miss on: "ring", on
// the caller's ring (ReadAtOn, a file opened direct; left out where there is no ring), and
// "async", asynchronously (ReadAtAsync, an NBD export). The tiers admit as admission says.
func eachMissAsync(t *testing.T, admission string, test func(t *testing.T, m missAsyncCase)) {
	const line = 16 << 10
	for _, way := range []string{"ring", "async"} {
		t.Run(way, func(t *testing.T) {
			var m missAsyncCase
			want, _, ssd := asyncSetup(t, line, 32, 8)
			var back backend.Backend
			if way == "ring" {
				loop := uringtest.New(t, 4)
				if loop == nil {
					testenv.Without(t, testenv.IOUring, "no ring to read on")
					return
				}
				rb := &ringBackend{Backend: fileSSD(t, 32*line, false)}
				back, m.faults = rb, &rb.startFaults
				m.read = func(p []byte, off int64) (bool, error) { return readAtOn(loop, m.c, p, off) }
			} else {
				ab := &asyncBackend{Backend: nbdBackend(t, 32*line)}
				back, m.faults = ab, &ab.startFaults
				m.read = func(p []byte, off int64) (bool, error) { return readAtAsync(t, m.c, p, off) }
			}
			_, err := back.WriteAt(want, 0)
			require.NoError(t, err)
			m.c = newCache(t, back, layout{line: line, ssd: 8, mode: WriteBack, admission: admission}, nil, ssd)
			defer m.c.Close()
			m.want = want
			test(t, m)
		})
	}
}

// TestMissAsync: over a backend that reads on the caller's ring (ReadAtOn, a file opened direct)
// or asynchronously (ReadAtAsync, an NBD export), a miss within one line is started on it and
// counted as read counts it; the tiers are filled once it has ended, and the line is let go then.
// Blocks the SSD tier holds of those the miss fetches come from it (a dirty block in write-back,
// newer than the backend's). A backend read that fails fails the read and fills nothing; one the
// backend refuses to start is read its own way.
func TestMissAsync(t *testing.T) {
	const line = 16 << 10
	eachMissAsync(t, "always", func(t *testing.T, m missAsyncCase) {
		c, want, back, read := m.c, m.want, m.faults, m.read
		ssdStats := func() TierStats { return c.Stats().Tiers[0] }
		// settled waits for the fill of line's miss: it holds the line until it is done.
		settled := func(line uint64) {
			c.locks.Lock(line, line)
			c.locks.Unlock(line, line)
		}
		buf := make([]byte, 8192)

		before := ssdStats()
		started, err := read(buf, 3*line+4096)
		require.True(t, started, "a miss, started on the backend")
		require.NoError(t, err)
		require.Equal(t, want[3*line+4096:3*line+12288], buf)
		require.Equal(t, int64(1), back.started.Load())
		settled(3)
		after := ssdStats()
		require.Equal(t, before.Misses+1, after.Misses)
		require.True(t, c.ssd.holds(3, linebits.Range(1, 3)), "the blocks fetched fill the SSD tier")
		require.Equal(t, uint64(8192), c.Stats().FetchedBytes)

		// A dirty block the SSD tier holds, beside one it does not: the miss fetches both, and
		// the read gets the dirty one from the tier.
		dirty := make([]byte, 4096)
		for i := range dirty {
			dirty[i] = 0xd1
		}
		_, err = c.WriteAt(dirty, 5*line)
		require.NoError(t, err)
		started, err = read(buf, 5*line)
		require.True(t, started)
		require.NoError(t, err)
		require.Equal(t, dirty, buf[:4096])
		require.Equal(t, want[5*line+4096:5*line+8192], buf[4096:])
		settled(5)
		require.True(t, c.ssd.holds(5, linebits.Range(0, 2)))

		back.fail.Store(true)
		started, err = read(buf, 7*line)
		require.True(t, started)
		require.ErrorIs(t, err, errStartedRead)
		settled(7)
		require.False(t, c.ssd.holds(7, linebits.Range(0, 2)), "a failed read fills nothing")
		back.fail.Store(false)

		back.refuse.Store(true)
		reads := back.started.Load()
		started, err = read(buf, 7*line)
		require.True(t, started, "refused by the backend, read on a goroutine")
		require.NoError(t, err)
		require.Equal(t, want[7*line:7*line+8192], buf)
		require.Equal(t, reads, back.started.Load())
		settled(7)
		require.True(t, c.ssd.holds(7, linebits.Range(0, 2)))
		back.refuse.Store(false)

		// A hit is the SSD tier's, and a read across two lines is left to ReadAt.
		started, err = read(buf, 3*line+4096)
		require.True(t, started)
		require.NoError(t, err)
		require.Equal(t, want[3*line+4096:3*line+12288], buf)
		require.Equal(t, after.Hits+1, ssdStats().Hits)
		started, _ = read(buf, 10*line-4096)
		require.False(t, started, "a read across two lines")
	})
}

// TestMissAsyncNoFill: a miss started on the backend that no tier admits (nhit:2, its first miss)
// serves the read, fills nothing and lets go of the line; its second miss fills the tier.
func TestMissAsyncNoFill(t *testing.T) {
	const line = 16 << 10
	eachMissAsync(t, "nhit:2", func(t *testing.T, m missAsyncCase) {
		c, want, back, read := m.c, m.want, m.faults, m.read
		buf := make([]byte, 4096)
		for i, fills := range []bool{false, true} {
			started, err := read(buf, 9*line+4096)
			require.True(t, started, "miss %d", i+1)
			require.NoError(t, err)
			require.Equal(t, want[9*line+4096:9*line+8192], buf)
			require.Equal(t, int64(i+1), back.started.Load())
			c.locks.Lock(9, 9) // waits for the line to be let go
			c.locks.Unlock(9, 9)
			require.Equal(t, fills, c.ssd.holds(9, linebits.Range(1, 2)), "miss %d", i+1)
		}
	})
}

// TestMissLeftToReadAt: over a backend that cannot start reads (a file read through the page
// cache, make run's default backend) ReadAtAsync takes no miss on, however it could start the SSD
// tier's hits: the server reads the miss with ReadAt, which fetches and fills it on the one
// goroutine, where a miss taken on would hand its backend read to another.
func TestMissLeftToReadAt(t *testing.T) {
	const line = 16 << 10
	want, _, ssd := asyncSetup(t, line, 32, 8)
	back := fileSSD(t, 32*line, true)
	_, err := back.WriteAt(want, 0)
	require.NoError(t, err)
	c := newCache(t, back, layout{line: line, ssd: 8, mode: WriteBack, admission: "always"}, nil, ssd)
	defer c.Close()
	buf := make([]byte, 4096)
	started, _ := readAtAsync(t, c, buf, 3*line)
	require.False(t, started, "a miss over a backend that cannot start reads")
	require.Zero(t, c.Stats().Tiers[0].Misses, "a miss left to ReadAt is counted there")
	_, err = c.ReadAt(buf, 3*line)
	require.NoError(t, err)
	started, err = readAtAsync(t, c, buf, 3*line)
	require.True(t, started, "the SSD tier's hit, once ReadAt filled it")
	require.NoError(t, err)
	require.Equal(t, want[3*line:3*line+4096], buf)
}
