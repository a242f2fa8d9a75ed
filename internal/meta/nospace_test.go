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

// On a file system with less than MinFree free, the store writes nothing but invalidations, down
// to ReserveFree, and says why: Commit and SetSuperblock fail with ErrNoSpace (badger never meets
// the full disk, where a write to its memory-mapped tables ends the process with SIGBUS); what was
// committed stays readable; Close leaves a full disk alone; once there is room again it commits;
// a store is not opened on a file system without room.
func TestNoSpace(t *testing.T) {
	dir := smallFS(t, 3*MinFree/2)
	db := filepath.Join(dir, "meta")
	s := openBadger(t, db)
	require.NoError(t, s.Commit([]Op{put(1, 1, []uint64{3}, nil), put(2, 2, []uint64{1}, nil)}, true))

	// Between the two marks: invalidations only.
	filler := fill(t, dir, (MinFree+ReserveFree)/2)
	err := s.Commit([]Op{put(3, 3, []uint64{1}, nil)}, true)
	require.ErrorIs(t, err, ErrNoSpace)
	require.ErrorContains(t, err, dir)
	require.ErrorIs(t, s.SetSuperblock(testSB), ErrNoSpace)
	invalidate := []Op{{Rec: Line{Line: 1, Slot: 1, Valid: []uint64{1}}, Invalidates: true}, {Delete: true, Rec: Line{Line: 2}, Invalidates: true}}
	require.NoError(t, s.Commit(invalidate, true))
	_, err = OpenBadger(filepath.Join(dir, "other"), nil)
	require.ErrorIs(t, err, ErrNoSpace)
	require.NoError(t, os.Remove(filler))

	// A full file system: without the check, the commits below end the test with SIGBUS.
	filler = fill(t, dir, 0)
	for i := range 1000 {
		err := s.Commit([]Op{{Rec: Line{Line: uint64(i + 4), Slot: uint32(i + 4), Valid: []uint64{1, 2, 3, 4}}, Invalidates: i%2 == 0}}, i%100 == 0)
		require.ErrorIs(t, err, ErrNoSpace)
	}
	want := []Line{{Line: 1, Slot: 1, Valid: []uint64{1}}}
	require.Equal(t, want, allLines(t, s))
	require.ErrorIs(t, s.Close(), ErrNoSpace)

	// The process would end here and let go of badger's lock; its log holds the commits, as
	// after a kill (TestBadgerSurvivesProcessKill). Here the test lets go of it, with room.
	require.NoError(t, os.Remove(filler))
	require.NoError(t, s.db.Close())
	s = openBadger(t, db)
	defer s.Close()
	require.Equal(t, want, allLines(t, s))
	require.NoError(t, s.Commit([]Op{put(3, 3, []uint64{1}, nil)}, true))
	require.Len(t, allLines(t, s), 2)
}
