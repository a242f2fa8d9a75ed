package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// counting is a mem backend that counts the calls that change it.
type counting struct {
	*mem.Mem
	writes, flushes, trims, zeroes atomic.Int64
	maxWrite                       atomic.Int64
	failWrites                     atomic.Bool
}

func (c *counting) WriteAt(p []byte, off int64) (int, error) {
	if c.failWrites.Load() {
		return 0, errors.New("injected write failure")
	}
	c.writes.Add(1)
	for {
		m := c.maxWrite.Load()
		if int64(len(p)) <= m || c.maxWrite.CompareAndSwap(m, int64(len(p))) {
			break
		}
	}
	return c.Mem.WriteAt(p, off)
}

func (c *counting) Flush() error { c.flushes.Add(1); return c.Mem.Flush() }

func (c *counting) Trim(off, length int64) error { c.trims.Add(1); return c.Mem.Trim(off, length) }

func (c *counting) WriteZeroes(off, length int64, mayUnmap bool) error {
	c.zeroes.Add(1)
	return c.Mem.WriteZeroes(off, length, mayUnmap)
}

func (c *counting) changes() int64 {
	return c.writes.Load() + c.flushes.Load() + c.trims.Load() + c.zeroes.Load()
}

// plain hides everything of a backend but backend.Backend: no trim, no write-zeroes.
type plain struct{ backend.Backend }

// model applies ops to a []byte as a backend would; trims zero the range where the backend can
// trim (mem's trims read back as zeroes) and do nothing where it cannot.
type model struct {
	b       []byte
	canTrim bool
}

func (m *model) apply(o op) {
	switch o.kind {
	case KindWrite:
		copy(m.b[o.off:], o.data)
	case KindZero:
		clear(m.b[o.off : o.off+o.len])
	case KindTrim:
		if m.canTrim {
			clear(m.b[o.off : o.off+o.len])
		}
	}
}

func randomOp(rng *rand.Rand, vol int64) op {
	switch rng.IntN(8) {
	case 0:
		off := rng.Int64N(vol)
		return op{kind: KindTrim, off: off, len: rng.Int64N(vol - off + 1)}
	case 1:
		off := rng.Int64N(vol)
		return op{kind: KindZero, off: off, len: rng.Int64N(min(vol-off, 3<<20) + 1)}
	case 2:
		return op{kind: KindFlush}
	default:
		return writeOp(rng, vol, []int{1, 512, 4096, 40000}[rng.IntN(4)])
	}
}

func bytesOf(t *testing.T, b backend.Backend) []byte {
	t.Helper()
	p := make([]byte, b.Size())
	_, err := b.ReadAt(p, 0)
	require.NoError(t, err)
	return p
}

func TestDrainMatchesAModel(t *testing.T) {
	const vol = 4 << 20
	for _, tc := range []struct {
		name    string
		wrap    func(*counting) backend.Backend
		canTrim bool
	}{
		{"trim and write-zeroes", func(c *counting) backend.Backend { return c }, true},
		{"plain backend", func(c *counting) backend.Backend { return plain{c} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			dev, l := newLog(t, 16<<20, vol)
			base := randBytes(rng, vol)
			nas := &counting{Mem: mem.New(vol)}
			_, err := nas.WriteAt(base, 0)
			require.NoError(t, err)
			nas.writes.Store(0)
			nas.maxWrite.Store(0)
			m := &model{b: bytes.Clone(base), canTrim: tc.canTrim}

			var want DrainStats
			var ops []op
			for range 300 {
				o := randomOp(rng, vol)
				ops = append(ops, o)
				put(t, l, o)
				want.Records++
				switch o.kind {
				case KindWrite:
					want.Writes++
					want.Bytes += o.len
				case KindTrim:
					want.Trims++
				case KindZero:
					want.Zeroes++
				case KindFlush:
					want.Flushes++
				}
			}
			require.NoError(t, l.Sync())
			for _, o := range ops {
				m.apply(o)
			}

			var calls []DrainStats
			st, err := Drain(dev, tc.wrap(nas), func(s DrainStats) { calls = append(calls, s) })
			require.NoError(t, err)
			assert.Equal(t, want, st)
			require.Len(t, calls, len(ops))
			for i, c := range calls {
				assert.Equal(t, int64(i+1), c.Records)
			}
			assert.Equal(t, calls[len(calls)-1], st)
			assert.True(t, bytes.Equal(m.b, bytesOf(t, nas)), "the backend differs from the model")
			assert.Equal(t, want.Flushes+1, nas.flushes.Load(), "a flush per flush record and one at the end")
			if tc.canTrim {
				assert.Equal(t, want.Trims, nas.trims.Load())
				assert.Equal(t, want.Zeroes, nas.zeroes.Load())
			} else {
				assert.Zero(t, nas.trims.Load())
				assert.Zero(t, nas.zeroes.Load())
				assert.LessOrEqual(t, nas.maxWrite.Load(), int64(zeroChunk), "zeroes are written in chunks of at most 1 MiB")
			}

			r, err := Open(dev)
			require.NoError(t, err)
			assert.True(t, r.Drained(), "the superblock says the log was drained")

			// The log is empty now: a second drain changes nothing, the log device included.
			before := nas.changes()
			st, err = Drain(dev, tc.wrap(nas), nil)
			require.NoError(t, err)
			assert.Equal(t, DrainStats{}, st)
			assert.Equal(t, before+1, nas.changes(), "only the final flush")
			assert.Empty(t, readAll(t, dev))
		})
	}
}

