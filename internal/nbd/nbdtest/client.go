package nbdtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Dial connects a client and closes it when the test ends (before the server stops).
func Dial(t testing.TB, cfg client.Config) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// Pattern is n pseudo-random bytes, the same for the same seed.
func Pattern(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(p)
	return p
}

// Exercise runs every command against a writable export of at least 8 MiB whose first
// 8 MiB are zeroes, checking the data with reads.
func Exercise(t testing.TB, c *client.Client) {
	t.Helper()
	const mib = 1 << 20
	read := func(off int64, n int) []byte {
		t.Helper()
		p := make([]byte, n)
		got, err := c.ReadAt(p, off)
		require.NoError(t, err)
		require.Equal(t, n, got)
		return p
	}
	require.Equal(t, make([]byte, mib), read(7*mib, mib), "a fresh export reads as zeroes")

	data := Pattern(1, 2*mib+4096)
	n, err := c.WriteAt(data, 4096)
	require.NoError(t, err)
	require.Equal(t, len(data), n)
	require.Equal(t, data, read(4096, len(data)))

	fua := Pattern(2, 64<<10)
	_, err = c.WriteAtFUA(fua, 3*mib)
	require.NoError(t, err)
	require.Equal(t, fua, read(3*mib, len(fua)))
	require.NoError(t, c.Flush())

	require.NoError(t, c.WriteZeroes(8192, 64<<10, false))
	require.NoError(t, c.WriteZeroes(mib, 64<<10, true))
	want := bytes.Clone(data)
	clear(want[8192-4096 : 8192-4096+64<<10])
	clear(want[mib-4096 : mib-4096+64<<10])
	require.Equal(t, want, read(4096, len(data)))

	require.NoError(t, c.Trim(2*mib, mib))
	if c.Flags()&proto.FlagSendCache != 0 {
		require.NoError(t, c.Cache(0, mib))
	}

	// ReadAtAsync: a read one request carries ends with the same bytes; what ReadAt would refuse
	// or split is not started.
	got := make([]byte, 64<<10)
	ended := make(chan error, 1)
	require.True(t, c.ReadAtAsync(got, mib+128<<10, func(err error) { ended <- err }))
	require.NoError(t, <-ended)
	require.Equal(t, want[mib+128<<10-4096:][:len(got)], got)
	never := func(error) { t.Error("done called for a read that was not started") }
	minBlock, _, maxBlock := c.BlockSizes()
	require.False(t, c.ReadAtAsync(nil, 0, never), "an empty read")
	require.False(t, c.ReadAtAsync(make([]byte, 4096), c.Size()-2048, never), "a read past the end")
	if minBlock > 1 {
		require.False(t, c.ReadAtAsync(make([]byte, 4096), int64(minBlock)/2, never), "an unaligned read")
	}
	if long := int64(min(maxBlock, 32<<20)) + int64(minBlock); long <= c.Size() {
		require.False(t, c.ReadAtAsync(make([]byte, long), 0, never), "a read longer than one request")
	}

	_, err = c.ReadAt(make([]byte, 4096), c.Size()-2048)
	require.ErrorIs(t, err, backend.ErrOutOfRange)
	_, err = c.WriteAt(make([]byte, 4096), c.Size())
	require.ErrorIs(t, err, backend.ErrOutOfRange)
	n, err = c.ReadAt(nil, c.Size())
	require.NoError(t, err)
	require.Zero(t, n)
}

// Hammer runs workers goroutines, each writing a fresh pattern to its own 64 KiB region and
// reading it back rounds times (with ReadAt, or ReadAtAsync for every fourth worker). It calls
// each (if not nil) after every completed round.
func Hammer(t testing.TB, c *client.Client, workers, rounds int, each func()) {
	t.Helper()
	const region = 64 << 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			got := make([]byte, region)
			off := int64(w) * region
			for r := range rounds {
				// Odd workers write and read in pieces so requests of many sizes interleave.
				data := Pattern(uint64(w*1000+r), region)
				piece := region
				if w%2 == 1 {
					piece = 4096 << (w % 4)
				}
				for p := 0; p < region; p += piece {
					if _, err := c.WriteAt(data[p:p+piece], off+int64(p)); err != nil {
						errs <- fmt.Errorf("worker %d round %d write: %w", w, r, err)
						return
					}
				}
				// Every fourth worker reads with ReadAtAsync, which must start a read of 64 KiB.
				var err error
				if w%4 == 2 {
					ended := make(chan error, 1)
					if !c.ReadAtAsync(got, off, func(err error) { ended <- err }) {
						errs <- fmt.Errorf("worker %d round %d: ReadAtAsync did not start", w, r)
						return
					}
					err = <-ended
				} else {
					_, err = c.ReadAt(got, off)
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d read: %w", w, r, err)
					return
				}
				if !bytes.Equal(got, data) {
					errs <- fmt.Errorf("worker %d round %d: read back other data", w, r)
					return
				}
				if each != nil {
					each()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
