package meta

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tierblk/tierblk/internal/tmpfs"
)

// On a file system with less than MinFree free, the store writes nothing but invalidations, down
// to ReserveFree, and says why: Commit and SetSuperblock fail with ErrNoSpace (badger never meets
// the full disk, where a write to its memory-mapped tables ends the process with SIGBUS); what was
// committed stays readable; Close leaves a full disk alone; once there is room again it commits;
// a store is not opened on a file system without room.
func TestNoSpace(t *testing.T) {
	dir := tmpfs.Mount(t, 3*MinFree/2)
	db := filepath.Join(dir, "meta")
	s := openBadger(t, db)
	require.NoError(t, s.Commit([]Op{put(1, 1, []uint64{3}, nil), put(2, 2, []uint64{1}, nil)}, true))

	// Between the two marks: invalidations only.
	filler := tmpfs.Fill(t, dir, (MinFree+ReserveFree)/2)
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
	filler = tmpfs.Fill(t, dir, 0)
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
