package daemon

import (
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/config"
)

// A clean stop's mark names the identity of the export that left the device, until a start takes
// the device (or makes it anew).
func TestLeftMarks(t *testing.T) {
	useLeftDir(t)
	require.Empty(t, leftBy("/dev/nbd3"), "no mark")
	require.NoError(t, markLeft([]leftDevice{{"/dev/nbd3", "tierblk:a"}, {"/dev/ublkb4", "tierblk:b"}}))
	require.Equal(t, "tierblk:a", leftBy("/dev/nbd3"))
	require.Equal(t, "tierblk:a", leftBy("/dev/nbd3"), "reading a mark keeps it")
	require.Equal(t, "tierblk:b", leftBy("/dev/ublkb4"))
	forgetLeft("/dev/ublkb4")
	require.Empty(t, leftBy("/dev/ublkb4"))
	_, err := os.Stat(leftMark("/dev/ublkb4"))
	require.ErrorIs(t, err, os.ErrNotExist)

	require.False(t, mayWriteBack(config.Export{}))
	require.False(t, mayWriteBack(config.Export{Cache: &config.Cache{RAM: "64MiB"}}))
	require.True(t, mayWriteBack(config.Export{Cache: &config.Cache{SSD: "/dev/vdb"}}))
}

// A ublk device left by a clean stop of this export is taken back as it is; one left by another
// export is refused, naming both identities, and keeps its mark; one without a mark (its daemon
// was killed) is taken back distrusted.
func TestMayTakeBack(t *testing.T) {
	useLeftDir(t)
	log := slog.New(slog.DiscardHandler)
	distrusted := 0
	distrust := func() { distrusted++ }
	require.NoError(t, markLeft([]leftDevice{{"/dev/ublkb0", "tierblk:a"}}))

	err := mayTakeBack(log, "x", "/dev/ublkb0", "tierblk:b", distrust)
	require.ErrorContains(t, err, `/dev/ublkb0 was left by a tierblk serving another export (identity "tierblk:a", this export's is "tierblk:b")`)
	require.Equal(t, "tierblk:a", leftBy("/dev/ublkb0"), "a refusal keeps the mark")

	require.NoError(t, mayTakeBack(log, "x", "/dev/ublkb0", "tierblk:a", distrust))
	require.Zero(t, distrusted, "a clean stop flushed every volume")

	require.NoError(t, mayTakeBack(log, "x", "/dev/ublkb1", "tierblk:a", distrust))
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

func useLeftDir(t *testing.T) {
	old := LeftDir
	LeftDir = t.TempDir() + "/run"
	t.Cleanup(func() { LeftDir = old })
}
