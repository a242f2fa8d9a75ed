package fault

import (
	"bytes"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/file"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// bare hides every optional interface of the backend it holds.
type bare struct{ backend.Backend }

func openFile(t *testing.T, path, query string, opts backend.Options) backend.Backend {
	t.Helper()
	b, err := file.Open(&url.URL{Scheme: "file", Path: path, RawQuery: query}, opts)
	require.NoError(t, err)
	return b
}

func TestConformance(t *testing.T) {
	cases := []struct {
		name  string
		inner func(t *testing.T, size int64) backend.Backend
		opts  Options
	}{
		{"mem", func(_ *testing.T, size int64) backend.Backend { return mem.New(size) }, Options{}},
		{"mem with delays", func(_ *testing.T, size int64) backend.Backend { return mem.New(size) },
			Options{Seed: 1, MaxDelay: 20 * time.Microsecond}},
		// A file has FUA, which mem lacks, so both ways of WriteAtFUA run.
		{"file", func(t *testing.T, size int64) backend.Backend {
			return openFile(t, filepath.Join(t.TempDir(), "disk.img"), "size="+strconv.FormatInt(size, 10), backend.Options{})
		}, Options{}},
		// Rates of zero and rules that never come up inject nothing.
		{"idle rules", func(_ *testing.T, size int64) backend.Backend { return mem.New(size) },
			Options{Rates: map[Op]float64{Write: 0}, Rules: []Rule{{Op: Write, Nth: 1 << 40}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T, size int64) backend.Backend { return New(c.inner(t, size), c.opts) })
		})
	}
}

func TestReadOnlyConformance(t *testing.T) {
	backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
		path := filepath.Join(t.TempDir(), "disk.img")
		require.NoError(t, os.WriteFile(path, content, 0o444))
		return New(openFile(t, path, "", backend.Options{ReadOnly: true}), Options{})
	})
}

// TestMissingCapabilities checks what the optional methods do over a backend that lacks them.
func TestMissingCapabilities(t *testing.T) {
	f := New(bare{mem.New(1 << 20)}, Options{})
	require.ErrorIs(t, f.Trim(0, 4096), backend.ErrNotSupported)
	require.ErrorIs(t, f.WriteZeroes(0, 4096, false), backend.ErrNotSupported)
	require.False(t, f.ReadOnly())
	p := backendtest.Pattern(1, 3000)
	n, err := f.WriteAtFUA(p, 100)
	require.NoError(t, err)
	require.Equal(t, len(p), n)
	got := make([]byte, len(p))
	_, err = f.ReadAt(got, 100)
	require.NoError(t, err)
	require.Equal(t, p, got)
	require.Equal(t, map[Op]int64{Read: 1, Write: 1, Flush: 0, Trim: 1, Zero: 1}, f.Counts())
}

// call makes one call of kind op on f, with a range at off.
func call(f *Backend, op Op, off int64) error {
	var err error
	switch op {
	case Read:
		_, err = f.ReadAt(make([]byte, 512), off)
	case Write:
		_, err = f.WriteAt(make([]byte, 512), off)
	case Flush:
		err = f.Flush()
	case Trim:
		err = f.Trim(off, 512)
	case Zero:
		err = f.WriteZeroes(off, 512, false)
	}
	return err
}

var allOps = []Op{Read, Write, Flush, Trim, Zero}

func TestRules(t *testing.T) {
	cases := []struct {
		name   string
		rules  []Rule
		op     Op
		failAt []int // 1-based calls of op that must fail
	}{
		{"third read", []Rule{{Op: Read, Nth: 3}}, Read, []int{3}},
		{"first write", []Rule{{Op: Write, Nth: 1}}, Write, []int{1}},
		{"seventh write", []Rule{{Op: Write, Nth: 7}}, Write, []int{7}},
		{"two writes", []Rule{{Op: Write, Nth: 2}, {Op: Write, Nth: 5}}, Write, []int{2, 5}},
		{"flush", []Rule{{Op: Flush, Nth: 4}}, Flush, []int{4}},
		{"trim", []Rule{{Op: Trim, Nth: 1}}, Trim, []int{1}},
		{"zero", []Rule{{Op: Zero, Nth: 10}}, Zero, []int{10}},
		{"a rule for another kind", []Rule{{Op: Read, Nth: 2}}, Write, nil},
		{"a call never made", []Rule{{Op: Write, Nth: 11}}, Write, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := New(mem.New(1<<20), Options{Rules: c.rules})
			var failed []int
			for i := 1; i <= 10; i++ {
				// Calls of other kinds in between must not move the count.
				for _, other := range allOps {
					if other != c.op && other != c.rules[0].Op {
						require.NoError(t, call(f, other, 0))
					}
				}
				err := call(f, c.op, int64(i)*4096)
				if err == nil {
					continue
				}
				failed = append(failed, i)
				require.ErrorIs(t, err, ErrInjected)
				require.ErrorIs(t, err, syscall.EIO)
				require.True(t, backend.IsRetryable(err))
				require.ErrorContains(t, err, fmt.Sprintf("rule: %s call #%d", c.op, i))
			}
			require.Equal(t, c.failAt, failed)
			require.Equal(t, int64(10), f.Counts()[c.op])
			require.Equal(t, int64(len(c.failAt)), f.Faults()[c.op])
		})
	}
}

