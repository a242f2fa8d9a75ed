package retry

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// fast retries almost at once, so that tests do not wait.
var fast = Options{Base: time.Microsecond, Max: 10 * time.Microsecond}

func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		wrap func(backend.Backend) backend.Backend
	}{
		{"mem", func(b backend.Backend) backend.Backend { return b }},
		{"fault over mem", func(b backend.Backend) backend.Backend { return fault.New(b, fault.Options{}) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			backendtest.Run(t, func(_ *testing.T, size int64) backend.Backend {
				return New(c.wrap(mem.New(size)), fast)
			})
		})
	}
}

// bare hides every optional interface of the backend it holds.
type bare struct{ backend.Backend }

func TestMissingCapabilities(t *testing.T) {
	f := fault.New(bare{mem.New(1 << 20)}, fault.Options{})
	r := New(bare{f}, fast)
	require.ErrorIs(t, r.Trim(0, 4096), backend.ErrNotSupported)
	require.ErrorIs(t, r.WriteZeroes(0, 4096, false), backend.ErrNotSupported)
	require.False(t, r.ReadOnly())
	p := backendtest.Pattern(1, 3000)
	n, err := r.WriteAtFUA(p, 100)
	require.NoError(t, err)
	require.Equal(t, len(p), n)
	got := make([]byte, len(p))
	_, err = r.ReadAt(got, 100)
	require.NoError(t, err)
	require.Equal(t, p, got)
	require.Equal(t, map[fault.Op]int64{fault.Read: 1, fault.Write: 1, fault.Flush: 1, fault.Trim: 0, fault.Zero: 0},
		f.Counts(), "FUA without FUA is a write and a flush")
}

// call is one kind of call through the retry wrapper, and the fault kind it reaches the wrapped
// backend as (a FUA write counts as a write).
type call struct {
	name string
	op   fault.Op
	do   func(r *Backend) error
}

var calls = []call{
	{"ReadAt", fault.Read, func(r *Backend) error {
		p := make([]byte, 4096)
		n, err := r.ReadAt(p, 4096)
		if err == nil && (n != len(p) || !bytes.Equal(p, backendtest.Pattern(9, 4096))) {
			return fmt.Errorf("read %d bytes, not the data written", n)
		}
		return err
	}},
	{"WriteAt", fault.Write, func(r *Backend) error { return checkWrite(r.WriteAt(backendtest.Pattern(9, 4096), 4096)) }},
	{"WriteAtFUA", fault.Write, func(r *Backend) error {
		return checkWrite(r.WriteAtFUA(backendtest.Pattern(9, 4096), 4096))
	}},
	{"Flush", fault.Flush, func(r *Backend) error { return r.Flush() }},
	{"Trim", fault.Trim, func(r *Backend) error { return r.Trim(0, 4096) }},
	{"WriteZeroes", fault.Zero, func(r *Backend) error { return r.WriteZeroes(0, 4096, false) }},
}

func checkWrite(n int, err error) error {
	if err == nil && n != 4096 {
		return fmt.Errorf("wrote %d bytes of 4096", n)
	}
	return err
}

// setup returns a retry wrapper over a fault injector over a device holding a pattern at 4096.
func setup(t *testing.T, fo fault.Options, o Options) (*Backend, *fault.Backend) {
	t.Helper()
	m := mem.New(1 << 20)
	_, err := m.WriteAt(backendtest.Pattern(9, 4096), 4096)
	require.NoError(t, err)
	f := fault.New(m, fo)
	r := New(f, o)
	t.Cleanup(func() { _ = r.Close() })
	return r, f
}

func TestSucceedsAfterTransientFailures(t *testing.T) {
	for _, c := range calls {
		for _, k := range []int64{0, 1, 2, 4} {
			t.Run(fmt.Sprintf("%s/%d failures", c.name, k), func(t *testing.T) {
				var rules []fault.Rule
				for n := range k {
					rules = append(rules, fault.Rule{Op: c.op, Nth: n + 1})
				}
				var log bytes.Buffer
				o := fast
				o.Logger = slog.New(slog.NewTextHandler(&log, nil))
				r, f := setup(t, fault.Options{Rules: rules}, o)
				require.NoError(t, c.do(r))
				require.Equal(t, k+1, f.Counts()[c.op], "calls reaching the backend")
				require.Equal(t, int(k), strings.Count(log.String(), "retrying"), "warnings logged:\n%s", log.String())
			})
		}
	}
}

