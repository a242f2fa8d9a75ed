package cache

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierblk/tierblk/pkg/backend/fault"
)

// endlessWriter has goroutines write random 4 KiB blocks to c (each its own blocks), each write
// stamped with a new id, until stopped; the model holds what every block was last written with once
// the write was acknowledged.
type endlessWriter struct {
	c       *Cache
	mu      sync.Mutex
	model   []byte
	writes  atomic.Int64
	stop    chan struct{}
	done    chan struct{}
	errOnce sync.Once
	err     error
}

func startEndlessWriter(t *testing.T, c *Cache, size int64, seed uint64, writers int, pause time.Duration) *endlessWriter {
	t.Helper()
	w := &endlessWriter{c: c, model: make([]byte, size), stop: make(chan struct{}), done: make(chan struct{})}
	var wg sync.WaitGroup
	for k := range writers {
		wg.Go(func() { w.write(size, rand.New(rand.NewPCG(seed, uint64(k))), k, writers, pause) })
	}
	go func() {
		wg.Wait()
		close(w.done)
	}()
	t.Cleanup(w.halt)
	return w
}

// write is writer k of n: blocks k, k+n, k+2n...; its ids grow.
func (w *endlessWriter) write(size int64, rng *rand.Rand, k, n int, pause time.Duration) {
	c := w.c
	buf := make([]byte, blockSize)
	for id := int64(1); ; id++ {
		select {
		case <-w.stop:
			return
		default:
		}
		off := (rng.Int64N(size/blockSize/int64(n))*int64(n) + int64(k)) * blockSize
		stamp(buf, int(off/sector), id<<8|int64(k))
		if _, err := c.WriteAt(buf, off); err != nil {
			w.errOnce.Do(func() { w.err = err })
			return
		}
		w.mu.Lock()
		copy(w.model[off:], buf)
		w.mu.Unlock()
		w.writes.Add(1)
		if pause > 0 {
			time.Sleep(pause)
		}
	}
}

// acked returns a copy of the model: every write in it was acknowledged before acked returned.
func (w *endlessWriter) acked() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.model...)
}

func (w *endlessWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// checkCovers fails unless every sector of the backend holds the write want has there or a later
// one (the writer's ids only grow), reading the backend alone.
func checkCovers(t *testing.T, back *crashDev, want []byte) {
	t.Helper()
	raw := make([]byte, len(want))
	back.ReadAt(raw, 0)
	got, exp := stamps(raw, 0), stamps(want, 0)
	for s := range got {
		if got[s] == corrupt || got[s] < exp[s] {
			t.Fatalf("the backend's sector %d holds write %d; a write acknowledged before the flush put %d there",
				s, got[s], exp[s])
		}
	}
}

// flushEndCache is a write-back cache over a slow backend (each call takes up to 4 ms, seeded),
// whose SSD tier holds the whole backend: dirty data never reaches its maximum, so writes are
// never held back and a writer keeps dirtying lines as fast as it likes.
func flushEndCache(t *testing.T) (*Cache, *crashDev, int64) {
	t.Helper()
	const (
		line  = 64 << 10
		lines = 1024 // four of the windows a flush locks at once
		size  = lines * line
	)
	back := newCrashDev(size)
	b := fault.New(back, fault.Options{Seed: int64(testSeed(t)), MaxDelay: 4 * time.Millisecond})
	c := newCache(t, b, layout{line: line, ssd: lines * 5 / 4, mode: WriteBack}, nil, nil)
	t.Cleanup(func() { c.Close() })
	return c, back, size
}

// flushEndBound bounds how long a flush of the test's dirty data may take: its snapshot drains in
// well under a second; a flush that chases new dirty data never ends.
const flushEndBound = 60 * time.Second

// TestFlushAllEndsWhileWriting: FlushAll, called while a writer keeps dirtying lines and never
// stops, returns within a bound; then every write acknowledged before the call is on the backend,
// and its progress has reached its total.
func TestFlushAllEndsWhileWriting(t *testing.T) {
	c, back, size := flushEndCache(t)
	w := startEndlessWriter(t, c, size, testSeed(t), 4, 50*time.Microsecond)
	waitFor(t, "dirty data", func() bool { return w.writes.Load() > 500 && c.ssd.dirtyCount.Load() > 32 })
	for round := range 3 {
		want := w.acked()
		var last [2]int64
		var calls int
		ctx, cancel := context.WithTimeout(context.Background(), flushEndBound)
		t0 := time.Now()
		before := w.writes.Load()
		err := c.FlushAll(ctx, func(done, total int64) {
			if done < last[0] || done > total {
				t.Errorf("progress went from %d to %d of %d", last[0], done, total)
			}
			last = [2]int64{done, total}
			calls++
		})
		cancel()
		if err != nil {
			t.Fatalf("round %d: FlushAll while a writer writes: %v (progress %d of %d after %v)", round, err, last[0], last[1], time.Since(t0))
		}
		t.Logf("round %d: FlushAll took %v; %d of %d bytes, %d progress calls; %d writes meanwhile, %d lines dirty now",
			round, time.Since(t0), last[0], last[1], calls, w.writes.Load()-before, c.ssd.dirtyCount.Load())
		// Nothing may be dirty at the call (the destager cleaned it all while the writer waited
		// for a CPU): the progress then ends at 0 of 0, but it must be told.
		if calls == 0 || last[0] != last[1] {
			t.Fatalf("round %d: progress ended at %d of %d after %d calls", round, last[0], last[1], calls)
		}
		checkCovers(t, back, want)
	}
	if w.halt(); w.err != nil {
		t.Fatal(w.err)
	}
}

// TestSetModeEndsWhileWriting: a switch from write-back to write-through, while a writer keeps
// writing, returns within a bound with nothing dirty, and the backend holds every write
// acknowledged before the call.
func TestSetModeEndsWhileWriting(t *testing.T) {
	c, back, size := flushEndCache(t)
	w := startEndlessWriter(t, c, size, testSeed(t), 4, 50*time.Microsecond)
	waitFor(t, "dirty data", func() bool { return w.writes.Load() > 500 && c.ssd.dirtyCount.Load() > 32 })
	want := w.acked()
	var last [2]int64
	ctx, cancel := context.WithTimeout(context.Background(), flushEndBound)
	defer cancel()
	t0 := time.Now()
	calls := 0
	if err := c.SetMode(ctx, WriteThrough, func(done, total int64) { last = [2]int64{done, total}; calls++ }); err != nil {
		t.Fatalf("SetMode(writethrough) while a writer writes: %v (progress %d of %d after %v)", err, last[0], last[1], time.Since(t0))
	}
	t.Logf("SetMode took %v; %d of %d bytes", time.Since(t0), last[0], last[1])
	if calls == 0 || last[0] != last[1] { // 0 of 0 where nothing was dirty at the call, as above
		t.Fatalf("progress ended at %d of %d after %d calls", last[0], last[1], calls)
	}
	if n := c.ssd.dirtyCount.Load(); n != 0 {
		t.Fatalf("%d lines dirty after the switch to write-through", n)
	}
	checkCovers(t, back, want)
	// The writer goes on in write-through: the backend holds every write acknowledged.
	time.Sleep(100 * time.Millisecond)
	if w.halt(); w.err != nil {
		t.Fatal(w.err)
	}
	checkCovers(t, back, w.acked())
}