// TestDrainFromTheTail: only the records after the last release are applied.
func TestDrainFromTheTail(t *testing.T) {
	const vol = 1 << 20
	dev, l := newLog(t, minDev, vol)
	for i := range 10 {
		tk := put(t, l, op{kind: KindWrite, off: int64(i) * 10, len: 10, data: bytes.Repeat([]byte{1}, 10)})
		if i == 6 {
			require.NoError(t, l.Release(tk.End))
		}
	}
	nas := mem.New(vol)
	st, err := Drain(dev, nas, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(3), st.Records)
	got := bytesOf(t, nas)
	assert.Equal(t, make([]byte, 70), got[:70])
	assert.Equal(t, bytes.Repeat([]byte{1}, 30), got[70:100])
}

func TestDrainRefuses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dev      func(t *testing.T) backend.Backend
		nasSize  int64
		want     string
		wantNoOp bool
	}{
		{"volume size differs", func(t *testing.T) backend.Backend {
			dev, l := newLog(t, minDev, 1<<20)
			put(t, l, op{kind: KindWrite, len: 3, data: []byte{1, 2, 3}})
			put(t, l, op{kind: KindFlush})
			return dev
		}, 2 << 20, "the log is of a volume of 1048576 bytes but the backend is 2097152 bytes", true},
		{"not a log", func(*testing.T) backend.Backend { return mem.New(minDev) }, 1 << 20, "not a tierblk replica log", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &counting{Mem: tc.dev(t).(*mem.Mem)}
			devImage := bytesOf(t, dev)
			nas := &counting{Mem: mem.New(tc.nasSize)}
			st, err := Drain(dev, nas, func(DrainStats) { t.Error("progress called") })
			require.ErrorContains(t, err, tc.want)
			assert.Equal(t, DrainStats{}, st)
			assert.Zero(t, nas.changes(), "nothing written to the backend")
			assert.Zero(t, dev.changes(), "nothing written to the log device")
			assert.Equal(t, devImage, bytesOf(t, dev))
		})
	}
}

// TestDrainFailureLeavesTheLog: a drain cut short by an error leaves the log whole, and the next
// one applies it all.
func TestDrainFailureLeavesTheLog(t *testing.T) {
	const vol = 1 << 20
	dev, l := newLog(t, minDev, vol)
	for i := range 5 {
		put(t, l, op{kind: KindWrite, off: int64(i), len: 1, data: []byte{byte(i + 1)}})
	}
	nas := &counting{Mem: mem.New(vol)}
	nas.failWrites.Store(true)
	_, err := Drain(dev, nas, nil)
	require.ErrorContains(t, err, "record seq 1 (write 0+1)")
	nas.failWrites.Store(false)
	st, err := Drain(dev, nas, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(5), st.Records)
	assert.Equal(t, []byte{1, 2, 3, 4, 5}, bytesOf(t, nas)[:5])
}

// crashDev is a log device with a volatile cache: writes since the last flush are pending, and a
// crash keeps any of them, in part or whole, in any order.
type crashDev struct {
	mu       sync.Mutex
	durable  *mem.Mem
	pending  []pendingWrite
	failNext bool // the next flush fails, leaving its writes pending
}

type pendingWrite struct {
	off  int64
	data []byte
}

func newCrashDev(size int64) *crashDev { return &crashDev{durable: mem.New(size)} }

func (d *crashDev) Size() int64  { return d.durable.Size() }
func (d *crashDev) Close() error { return nil }

func (d *crashDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.durable.ReadAt(p, off); err != nil {
		return 0, err
	}
	for _, w := range d.pending {
		lo, hi := max(off, w.off), min(off+int64(len(p)), w.off+int64(len(w.data)))
		if lo < hi {
			copy(p[lo-off:hi-off], w.data[lo-w.off:])
		}
	}
	return len(p), nil
}

func (d *crashDev) WriteAt(p []byte, off int64) (int, error) {
	if err := backend.CheckRange(off, int64(len(p)), d.Size()); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending = append(d.pending, pendingWrite{off, bytes.Clone(p)})
	return len(p), nil
}

func (d *crashDev) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failNext {
		d.failNext = false
		return errors.New("injected flush failure")
	}
	for _, w := range d.pending {
		_, _ = d.durable.WriteAt(w.data, w.off)
	}
	d.pending = nil
	return nil
}

// crash returns what survives: the durable image with each pending write dropped, kept, or kept
// in part (a prefix of whole sectors, as a disk tears a write), in a random order.
func (d *crashDev) crash(rng *rand.Rand) *mem.Mem {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, i := range rng.Perm(len(d.pending)) {
		w := d.pending[i]
		switch rng.IntN(3) {
		case 0:
		case 1:
			_, _ = d.durable.WriteAt(w.data, w.off)
		case 2:
			n := rng.IntN(len(w.data)/sector+1) * sector
			_, _ = d.durable.WriteAt(w.data[:n], w.off)
		}
	}
	d.pending = nil
	return d.durable
}