func TestErrors(t *testing.T) {
	permanent := fmt.Errorf("disk gone: %w", backend.ErrClosed)
	f := New(mem.New(1<<20), Options{
		Err:   permanent,
		Rules: []Rule{{Op: Write, Nth: 1}, {Op: Write, Nth: 2, Err: syscall.ENOSPC}, {Op: Flush, Nth: 1}},
	})
	_, err := f.WriteAt(make([]byte, 512), 4096)
	require.EqualError(t, err, "write at offset 4096 length 512: disk gone: backend: closed (fault injected by rule: write call #1)")
	require.ErrorIs(t, err, backend.ErrClosed)
	require.False(t, backend.IsRetryable(err))

	_, err = f.WriteAt(make([]byte, 100), 7)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.NotErrorIs(t, err, backend.ErrClosed)
	var fe *Error
	require.ErrorAs(t, err, &fe)
	require.Equal(t, Error{Op: Write, Off: 7, Len: 100, Cause: "rule: write call #2", Err: syscall.ENOSPC}, *fe)

	require.EqualError(t, f.Flush(), "flush: disk gone: backend: closed (fault injected by rule: flush call #1)")
}

// pattern makes n calls of kind op and returns which failed.
func pattern(f *Backend, op Op, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = call(f, op, int64(i%100)*4096) != nil
	}
	return out
}

func TestRatesReproducible(t *testing.T) {
	for _, op := range allOps {
		t.Run(op.String(), func(t *testing.T) {
			run := func(seed int64, extra []Rule) []bool {
				f := New(mem.New(1<<20), Options{Seed: seed, Rates: map[Op]float64{op: 0.3}, Rules: extra,
					MaxDelay: time.Microsecond})
				return pattern(f, op, 300)
			}
			a, b := run(42, nil), run(42, nil)
			require.Equal(t, a, b, "same seed, same calls, different faults")
			fails := 0
			for _, failed := range a {
				if failed {
					fails++
				}
			}
			require.True(t, fails > 30 && fails < 270, "rate 0.3 failed %d of 300 calls", fails)
			require.NotEqual(t, a, run(43, nil), "another seed gives the same faults")
			// A rule adds its failure and leaves the rate's pattern alone.
			withRule := run(42, []Rule{{Op: op, Nth: 5}})
			a[4] = true
			require.Equal(t, a, withRule)
		})
	}
	t.Run("extremes", func(t *testing.T) {
		f := New(mem.New(1<<20), Options{Rates: map[Op]float64{Read: 1, Write: 0}})
		require.Equal(t, bytes.Repeat([]byte{1}, 50), toBytes(pattern(f, Read, 50)))
		require.Equal(t, make([]byte, 50), toBytes(pattern(f, Write, 50)))
	})
}

func toBytes(bs []bool) []byte {
	out := make([]byte, len(bs))
	for i, b := range bs {
		if b {
			out[i] = 1
		}
	}
	return out
}

func TestSetFailing(t *testing.T) {
	f := New(mem.New(1<<20), Options{TornWrites: true})
	for _, op := range allOps {
		require.NoError(t, call(f, op, 0), op.String())
	}
	data := backendtest.Pattern(2, 4096)
	_, err := f.WriteAt(data, 8192)
	require.NoError(t, err)

	f.SetFailing(true)
	for _, op := range allOps {
		err := call(f, op, 8192)
		require.ErrorIs(t, err, ErrInjected, op.String())
		require.ErrorContains(t, err, "SetFailing", op.String())
	}
	_, err = f.WriteAtFUA(make([]byte, 4096), 8192)
	require.ErrorIs(t, err, ErrInjected)

	f.SetFailing(false)
	got := make([]byte, 4096)
	_, err = f.ReadAt(got, 8192)
	require.NoError(t, err)
	require.Equal(t, data, got, "a dead device changed data")
	require.Equal(t, map[Op]int64{Read: 3, Write: 4, Flush: 2, Trim: 2, Zero: 2}, f.Counts())
	require.Equal(t, map[Op]int64{Read: 1, Write: 2, Flush: 1, Trim: 1, Zero: 1}, f.Faults())
}

func TestAddRule(t *testing.T) {
	f := New(mem.New(1<<20), Options{})
	require.NoError(t, call(f, Write, 0))
	f.AddRule(Rule{Op: Write, Nth: f.Counts()[Write] + 1})
	f.AddRule(Rule{Op: Write, Nth: 1}) // already past: never fires
	require.ErrorIs(t, call(f, Write, 0), ErrInjected)
	require.NoError(t, call(f, Write, 0))
}

