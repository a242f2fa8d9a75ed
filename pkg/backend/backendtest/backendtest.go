// Package backendtest is the conformance suite that every backend.Backend runs: read-back at aligned
// and unaligned offsets, range errors, zero-length requests, flush, concurrency on disjoint ranges
// (including disjoint pieces of one block), the optional capabilities, read-only opening, and use
// after Close. CheckDeviceTime checks a backend on a block device that counts its device's
// requests (backend.DeviceTimer).
//
// It compares each backend with a byte-slice model of the device. It is deterministic (seeded
// math/rand) and makes no timing assertions. It must never depend on a particular backend: only the
// backend package's interfaces and errors.
package backendtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Size is the size of the devices the suite opens: 4 MiB, large enough to cross 1 MiB buffers
// and pages of any reasonable size, small enough to verify completely after each step.
const Size = 4 << 20

// Opener returns a new writable backend of exactly size bytes whose contents are all zeroes. It
// should register with t.Cleanup whatever must be removed afterwards; the suite closes the backend
// itself (and may already have closed it).
type Opener func(t *testing.T, size int64) backend.Backend

// ReadOnlyOpener returns a backend opened read-only whose contents are content.
type ReadOnlyOpener func(t *testing.T, content []byte) backend.Backend

// Run runs the conformance suite on the backends open returns.
func Run(t *testing.T, open Opener) {
	t.Run("Size", func(t *testing.T) { testSize(t, open) })
	t.Run("ReadBack", func(t *testing.T) { testReadBack(t, open) })
	t.Run("RandomOps", func(t *testing.T) { testRandomOps(t, open) })
	t.Run("OutOfRange", func(t *testing.T) { testOutOfRange(t, open) })
	t.Run("ZeroLength", func(t *testing.T) { testZeroLength(t, open) })
	t.Run("Flush", func(t *testing.T) { testFlush(t, open) })
	t.Run("ConcurrentDisjoint", func(t *testing.T) { testConcurrentDisjoint(t, open) })
	t.Run("ConcurrentSameBlock", func(t *testing.T) { testConcurrentSameBlock(t, open) })
	t.Run("Trim", func(t *testing.T) { testTrim(t, open) })
	t.Run("WriteZeroes", func(t *testing.T) { testWriteZeroes(t, open) })
	t.Run("FUA", func(t *testing.T) { testFUA(t, open) })
	t.Run("Closed", func(t *testing.T) { testClosed(t, open) })
}

// RunReadOnly checks a backend opened read-only: it reads what is there, reports itself read-only,
// and every kind of write fails with an error wrapping backend.ErrReadOnly and changes nothing.
func RunReadOnly(t *testing.T, open ReadOnlyOpener) {
	content := Pattern(1, Size)
	b := open(t, content)
	t.Cleanup(func() { _ = b.Close() })
	m := &model{b: b, want: bytes.Clone(content)}

	t.Run("Reads", func(t *testing.T) {
		require.Equal(t, int64(Size), b.Size())
		m.verifyAll(t)
		m.randomReads(t, rand.New(rand.NewPCG(2, 2)), 50)
	})
	t.Run("Reports", func(t *testing.T) {
		r, ok := b.(backend.ReadOnlyReporter)
		require.True(t, ok, "a read-only backend must implement backend.ReadOnlyReporter")
		require.True(t, r.ReadOnly())
	})
	t.Run("WritesFail", func(t *testing.T) {
		for _, w := range writeKinds(b) {
			require.ErrorIs(t, w.do(1000, 5000), backend.ErrReadOnly, w.name)
		}
		m.verifyAll(t)
	})
}

// Pattern returns n bytes of seeded pseudo-random data.
func Pattern(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(p) // never fails
	return p
}

// newDev opens a device of Size bytes and closes it when the test ends.
func newDev(t *testing.T, open Opener) *model {
	t.Helper()
	b := open(t, Size)
	require.NotNil(t, b)
	t.Cleanup(func() { _ = b.Close() })
	return &model{b: b, want: make([]byte, Size)}
}

// model is a backend together with the bytes it should hold.
type model struct {
	b    backend.Backend
	want []byte
}