// TestCrashProperty plays a primary: random ops logged, syncs, write-backs with releases, and
// write-backs forced by a full log; then a crash at a random point, with a random part of the
// unsynced writes lost, perhaps in the middle of a release. Draining what survived onto the
// backend must give the state after some prefix of the ops that holds every op up to the last
// sync, applied exactly in order.
func TestCrashProperty(t *testing.T) {
	const (
		vol    = 64 << 10
		rounds = 100
	)
	for round := range rounds {
		seed := uint64(0x5eed0000 + round)
		runCrash(t, seed, vol)
		if t.Failed() {
			return
		}
	}
}

func runCrash(t *testing.T, seed uint64, vol int64) {
	rng := rand.New(rand.NewPCG(seed, 0))
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: %s", seed, fmt.Sprintf(format, args...))
	}
	dev := newCrashDev(minDev)
	l, err := Create(dev, vol)
	if err != nil {
		fail("create: %v", err)
	}
	base := randBytes(rng, int(vol))
	nas := mem.New(vol)
	_, _ = nas.WriteAt(base, 0)
	state := func(k int, ops []op) []byte {
		m := &model{b: bytes.Clone(base), canTrim: true}
		for _, o := range ops[:k] {
			m.apply(o)
		}
		return m.b
	}

	var (
		ops        []op
		tickets    []Ticket
		released   int // ops[:released] are written back to nas and released
		lastSynced int // ops[:lastSynced] were durable in the log before the crash
	)
	// writeBack plays the cache writing back ops[released:r] and releasing them. The cache writes
	// back only what it acknowledged, and it acknowledges only what the log holds durably.
	writeBack := func(r int) error {
		if r <= released {
			return nil
		}
		if r > lastSynced {
			if err := l.Sync(); err != nil {
				return err
			}
			lastSynced = len(ops)
		}
		for _, o := range ops[released:r] {
			if err := apply(nas, &Record{Kind: o.kind, Off: o.off, Len: o.len, Data: o.data}, new([]byte)); err != nil {
				fail("write back: %v", err)
			}
		}
		if err := l.Release(tickets[r-1].End); err != nil {
			return err
		}
		released = r
		return nil
	}
	l.SetOnFull(func() {
		if err := writeBack(len(ops)); err != nil {
			fail("write back on full: %v", err)
		}
	})

	n := rng.IntN(400)
	for range n {
		o := randomOp(rng, vol)
		if o.kind == KindZero || o.kind == KindTrim {
			o.len = min(o.len, vol-o.off)
		}
		tk, err := l.Reserve(context.Background(), o.kind, o.off, o.len, len(o.data))
		if err != nil {
			fail("reserve: %v", err)
		}
		if err := l.Write(tk, o.data); err != nil {
			fail("write: %v", err)
		}
		ops = append(ops, o)
		tickets = append(tickets, tk)
		switch rng.IntN(10) {
		case 0, 1:
			if err := l.Sync(); err != nil {
				fail("sync: %v", err)
			}
			lastSynced = len(ops)
		case 2:
			if err := writeBack(released + rng.IntN(len(ops)-released+1)); err != nil {
				fail("write back: %v", err)
			}
		}
	}

	// Perhaps crash in the middle of a release: its superblock written but not flushed.
	midRelease := len(ops) > released && rng.IntN(4) == 0
	oldReleased := released
	if midRelease {
		r := released + 1 + rng.IntN(len(ops)-released)
		if r > lastSynced {
			if err := l.Sync(); err != nil {
				fail("sync: %v", err)
			}
			lastSynced = len(ops)
		}
		dev.mu.Lock()
		dev.failNext = true
		dev.mu.Unlock()
		if err := writeBack(r); err == nil {
			fail("release with a failing flush succeeded")
		}
		// The cache wrote ops[:r] back before it released them; the release may or may not
		// have reached the device.
		released = r
	}

	image := dev.crash(rng)
	r, err := Open(image)
	if err != nil {
		fail("open after crash: %v", err)
	}
	tail := int(r.Tail().Seq - 1)
	if tail != released && !(midRelease && tail == oldReleased) {
		fail("tail at op %d, want %d (or %d)", tail, released, oldReleased)
	}
	st, err := Drain(image, nas, nil)
	if err != nil {
		fail("drain: %v", err)
	}
	k := tail + int(st.Records)
	if k < lastSynced || k > len(ops) {
		fail("drain applied up to op %d; synced %d, logged %d", k, lastSynced, len(ops))
	}
	if !bytes.Equal(bytesOf(t, nas), state(k, ops)) {
		fail("after draining to op %d (tail %d, synced %d, logged %d) the backend is not the state after op %d",
			k, tail, lastSynced, len(ops), k)
	}
	// And the log is empty for a second drain.
	st, err = Drain(image, nas, nil)
	if err != nil || st.Records != 0 {
		fail("second drain: %+v, %v", st, err)
	}
}
