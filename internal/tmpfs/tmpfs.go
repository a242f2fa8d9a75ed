// Package tmpfs gives tests a small file system of their own, to fill: a tmpfs of a set size,
// mounted for the test's lifetime. It is for tests only, and needs root (it skips otherwise).
package tmpfs

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Mount mounts a tmpfs of size bytes on a new directory until the test ends, and returns it; it
// skips the test where this process may not mount.
func Mount(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// Fill takes all but leave bytes of dir's file system with one new file, and returns its path:
// remove it to give the room back.
func Fill(t *testing.T, dir string, leave int64) string {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fallocate(int(f.Fd()), 0, 0, int64(st.Bavail)*st.Bsize-leave))
	return path
}
