package trace

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// recordConcurrently writes the same requests as a server would: from several goroutines at once.
func recordConcurrently(t *testing.T, path, filename string, workers, each int) []Request {
	f, err := os.Create(path)
	require.NoError(t, err)
	w, err := NewFioLogWriter(f, filename)
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		want []Request
		wg   sync.WaitGroup
	)
	for g := range workers {
		wg.Go(func() {
			for i := range each {
				r := Request{Offset: int64(g*each+i) * 4096, Length: 4096, Op: Op(i % 3)}
				if i%30 == 29 { // a flush: no range
					r.Offset, r.Length = 0, 0
				}
				require.NoError(t, w.Write(r))
				mu.Lock()
				want = append(want, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Close())
	require.Error(t, w.Write(Request{}), "write after close")
	require.NoError(t, f.Close())
	return want
}

func byRange(a, b Request) int {
	if a.Offset != b.Offset {
		return int(a.Offset - b.Offset)
	}
	return int(a.Op) - int(b.Op)
}

// TestFioLogRoundTrip reads back a log recorded from several goroutines. That fio replays such a
// log is TestFioReplaysRecordedLog in integration/.
func TestFioLogRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.iolog")
	want := recordConcurrently(t, path, "/dev/nbd0", 4, 300)

	r, err := Open(path, "auto")
	require.NoError(t, err)
	got := readAll(t, r)
	require.Equal(t, "/dev/nbd0", r.(VolumeNamer).VolumeName(0))
	require.Len(t, got, len(want))
	for i := 1; i < len(got); i++ {
		require.LessOrEqual(t, got[i-1].Time, got[i].Time, "timestamps go forward")
	}
	for i := range got {
		got[i].Time, got[i].ID, got[i].Volume = 0, 0, 0
	}
	slices.SortFunc(got, byRange)
	slices.SortFunc(want, byRange)
	require.Equal(t, want, got)
}

func TestFioLogWriterRejects(t *testing.T) {
	for _, name := range []string{"", "a b", string(bytes.Repeat([]byte("x"), 257))} {
		_, err := NewFioLogWriter(&bytes.Buffer{}, name)
		require.Error(t, err, "%q", name)
	}
	w, err := NewFioLogWriter(&bytes.Buffer{}, "/dev/x")
	require.NoError(t, err)
	require.Error(t, w.Write(Request{Offset: -1, Length: 1}))
	require.Error(t, w.Write(Request{Length: 1 << 32}))
}
