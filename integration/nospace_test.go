package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/tmpfs"
	"golang.org/x/sys/unix"
)

// TestMetadataDiskFull fills the file system of a write-back cache's metadata directory (a small
// tmpfs) while clients write: the daemon stays up, bypasses its SSD tier saying why, serves every
// byte written, and takes the tier back (tierblk heal) once there is room again. Without the
// store's free-space check, badger ended the process with SIGBUS.
func TestMetadataDiskFull(t *testing.T) {
	requireTools(t, "qemu-io")
	dir := t.TempDir()
	metaFS := tmpfs.Mount(t, 96<<20)
	admin := "unix:" + filepath.Join(shortTempDir(t), "admin.sock")
	d := startServe(t, "--backend", "file://"+filepath.Join(dir, "back.img")+"?size=64MiB", "--ssd", filepath.Join(dir, "ssd.img"),
		"--ssd-size", "32MiB", "--meta", filepath.Join(metaFS, "meta"), "--mode", "writeback", "--admin", admin)
	uri := unixURI(d.Unix, "")
	mustQemuIO(t, uri, "write -P 0xaa 0 4M", "flush")
	require.False(t, adminStats(t, admin).tier(t, "ssd").Failed)

	// Fill the metadata's file system to below what its store needs for new records, above what
	// it keeps for invalidations: the tier is bypassed, and writes go on to the backend.
	filler := tmpfs.Fill(t, metaFS, (meta.MinFree+meta.ReserveFree)/2)
	mustQemuIO(t, uri, "write -P 0xbb 4M 4M", "flush", "write -P 0xcc 1M 64k", "flush")
	deadline := time.Now().Add(20 * time.Second)
	for !adminStats(t, admin).tier(t, "ssd").Failed {
		require.True(t, time.Now().Before(deadline), "the SSD tier is still in service on a full metadata file system")
		time.Sleep(100 * time.Millisecond)
	}
	code, out := runTierblk(t, "stats", "--admin", admin)
	require.Zero(t, code, out)
	require.Contains(t, out, "no room for metadata")
	check := []string{"read -P 0xaa 0 1M", "read -P 0xcc 1M 64k", "read -P 0xaa 1088k 2944k", "read -P 0xbb 4M 4M"}
	mustQemuIO(t, uri, check...)
	mustQemuIO(t, uri, "write -P 0xdd 8M 1M", "flush", "read -P 0xdd 8M 1M")

	// Full to the last block: writes fail, saying why, and everything written is still read.
	require.NoError(t, os.Remove(filler))
	filler = tmpfs.Fill(t, metaFS, 0)
	_, err := qemuIO(t, uri, "write -P 0xee 0 64k")
	require.Error(t, err, "a write that cannot invalidate the SSD tier's copy first")
	mustQemuIO(t, uri, check...)
	require.Contains(t, d.output.String(), "no room for metadata")

	require.NoError(t, os.Remove(filler))
	code, out = runTierblk(t, "heal", "--admin", admin)
	require.Zero(t, code, out)
	require.False(t, adminStats(t, admin).tier(t, "ssd").Failed)
	mustQemuIO(t, uri, check...)
	d.requireStop(unix.SIGTERM)
}
