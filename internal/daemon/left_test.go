package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/file/filetest"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// A clean stop's mark names the identity of the export that left the device, until a start takes
// the device (or makes it anew).
func TestLeftMarks(t *testing.T) {
	dir := t.TempDir() + "/run"
	require.Empty(t, leftBy(dir, "/dev/nbd3"), "no mark")
	require.NoError(t, markLeft(dir, []leftDevice{{"/dev/nbd3", "tierblk:a"}, {"/dev/ublkb4", "tierblk:b"}}))
	require.Equal(t, "tierblk:a", leftBy(dir, "/dev/nbd3"))
	require.Equal(t, "tierblk:a", leftBy(dir, "/dev/nbd3"), "reading a mark keeps it")
	require.Equal(t, "tierblk:b", leftBy(dir, "/dev/ublkb4"))
	forgetLeft(dir, "/dev/ublkb4")
	require.Empty(t, leftBy(dir, "/dev/ublkb4"))
	_, err := os.Stat(leftMark(dir, "/dev/ublkb4"))
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

// A ublk device left by a clean stop of this export is taken back as it is; one left by another
// export is refused, naming both identities, and keeps its mark; one without a mark (its daemon
// was killed) is taken back distrusted.
func TestMayTakeBack(t *testing.T) {
	dir := t.TempDir() + "/run"
	log := slog.New(slog.DiscardHandler)
	distrusted := 0
	distrust := func() { distrusted++ }
	require.NoError(t, markLeft(dir, []leftDevice{{"/dev/ublkb0", "tierblk:a"}}))

	err := mayTakeBack(log, dir, "x", "/dev/ublkb0", "tierblk:b", distrust)
	require.ErrorContains(t, err, `/dev/ublkb0 was left by a tierblk serving another export (identity "tierblk:a", this export's is "tierblk:b")`)
	require.Equal(t, "tierblk:a", leftBy(dir, "/dev/ublkb0"), "a refusal keeps the mark")

	require.NoError(t, mayTakeBack(log, dir, "x", "/dev/ublkb0", "tierblk:a", distrust))
	require.Zero(t, distrusted, "a clean stop flushed every volume")

	require.NoError(t, mayTakeBack(log, dir, "x", "/dev/ublkb1", "tierblk:a", distrust))
	require.Equal(t, 1, distrusted, "no mark: the daemon was killed")
}

// The identity changes with the backend and the SSD tier, and not with what the URL's
// credentials are.
func TestDeviceIdentity(t *testing.T) {
	a := config.Export{Backend: "file:///dev/vda", Cache: &config.Cache{SSD: "/dev/vdb", Meta: "/tmp/meta"}}
	b := a
	b.Backend = "file:///dev/vdc"
	c := a
	c.Cache = &config.Cache{SSD: "/dev/vdc", Meta: "/tmp/meta"}
	require.NotEqual(t, deviceIdentity(a), deviceIdentity(b))
	require.NotEqual(t, deviceIdentity(a), deviceIdentity(c))
	require.Regexp(t, `^tierblk:[0-9a-f]{16}$`, deviceIdentity(a))
	require.Equal(t, deviceIdentity(config.Export{Backend: "iscsi://alice:one@nas/iqn.2001-04.com.example:disk/1"}),
		deviceIdentity(config.Export{Backend: "iscsi://alice:two@nas/iqn.2001-04.com.example:disk/1"}))
}

// The wrapper that fails the first flush after a killed daemon passes the ublk queue's requests
// on its ring to the volume, which serves them there (a file backend opened direct): it must
// not send every read and write of a taken-back device to a goroutine. Its flush fails once
// armed, then passes too.
func TestDistrustFlushPassesRingRequests(t *testing.T) {
	f, loop := filetest.DirectOnRing(t, "1MiB", 2)
	d := &distrustFlush{Device: volume.New(f, volume.Options{})}
	p := bufpool.Aligned(4096)
	copy(p, "taken back")
	loop.RoundTrip(t, d, d, p, 8192, false)

	d.armed.Store(true)
	require.ErrorIs(t, d.Flush(), errKilledDaemon)
	require.NoError(t, d.Flush())
}
