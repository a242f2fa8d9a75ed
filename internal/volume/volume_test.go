package volume

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/trace"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/file/filetest"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// plain hides every optional capability of the backend it embeds and counts flushes, so the tests
// see the volume's emulations.
type plain struct {
	backend.Backend
	flushes atomic.Int64
}

func (p *plain) Flush() error { p.flushes.Add(1); return p.Backend.Flush() }

const size = 1 << 20

func TestInfoFollowsCapabilities(t *testing.T) {
	full := New(mem.New(size), Options{MultiConn: true}).Info()
	require.Equal(t, Info{Size: size, CanTrim: true, CanZero: true, CanFastZero: true, CanFUA: true, MultiConn: true,
		MinBlock: 1, PreferredBlock: 4096, MaxBlock: DefaultMaxBlock}, full)

	bare := New(&plain{Backend: mem.New(size)}, Options{}).Info()
	require.False(t, bare.CanTrim)
	require.False(t, bare.CanFastZero)
	require.True(t, bare.CanZero, "zeroes are emulated with writes")

	ro := New(mem.New(size), Options{ReadOnly: true}).Info()
	require.True(t, ro.ReadOnly)
	require.False(t, ro.CanTrim || ro.CanZero || ro.CanFUA || ro.CanFastZero)
}

func TestRangeChecks(t *testing.T) {
	v := New(mem.New(size), Options{})
	buf := make([]byte, 4096)
	for _, tc := range []struct {
		name string
		err  error
		op   func() error
	}{
		{"read past end", ErrOutOfRange, func() error { return v.ReadAt(buf, size-100) }},
		{"read at end", ErrOutOfRange, func() error { return v.ReadAt(buf[:1], size) }},
		{"write past end", ErrOutOfRange, func() error { return v.WriteAt(buf, size-1, false) }},
		{"trim past end", ErrOutOfRange, func() error { return v.Trim(0, size+1, false) }},
		{"zero past end", ErrOutOfRange, func() error { return v.WriteZeroes(size-4096, 8192, ZeroFlags{}) }},
		{"cache past end", ErrOutOfRange, func() error { return v.Cache(size, 1) }},
		{"negative offset", ErrInvalid, func() error { return v.ReadAt(buf, -1) }},
		{"huge offset", ErrOutOfRange, func() error { return v.WriteAt(buf, 1<<62, false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.op(), tc.err)
		})
	}
	// Nothing above wrote anything.
	got := make([]byte, size)
	require.NoError(t, v.ReadAt(got, 0))
	require.Equal(t, make([]byte, size), got)
	require.NoError(t, v.ReadAt(buf[:0], size), "an empty read at the end is in range")
}

func TestReadOnlyRefusesWrites(t *testing.T) {
	b := mem.New(size)
	v := New(b, Options{ReadOnly: true})
	p := bytes.Repeat([]byte{1}, 512)
	require.ErrorIs(t, v.WriteAt(p, 0, false), ErrReadOnly)
	require.ErrorIs(t, v.Trim(0, 512, false), ErrReadOnly)
	require.ErrorIs(t, v.WriteZeroes(0, 512, ZeroFlags{}), ErrReadOnly)
	require.NoError(t, v.Flush())
	require.NoError(t, v.ReadAt(p, 0))
	require.Equal(t, make([]byte, 512), p)
}

func TestFUAFlushes(t *testing.T) {
	p := &plain{Backend: mem.New(size)}
	v := New(p, Options{})
	require.NoError(t, v.WriteAt([]byte{1}, 0, false))
	require.Zero(t, p.flushes.Load())
	require.NoError(t, v.WriteAt([]byte{1}, 0, true))
	require.EqualValues(t, 1, p.flushes.Load())
	require.NoError(t, v.WriteZeroes(0, 10, ZeroFlags{FUA: true}))
	require.EqualValues(t, 2, p.flushes.Load())
}

func TestWriteZeroesEmulated(t *testing.T) {
	p := &plain{Backend: mem.New(4 << 20)}
	v := New(p, Options{})
	ones := bytes.Repeat([]byte{0xff}, 4<<20)
	require.NoError(t, v.WriteAt(ones, 0, false))
	// Longer than the emulation's chunk, unaligned at both ends.
	require.NoError(t, v.WriteZeroes(100, 3<<20, ZeroFlags{NoHole: true}))
	got := make([]byte, 4<<20)
	require.NoError(t, v.ReadAt(got, 0))
	want := bytes.Clone(ones)
	clear(want[100 : 100+3<<20])
	require.Equal(t, want, got)
	require.ErrorIs(t, v.WriteZeroes(0, 4096, ZeroFlags{Fast: true}), ErrNotSupported)
	require.NoError(t, v.ReadAt(got[:4096], 0))
	require.Equal(t, byte(0xff), got[0], "a refused fast zero writes nothing")
}

func TestTrimWithoutTrimmerIsIgnored(t *testing.T) {
	v := New(&plain{Backend: mem.New(size)}, Options{})
	require.NoError(t, v.WriteAt([]byte{7}, 0, false))
	require.NoError(t, v.Trim(0, 4096, false))
	got := []byte{0}
	require.NoError(t, v.ReadAt(got, 0))
	require.Equal(t, byte(7), got[0])
}

// refusing claims trim and write-zeroes but refuses both, as a remote NBD server without those
// commands does.
type refusing struct{ backend.Backend }

