package cache

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring/uringtest"
	"github.com/tierblk/tierblk/pkg/backend"
)

// ringBackend is a backend that reads on a caller's ring (a file opened direct), with faults: its
// ring reads fail (fail) or are refused (refuse).
type ringBackend struct {
	backend.Backend
	fail, refuse atomic.Bool
	ringReads    atomic.Int64 // ring reads started
}

var errRingRead = errors.New("injected ring read failure")

func (b *ringBackend) ReadAtOn(r backend.Ring, p []byte, off int64, done func(error)) bool {
	switch {
	case b.refuse.Load():
		return false
	case b.fail.Load():
		b.ringReads.Add(1)
		done(errRingRead)
		return true
	}
	if !b.Backend.(backend.RingReader).ReadAtOn(r, p, off, done) {
		return false
	}
	b.ringReads.Add(1)
	return true
}

// TestMissOnRing: over a backend that reads on the caller's ring, ReadAtOn serves a miss within one
// line there and counts it as read does; the tiers are filled once it has ended, and the line is
// let go then. Blocks the SSD tier holds of those the miss fetches come from it (a dirty block in
// write-back, newer than the backend's). A backend read that fails fails the read and fills
// nothing; one the backend refuses to start on the ring is read its own way.
func TestMissOnRing(t *testing.T) {
	loop := uringtest.New(t, 4)
	if loop == nil {
		testenv.Without(t, testenv.IOUring, "no ring to read on")
		return
	}
	const line = 16 << 10
	want, _, ssd := asyncSetup(t, line, 32, 8)
	back := &ringBackend{Backend: fileSSD(t, 32*line, false)}
	_, err := back.WriteAt(want, 0)
	require.NoError(t, err)
	c := newCache(t, back, layout{line: line, ssd: 8, mode: WriteBack, admission: "always"}, nil, ssd)
	defer c.Close()
	ssdStats := func() TierStats { return c.Stats().Tiers[0] }
	// settled waits for the fill of line's miss: it holds the line until it is done.
	settled := func(line uint64) {
		c.locks.Lock(line, line)
		c.locks.Unlock(line, line)
	}
	buf := make([]byte, 8192)

	before := ssdStats()
	started, err := readAtOn(loop, c, buf, 3*line+4096)
	require.True(t, started, "a miss, on the ring")
	require.NoError(t, err)
	require.Equal(t, want[3*line+4096:3*line+12288], buf)
	require.Equal(t, int64(1), back.ringReads.Load())
	settled(3)
	after := ssdStats()
	require.Equal(t, before.Misses+1, after.Misses)
	require.True(t, c.ssd.holds(3, linebits.Range(1, 3)), "the blocks fetched fill the SSD tier")
	require.Equal(t, uint64(8192), c.Stats().FetchedBytes)

	// A dirty block the SSD tier holds, beside one it does not: the miss fetches both, and the
	// read gets the dirty one from the tier.
	dirty := make([]byte, 4096)
	for i := range dirty {
		dirty[i] = 0xd1
	}
	_, err = c.WriteAt(dirty, 5*line)
	require.NoError(t, err)
	started, err = readAtOn(loop, c, buf, 5*line)
	require.True(t, started)
	require.NoError(t, err)
	require.Equal(t, dirty, buf[:4096])
	require.Equal(t, want[5*line+4096:5*line+8192], buf[4096:])
	settled(5)
	require.True(t, c.ssd.holds(5, linebits.Range(0, 2)))

	back.fail.Store(true)
	started, err = readAtOn(loop, c, buf, 7*line)
	require.True(t, started)
	require.ErrorIs(t, err, errRingRead)
	settled(7)
	require.False(t, c.ssd.holds(7, linebits.Range(0, 2)), "a failed read fills nothing")
	back.fail.Store(false)

	back.refuse.Store(true)
	reads := back.ringReads.Load()
	started, err = readAtOn(loop, c, buf, 7*line)
	require.True(t, started, "refused on the ring, read on a goroutine")
	require.NoError(t, err)
	require.Equal(t, want[7*line:7*line+8192], buf)
	require.Equal(t, reads, back.ringReads.Load())
	settled(7)
	require.True(t, c.ssd.holds(7, linebits.Range(0, 2)))
	back.refuse.Store(false)

	// A hit is the SSD tier's, and a read across two lines is left to ReadAt.
	started, err = readAtOn(loop, c, buf, 3*line+4096)
	require.True(t, started)
	require.NoError(t, err)
	require.Equal(t, want[3*line+4096:3*line+12288], buf)
	require.Equal(t, after.Hits+1, ssdStats().Hits)
	started, _ = readAtOn(loop, c, buf, 10*line-4096)
	require.False(t, started, "a read across two lines")
}