// misaligned returns a buffer of n bytes that starts shift bytes into an allocation, so that
// backends needing aligned memory (direct I/O) see unaligned buffers too.
func misaligned(n, shift int) []byte {
	return make([]byte, n+shift)[shift : shift+n]
}

func (m *model) write(t *testing.T, off int64, p []byte) {
	t.Helper()
	n, err := m.b.WriteAt(p, off)
	require.NoError(t, err, "WriteAt(len %d, off %d)", len(p), off)
	require.Equal(t, len(p), n, "WriteAt(len %d, off %d) count", len(p), off)
	copy(m.want[off:], p)
}

// verify reads [off, off+n) into a buffer shifted by shift bytes and compares it with the model.
func (m *model) verify(t *testing.T, off int64, n, shift int) {
	t.Helper()
	got := misaligned(n, shift)
	c, err := m.b.ReadAt(got, off)
	require.NoError(t, err, "ReadAt(len %d, off %d)", n, off)
	require.Equal(t, n, c, "ReadAt(len %d, off %d) count", n, off)
	if d := firstDiff(got, m.want[off:off+int64(n)]); d >= 0 {
		require.Failf(t, "wrong data", "ReadAt(len %d, off %d): byte at device offset %d is %#x, want %#x",
			n, off, off+int64(d), got[d], m.want[off+int64(d)])
	}
}

func (m *model) verifyAll(t *testing.T) {
	t.Helper()
	for off := int64(0); off < int64(len(m.want)); off += 1 << 20 {
		m.verify(t, off, int(min(1<<20, int64(len(m.want))-off)), 0)
	}
}

// randomRange returns a range inside the model of at most maxLen bytes, 4 KiB-aligned half the time.
func (m *model) randomRange(r *rand.Rand, maxLen int64) (off, n int64) {
	size := int64(len(m.want))
	n = 1 + r.Int64N(maxLen)
	off = r.Int64N(size - n + 1)
	if r.IntN(2) == 0 {
		off &^= 4095
		n = max(4096, n&^4095)
	}
	return off, n
}

func (m *model) randomReads(t *testing.T, r *rand.Rand, count int) {
	t.Helper()
	for range count {
		off, n := m.randomRange(r, 200<<10)
		m.verify(t, off, int(n), r.IntN(8))
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func testSize(t *testing.T, open Opener) {
	m := newDev(t, open)
	require.Equal(t, int64(Size), m.b.Size())
	if r, ok := m.b.(backend.ReadOnlyReporter); ok {
		require.False(t, r.ReadOnly(), "a backend opened for writing reports itself read-only")
	}
	m.verifyAll(t) // starts zeroed
}

func testReadBack(t *testing.T, open Opener) {
	m := newDev(t, open)
	cases := []struct {
		name string
		off  int64
		n    int
	}{
		{"first sector", 0, 512},
		{"aligned 4K", 4096, 4096},
		{"aligned 64K", 64 << 10, 64 << 10},
		{"one byte", 1, 1},
		{"two bytes across a 4K boundary", 4095, 2},
		{"unaligned 4K", 1000, 4096},
		{"across a 64K boundary", 64<<10 - 100, 200},
		{"across a 256K boundary", 256<<10 - 3000, 6000},
		{"across 1 MiB windows", 1<<20 - 4096 - 7, 1<<20 + 4096 + 14},
		{"large aligned", 1 << 20, 2 << 20},
		{"last byte", Size - 1, 1},
		{"unaligned tail", Size - 5000, 5000},
		{"whole device", 0, Size},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := misaligned(c.n, i%3)
			copy(p, Pattern(uint64(i)+10, c.n))
			m.write(t, c.off, p)
			m.verify(t, c.off, c.n, 0)
			m.verify(t, c.off, c.n, 1+i%5)
			if c.n > 2 {
				m.verify(t, c.off+1, c.n-2, 3)
			}
			m.verifyAll(t) // neighbours intact
		})
	}
	m.randomReads(t, rand.New(rand.NewPCG(3, 3)), 100)
}

