package integration

// Tests of the NBD backend (pkg/backend/nbd), run in this process against nbdkit: the backend
// conformance suite over a Unix socket and over TCP with several connections, read-only exports,
// a server without trim, write-zeroes, flush or FUA, and the errors of opening one. The backend is
// opened by URL through the daemon's registry, as `tierblk serve --backend` opens it; its URL
// parsing is tested beside it.

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbdkit"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// nbdkitSocket runs `nbdkit args...` on a Unix socket until the test ends and returns its path.
func nbdkitSocket(t *testing.T, args ...string) string {
	t.Helper()
	return nbdkit.Start(t, "unix", args...).Addr
}

func TestNBDBackendConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		sock := nbdkitSocket(t, "memory", strconv.FormatInt(size, 10))
		return openBackend(t, "nbd+unix:///?socket="+sock, backend.Options{})
	})
}

func TestNBDBackendConformanceTCPMultiConn(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		addr := nbdkit.Start(t, "tcp", "memory", strconv.FormatInt(size, 10)).Addr
		return openBackend(t, "nbd://"+addr+"/?connections=3", backend.Options{})
	})
}

func TestNBDBackendReadOnly(t *testing.T) {
	t.Run("opened read-only", func(t *testing.T) {
		backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
			img := filepath.Join(t.TempDir(), "disk.img")
			require.NoError(t, os.WriteFile(img, content, 0o600))
			return openBackend(t, "nbd+unix:///?socket="+nbdkitSocket(t, "file", img), backend.Options{ReadOnly: true})
		})
	})
	t.Run("read-only export", func(t *testing.T) {
		backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
			img := filepath.Join(t.TempDir(), "disk.img")
			require.NoError(t, os.WriteFile(img, content, 0o600))
			return openBackend(t, "nbd+unix:///?socket="+nbdkitSocket(t, "-r", "file", img), backend.Options{})
		})
	})
}

// TestNBDBackendMissingCapabilities checks a server without trim, write-zeroes, flush and FUA:
// the calls that need them fail with ErrNotSupported, FUA writes still work.
func TestNBDBackendMissingCapabilities(t *testing.T) {
	sock := nbdkitSocket(t, "--filter=nozero", "eval", "get_size=echo 1048576",
		"pread=head -c $3 /dev/zero", "pwrite=cat >/dev/null", "can_write=exit 0",
		"can_trim=exit 3", "can_flush=exit 3", "can_fua=echo none", "zeromode=none")
	b := openBackend(t, "nbd+unix:///?socket="+sock, backend.Options{})
	defer b.Close()
	require.ErrorIs(t, b.(backend.Trimmer).Trim(0, 4096), backend.ErrNotSupported)
	require.ErrorIs(t, b.(backend.ZeroWriter).WriteZeroes(0, 4096, false), backend.ErrNotSupported)
	_, err := b.(backend.FUAWriter).WriteAtFUA(make([]byte, 4096), 0)
	require.NoError(t, err)
	require.NoError(t, b.Flush())
	require.False(t, b.(backend.ReadOnlyReporter).ReadOnly())
}

func TestNBDBackendOpenErrors(t *testing.T) {
	sock := nbdkitSocket(t, "--filter=exportname", "memory", "1M", "exportname=disk", "exportname-strict=true")
	_, err := registry.Default().Open("nbd+unix:///other?socket="+sock, backend.Options{})
	require.ErrorIs(t, err, client.ErrExportNotFound)
	_, err = registry.Default().Open("nbd+unix:///disk", backend.Options{})
	require.ErrorContains(t, err, "socket=")
	b := openBackend(t, "nbd+unix:///disk?socket="+sock, backend.Options{})
	require.Equal(t, int64(1<<20), b.Size())
	require.NoError(t, b.Close())
}
