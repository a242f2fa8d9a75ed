package ublk

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring"
)

// testRing sets up a ring, or skips the test where the host kernel forbids io_uring.
func testRing(t *testing.T, entries, flags uint32) *uring.Ring {
	t.Helper()
	r, err := uring.New(entries, flags)
	if uring.Unavailable(err) {
		testenv.Skip(t, testenv.IOUring, err.Error())
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

// The completion hand-off of a queue: workers call complete from any goroutine, while the loop
// is in a batch (no wake-up) or waiting (the eventfd's poll fires); takeDone returns every
// completion exactly once and no completion waits without a wake-up.
func TestCompletionHandoff(t *testing.T) {
	r := testRing(t, 4, 0)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	q := &queue{efd: efd}
	t.Cleanup(q.unmap)

	const workers, each = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				q.complete(completion{tag: uint16(w*each + i), res: int32(i)})
			}
		})
	}
	seen := map[uint16]bool{}
	armed := false
	for len(seen) < workers*each {
		if !armed {
			require.NoError(t, q.armPoll(r))
			armed = true
		}
		require.NoError(t, r.Submit(1))
		q.setReaping()
		woken := false
		r.Reap(func(e uring.CQE) {
			require.Equal(t, uint64(pollTag), e.UserData)
			require.Equal(t, int32(unix.POLLIN), e.Res&unix.POLLIN)
			woken = true
		})
		require.True(t, woken)
		armed = false
		done, quit := q.takeDone(woken)
		require.False(t, quit)
		for _, c := range done {
			require.False(t, seen[c.tag], "tag %d handed back twice", c.tag)
			seen[c.tag] = true
			require.Equal(t, int32(c.tag%each), c.res)
		}
	}
	wg.Wait()
	done, _ := q.takeDone(false)
	require.Empty(t, done)

	q.abandon()
	require.NoError(t, q.armPoll(r))
	require.NoError(t, r.Submit(1))
	_, quit := q.takeDone(true)
	require.True(t, quit, "abandon wakes the loop and tells it to leave")
}

// A request finished during the loop's batch (on the loop's own goroutine, as a file op on its
// ring is) is taken at the batch's end and writes no eventfd.
func TestCompletionInBatch(t *testing.T) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	q := &queue{efd: efd}
	t.Cleanup(q.unmap)

	q.setReaping()
	q.complete(completion{tag: 3, res: 4096})
	var b [8]byte
	_, err = unix.Read(efd, b[:])
	require.ErrorIs(t, err, unix.EAGAIN, "no wake-up for a request finished in a batch")
	done, _ := q.takeDone(false)
	require.Equal(t, []completion{{tag: 3, res: 4096}}, done)

	q.complete(completion{tag: 5, res: 0})
	_, err = unix.Read(efd, b[:])
	require.NoError(t, err, "outside a batch the first request wakes the loop")
}