// testRandomOps runs a seeded mix of writes, reads and (if supported) write-zeroes against the
// model.
func testRandomOps(t *testing.T, open Opener) {
	m := newDev(t, open)
	zw, canZero := m.b.(backend.ZeroWriter)
	r := rand.New(rand.NewPCG(4, 4))
	for i := range 300 {
		off, n := m.randomRange(r, 128<<10)
		switch op := r.IntN(10); {
		case op < 5:
			p := misaligned(int(n), r.IntN(8))
			copy(p, Pattern(uint64(i)+100, int(n)))
			m.write(t, off, p)
		case op < 8 || !canZero:
			m.verify(t, off, int(n), r.IntN(8))
		default:
			require.NoError(t, zw.WriteZeroes(off, n, r.IntN(2) == 0))
			clear(m.want[off : off+n])
		}
	}
	m.verifyAll(t)
}

// writeKind is one way of changing the device, for tests that must try them all.
type writeKind struct {
	name string
	do   func(off, n int64) error
}

// writeKinds lists WriteAt and every write-type capability b has, each writing a nonzero pattern
// or zeroes over [off, off+n).
func writeKinds(b backend.Backend) []writeKind {
	ws := []writeKind{{"WriteAt", func(off, n int64) error {
		return checkCount(b.WriteAt(Pattern(5, int(max(n, 0))), off))
	}}}
	if f, ok := b.(backend.FUAWriter); ok {
		ws = append(ws, writeKind{"WriteAtFUA", func(off, n int64) error {
			return checkCount(f.WriteAtFUA(Pattern(6, int(max(n, 0))), off))
		}})
	}
	if tr, ok := b.(backend.Trimmer); ok {
		ws = append(ws, writeKind{"Trim", tr.Trim})
	}
	if z, ok := b.(backend.ZeroWriter); ok {
		ws = append(ws,
			writeKind{"WriteZeroes(mayUnmap)", func(off, n int64) error { return z.WriteZeroes(off, n, true) }},
			writeKind{"WriteZeroes", func(off, n int64) error { return z.WriteZeroes(off, n, false) }})
	}
	return ws
}

// checkCount turns a failed write that claims to have written something into a test-visible error.
func checkCount(n int, err error) error {
	if err != nil && n != 0 {
		return fmt.Errorf("failed write reported %d bytes written: %w", n, err)
	}
	return err
}

func testOutOfRange(t *testing.T, open Opener) {
	m := newDev(t, open)
	// A pattern everywhere, so that a stray trim or zero shows too.
	m.write(t, 0, Pattern(7, Size))
	cases := []struct {
		name   string
		off, n int64
	}{
		{"negative offset", -1, 1},
		{"at the end", Size, 1},
		{"across the end", Size - 1, 2},
		{"past the end", Size + 4096, 4096},
		{"longer than the device", 0, Size + 1},
		{"offset near MaxInt64", math.MaxInt64 - 10, 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, err := m.b.ReadAt(make([]byte, c.n), c.off)
			require.ErrorIs(t, err, backend.ErrOutOfRange, "ReadAt")
			require.Zero(t, n, "ReadAt count")
			for _, w := range writeKinds(m.b) {
				require.ErrorIs(t, w.do(c.off, c.n), backend.ErrOutOfRange, w.name)
			}
		})
	}
	t.Run("negative length", func(t *testing.T) {
		for _, w := range writeKinds(m.b) {
			if !strings.HasPrefix(w.name, "WriteAt") { // a buffer cannot have a negative length
				require.ErrorIs(t, w.do(0, -1), backend.ErrOutOfRange, w.name)
			}
		}
	})
	m.verifyAll(t) // nothing written
}

func testZeroLength(t *testing.T, open Opener) {
	m := newDev(t, open)
	m.write(t, 0, Pattern(8, Size))
	for _, off := range []int64{0, 12345, Size} {
		n, err := m.b.ReadAt(nil, off)
		require.NoError(t, err, "ReadAt(nil, %d)", off)
		require.Zero(t, n)
		n, err = m.b.ReadAt([]byte{}, off)
		require.NoError(t, err, "ReadAt([]byte{}, %d)", off)
		require.Zero(t, n)
		for _, w := range writeKinds(m.b) {
			require.NoError(t, w.do(off, 0), "%s(%d, 0)", w.name, off)
		}
	}
	m.verifyAll(t)
}

