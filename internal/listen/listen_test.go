package listen

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUnixSockets(t *testing.T) {
	dir := t.TempDir()

	// A missing directory is created.
	l, err := Listen("unix", filepath.Join(dir, "new", "a.sock"))
	require.NoError(t, err)
	defer l.Close()

	// A live socket is refused and left alone.
	_, err = Listen("unix", filepath.Join(dir, "new", "a.sock"))
	require.ErrorContains(t, err, "in use by another server")

	// A socket nobody listens on any more is replaced.
	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.Listen("unix", stale)
	require.NoError(t, err)
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	sl.Close()
	l2, err := Listen("unix", stale)
	require.NoError(t, err)
	l2.Close()

	// A file that is not a socket is refused and kept.
	file := filepath.Join(dir, "data")
	require.NoError(t, os.WriteFile(file, []byte("keep"), 0o644))
	_, err = Listen("unix", file)
	require.ErrorContains(t, err, "is not a socket")
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b))
}
