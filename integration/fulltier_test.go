package integration

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/rangelock"
)

// The test here is a full SSD tier as a user met it: a 50 MiB export over a file, behind a 16 MiB SSD
// tier in write-back, and clients that write requests of 4 KiB to 50 MiB over data they wrote
// before, several in flight, reading back and flushing. The SSD tier is full of dirty data most of
// the time, and many writes are larger than it: none may fail, for any --reduction and line size.

const (
	fullTierDisk = 50 << 20
	fullTierSSD  = "16MiB"
)

// TestWriteBackFullTier runs the workload for every --reduction with lines of 4 KiB and 64 KiB,
// then requires every read to have matched the model, the data to read back whole, and the
// backend file, after a FLUSH, `tierblk flush` and a stop, to hold it.
func TestWriteBackFullTier(t *testing.T) {
	for _, reduction := range reductions {
		for _, line := range []string{"4KiB", "64KiB"} {
			t.Run(reduction+"-"+line, func(t *testing.T) { checkFullTier(t, reduction, line) })
		}
	}
}

func checkFullTier(t *testing.T, reduction, line string) {
	dir := shortTempDir(t)
	image := filepath.Join(dir, "disk.img")
	o := cacheOpts{backend: fmt.Sprintf("file://%s?size=%d", image, fullTierDisk), dir: dir, ram: "4MiB",
		ssdSize: fullTierSSD, line: line, mode: "writeback", reduction: reduction}
	d := startServe(t, o.args()...)
	c := dialNBD(t, d.Unix)
	defer c.Close()

	m := newBlockModel(fullTierDisk / blockBytes)
	locks := rangelock.New()
	const clients, ops = 3, 12
	errs := make([]error, clients)
	var large atomic.Int64 // writes larger than the SSD tier
	var wg sync.WaitGroup
	for k := range clients {
		wg.Go(func() { errs[k] = fullTierClient(c, m, locks, rand.New(rand.NewPCG(42, uint64(k))), ops, &large) })
	}
	wg.Wait()
	for k, err := range errs {
		require.NoError(t, err, "client %d", k)
	}
	require.NotZero(t, large.Load(), "no write was larger than the SSD tier")

	require.NoError(t, c.Flush())
	m.verify(t, c, "through tierblk")
	flushAdmin(t, o.admin())
	s := adminStats(t, o.admin())
	require.Zero(t, s.Backend.Errors, "backend errors")
	require.NoError(t, c.Close())
	d.requireStop(syscall.SIGTERM)
	f, err := os.Open(image)
	require.NoError(t, err)
	defer f.Close()
	m.verify(t, f, "on the backend file")
}

// fullTierClient runs ops requests on c: writes (some FUA) of 512 bytes to the whole disk, starting
// anywhere on a 512-byte boundary; checked reads of the same sizes; and flushes. Each request holds its range in locks while in flight, so
// the model stays exact. It returns the first failure.
func fullTierClient(c *client.Client, m *blockModel, locks *rangelock.Locks, rng *rand.Rand, ops int, large *atomic.Int64) error {
	const total = fullTierDisk / blockBytes
	for k := range ops {
		// Half of the sizes spread evenly over their powers of two (4 KiB to 32 MiB), half of
		// them evenly over 4 KiB to the whole disk, as the user's client did.
		n := rng.IntN(total) + 1
		if rng.IntN(2) == 0 {
			n = (4096 / blockBytes) << rng.IntN(14)
			n = n/2 + rng.IntN(n/2+1)
		}
		start := rng.IntN(total - n + 1)
		off, p := int64(start)*blockBytes, make([]byte, n*blockBytes)
		locks.Lock(off, off+int64(len(p)))
		err := fullTierOp(c, m, rng, start, p)
		locks.Unlock(off, off+int64(len(p)))
		if err != nil {
			return fmt.Errorf("request %d (%d bytes at %d): %w", k, len(p), off, err)
		}
		if len(p) > 16<<20 {
			large.Add(1)
		}
	}
	return nil
}

// fullTierOp makes one request over blocks [start, start+len(p)/blockBytes), which the caller holds.
func fullTierOp(c *client.Client, m *blockModel, rng *rand.Rand, start int, p []byte) error {
	n, off := len(p)/blockBytes, int64(start)*blockBytes
	switch op := rng.IntN(10); {
	case op < 3:
		if _, err := c.ReadAt(p, off); err != nil {
			return err
		}
		for i := range n {
			if err := m.check(start+i, p[i*blockBytes:(i+1)*blockBytes]); err != nil {
				return err
			}
		}
		return nil
	case op < 4:
		return c.Flush()
	default:
		id := m.ids.Add(1)
		for i := range n {
			fillBlock(p[i*blockBytes:(i+1)*blockBytes], start+i, id)
		}
		m.pend(start, n, id)
		var err error
		if op < 5 {
			_, err = c.WriteAtFUA(p, off)
		} else {
			_, err = c.WriteAt(p, off)
		}
		if err != nil {
			return err
		}
		for i := range n {
			s := &m.blocks[start+i]
			s.acked, s.doubt = s.pending, false
		}
		return nil
	}
}