func testFlush(t *testing.T, open Opener) {
	m := newDev(t, open)
	require.NoError(t, m.b.Flush(), "Flush of an idle device")
	m.write(t, 8192+3, Pattern(9, 70000))
	require.NoError(t, m.b.Flush())
	require.NoError(t, m.b.Flush(), "second Flush")
	m.verifyAll(t)
}

// run starts fn(g) in n goroutines and waits for them. fn reports with assert, not require: only the
// test goroutine may stop a test.
func run(n int, fn func(g int)) {
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() { fn(g) })
	}
	wg.Wait()
}

// testConcurrentDisjoint has writers and readers work at once, each on a region of its own.
func testConcurrentDisjoint(t *testing.T, open Opener) {
	m := newDev(t, open)
	const workers = 8
	region := int64(Size / workers)
	run(workers, func(g int) {
		r := rand.New(rand.NewPCG(uint64(g), 5))
		base := int64(g) * region
		mine := m.want[base : base+region] // only this goroutine touches it
		for i := range 40 {
			n := 1 + r.Int64N(64<<10)
			off := r.Int64N(region - n + 1)
			p := Pattern(uint64(g*1000+i), int(n))
			c, err := m.b.WriteAt(p, base+off)
			if !assert.NoError(t, err) || !assert.Equal(t, int(n), c) {
				return
			}
			copy(mine[off:], p)
			// Read back a random piece of the whole region.
			roff := r.Int64N(region)
			got := make([]byte, 1+r.Int64N(region-roff))
			_, err = m.b.ReadAt(got, base+roff)
			if !assert.NoError(t, err) || !assert.True(t, bytes.Equal(got, mine[roff:roff+int64(len(got))]),
				"goroutine %d: region read back wrong at %d", g, base+roff) {
				return
			}
		}
	})
	m.verifyAll(t)
}

// testConcurrentSameBlock has goroutines write disjoint, unaligned pieces of the same blocks at
// once: a backend that does read-modify-write of whole blocks must not lose a neighbour's piece.
func testConcurrentSameBlock(t *testing.T, open Opener) {
	m := newDev(t, open)
	const (
		workers = 8
		piece   = 300 // not a divisor of any block size, so pieces straddle block boundaries
		pieces  = (128 << 10) / piece
		rounds  = 3
	)
	base := int64(1<<20 + 100)
	run(workers, func(g int) {
		r := rand.New(rand.NewPCG(uint64(g), 6))
		var mine []int
		for k := g; k < pieces; k += workers {
			mine = append(mine, k)
		}
		for round := range rounds {
			r.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
			for _, k := range mine {
				off := base + int64(k*piece)
				p := Pattern(uint64(round*pieces+k), piece)
				if _, err := m.b.WriteAt(p, off); !assert.NoError(t, err) {
					return
				}
				got := make([]byte, piece)
				if _, err := m.b.ReadAt(got, off); !assert.NoError(t, err) ||
					!assert.True(t, bytes.Equal(got, p), "piece %d read back wrong", k) {
					return
				}
			}
		}
	})
	for k := range pieces {
		copy(m.want[base+int64(k*piece):], Pattern(uint64((rounds-1)*pieces+k), piece))
	}
	m.verifyAll(t)
}

func testTrim(t *testing.T, open Opener) {
	m := newDev(t, open)
	tr, ok := m.b.(backend.Trimmer)
	if !ok {
		t.Skip("backend does not implement backend.Trimmer")
	}
	m.write(t, 0, Pattern(10, Size))
	cases := []struct {
		name   string
		off, n int64
	}{
		{"aligned 64K", 64 << 10, 64 << 10},
		{"unaligned", 3*4096 + 100, 10000},
		{"one byte", 500000, 1},
		{"large", 1 << 20, 1<<20 + 12345},
		{"whole device", 0, Size},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, tr.Trim(c.off, c.n))
			got := make([]byte, c.n)
			_, err := m.b.ReadAt(got, c.off)
			require.NoError(t, err)
			old := m.want[c.off : c.off+c.n]
			for i := range got {
				if got[i] != 0 && got[i] != old[i] {
					require.Failf(t, "trimmed range", "byte at %d is %#x: neither zero nor the old %#x",
						c.off+int64(i), got[i], old[i])
				}
			}
			copy(old, got) // whichever it is, it must now stay
			m.verifyAll(t) // neighbours intact
			// A write after a trim is read back.
			p := Pattern(11, int(min(c.n, 9000)))
			m.write(t, c.off, p)
			m.verifyAll(t)
		})
	}
}

