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

// TestRecordingKeepsAsync: a recorded volume keeps the volume's asynchronous reads, plugging and
// run ends (a frontend that looks for them finds them), and records a read started
// asynchronously once, and one the volume leaves to ReadAt not at all until ReadAt.
func TestRecordingKeepsAsync(t *testing.T) {
	u, err := url.Parse("file://" + filepath.Join(t.TempDir(), "disk.img") + "?size=1MiB&direct=true")
	require.NoError(t, err)
	b, err := file.Open(u, backend.Options{})
	require.NoError(t, err)
	defer b.Close()
	rec := &requests{}
	d := Recording(New(b, Options{}), rec, func(err error) { t.Errorf("recording: %v", err) })

	a, ok := d.(backend.AsyncReader)
	require.True(t, ok, "a recorded volume reads asynchronously")
	_, ok = d.(backend.AsyncWriter)
	require.True(t, ok, "and writes")
	_, ok = d.(backend.Plugger)
	require.True(t, ok, "and plugs")
	_, ok = d.(backend.RunDeferrer)
	require.True(t, ok, "and answers at a run's end")
	_, ok = d.(backend.Waiter)
	require.True(t, ok, "and counts its waits")

	done := make(chan error, 1)
	buf := bufpool.Aligned(4096) // direct reads: aligned memory
	require.True(t, a.ReadAtAsync(buf, 8192, func(err error) { done <- err }), "the file backend reads asynchronously")
	require.NoError(t, <-done)
	require.False(t, a.ReadAtAsync(buf, 1<<20, func(error) { t.Error("done of a read not started") }), "past the end: left to ReadAt")
	require.Error(t, d.ReadAt(buf, 1<<20))
	require.Equal(t, []trace.Request{
		{Offset: 8192, Length: 4096, ID: 8192, Op: trace.OpRead},
		{Offset: 1 << 20, Length: 4096, ID: 1 << 20, Op: trace.OpRead},
	}, rec.got)
}