// TestTornWrites fails every write and checks that each leaves, at most, a prefix of itself that
// ends on a sector boundary, and that the prefixes vary.
func TestTornWrites(t *testing.T) {
	const size = 1 << 20
	m := mem.New(size)
	f := New(m, Options{Seed: 7, Rates: map[Op]float64{Write: 1}, TornWrites: true})
	old := backendtest.Pattern(3, size)
	cases := []struct {
		off int64
		n   int
	}{
		{0, 512}, {4096, 4096}, {8192, 64 << 10}, {100, 1000}, {511, 2}, {700, 100}, {size - 4096, 4096},
		{1000, 100_000}, {3 * 512, 5 * 512},
	}
	var empty, partial, whole int
	for round := range 20 {
		for _, c := range cases {
			_, err := m.WriteAt(old, 0)
			require.NoError(t, err)
			p := backendtest.Pattern(uint64(100+round), c.n)
			_, err = f.WriteAt(p, c.off)
			require.ErrorIs(t, err, ErrInjected)

			got := make([]byte, size)
			_, err = m.ReadAt(got, 0)
			require.NoError(t, err)
			end := tearEnd(got, p, c.off)
			require.Equal(t, old[:c.off], got[:c.off], "write at %d+%d changed data before it", c.off, c.n)
			require.Equal(t, p[:end-c.off], got[c.off:end])
			require.Equal(t, old[end:], got[end:], "write at %d+%d: data after %d changed", c.off, c.n, end)
			switch end {
			case c.off:
				empty++
			case c.off + int64(c.n):
				whole++
			default:
				partial++
			}
		}
	}
	require.Positive(t, empty)
	require.Positive(t, partial)
	require.Positive(t, whole)
}

// tearEnd returns the last sector boundary in (off, off+len(p)] up to which the device holds p, or
// off if there is none. The caller checks that nothing changed beyond it.
func tearEnd(got, p []byte, off int64) int64 {
	end := off
	for b := (off/SectorSize + 1) * SectorSize; b <= off+int64(len(p)); b += SectorSize {
		if !bytes.Equal(got[off:b], p[:b-off]) {
			break
		}
		end = b
	}
	return end
}

func TestBadOptions(t *testing.T) {
	cases := []struct {
		name string
		opts Options
		want string
	}{
		{"rate above 1", Options{Rates: map[Op]float64{Write: 1.5}}, "write rate 1.5 is not a probability"},
		{"negative rate", Options{Rates: map[Op]float64{Read: -0.1}}, "read rate -0.1"},
		{"NaN rate", Options{Rates: map[Op]float64{Flush: math.NaN()}}, "flush rate NaN"},
		{"unknown op", Options{Rates: map[Op]float64{Op(9): 0.1}}, "unknown operation fault.Op(9)"},
		{"zeroth call", Options{Rules: []Rule{{Op: Trim, Nth: 0}}}, "trim call 0: calls count from 1"},
		{"rule for unknown op", Options{Rules: []Rule{{Op: -1, Nth: 1}}}, "unknown operation fault.Op(-1)"},
		{"negative delay", Options{MaxDelay: -time.Second}, "negative MaxDelay"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				require.NotNil(t, r, "New accepted %+v", c.opts)
				require.Contains(t, fmt.Sprint(r), c.want)
			}()
			New(mem.New(4096), c.opts)
		})
	}
}

// BadSectors: a read failed by a rule marks its sectors bad; later reads that overlap them fail,
// others do not; a write that covers a sector whole clears it, one that covers part does not.
func TestBadSectors(t *testing.T) {
	f := New(mem.New(1<<20), Options{BadSectors: true, Rules: []Rule{{Op: Read, Nth: 1}}})
	read := func(off, n int64) error {
		_, err := f.ReadAt(make([]byte, n), off)
		return err
	}
	require.ErrorIs(t, read(4096, 1024), ErrInjected) // sectors 8 and 9
	for _, r := range []struct {
		off, n int64
		bad    bool
	}{{4096, 512, true}, {4608, 512, true}, {0, 8192, true}, {4000, 100, true}, {5120, 512, false}, {0, 4096, false}} {
		err := read(r.off, r.n)
		if r.bad {
			require.ErrorContains(t, err, "bad sector", "read %d at %d", r.n, r.off)
		} else {
			require.NoError(t, err, "read %d at %d", r.n, r.off)
		}
	}
	_, err := f.WriteAt(make([]byte, 700), 4096) // sector 8 whole, 9 in part
	require.NoError(t, err)
	require.NoError(t, read(4096, 512))
	require.ErrorContains(t, read(4608, 512), "bad sector 9")
	_, err = f.WriteAtFUA(make([]byte, 512), 4608)
	require.NoError(t, err)
	require.NoError(t, read(0, 8192))
}
