package ublk

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// testRing sets up a ring, or skips the test where the host kernel forbids io_uring
// (kernel.io_uring_disabled, seccomp in containers, kernels before 5.1).
func testRing(t *testing.T, entries, flags uint32) *ring {
	t.Helper()
	r, err := newRing(entries, flags)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		t.Skipf("io_uring is not available on this host: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

func TestRingNop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags uint32
	}{
		{"64-byte SQEs", 0},
		{"128-byte SQEs", setupSQE128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRing(t, 4, tc.flags)
			// Several rounds, more than the ring holds, so that head and tail wrap around.
			for round := range 5 {
				for i := range 4 {
					s, cmd, err := r.get()
					require.NoError(t, err)
					require.Len(t, cmd, r.sqeSize-sqeCmdOffset)
					s.Opcode = opNop
					s.UserData = uint64(round*10 + i)
				}
				_, _, err := r.get()
				require.ErrorIs(t, err, errRingFull)
				require.NoError(t, r.submit(4))
				var got []uint64
				r.reap(func(e cqe) {
					require.Zero(t, e.Res)
					got = append(got, e.UserData)
				})
				want := []uint64{uint64(round * 10), uint64(round*10 + 1), uint64(round*10 + 2), uint64(round*10 + 3)}
				require.ElementsMatch(t, want, got)
				require.Zero(t, r.ready())
			}
		})
	}
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
		require.NoError(t, r.submit(1))
		polls := 0
		r.reap(func(e cqe) {
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
	require.NoError(t, r.submit(1))
	_, quit := q.takeDone()
	require.True(t, quit, "abandon wakes the loop and tells it to leave")
}