func testWriteZeroes(t *testing.T, open Opener) {
	m := newDev(t, open)
	z, ok := m.b.(backend.ZeroWriter)
	if !ok {
		t.Skip("backend does not implement backend.ZeroWriter")
	}
	cases := []struct {
		name   string
		off, n int64
	}{
		{"aligned 4K", 4096, 4096},
		{"aligned 256K", 256 << 10, 256 << 10},
		{"unaligned", 3*4096 + 100, 10000},
		{"one byte", 777777, 1},
		{"crossing pages", 64<<10 - 1000, 200<<10 + 2000},
		{"sub-sector", 1<<20 + 10, 100},
		{"whole device", 0, Size},
	}
	for _, mayUnmap := range []bool{false, true} {
		for i, c := range cases {
			t.Run(fmt.Sprintf("%s/mayUnmap=%v", c.name, mayUnmap), func(t *testing.T) {
				m.write(t, 0, Pattern(uint64(20+i), Size))
				require.NoError(t, z.WriteZeroes(c.off, c.n, mayUnmap))
				clear(m.want[c.off : c.off+c.n])
				m.verifyAll(t)
			})
		}
	}
}

func testFUA(t *testing.T, open Opener) {
	m := newDev(t, open)
	f, ok := m.b.(backend.FUAWriter)
	if !ok {
		t.Skip("backend does not implement backend.FUAWriter")
	}
	for i, c := range []struct{ off, n int64 }{{0, 4096}, {4096 + 1, 3000}, {1<<20 - 10, 1<<20 + 20}} {
		p := misaligned(int(c.n), i)
		copy(p, Pattern(uint64(30+i), int(c.n)))
		n, err := f.WriteAtFUA(p, c.off)
		require.NoError(t, err)
		require.Equal(t, int(c.n), n)
		copy(m.want[c.off:], p)
		m.verifyAll(t)
	}
}

// testClosed checks that every call on a closed backend fails with ErrClosed rather than panicking
// or touching whatever reuses its resources.
func testClosed(t *testing.T, open Opener) {
	m := newDev(t, open)
	m.write(t, 0, Pattern(12, 8192))
	require.NoError(t, m.b.Close())
	calls := []writeKind{
		{"ReadAt", func(off, n int64) error { _, err := m.b.ReadAt(make([]byte, n), off); return err }},
		{"Flush", func(int64, int64) error { return m.b.Flush() }},
	}
	calls = append(calls, writeKinds(m.b)...)
	for _, c := range calls {
		var err error
		require.NotPanics(t, func() { err = c.do(0, 4096) }, c.name)
		require.ErrorIs(t, err, backend.ErrClosed, c.name)
		require.False(t, backend.IsRetryable(err), c.name)
	}
	var err error
	require.NotPanics(t, func() { err = m.b.Close() }, "second Close")
	require.True(t, err == nil || errors.Is(err, backend.ErrClosed), "second Close: %v", err)
}

// CheckDeviceTime checks a backend on a block device (or on a file on one), which must implement
// backend.DeviceTimer: the writes its device completed grow by at least the number of FUA writes
// made through it. The buffers are aligned for direct I/O.
func CheckDeviceTime(t *testing.T, b backend.Backend) {
	t.Helper()
	timer, ok := b.(backend.DeviceTimer)
	require.True(t, ok, "the backend does not implement backend.DeviceTimer")
	before, err := timer.DeviceTime()
	require.NoError(t, err)
	buf := bufpool.Aligned(64 << 10)
	for i := range 8 {
		_, err := backend.WriteFUA(b, buf, int64(i)*int64(len(buf)))
		require.NoError(t, err)
	}
	after, err := timer.DeviceTime()
	require.NoError(t, err)
	require.GreaterOrEqual(t, after.Writes-before.Writes, uint64(8), "writes the device completed for 8 FUA writes: %+v then %+v", before, after)
}
