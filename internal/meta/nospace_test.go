package meta

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// smallFS mounts a tmpfs of size bytes for the test, or skips where this process may not mount.
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fill takes all but leave bytes of dir's file system with one file, and returns its path.
func fill(t *testing.T, dir string, leave int64) string {
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

// On a file system with less than MinFree free, the store writes nothing and says why: Commit
// and SetSuperblock fail with ErrNoSpace (badger never meets the full disk, where a write to its
// memory-mapped tables ends the process with SIGBUS), what was committed stays readable, and once
// there is room again it commits; a store is not opened there at all.
func TestNoSpace(t *testing.T) {
	dir := smallFS(t, 3*MinFree/2)
	db := filepath.Join(dir, "meta")
	s := openBadger(t, db)
	defer s.Close()
	require.NoError(t, s.Commit([]Op{put(1, 1, []uint64{1}, nil)}, true))

	// A full file system: without the check, the commits below end the test with SIGBUS.
	filler := fill(t, dir, 0)
	for i := range 1000 {
		err := s.Commit([]Op{put(uint64(i+2), uint32(i+2), []uint64{1, 2, 3, 4}, nil)}, i%100 == 0)
		require.ErrorIs(t, err, ErrNoSpace)
		require.ErrorContains(t, err, dir)
	}
	require.ErrorIs(t, s.SetSuperblock(testSB), ErrNoSpace)
	require.Equal(t, []Line{{Line: 1, Slot: 1, Valid: []uint64{1}}}, allLines(t, s))
	_, err := OpenBadger(filepath.Join(dir, "other"), nil)
	require.ErrorIs(t, err, ErrNoSpace)

	require.NoError(t, os.Remove(filler))
	require.NoError(t, s.Commit([]Op{put(2, 2, []uint64{1}, nil)}, true))
	require.Len(t, allLines(t, s), 2)
}
