package volume

import (
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/trace"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/file"
)

type requests struct {
	mu  sync.Mutex
	got []trace.Request
}

func (r *requests) Write(q trace.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, q)
	return nil
}

// TestRecordingKeepsAsync: a recorded volume records a read started asynchronously once, and one
// the volume leaves to ReadAt not at all until ReadAt, which records one it refuses not at all.
func TestRecordingKeepsAsync(t *testing.T) {
	u, err := url.Parse("file://" + filepath.Join(t.TempDir(), "disk.img") + "?size=1MiB&direct=true")
	require.NoError(t, err)
	b, err := file.Open(u, backend.Options{})
	require.NoError(t, err)
	defer b.Close()
	rec := &requests{}
	d := New(b, Options{Observers: []Observer{Recording(rec, func(err error) { t.Errorf("recording: %v", err) })}})
	var a backend.AsyncReader = d

	done := make(chan error, 1)
	buf := bufpool.Aligned(4096) // direct reads: aligned memory
	require.True(t, a.ReadAtAsync(buf, 8192, func(err error) { done <- err }), "the file backend reads asynchronously")
	require.NoError(t, <-done)
	require.False(t, a.ReadAtAsync(buf, 1<<20, func(error) { t.Error("done of a read not started") }), "past the end: left to ReadAt")
	require.Error(t, d.ReadAt(buf, 1<<20), "past the end")
	require.NoError(t, d.ReadAt(buf, 4096))
	require.NoError(t, d.WriteZeroes(0, 8192, ZeroFlags{}))
	require.Equal(t, []trace.Request{
		{Offset: 8192, Length: 4096, ID: 8192, Op: trace.OpRead},
		{Offset: 4096, Length: 4096, ID: 4096, Op: trace.OpRead},
		{Offset: 0, Length: 8192, ID: 0, Op: trace.OpWrite},
	}, rec.got)
}
