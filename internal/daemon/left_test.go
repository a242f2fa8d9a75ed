package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// A clean stop's mark lets the next start take its device over once, and only with the same
// identity.
func TestLeftMarks(t *testing.T) {
	dir := t.TempDir() + "/run"
	require.False(t, takeLeft(dir, "/dev/nbd3", "tierblk:a"), "no mark")
	require.NoError(t, markLeft(dir, []leftDevice{{"/dev/nbd3", "tierblk:a"}, {"/dev/nbd4", "tierblk:b"}}))
	require.False(t, takeLeft(dir, "/dev/nbd3", "tierblk:other"), "another identity")
	require.False(t, takeLeft(dir, "/dev/nbd3", "tierblk:a"), "a mark is read once")
	require.True(t, takeLeft(dir, "/dev/nbd4", "tierblk:b"))
	_, err := os.Stat(leftMark(dir, "/dev/nbd4"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// Without a mark, a device left by the last run is taken over where no acknowledged write can have
// been lost with that run: the export has no SSD tier, or its cache replayed the run log the
// last run left in the run directory. A new SSD tier, or one whose run log is missing, has no such
// log: its device is released (or, for ublk, its first flush fails).
func TestTakeOverAfterRunLog(t *testing.T) {
	require.NoError(t, lostWith(config.Export{}, nil))
	require.NoError(t, lostWith(config.Export{Cache: &config.Cache{RAM: "64MiB"}}, nil))

	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	e := config.Export{Name: "disk", Backend: "file://" + filepath.Join(dir, "disk.img") + "?size=1MiB", Cache: &config.Cache{
		Mode: "writeback", Line: "4KiB", SSD: filepath.Join(dir, "ssd.img"), SSDSize: "256KiB"}}
	open := func() *cache.Cache {
		t.Helper()
		reg := registry.Default()
		b, err := reg.Open(e.Backend, backend.Options{})
		require.NoError(t, err)
		c, err := openCache(e, b, reg, run, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		return c
	}
	c := open()
	require.Error(t, lostWith(e, c), "a new SSD tier: no run to recover")
	_, err := c.WriteAt(make([]byte, 4096), 0)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	c = open()
	require.NoError(t, lostWith(e, c), "the last run's log, replayed")
	require.NoError(t, c.Close())

	require.NoError(t, os.Remove(runLog(run, e)))
	c = open()
	require.Error(t, lostWith(e, c), "no run log")
	require.NoError(t, c.Close())
}
