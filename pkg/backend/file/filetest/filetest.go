// Package filetest opens file backends for the tests of the layers above them (a volume, the
// daemon's wrappers) that serve requests on a caller's ring. It is for tests only.
package filetest

import (
	"errors"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring/uringtest"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/file"
)

// DirectOnRing opens a file backend of size bytes in t's temporary directory, read and written
// direct, and a ring loop for n requests at once to serve it on; it skips t where this machine
// has no direct I/O or no io_uring. The file is closed when t ends.
func DirectOnRing(t *testing.T, size string, n int) (backend.Backend, *uringtest.Loop) {
	t.Helper()
	u := &url.URL{Scheme: "file", Path: filepath.Join(t.TempDir(), "f"), RawQuery: "direct=true&size=" + size}
	f, err := file.Open(u, backend.Options{})
	if errors.Is(err, backend.ErrNoDirectIO) {
		testenv.Skip(t, testenv.DirectIO, err.Error())
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	loop := uringtest.New(t, n)
	if loop == nil {
		testenv.Skip(t, testenv.IOUring, "no ring to serve the file on")
	}
	return f, loop
}
