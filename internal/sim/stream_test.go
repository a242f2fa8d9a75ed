package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/trace"
)

// oracleGeneralStream is an endless-looking oracleGeneral trace made as it is read: n records of
// ids drawn from a seeded generator over objects ids. It is the test's input, never held whole.
type oracleGeneralStream struct {
	n, objects uint64
	i, x       uint64
	rec        [24]byte
	left       []byte // the unread part of a record cut by a short Read
}

func (g *oracleGeneralStream) next() []byte {
	g.x = g.x*6364136223846793005 + 1442695040888963407
	le := binary.LittleEndian
	le.PutUint32(g.rec[0:], uint32(g.i))
	le.PutUint64(g.rec[4:], (g.x>>33)%g.objects)
	le.PutUint32(g.rec[12:], 4096)
	le.PutUint64(g.rec[16:], ^uint64(0)) // next access: none
	g.i++
	return g.rec[:]
}

func (g *oracleGeneralStream) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(g.left) == 0 {
			if g.i == g.n {
				break
			}
			g.left = g.next()
		}
		c := copy(p[n:], g.left)
		g.left, n = g.left[c:], n+c
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// peakHeap samples the heap's objects while f runs and returns the most it saw. It collects first,
// so that what earlier tests left behind is not counted.
func peakHeap(t *testing.T, f func()) uint64 {
	t.Helper()
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	f()
	close(stop)
	wg.Wait()
	return peak.Load()
}

// A trace far longer than the memory the test allows itself streams through a count of its keys
// and a replay of several caches: the heap stays under a bound that holding the trace (at 36 bytes
// a request at the very least) would pass many times over.
func TestStreamInBoundedMemory(t *testing.T) {
	requests := uint64(10_000_000)
	if raceEnabled || testing.Short() {
		requests = 4_000_000
	}
	const objects = 100_000
	const bound = 32 << 20
	open := func() trace.Reader {
		r, err := trace.NewReader(&oracleGeneralStream{n: requests, objects: objects, x: 7}, "generated.oracleGeneral", "oraclegeneral")
		require.NoError(t, err)
		return r
	}
	var counted, replayed Summary
	peak := peakHeap(t, func() {
		var err error
		r := open()
		counted, err = CountKeys(context.Background(), r, Options{})
		require.NoError(t, err)
		require.NoError(t, r.Close())
		r = open()
		replayed, err = Run(context.Background(), r, []Job{{Policy: "lru", Size: 1000}, {Policy: "s3fifo", Size: 10_000}, {Policy: "arc", Size: 50_000}}, Options{Workers: 2})
		require.NoError(t, err)
		require.NoError(t, r.Close())
	})
	require.Equal(t, Summary{Requests: int64(requests), Distinct: objects}, counted)
	require.EqualValues(t, requests, replayed.Requests)
	res := replayed.Results
	require.Greater(t, res[0].MissRatio, res[1].MissRatio)
	require.Greater(t, res[1].MissRatio, res[2].MissRatio)
	require.Less(t, peak, uint64(bound), "peak heap %d MiB", peak>>20)
	require.Less(t, uint64(bound), 36*requests/4, "the bound is far below what holding the trace takes")
	t.Logf("%d requests, peak heap %.1f MiB", requests, float64(peak)/(1<<20))
}

// Progress redraws one line per pass (what, requests, rate, share and time left of a file of known
// size) and ends it with the total.
func TestProgress(t *testing.T) {
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = time.Millisecond
	path := filepath.Join(t.TempDir(), "t.oracleGeneral")
	f, err := os.Create(path)
	require.NoError(t, err)
	_, err = io.Copy(f, &oracleGeneralStream{n: 300_000, objects: 1000, x: 3})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	r, err := trace.Open(path, "oraclegeneral")
	require.NoError(t, err)
	defer r.Close()
	var out syncBuffer
	_, err = Run(context.Background(), r, []Job{{Policy: "lru", Size: 10}, {Policy: "lirs", Size: 100}}, Options{Progress: &out})
	require.NoError(t, err)
	got := out.String()
	require.Regexp(t, `^\r2 caches: [0-9.]+[kM]? requests, [0-9.]+M/s, [0-9]+%, [0-9]+s left`, got)
	require.Regexp(t, `\r2 caches: 300k requests in [0-9.]+m?s, [0-9.]+M/s +\n$`, got)
}

// syncBuffer is a bytes.Buffer that the progress goroutine and the test may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
