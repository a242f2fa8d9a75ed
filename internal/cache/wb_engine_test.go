package cache

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// The tests here check the write-back engine's own promises: the destager never marks a line clean
// with old data, writes wait (never fail) while the backend is down and dirty data is at its
// maximum, dirty lines never pass the maximum, and dirty data outlives a clean stop.

// waitFor polls cond until it holds, failing the test after a generous limit: the limit only stops
// a hung test, it asserts no speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// checkBackend compares the backend's raw content with want, naming the first sector that differs.
func checkBackend(t *testing.T, back *crashDev, want []byte) {
	t.Helper()
	raw := make([]byte, len(want))
	back.ReadAt(raw, 0)
	if bytes.Equal(raw, want) {
		return
	}
	got, exp := stamps(raw, 0), stamps(want, 0)
	for s := range got {
		if got[s] != exp[s] {
			t.Fatalf("the backend's sector %d holds write %d, want %d", s, got[s], exp[s])
		}
	}
	t.Fatal("the backend differs from what it should hold")
}

// TestDestageRace has writers hammer a few lines (whole and partial blocks) while FlushAll runs in
// a loop and the background destager runs too: a line being destaged that receives a new write
// must never be marked clean with old data, so after a last FlushAll the backend equals the model.
func TestDestageRace(t *testing.T) {
	const (
		line    = 16 << 10
		devSize = 4 * line // the writers' lines, all held by the tier
		writers = 4
	)
	seed := testSeed(t)
	ops := 400
	if testing.Short() {
		ops = 150
	}
	back := newCrashDev(devSize)
	b := fault.New(back, fault.Options{Seed: int64(seed), MaxDelay: 50 * time.Microsecond})
	c := newCache(t, b, layout{line: line, ram: 2, ssd: 8, mode: WriteBack}, nil, nil)
	defer c.Close()

	model := make([]byte, devSize)
	stop := make(chan struct{})
	flushErr := make(chan error, 1)
	go func() {
		defer close(flushErr)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := c.FlushAll(context.Background(), nil); err != nil {
				flushErr <- err
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range writers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for k := range ops {
				// The model knows each sector's last write; every line is shared by all writers.
				first, n := ownedSectors(rng, devSize, writers, w)
				buf := make([]byte, n*sector)
				off := int64(first) * sector
				if rng.IntN(4) == 0 {
					if _, err := c.ReadAt(buf, off); err != nil {
						t.Errorf("writer %d: read: %v", w, err)
						return
					}
					if !bytes.Equal(buf, model[off:off+int64(len(buf))]) {
						t.Errorf("seed %d: writer %d: read of sectors [%d,%d) returned %v, not its last writes",
							seed, w, first, first+n, stamps(buf, first))
						return
					}
					continue
				}
				stamp(buf, first, int64(w+1)<<32|int64(k+1))
				if _, err := c.WriteAt(buf, off); err != nil {
					t.Errorf("writer %d: write: %v", w, err)
					return
				}
				copy(model[off:], buf) // only this writer touches these bytes
			}
		})
	}
	wg.Wait()
	close(stop)
	if err := <-flushErr; err != nil {
		t.Fatalf("FlushAll while writing: %v", err)
	}
	if t.Failed() {
		return
	}
	if err := c.FlushAll(context.Background(), nil); err != nil {
		t.Fatalf("final FlushAll: %v", err)
	}
	if d := c.Stats().Dirty; d.Lines != 0 || d.DestagedBytes == 0 {
		t.Fatalf("after FlushAll: %+v; want no dirty line, and bytes destaged", d)
	}
	checkBackend(t, back, model)
}

