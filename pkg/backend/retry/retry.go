// Package retry wraps a backend.Backend so that calls failing with a transient error (an EIO, a
// dropped connection: whatever backend.IsRetryable accepts) are tried again after an exponential
// backoff, and the error that finally comes back says how many attempts were made.
//
// It must never retry a permanent error (out of range, read-only, not supported, closed): those are
// returned at once. It must never wait on after Close or after its context is done, so that
// shutting down is not held up by a backend that is down.
package retry

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// Defaults for the zero Options.
const (
	DefaultAttempts = 5
	DefaultBase     = 10 * time.Millisecond
	DefaultMax      = time.Second
)

// Options tune the retries. Zero fields take the defaults.
type Options struct {
	// Attempts is how many times a call is tried in all, the first time included.
	Attempts int
	// Base is the delay before the second attempt; each later delay doubles, up to Max. Each
	// delay is jittered down by up to half, so that callers failing together do not retry together.
	Base, Max time.Duration
	// Context, when done, stops the waiting, as Close does.
	Context context.Context
	// Logger, if set, gets a warning for each retry.
	Logger *slog.Logger
}

// Backend retries the calls of the backend it wraps. It is safe for concurrent use.
//
// It implements every optional interface, so that it can stand in for any backend: Trim and
// WriteZeroes fail with an error wrapping backend.ErrNotSupported when the wrapped backend lacks
// them (callers fall back, as they must for an NBD server that refuses); WriteAtFUA falls back to
// WriteAt then Flush, which is what FUA promises; ReadOnly reports false when the wrapped backend
// cannot tell.
type Backend struct {
	inner     backend.Backend
	attempts  int
	base, max time.Duration
	ctx       context.Context
	log       *slog.Logger

	closeOnce sync.Once
	closed    chan struct{} // closed by Close: stop waiting
}

// New wraps b.
func New(b backend.Backend, o Options) *Backend {
	r := &Backend{
		inner:    b,
		attempts: orDefault(o.Attempts, DefaultAttempts),
		base:     orDefault(o.Base, DefaultBase),
		max:      orDefault(o.Max, DefaultMax),
		ctx:      o.Context,
		log:      o.Logger,
		closed:   make(chan struct{}),
	}
	if r.ctx == nil {
		r.ctx = context.Background()
	}
	r.max = max(r.max, r.base)
	return r
}

// orDefault returns v, or def if v is not positive.
func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// delay is the wait before attempt number next (2 or more): Base doubled for each attempt after
// the second, capped at Max, then jittered into [d/2, d].
func (r *Backend) delay(next int) time.Duration {
	d := r.max
	if shift := next - 2; shift < 62 && r.base<<shift > 0 && r.base<<shift < r.max {
		d = r.base << shift
	}
	return d/2 + rand.N(d/2+1)
}

// do calls fn until it succeeds, fails permanently, has been tried r.attempts times, or waiting is
// stopped. what names the call for errors and logs.
func (r *Backend) do(what func() string, fn func() error) error {
	err := fn()
	attempt := 1
	for ; backend.IsRetryable(err) && attempt < r.attempts; attempt++ {
		d := r.delay(attempt + 1)
		if r.log != nil {
			r.log.Warn("backend call failed; retrying", "call", what(), "attempt", attempt,
				"attempts", r.attempts, "delay", d, "err", err)
		}
		if stop := r.wait(d); stop != nil {
			return fmt.Errorf("%s: stopped retrying after %s (%w): %w", what(), attempts(attempt), stop, err)
		}
		err = fn()
	}
	switch {
	case err == nil || attempt == 1:
		return err
	case backend.IsRetryable(err):
		return fmt.Errorf("%s: gave up after %s: %w", what(), attempts(attempt), err)
	default:
		return fmt.Errorf("%s: failed permanently on attempt %d: %w", what(), attempt, err)
	}
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// wait sleeps for d; it returns an error if waiting was stopped first.
func (r *Backend) wait(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.closed:
		return backend.ErrClosed
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
}

func describe(op string, off, n int64) func() string {
	return func() string { return fmt.Sprintf("%s at offset %d length %d", op, off, n) }
}

// ReadAt implements backend.Backend.
func (r *Backend) ReadAt(p []byte, off int64) (n int, err error) {
	err = r.do(describe("read", off, int64(len(p))), func() error {
		n, err = r.inner.ReadAt(p, off)
		return err
	})
	return n, err
}

// WriteAt implements backend.Backend. A retried write writes all of p again, which is harmless
// whatever part of it the failed attempt wrote.
func (r *Backend) WriteAt(p []byte, off int64) (n int, err error) {
	err = r.do(describe("write", off, int64(len(p))), func() error {
		n, err = r.inner.WriteAt(p, off)
		return err
	})
	return n, err
}

// WriteAtFUA implements backend.FUAWriter.
func (r *Backend) WriteAtFUA(p []byte, off int64) (n int, err error) {
	err = r.do(describe("FUA write", off, int64(len(p))), func() error {
		n, err = backend.WriteFUA(r.inner, p, off)
		return err
	})
	if err != nil {
		n = 0
	}
	return n, err
}

// Size implements backend.Backend.
func (r *Backend) Size() int64 { return r.inner.Size() }

// Waits implements backend.Waiter for the wrapped backend.
func (r *Backend) Waits() uint64 { return backend.WaitsOf(r.inner) }

// Flush implements backend.Backend.
func (r *Backend) Flush() error {
	return r.do(func() string { return "flush" }, r.inner.Flush)
}

// Trim implements backend.Trimmer.
func (r *Backend) Trim(off, length int64) error {
	t, ok := r.inner.(backend.Trimmer)
	if !ok {
		return fmt.Errorf("trim: wrapped backend %T: %w", r.inner, backend.ErrNotSupported)
	}
	return r.do(describe("trim", off, length), func() error { return t.Trim(off, length) })
}

// WriteZeroes implements backend.ZeroWriter.
func (r *Backend) WriteZeroes(off, length int64, mayUnmap bool) error {
	z, ok := r.inner.(backend.ZeroWriter)
	if !ok {
		return fmt.Errorf("write-zeroes: wrapped backend %T: %w", r.inner, backend.ErrNotSupported)
	}
	return r.do(describe("write-zeroes", off, length), func() error {
		return z.WriteZeroes(off, length, mayUnmap)
	})
}

// ReadOnly implements backend.ReadOnlyReporter.
func (r *Backend) ReadOnly() bool {
	ro, ok := r.inner.(backend.ReadOnlyReporter)
	return ok && ro.ReadOnly()
}

// Close stops every wait for a retry, then closes the wrapped backend. It does not flush.
func (r *Backend) Close() error {
	r.closeOnce.Do(func() { close(r.closed) })
	return r.inner.Close()
}

// The optional interfaces Backend promises.
var (
	_ backend.Trimmer          = (*Backend)(nil)
	_ backend.ZeroWriter       = (*Backend)(nil)
	_ backend.FUAWriter        = (*Backend)(nil)
	_ backend.ReadOnlyReporter = (*Backend)(nil)
)
