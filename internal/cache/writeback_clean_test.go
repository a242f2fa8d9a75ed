package cache

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// landThenHold is a backend whose first write at off, once it has landed, waits for resume:
// the instant after a write back reached the backend, before the cache has done anything more.
type landThenHold struct {
	backend.Backend
	off            int64
	landed, resume chan struct{}
	armed          atomic.Bool // the next write at off is held
}

func (h *landThenHold) WriteAt(p []byte, off int64) (int, error) {
	n, err := h.Backend.WriteAt(p, off)
	if err == nil && off <= h.off && h.off < off+int64(len(p)) && h.armed.CompareAndSwap(true, false) {
		close(h.landed)
		<-h.resume
	}
	return n, err
}

// TestPackedWriteOverCleanCrashAfterWriteBack: a write-back write over a block a packed tier holds
// clean, stored in a new unit while the store's record called the block clean in its older one,
// then written back to the backend, and a crash the instant after, before any later checkpoint:
// the restarted cache serves the write, not the older data the backend no longer has. (Today the
// write invalidates the block durably first, writeBackPieces; a write path that skipped that
// commit would need the write back to have the store catch up, journal.settleClaims.)
func TestPackedWriteOverCleanCrashAfterWriteBack(t *testing.T) {
	for _, r := range []Reduction{ReductionCompress, ReductionDedupe} {
		t.Run(r.String(), func(t *testing.T) {
			l := layout{line: 16 << 10, ssd: 8, mode: WriteBack, reduction: r}
			store := meta.NewMem()
			ssd := mem.New(l.ssd * l.line)
			const block = 5
			back := &landThenHold{Backend: newCrashDev(orderDevSize), off: block * blockSize,
				landed: make(chan struct{}), resume: make(chan struct{})}
			open := func(g *gate) *Cache {
				cfg := testConfig(l, gatedStore{g, store}, gatedDev{g, ssd})
				c, err := New(back, cfg)
				require.NoError(t, err)
				return c
			}
			data := func(id int64) []byte {
				p := make([]byte, blockSize)
				stamp(p, block*blockSize/sector, id)
				return p
			}
			read := func(c *Cache) []byte {
				got := make([]byte, blockSize)
				_, err := c.ReadAt(got, block*blockSize)
				require.NoError(t, err)
				return got
			}

			// The block clean on the SSD tier, and so in the store once the cache is closed.
			c := open(&gate{})
			_, err := c.WriteAt(data(1), block*blockSize)
			require.NoError(t, err)
			require.NoError(t, c.FlushAll(context.Background(), nil))
			require.NoError(t, c.Close())
			back.armed.Store(true)

			g := &gate{}
			c = open(g)
			hits := c.Stats().Tiers[0].Hits
			require.Equal(t, data(1), read(c))
			require.Greater(t, c.Stats().Tiers[0].Hits, hits, "a hit on the clean block")
			_, err = c.WriteAt(data(2), block*blockSize)
			require.NoError(t, err)
			flushed := make(chan error, 1)
			go func() { flushed <- c.FlushAll(context.Background(), nil) }()
			<-back.landed
			g.crash()
			close(back.resume)
			<-flushed // failed or not: the crash cut the SSD tier and the store
			c.Close()

			c = open(&gate{})
			defer c.Close()
			require.Equal(t, data(2), read(c), "the write the backend holds, not the older clean data")
		})
	}
}