func TestGivesUp(t *testing.T) {
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			o := fast
			o.Attempts = 3
			r, f := setup(t, fault.Options{}, o)
			f.SetFailing(true)
			err := c.do(r)
			require.ErrorIs(t, err, fault.ErrInjected)
			require.ErrorIs(t, err, syscall.EIO)
			require.ErrorContains(t, err, "gave up after 3 attempts")
			require.Equal(t, int64(3), f.Counts()[c.op])
		})
	}
	t.Run("default attempts", func(t *testing.T) {
		r, f := setup(t, fault.Options{}, Options{Base: time.Microsecond})
		f.SetFailing(true)
		require.ErrorContains(t, r.Flush(), fmt.Sprintf("gave up after %d attempts", DefaultAttempts))
		require.Equal(t, int64(DefaultAttempts), f.Counts()[fault.Flush])
	})
}

func TestPermanentErrors(t *testing.T) {
	cases := []struct {
		name    string
		rules   []fault.Rule
		do      func(r *Backend) error
		want    error
		calls   int64
		message string // "" if the error must come back unchanged
	}{
		{"out of range", nil, func(r *Backend) error {
			_, err := r.WriteAt(make([]byte, 4096), 1<<20-100)
			return err
		}, backend.ErrOutOfRange, 1, ""},
		{"read out of range", nil, func(r *Backend) error {
			_, err := r.ReadAt(make([]byte, 1), -1)
			return err
		}, backend.ErrOutOfRange, 1, ""},
		{"injected permanent", []fault.Rule{{Op: fault.Write, Nth: 1, Err: backend.ErrReadOnly}}, func(r *Backend) error {
			_, err := r.WriteAt(make([]byte, 4096), 0)
			return err
		}, backend.ErrReadOnly, 1, ""},
		{"permanent after transient", []fault.Rule{{Op: fault.Trim, Nth: 1}, {Op: fault.Trim, Nth: 2, Err: backend.ErrNotSupported}},
			func(r *Backend) error { return r.Trim(0, 4096) },
			backend.ErrNotSupported, 2, "trim at offset 0 length 4096: failed permanently on attempt 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, f := setup(t, fault.Options{Rules: c.rules}, fast)
			err := c.do(r)
			require.ErrorIs(t, err, c.want)
			require.False(t, backend.IsRetryable(err))
			total := int64(0)
			for _, n := range f.Counts() {
				total += n
			}
			require.Equal(t, c.calls, total, "calls reaching the backend")
			if c.message == "" {
				require.NotContains(t, err.Error(), "attempt")
			} else {
				require.ErrorContains(t, err, c.message)
			}
		})
	}
}

// TestStopsWaiting checks that Close or the context ends a retry that would otherwise wait for an
// hour.
func TestStopsWaiting(t *testing.T) {
	cases := []struct {
		name string
		stop func(t *testing.T, r *Backend, cancel context.CancelFunc)
		want error
	}{
		{"Close", func(t *testing.T, r *Backend, _ context.CancelFunc) { require.NoError(t, r.Close()) }, backend.ErrClosed},
		{"context", func(_ *testing.T, _ *Backend, cancel context.CancelFunc) { cancel() }, context.Canceled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r, f := setup(t, fault.Options{}, Options{Base: time.Hour, Context: ctx})
			f.SetFailing(true)
			errc := make(chan error, 1)
			go func() {
				_, err := r.WriteAt(make([]byte, 4096), 0)
				errc <- err
			}()
			for f.Counts()[fault.Write] == 0 {
				time.Sleep(time.Millisecond)
			}
			c.stop(t, r, cancel)
			err := <-errc
			require.ErrorIs(t, err, c.want)
			require.ErrorIs(t, err, fault.ErrInjected, "the last error is lost")
			require.ErrorContains(t, err, "stopped retrying after 1 attempt (")
			require.Equal(t, int64(1), f.Counts()[fault.Write])
		})
	}
}

func TestDelay(t *testing.T) {
	r := New(mem.New(4096), Options{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond})
	for _, c := range []struct {
		next     int
		min, max time.Duration
	}{
		{2, 5 * time.Millisecond, 10 * time.Millisecond},
		{3, 10 * time.Millisecond, 20 * time.Millisecond},
		{5, 40 * time.Millisecond, 80 * time.Millisecond},
		{6, 50 * time.Millisecond, 100 * time.Millisecond},
		{100, 50 * time.Millisecond, 100 * time.Millisecond}, // no overflow
	} {
		for range 20 {
			d := r.delay(c.next)
			require.True(t, d >= c.min && d <= c.max, "delay before attempt %d is %v, want [%v, %v]", c.next, d, c.min, c.max)
		}
	}
}