// TestBackendOutage fails the backend: write-back writes are absorbed until dirty lines reach the
// maximum, then a write waits (it must not complete, nor fail, while the backend is down) and the
// destager retries. Once the backend is back the write completes and FlushAll writes everything.
func TestBackendOutage(t *testing.T) {
	const (
		line = 4 << 10
		ssd  = 8
	)
	l := layout{line: line, ssd: ssd, mode: WriteBack}
	maxLines := int(DefaultWriteBack.Max * ssd)
	devSize := int64(4*ssd) * line
	back := newCrashDev(devSize)
	b := fault.New(back, fault.Options{Seed: 1})
	c := newCache(t, b, l, nil, nil)
	defer c.Close()
	b.SetFailing(true)

	model := make([]byte, devSize)
	write := func(ln int) error {
		buf := make([]byte, line)
		first := ln * line / sector
		stamp(buf, first, int64(ln+1))
		_, err := c.WriteAt(buf, int64(ln)*line)
		if err == nil {
			copy(model[int64(ln)*line:], buf)
		}
		return err
	}
	for ln := range maxLines {
		if err := write(ln); err != nil {
			t.Fatalf("write-back write to line %d with the backend down and %d of %d lines dirty: %v",
				ln, ln, maxLines, err)
		}
	}
	if d := c.Stats().Dirty; int(d.Lines) != maxLines {
		t.Fatalf("dirty lines %d, want %d: %+v", d.Lines, maxLines, d)
	}
	// Nothing of the client's went to the backend: a FLUSH needs only the SSD tier, so it works
	// while the backend is down (a database's fsync must not fail because the NAS is rebooting).
	if err := c.Flush(); err != nil {
		t.Fatalf("FLUSH with the backend down and every write on the SSD tier: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- write(maxLines) }()
	// The write needs room, the destager tries to make it and fails: wait for two failures (with
	// backoff between them), then the write must still be waiting.
	errs0 := c.Stats().Dirty.DestageErrors
	waitFor(t, "destage retries", func() bool { return c.Stats().Dirty.DestageErrors >= errs0+2 })
	select {
	case err := <-done:
		t.Fatalf("a write past the dirty maximum completed while the backend was down (err %v): %+v", err, c.Stats().Dirty)
	default:
	}
	if d := c.Stats().Dirty; int(d.Lines) > maxLines {
		t.Fatalf("dirty lines %d passed the maximum %d", d.Lines, maxLines)
	}
	b.SetFailing(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiting write failed once the backend came back: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting write never completed after the backend came back")
	}
	if err := c.FlushAll(context.Background(), nil); err != nil {
		t.Fatalf("FlushAll after the outage: %v", err)
	}
	checkBackend(t, back, model)
	got := make([]byte, devSize)
	if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("the cache does not serve what was written (err %v)", err)
	}
}

// TestDirtyNeverPastMax has many writers dirty more lines than the SSD tier holds while a sampler
// watches the dirty line count: it must never pass floor(Max * slots).
func TestDirtyNeverPastMax(t *testing.T) {
	const (
		line    = 4 << 10
		ssd     = 16
		devSize = 64 * line
		writers = 6
	)
	seed := testSeed(t)
	ops := 300
	if testing.Short() {
		ops = 100
	}
	c := newCache(t, newCrashDev(devSize), layout{line: line, ram: 2, ssd: ssd, mode: WriteBack}, nil, nil)
	defer c.Close()
	limit := uint64(math.Floor(c.Stats().Dirty.Max * ssd))
	var worst atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := c.Stats().Dirty.Lines; n > worst.Load() {
				worst.Store(n)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range writers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for k := range ops {
				// Up to two lines per write, anywhere on the device.
				n := 1 + rng.IntN(2*line/sector)
				first := rng.IntN(devSize/sector - n)
				buf := make([]byte, n*sector)
				stamp(buf, first, int64(w+1)<<32|int64(k+1))
				if _, err := c.WriteAt(buf, int64(first)*sector); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	if worst.Load() > limit {
		t.Fatalf("seed %d: dirty lines reached %d; the maximum is %d", seed, worst.Load(), limit)
	}
	if worst.Load() == 0 {
		t.Fatal("the sampler never saw a dirty line: the test tests nothing")
	}
}

// TestRestartWithDirtyData stops a write-back cache cleanly (as on SIGTERM) with dirty data on the
// SSD: restarted in write-back it still serves that data and still holds it dirty; restarted in
// write-through it writes it back by itself, with no request.
func TestRestartWithDirtyData(t *testing.T) {
	const (
		line  = 8 << 10
		ssd   = 16
		dirty = 4 // lines, below the high watermark: no destage before the stop
	)
	devSize := int64(32 * line)
	back, ssdDev, store := newCrashDev(devSize), newCrashDev(ssd*line), meta.NewMem()
	// Each start gets the same devices and store through a new gate (Close leaves them for the
	// next start) and a backend that can be cut: while the data must stay dirty the backend is
	// down, so that no idle destage writes it back behind the test's back.
	start := func(mode Mode) (*Cache, *fault.Backend) {
		g := &gate{}
		b := fault.New(gatedDev{g, back}, fault.Options{Seed: 1})
		b.SetFailing(mode == WriteBack)
		return newCache(t, b, layout{line: line, ram: 2, ssd: ssd, mode: mode},
			gatedStore{g, store}, gatedDev{g, ssdDev}), b
	}
	c, b := start(WriteBack)
	want := make([]byte, devSize)
	for i := range dirty {
		off := int64(3*i+1) * line
		buf := want[off : off+line]
		stamp(buf, int(off/sector), int64(i+1))
		if _, err := c.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if d := c.Stats().Dirty; d.Lines != dirty {
		t.Fatalf("before the stop: %d dirty lines, want %d", d.Lines, dirty)
	}
	// Close checkpoints the index with the dirty lines, which flushes the backend: up for that.
	b.SetFailing(false)
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	c, b = start(WriteBack)
	if d := c.Stats().Dirty; d.Lines != dirty {
		t.Fatalf("restarted in write-back: %d dirty lines, want %d", d.Lines, dirty)
	}
	for i := range dirty { // only the dirty lines: the rest would need the backend
		off := int64(3*i+1) * line
		got := make([]byte, line)
		if _, err := c.ReadAt(got, off); err != nil || !bytes.Equal(got, want[off:off+line]) {
			t.Fatalf("restarted in write-back, the cache does not serve the dirty line at %d (err %v)", off, err)
		}
	}
	if d := c.Stats().Dirty; d.Lines != dirty {
		t.Fatalf("restarted in write-back, after a read: %d dirty lines, want %d", d.Lines, dirty)
	}
	b.SetFailing(false)
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	c, _ = start(WriteThrough)
	defer c.Close()
	waitFor(t, "the write-through restart to write the dirty data back", func() bool { return c.Stats().Dirty.Lines == 0 })
	checkBackend(t, back, want)
}

// TestBurstPastTheSSDTierStaysOnIt writes twice as much as the SSD tier holds, twice, with the
// tier full of clean lines in between (after FlushAll): a line that finds no free slot waits for
// the checkpoint that frees evicted ones rather than going to the backend itself. Every backend
// write is then the destager's, coalesced, never a foreground write around the cache.
func TestBurstPastTheSSDTierStaysOnIt(t *testing.T) {
	const (
		line  = 4 << 10
		ssd   = 16
		lines = 2 * ssd
	)
	back := newCrashDev(lines * line)
	c := newCache(t, back, layout{line: line, ssd: ssd, mode: WriteBack}, nil, nil)
	defer c.Close()
	want := make([]byte, lines*line)
	for pass := range 2 {
		before := c.Stats()
		for l := range lines {
			p := want[l*line : (l+1)*line]
			stamp(p, l*line/sector, int64(pass+1))
			if _, err := c.WriteAt(p, int64(l*line)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.FlushAll(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		after := c.Stats()
		writes := after.Backend.Writes - before.Backend.Writes
		destaged := after.Dirty.DestageWrites - before.Dirty.DestageWrites
		if writes != destaged {
			t.Fatalf("pass %d: %d backend writes, of which only %d by the destager: the rest went around the SSD tier", pass, writes, destaged)
		}
		if destaged == 0 {
			t.Fatalf("pass %d: nothing destaged: the test tests nothing", pass)
		}
	}
	checkBackend(t, back, want)
}

// TestDestageBoundedAcrossCallers: the writes back of two callers at once (two writes over dirty
// lines that destage what they touch, or such a write and the destager) share destageBudget, not
// each their own: the destager's buffers stay within MemoryPlan's share. The first caller's run
// of maxDestageWrite takes all of it, and the backend holds that write until the other caller
// waits for its turn.
func TestDestageBoundedAcrossCallers(t *testing.T) {
	const (
		line  = 64 << 10
		first = maxDestageWrite / line // lines 0 to first-1: one run of maxDestageWrite
		other = 300                    // farther than the destager's window
	)
	back := &writeRecorder{crashDev: newCrashDev(512 * line), gate: make(chan struct{})}
	c := newCache(t, back, layout{line: line, ssd: 512, mode: WriteBack}, nil, nil)
	defer c.Close()
	var open sync.Once
	release := func() { open.Do(func() { close(back.gate) }) }
	defer release() // before Close, should the test fail with writes held
	want := make([]byte, 512*line)
	calls := [][]uint64{{}, {other}}
	for l := range uint64(first) {
		calls[0] = append(calls[0], l)
	}
	for _, l := range append(slices.Clone(calls[0]), other) {
		p := want[l*line : (l+1)*line]
		stamp(p, int(l)*line/sector, 1)
		if _, err := c.WriteAt(p, int64(l*line)); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, len(calls))
	for _, lines := range calls {
		go func() {
			lo, hi := lines[0], lines[len(lines)-1]
			c.locks.Lock(lo, hi)
			defer c.locks.Unlock(lo, hi)
			_, err := c.destageLocked(lines)
			errs <- err
		}()
	}
	waitFor(t, "a write back held by the backend and another caller waiting for its turn", func() bool {
		back.mu.Lock()
		n, b := back.inFlight, back.bytesInFlight
		back.mu.Unlock()
		if b > destageBytesInFlight {
			t.Fatalf("%d bytes of backend writes under way at once, want at most %d", b, destageBytesInFlight)
		}
		return n == 1 && waitingForDestageBudget()
	})
	release()
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	back.mu.Lock()
	most := back.mostBytes
	back.mu.Unlock()
	if most > destageBytesInFlight {
		t.Fatalf("%d bytes of backend writes under way at once, want at most %d", most, destageBytesInFlight)
	}
	checkBackend(t, back.crashDev, want)
}

// TestDestageSmallRunsTogether: the scattered dirty blocks of random writes make many small runs;
// one destage sends them together, as many as destageWritesInFlight, not one after another. The
// backend holds every write until that many are under way.
func TestDestageSmallRunsTogether(t *testing.T) {
	const line = 64 << 10
	back := &writeRecorder{crashDev: newCrashDev(512 * line), gate: make(chan struct{})}
	c := newCache(t, back, layout{line: line, ssd: 512, mode: WriteBack}, nil, nil)
	defer c.Close()
	var open sync.Once
	release := func() { open.Do(func() { close(back.gate) }) }
	defer release()
	want := make([]byte, 512*line)
	var lines []uint64
	// One block every other line: no two adjacent, so each is a run of its own.
	for i := range uint64(2 * destageWritesInFlight) {
		l := 2 * i
		lines = append(lines, l)
		p := want[l*line : l*line+blockSize]
		stamp(p, int(l)*line/sector, 1)
		if _, err := c.WriteAt(p, int64(l*line)); err != nil {
			t.Fatal(err)
		}
	}
	errc := make(chan error, 1)
	go func() {
		c.locks.Lock(lines[0], lines[len(lines)-1])
		defer c.locks.Unlock(lines[0], lines[len(lines)-1])
		_, err := c.destageLocked(lines)
		errc <- err
	}()
	waitFor(t, fmt.Sprintf("%d backend writes under way together", destageWritesInFlight), func() bool {
		back.mu.Lock()
		n := back.inFlight
		back.mu.Unlock()
		if n > destageWritesInFlight {
			t.Fatalf("%d backend writes under way at once, want at most %d", n, destageWritesInFlight)
		}
		return n == destageWritesInFlight
	})
	release()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	back.mu.Lock()
	writes, most := len(back.sizes), back.most
	back.mu.Unlock()
	if writes != len(lines) || most != destageWritesInFlight {
		t.Fatalf("%d backend writes, at most %d at once; want %d, %d at once", writes, most, len(lines), destageWritesInFlight)
	}
	checkBackend(t, back.crashDev, want)
}

// waitingForDestageBudget reports whether a goroutine waits in writeRuns for its share of the
// destage budget.
func waitingForDestageBudget() bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "(*Weighted).Acquire(") && strings.Contains(g, "(*Cache).writeRuns(") {
			return true
		}
	}
	return false
}

// writeRecorder is a backend that records the size of every write and how many were under way at
// once; each write takes a little while, so that writes sent together overlap, or, with gate,
// waits until gate is closed.
type writeRecorder struct {
	*crashDev
	gate                     chan struct{}
	mu                       sync.Mutex
	sizes                    []int
	inFlight, most           int
	bytesInFlight, mostBytes int
}

func (w *writeRecorder) WriteAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	w.sizes = append(w.sizes, len(p))
	w.inFlight++
	w.bytesInFlight += len(p)
	w.most = max(w.most, w.inFlight)
	w.mostBytes = max(w.mostBytes, w.bytesInFlight)
	w.mu.Unlock()
	if w.gate != nil {
		<-w.gate
	} else {
		time.Sleep(5 * time.Millisecond)
	}
	defer func() {
		w.mu.Lock()
		w.inFlight--
		w.bytesInFlight -= len(p)
		w.mu.Unlock()
	}()
	return w.crashDev.WriteAt(p, off)
}

// TestUrgentDestageWritesLargeWithinBound writes a sequential stretch in write-back and drains it
// with FlushAll: the destager writes it back in writes of maxDestageWrite, never more than
// destageBytesInFlight under way at once (their buffers are MemoryPlan's destage share), and the
// backend then holds it all.
func TestUrgentDestageWritesLargeWithinBound(t *testing.T) {
	const (
		line    = 64 << 10
		ssd     = 512
		written = 3 * maxDestageWrite / line
	)
	back := &writeRecorder{crashDev: newCrashDev(ssd * line)}
	c := newCache(t, back, layout{line: line, ssd: ssd, mode: WriteBack}, nil, nil)
	defer c.Close()
	want := make([]byte, ssd*line)
	for l := range written {
		p := want[l*line : (l+1)*line]
		stamp(p, l*line/sector, 1)
		if _, err := c.WriteAt(p, int64(l*line)); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Stats().Dirty.DestagedBytes; n != 0 {
		t.Fatalf("the destager wrote back %d bytes before FlushAll: the test would not see how FlushAll writes", n)
	}
	if err := c.FlushAll(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	back.mu.Lock()
	sizes, most := back.sizes, back.mostBytes
	back.mu.Unlock()
	if want := []int{maxDestageWrite, maxDestageWrite, maxDestageWrite}; !slices.Equal(sizes, want) {
		t.Fatalf("backend writes of %v bytes, want %v", sizes, want)
	}
	if most < 1 || most > destageBytesInFlight {
		t.Fatalf("%d bytes of backend writes under way at once, want 1 to %d", most, destageBytesInFlight)
	}
	checkBackend(t, back.crashDev, want)
}

// hangingDev is a backend whose writes and flushes, once hung, wait until it is closed, as an NBD
// disk's requests wait for a server that went away.
type hangingDev struct {
	*crashDev
	hung    atomic.Bool
	waiting atomic.Int32
	closed  chan struct{}
}

var errHungClosed = fmt.Errorf("hanging backend: closed while a call waited")

func (h *hangingDev) wait() error {
	if !h.hung.Load() {
		return nil
	}
	h.waiting.Add(1)
	<-h.closed
	return errHungClosed
}

func (h *hangingDev) WriteAt(p []byte, off int64) (int, error) {
	if err := h.wait(); err != nil {
		return 0, err
	}
	return h.crashDev.WriteAt(p, off)
}

func (h *hangingDev) Flush() error {
	if err := h.wait(); err != nil {
		return err
	}
	return h.crashDev.Flush()
}

func (h *hangingDev) Close() error {
	close(h.closed)
	return nil
}

// TestCloseWhileTheBackendHangs stops a write-back cache while the destager waits for a backend
// that does not answer: Close gives up on it after its grace (shortened here), closes the backend under it, and
// the dirty data is still there at the next start.
func TestCloseWhileTheBackendHangs(t *testing.T) {
	const (
		line  = 8 << 10
		ssd   = 16
		dirty = 4
	)
	devSize := int64(32 * line)
	back, ssdDev, store := newCrashDev(devSize), newCrashDev(ssd*line), meta.NewMem()
	hang := &hangingDev{crashDev: back, closed: make(chan struct{})}
	// Close leaves the SSD and the store, behind an open gate, for the next start.
	g := &gate{}
	c := newCache(t, hang, layout{line: line, ssd: ssd, mode: WriteBack}, gatedStore{g, store}, gatedDev{g, ssdDev})
	want := make([]byte, devSize)
	for i := range dirty {
		off := int64(3*i+1) * line
		stamp(want[off:off+line], int(off/sector), int64(i+1))
		if _, err := c.WriteAt(want[off:off+line], off); err != nil {
			t.Fatal(err)
		}
	}
	c.bg.grace = 50 * time.Millisecond
	hang.hung.Store(true)
	// Idle for a second, the destager writes the dirty lines back, and waits on the backend.
	waitFor(t, "the destager to wait on the hung backend", func() bool { return hang.waiting.Load() > 0 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close still waits for the hung backend")
	}

	c = newCache(t, back, layout{line: line, ssd: ssd, mode: WriteBack}, gatedStore{g, store}, gatedDev{g, ssdDev})
	defer c.Close()
	if d := c.Stats().Dirty; d.Lines != dirty {
		t.Fatalf("restarted: %d dirty lines, want %d", d.Lines, dirty)
	}
	if err := c.FlushAll(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	checkBackend(t, back, want)
}

// TestDoomedLineDoesNotStopAdmission: when the eviction policy picks a dirty line, the line is
// doomed and keeps its slot until it is written back. Below the high watermark, with clients busy,
// nothing else would write it back, and once doomed lines hold more slots than the tier keeps in
// reserve, the SSD tier (its slots full, its policy short of lines to evict) would admit no new
// line at all. The destager writes doomed lines back first.
func TestDoomedLineDoesNotStopAdmission(t *testing.T) {
	const (
		line  = 4 << 10
		ssd   = 16
		lines = 4 * ssd
	)
	c := newCache(t, newCrashDev(lines*line), layout{line: line, ssd: ssd, mode: WriteBack, policy: "lru"}, nil, nil)
	defer c.Close()
	p := make([]byte, line)
	// Lines 0 to 6 dirty, the least recently used: below the high watermark (half the tier).
	const dirty = ssd/2 - 1
	for l := range dirty {
		if _, err := c.WriteAt(p, int64(l*line)); err != nil {
			t.Fatal(err)
		}
	}
	read := func(l int) {
		if _, err := c.ReadAt(p, int64(l*line)); err != nil {
			t.Fatal(err)
		}
	}
	cached := func(l int) bool {
		c.ssd.mu.Lock()
		defer c.ssd.mu.Unlock()
		_, ok := c.ssd.slotOf(uint64(l))
		return ok
	}
	// Clients stay busy (the destager's idle rule never applies) and dirty data stays far below
	// the high watermark, for longer than the destager's tick and a checkpoint take.
	deadline := time.Now().Add(2 * time.Second)
	for l := dirty; time.Now().Before(deadline); l = dirty + (l+1-dirty)%(lines-dirty) {
		read(l)
		if l == lines-1 && cached(lines-1) {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	if !cached(lines - 1) {
		t.Fatalf("line %d, read again and again, never got into the SSD tier: admission stopped behind doomed lines %v",
			lines-1, c.ssd.doomedLines(ssd))
	}
	if got := c.Stats().Dirty.DestagedBytes; got == 0 {
		t.Fatal("the doomed lines were not written back")
	}
}

// TestDestageRateAndThrottleDelayInStats: above the high watermark a write is delayed, and the
// stats say by how much now; once the backend takes the dirty data, they say how fast it went.
func TestDestageRateAndThrottleDelayInStats(t *testing.T) {
	c, b := throttledCache(t)
	if d := c.Stats().Dirty; d.ThrottleDelay <= 0 || d.DestageRate != 0 {
		t.Fatalf("dirty ratio %.2f: throttle delay %gs (want > 0), destage rate %g B/s (want 0)", d.Ratio, d.ThrottleDelay, d.DestageRate)
	}
	b.SetFailing(false)
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Dirty.DestagedBytes == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if d := c.Stats().Dirty; d.DestagedBytes == 0 || d.DestageRate <= 0 {
		t.Fatalf("%d bytes destaged, at %g B/s: want both > 0", d.DestagedBytes, d.DestageRate)
	}
}

// TestOneInvalidationPerLineAndCheckpoint checks that overwriting clean blocks costs one metadata
// commit per line between two checkpoints, not one per write: the first write to a clean block
// commits the line's record without any of its clean blocks. What was written still reads back
// after a restart, dirty, and the clean rest comes from the backend. (Address order: FLUSH order
// writes each epoch back as soon as a FLUSH ends it, and the lines would not stay dirty.)
func TestOneInvalidationPerLineAndCheckpoint(t *testing.T) {
	const line = 64 << 10
	back, ssdDev, stored := newCrashDev(16*line), newCrashDev(8*line), meta.NewMem()
	want := backendtest.Pattern(1, 16*line)
	if _, err := back.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	l := layout{line: line, ram: 2, ssd: 8, mode: WriteBack, order: OrderAddress}
	// Each start gets the same devices and store through a new gate (Close leaves them).
	start := func(store meta.Store) *Cache {
		g := &gate{}
		return newCache(t, gatedDev{g, back}, l, gatedStore{g, store}, gatedDev{g, ssdDev})
	}
	store := &failStore{Store: stored}
	c := start(store)
	buf := make([]byte, 2*line)
	for range 2 { // admitted by the first read at the latest
		if _, err := c.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(); err != nil { // a checkpoint stores both lines clean
		t.Fatal(err)
	}
	for _, ln := range []uint64{0, 1} {
		if v, d := c.ssd.bits(ln); v != linebits.Range(0, c.ssd.blocks) || !d.IsZero() {
			t.Fatalf("line %d before the writes: valid %v dirty %v, want all clean", ln, v, d)
		}
	}
	calls := func() int {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.calls
	}
	write := func(off int64, seed uint64) {
		t.Helper()
		p := backendtest.Pattern(seed, 4096)
		if _, err := c.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], p)
	}
	// Holding checkpointMu keeps the background checkpoint out: every commit counted is an
	// invalidation.
	for _, step := range []struct {
		off     int64
		commits int
	}{
		{0, 1},           // line 0's first clean block: its record goes without its clean blocks
		{8 << 10, 0},     // another clean block of line 0: the store claims none of them
		{line + 4096, 1}, // line 1's first
		{line + 16<<10, 0},
	} {
		c.ssd.j.checkpointMu.Lock()
		n := calls()
		write(step.off, uint64(step.off)+2)
		got := calls() - n
		c.ssd.j.checkpointMu.Unlock()
		if got != step.commits {
			t.Fatalf("write at %d: %d metadata commits, want %d", step.off, got, step.commits)
		}
	}
	// A checkpoint stores line 0 whole again: its next clean block costs a commit again.
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	c.ssd.j.checkpointMu.Lock()
	n := calls()
	write(24<<10, 9)
	got := calls() - n
	c.ssd.j.checkpointMu.Unlock()
	if got != 1 {
		t.Fatalf("first write to a clean block after a checkpoint: %d metadata commits, want 1", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c = start(stored)
	defer c.Close()
	if d := c.Stats().Dirty; d.Lines != 2 {
		t.Fatalf("after the restart: %d dirty lines, want 2", d.Lines)
	}
	if _, err := c.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want[:2*line]) {
		t.Fatal("after the restart, the two lines do not read back as written")
	}
}

// A write-back write that rewrites dirty blocks allocates nothing: at tens of thousands of
// requests a second, garbage costs the collector's time and the server's CPU.
func TestRewriteOfDirtyDataAllocatesNothing(t *testing.T) {
	const line = 64 << 10
	c := newCache(t, mem.New(16*line), layout{line: line, ram: 2, ssd: 8, mode: WriteBack}, nil, nil)
	defer c.Close()
	p := backendtest.Pattern(3, 2*line)
	write := func() {
		if _, err := c.WriteAt(p[:line], 0); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteAt(p[line:], line/2); err != nil { // across two lines
			t.Fatal(err)
		}
	}
	write() // dirties the lines: their first writes commit metadata
	if n := testing.AllocsPerRun(100, write); n != 0 {
		t.Fatalf("%.1f allocations a rewrite, want none", n)
	}
}

// TestWriteBackConfigZeros: a configuration that gives no watermark takes the defaults; one that
// gives any takes its zeros as given: low 0 is valid (destage until nothing is dirty), max 0 is
// refused, never replaced.
func TestWriteBackConfigZeros(t *testing.T) {
	d := DefaultWriteBack
	for _, tc := range []struct {
		in, want WriteBackConfig
		err      string
	}{
		{in: WriteBackConfig{}, want: d},
		{in: WriteBackConfig{High: 0.5, Max: 0.9}, want: WriteBackConfig{High: 0.5, Max: 0.9, Destage: d.Destage, Throttle: d.Throttle, Order: d.Order}},
		{in: WriteBackConfig{Order: OrderFlush}, want: WriteBackConfig{High: d.High, Low: d.Low, Max: d.Max, Destage: d.Destage, Throttle: d.Throttle, Order: OrderFlush}},
		{in: WriteBackConfig{High: 0.5, Low: 0.1}, err: "need 0 <= low < high <= max <= 1"},
		{in: WriteBackConfig{Order: "fifo"}, err: `write-back order "fifo": need "address" or "flush"`},
	} {
		w := tc.in
		w.fill()
		err := w.validate()
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%+v", tc.in)
			continue
		}
		require.NoError(t, err, "%+v", tc.in)
		require.Equal(t, tc.want, w)
	}
}

// TestSetModeWaitsForThrottledWrites: a write-back write that was throttled when the mode switched
// away from write-back takes the new mode's way: once SetMode has returned, no dirty data is left,
// even after the write.
func TestSetModeWaitsForThrottledWrites(t *testing.T) {
	c, b := throttledCache(t)
	b.SetFailing(false)
	p := make([]byte, throttledLine)
	c.wb.blockTime.Store(int64(20 * time.Millisecond)) // the next write sleeps a while in the throttle
	require.Greater(t, c.throttleDelay(c.ssd.blocks), 100*time.Millisecond)
	written := make(chan error, 1)
	go func() { _, err := c.WriteAt(p, int64(throttledSSD*throttledLine)); written <- err }()
	time.Sleep(50 * time.Millisecond) // the write is asleep in the throttle
	require.NoError(t, c.SetMode(context.Background(), WriteThrough, nil))
	require.NoError(t, <-written)
	require.Zero(t, c.ssd.dirtyCount.Load(), "dirty lines after the switch to write-through")
}

// throttledCache is a write-back cache of throttledSSD lines with the proportional throttle, 75 %
// of it dirty (above the high watermark, below the maximum), over a backend that fails every call
// until the caller lets it work (b.SetFailing(false)).
func throttledCache(t *testing.T) (*Cache, *fault.Backend) {
	t.Helper()
	b := fault.New(newCrashDev(4*throttledSSD*throttledLine), fault.Options{Seed: 1})
	c := newCache(t, b, layout{line: throttledLine, ssd: throttledSSD, mode: WriteBack}, nil, nil)
	t.Cleanup(func() { c.Close() })
	c.wb.throttle, _ = policy.NewThrottle("proportional") // newCache turns throttling off
	b.SetFailing(true)                                    // nothing is written back yet
	p := make([]byte, throttledLine)
	for l := range 3 * throttledSSD / 4 {
		_, err := c.WriteAt(p, int64(l*throttledLine))
		require.NoError(t, err)
	}
	return c, b
}

const (
	throttledLine = 64 << 10
	throttledSSD  = 16
)

// TestAdmitDirtyInOrder: writes waiting for room for dirty data get it in the order they asked.
// A write of three lines waits first, then one of a single line; a line of room comes free: the
// single line would fit, but waits behind the first; two more lines free: the first goes, then,
// once its room is given back, the second. Otherwise small writes that fit in each line the
// destager frees could pass a large one for as long as they come (the kernel's NBD client times a
// request out after 30 s).
func TestAdmitDirtyInOrder(t *testing.T) {
	c := newCache(t, mem.New(64<<10*64), layout{line: 64 << 10, ssd: 16, mode: WriteBack}, nil, nil)
	defer c.Close()
	w := c.wb
	full := int64(w.maxLines)
	c.ssd.dirtyCount.Store(full) // as if the tier held its most dirty lines: none are, really
	defer c.ssd.dirtyCount.Store(0)
	var mu sync.Mutex
	var order []string
	admit := func(name string, n int) func() {
		return func() {
			if err := c.admitDirty(n, n); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			c.releaseDirty(n)
		}
	}
	waitFor := func(n int32) {
		for w.waiting.Load() < n {
			runtime.Gosched()
		}
	}
	var wg sync.WaitGroup
	wg.Go(admit("three lines", 3))
	waitFor(1)
	wg.Go(admit("one line", 1))
	waitFor(2)
	free := func(lines int64) {
		w.mu.Lock()
		c.ssd.dirtyCount.Add(-lines)
		w.mu.Unlock()
		w.cond.Broadcast()
	}
	free(1)
	free(2)
	wg.Wait()
	require.Equal(t, []string{"three lines", "one line"}, order)
}
