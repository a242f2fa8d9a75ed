package listen

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
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

// TestPrepare: prepare sees the socket's file before any client can connect, what it sets holds
// once the socket listens, and a failed prepare leaves no file behind.
func TestPrepare(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.sock")
	l, err := ListenUnix(path, func(p string) error {
		require.Equal(t, path, p)
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		require.NotZero(t, fi.Mode()&os.ModeSocket, "the file exists and is the socket")
		_, err = net.Dial("unix", p)
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "a client connected before prepare returned")
		return os.Chmod(p, 0o600)
	})
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	c.Close()
	require.NoError(t, l.Close())
	require.NoFileExists(t, path, "closing the listener removes its file")

	failed := filepath.Join(dir, "failed.sock")
	why := errors.New("no such group")
	_, err = ListenUnix(failed, func(string) error { return why })
	require.Equal(t, why, err, "prepare's error, as it is")
	require.NoFileExists(t, failed)
}
