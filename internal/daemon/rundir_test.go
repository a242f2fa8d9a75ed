package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The run directory is made where it is missing, and refused where it is not the daemon's own: a
// link, a file, or a directory others may write (as /dev/shm/tierblk-UID made by someone else
// first could be).
func TestPrepareRunDir(t *testing.T) {
	dir := t.TempDir()
	made := filepath.Join(dir, "a", "run")
	require.NoError(t, prepareRunDir(made))
	fi, err := os.Stat(made)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "made for the daemon's user alone")
	require.NoError(t, prepareRunDir(made), "again: it is there")

	open := filepath.Join(dir, "open")
	require.NoError(t, os.Mkdir(open, 0o700))
	require.NoError(t, os.Chmod(open, 0o777))
	require.ErrorContains(t, prepareRunDir(open), "may be written by other users (mode -rwxrwxrwx)")

	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(made, link))
	require.ErrorContains(t, prepareRunDir(link), "is not a directory (L")

	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.ErrorContains(t, prepareRunDir(file), "not a directory")
}
