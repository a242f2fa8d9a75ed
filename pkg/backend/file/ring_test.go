package file

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring/uringtest"
	"github.com/tierblk/tierblk/pkg/backend"
)

// TestReadWriteAtOn: a file read direct serves aligned reads on a caller's ring, and one written
// direct aligned writes (FUA too); the data is the file's. An unaligned request, one out of
// range, a write where writes go through the page cache or a write to a read-only file is left to
// ReadAt and WriteAt; so is every request once the file is closed, and Close waits for the
// requests in flight. A file without the ring runs nothing on a caller's ring.
func TestReadWriteAtOn(t *testing.T) {
	dir := directDir(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 64<<10/16)
	path := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(path, want, 0o644))
	opened := mustOpen(t, fileURL(path, "direct=true"), backend.Options{})
	defer opened.Close()
	loop := uringtest.New(t, 4)
	if opened.ring == nil || loop == nil {
		testenv.Skip(t, testenv.IOUring, "no ring to read on")
	}
	f := ringFile{opened}
	never := func(error) { t.Error("done called for a request left to ReadAt or WriteAt") }

	buf := bufpool.Aligned(8192)
	started, err := loop.Do(func(r backend.Ring, done func(error)) bool { return f.ReadAtOn(r, buf, 16384, done) })
	require.True(t, started, "an aligned read")
	require.NoError(t, err)
	require.Equal(t, want[16384:16384+8192], buf)
	require.Zero(t, f.Waits(), "a read on the ring keeps no goroutine waiting")

	copy(buf, bytes.Repeat([]byte("W"), len(buf)))
	for _, fua := range []bool{false, true} {
		started, err = loop.Do(func(r backend.Ring, done func(error)) bool { return f.WriteAtOn(r, buf, 4096, fua, done) })
		require.True(t, started, "an aligned write, fua %v", fua)
		require.NoError(t, err)
	}
	got := make([]byte, len(want))
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	copy(want[4096:], buf)
	require.Equal(t, want, got)

	require.False(t, f.ReadAtOn(nil, buf[1:4097], 0, never), "an unaligned buffer")
	require.False(t, f.WriteAtOn(nil, buf, 512, false, never), "an unaligned offset")
	require.False(t, f.ReadAtOn(nil, buf, 64<<10, never), "past the end")
	require.NoError(t, f.Close())
	require.False(t, f.ReadAtOn(nil, buf, 0, never), "closed")

	for _, query := range []string{"direct=reads", "direct=true&uring=false", ""} {
		p := mustOpen(t, fileURL(path, query), backend.Options{})
		served := p.served()
		if rw, ok := served.(backend.RingWriter); ok {
			require.Equal(t, "direct=reads", query, "only a file read direct has a ring")
			require.False(t, rw.WriteAtOn(nil, buf, 0, false, never), "%s: a write", query)
		}
		if query != "direct=reads" {
			_, ok := served.(backend.RingReader)
			require.False(t, ok, "%s: Open's file runs nothing on a caller's ring", query)
		}
		require.NoError(t, p.Close())
	}
	ro := ringFile{mustOpen(t, fileURL(path, "direct=true"), backend.Options{ReadOnly: true})}
	require.False(t, ro.WriteAtOn(nil, buf, 0, false, never), "read-only")

	// Close, begun while a read is in flight on the ring, returns only after it ended.
	closed := make(chan error, 1)
	started, err = loop.Do(func(r backend.Ring, done func(error)) bool {
		if !ro.ReadAtOn(r, buf, 0, done) {
			return false
		}
		go func() { closed <- ro.Close() }()
		for !ro.closed.Load() {
			runtime.Gosched()
		}
		select {
		case <-closed:
			t.Error("Close returned with a read in flight")
		default:
		}
		return true
	})
	require.True(t, started)
	require.NoError(t, err)
	require.NoError(t, <-closed)
}
