package ublk

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/uring"
)

// testRing sets up a ring, or skips the test where the host kernel forbids io_uring.
func testRing(t *testing.T, entries, flags uint32) *uring.Ring {
	t.Helper()
	r, err := uring.New(entries, flags)
	if uring.Unavailable(err) {
		t.Skipf("io_uring is not available on this host: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

// The completion hand-off of a queue: workers call complete from any goroutine; the loop's poll
// on the eventfd fires and takeDone returns every completion exactly once.
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
	for len(seen) < workers*each {
		require.NoError(t, q.armPoll(r))
		require.NoError(t, r.Submit(1))
		polls := 0
		r.Reap(func(e uring.CQE) {
			require.Equal(t, uint64(pollTag), e.UserData)
			require.Equal(t, int32(unix.POLLIN), e.Res&unix.POLLIN)
			polls++
		})
		require.Equal(t, 1, polls)
		done, quit := q.takeDone()
		require.False(t, quit)
		for _, c := range done {
			require.False(t, seen[c.tag], "tag %d handed back twice", c.tag)
			seen[c.tag] = true
			require.Equal(t, int32(c.tag%each), c.res)
		}
	}
	wg.Wait()
	done, _ := q.takeDone()
	require.Empty(t, done)

	q.abandon()
	require.NoError(t, q.armPoll(r))
	require.NoError(t, r.Submit(1))
	_, quit := q.takeDone()
	require.True(t, quit, "abandon wakes the loop and tells it to leave")
}
