// Package uringtest runs requests on a ring the test's goroutine owns, as a ublk queue's loop
// does, for the tests of backends that serve reads and writes on a caller's ring
// (backend.RingReader, backend.RingWriter). It is for tests only.
package uringtest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/uring"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Loop is a ring and its Ops, owned by the goroutine that calls Do.
type Loop struct {
	r   *uring.Ring
	ops *uring.Ops
}

// New sets up a ring for n ops at once; it returns nil where the kernel refuses io_uring.
func New(t testing.TB, n int) *Loop {
	t.Helper()
	r, err := uring.New(uint32(n), 0)
	if uring.Unavailable(err) {
		return nil
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return &Loop{r: r, ops: uring.NewOps(r, n)}
}

// InFlight is the number of ops on the loop's ring not yet reaped.
func (l *Loop) InFlight() int { return l.ops.InFlight() }

// Do calls start with the loop's ring and a done, then, if it started, reaps the ring until done
// is called (on the ring's goroutine, or on another the backend chose). It reports whether start
// started and done's error, or what went wrong with the ring (an op left in flight, a completion
// not an op's). It does not fail the test itself, so any goroutine may call it.
func (l *Loop) Do(start func(r backend.Ring, done func(error)) bool) (bool, error) {
	ended, started, err := l.Begin(start)
	if !started || err != nil {
		return started, err
	}
	return true, l.End(ended)
}

// Begin is Do's first half: it calls start and, if it started, returns what End waits on.
func (l *Loop) Begin(start func(r backend.Ring, done func(error)) bool) (<-chan error, bool, error) {
	ended := make(chan error, 1)
	if !start(l.ops, func(err error) { ended <- err }) {
		if l.ops.InFlight() != 0 {
			return nil, false, errors.New("uringtest: a request not started left an op in flight")
		}
		return nil, false, nil
	}
	return ended, true, nil
}

// End is Do's second half: it reaps the ring until the request Begin started ends, and returns
// its error.
func (l *Loop) End(ended <-chan error) error {
	for {
		select {
		case err := <-ended:
			if l.ops.InFlight() != 0 {
				return errors.New("uringtest: done called with an op in flight")
			}
			return err
		default:
		}
		if l.ops.InFlight() == 0 {
			return <-ended // done comes from another goroutine
		}
		if err := l.r.Submit(1); err != nil {
			return fmt.Errorf("uringtest: %w", err)
		}
		var stray error
		l.r.Reap(func(c uring.CQE) {
			if !l.ops.Complete(c) {
				stray = fmt.Errorf("uringtest: a completion not an op's: %+v", c)
			}
		})
		if stray != nil {
			return stray
		}
	}
}

// RoundTrip writes p at off through w on the loop's ring, then reads it back through r, and fails
// t unless both went on the ring, without error, and the data came back.
func (l *Loop) RoundTrip(t testing.TB, w backend.RingWriter, r backend.RingReader, p []byte, off int64, fua bool) {
	t.Helper()
	started, err := l.Do(func(ring backend.Ring, done func(error)) bool { return w.WriteAtOn(ring, p, off, fua, done) })
	require.True(t, started, "a write on the ring")
	require.NoError(t, err)
	got := bufpool.Aligned(len(p))
	started, err = l.Do(func(ring backend.Ring, done func(error)) bool { return r.ReadAtOn(ring, got, off, done) })
	require.True(t, started, "a read on the ring")
	require.NoError(t, err)
	require.Equal(t, p, got)
}