func (refusing) Trim(off, length int64) error                       { return backend.ErrNotSupported }
func (refusing) WriteZeroes(off, length int64, mayUnmap bool) error { return backend.ErrNotSupported }

// TestRefusedTrimAndZeroFallBack: a backend's refusals fall back to what the client asked for, and
// a fast zero refused changes nothing, so observers never hear of it.
func TestRefusedTrimAndZeroFallBack(t *testing.T) {
	rec := &requests{}
	v := New(refusing{mem.New(size)}, Options{Observers: []Observer{Recording(rec, func(err error) { t.Errorf("recording: %v", err) })}})
	ones := bytes.Repeat([]byte{0xff}, 8192)
	require.NoError(t, v.WriteAt(ones, 0, false))
	require.NoError(t, v.Trim(0, 4096, false), "trim is advisory")
	require.ErrorIs(t, v.WriteZeroes(0, 4096, ZeroFlags{Fast: true}), ErrNotSupported)
	require.NoError(t, v.WriteZeroes(0, 4096, ZeroFlags{}))
	got := make([]byte, 8192)
	require.NoError(t, v.ReadAt(got, 0))
	require.Equal(t, append(make([]byte, 4096), ones[:4096]...), got)
	require.Equal(t, []trace.Op{trace.OpWrite, trace.OpOther, trace.OpWrite, trace.OpRead}, ops(rec.got))
}

func ops(rs []trace.Request) []trace.Op {
	var out []trace.Op
	for _, r := range rs {
		out = append(out, r.Op)
	}
	return out
}

// TestOnRing: a volume passes reads and writes on a caller's ring to a backend that serves them
// so (a file opened direct), after its own checks: out of range or, read-only, a write is left
// to ReadAt and WriteAt, which report why; a backend without them leaves every request.
func TestOnRing(t *testing.T) {
	f, loop := filetest.DirectOnRing(t, "1MiB", 2)
	v := New(f, Options{})
	p := bufpool.Aligned(8192)
	copy(p, bytes.Repeat([]byte("ring"), 2048))
	loop.RoundTrip(t, v, v, p, 4096, true)
	got := bufpool.Aligned(8192)

	never := func(error) { t.Error("done called for a request left to ReadAt or WriteAt") }
	require.False(t, v.ReadAtOn(nil, got, size-4096, never), "past the end")
	require.False(t, New(f, Options{ReadOnly: true}).WriteAtOn(nil, p, 0, false, never), "read-only")
	bare := New(&plain{Backend: f}, Options{})
	require.False(t, bare.ReadAtOn(nil, got, 0, never), "a backend without ring reads")
	require.False(t, bare.WriteAtOn(nil, p, 0, false, never), "a backend without ring writes")
}

// meterCalls records what a volume told its meter.
type meterCalls struct {
	mu    sync.Mutex
	calls []string
}

func (m *meterCalls) add(kind string, n int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, fmt.Sprintf("%s %d %v", kind, n, err != nil))
}

func (m *meterCalls) Read(n int, _ time.Duration, err error)  { m.add("read", n, err) }
func (m *meterCalls) Write(n int, _ time.Duration, err error) { m.add("write", n, err) }
func (m *meterCalls) Failed(err error)                        { m.add("other", 0, err) }

// TestMeter: a volume with a meter records every request that reaches its backend, by kind, bytes
// and failure, on its ring too; a request it refuses itself (out of range) is not the backend's.
func TestMeter(t *testing.T) {
	f, loop := filetest.DirectOnRing(t, "1MiB", 2)
	dev := fault.New(f, fault.Options{})
	m := &meterCalls{}
	v := New(dev, Options{Meter: m})
	p := bufpool.Aligned(4096)
	require.NoError(t, v.WriteAt(p, 0, true))
	require.NoError(t, v.ReadAt(p[:512], 512))
	require.Error(t, v.ReadAt(p, size), "out of range")
	dev.SetFailing(true)
	require.Error(t, v.ReadAt(p, 0))
	require.Error(t, v.Flush())
	require.Error(t, v.Trim(0, 4096, false))
	require.Error(t, v.WriteZeroes(0, 4096, ZeroFlags{}))
	dev.SetFailing(false)
	require.NoError(t, v.Flush())
	require.Equal(t, []string{"write 4096 false", "read 512 false", "read 4096 true", "other 0 true", "other 0 true", "other 0 true", "other 0 false"}, m.calls)

	m.calls = nil
	ring := New(f, Options{Meter: m})
	loop.RoundTrip(t, ring, ring, p, 8192, false)
	require.Equal(t, []string{"write 4096 false", "read 4096 false"}, m.calls, "on the ring")
}

// nopMeter records nothing: the allocations measured are the volume's own.
type nopMeter struct{}

func (nopMeter) Read(int, time.Duration, error)  {}
func (nopMeter) Write(int, time.Duration, error) {}
func (nopMeter) Failed(error)                    {}

// A metered request on a ring or started asynchronously costs no allocation once the pool of
// the ops that record them is warm.
func TestMeteredAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops ops on purpose")
	}
	v := New(mem.New(size), Options{Meter: nopMeter{}})
	done := func(error) {}
	v.metered(false, 4096, done)(nil) // warms the pool
	if n := testing.AllocsPerRun(100, func() { v.metered(true, 4096, done)(nil) }); n > 0 {
		t.Fatalf("%.1f allocations a metered request, want none", n)
	}
}
