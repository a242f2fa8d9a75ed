package integration

// Tests of the file backend (pkg/backend/file) on a block device: a loop device that losetup
// attaches (which needs root, as `make test` in CI runs). The backend is opened by URL through the
// daemon's registry, as `tierblk serve --backend file:///dev/...` opens it; its tests on files
// are beside it.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// loopDevice attaches a fresh zeroed (sparse) file of size bytes to a free loop device until the
// test ends and returns the device's path.
func loopDevice(t *testing.T, size int64) string {
	t.Helper()
	requireTools(t, "losetup")
	img := filepath.Join(t.TempDir(), "loop.img")
	require.NoError(t, os.WriteFile(img, nil, 0o644))
	require.NoError(t, os.Truncate(img, size))
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	require.NoError(t, err, "losetup (loop devices need root and the loop driver): %s", out)
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// openBlockDevice opens the file backend on dev with the URL query (direct=..., uring=...), and
// checks that it took its size from the kernel: a block device's stat size is 0.
func openBlockDevice(t *testing.T, dev, query string, size int64, opts backend.Options) backend.Backend {
	t.Helper()
	b := openBackend(t, "file://"+dev+"?"+query, opts)
	require.Equal(t, size, b.Size(), "the size of %s", dev)
	return b
}

func TestFileBackendBlockDeviceConformance(t *testing.T) {
	for _, c := range []struct{ name, query string }{
		{"block device", ""},
		{"block device direct", "direct=true"},
		{"block device direct reads", "direct=reads"},
		{"block device direct reads, pread", "direct=reads&uring=false"},
	} {
		t.Run(c.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
				return openBlockDevice(t, loopDevice(t, size), c.query, size, backend.Options{})
			})
		})
	}
}

// TestFileBackendBlockDeviceOddSize checks direct I/O at the end of a device whose size is a
// multiple of its 512-byte blocks but not of 4096: the bounce window must stop at the device's
// end.
func TestFileBackendBlockDeviceOddSize(t *testing.T) {
	const size = 1<<20 + 512
	b := openBlockDevice(t, loopDevice(t, size), "direct=true", size, backend.Options{})
	defer b.Close()
	want := backendtest.Pattern(40, 700)
	_, err := b.WriteAt(want, size-700)
	require.NoError(t, err)
	got := make([]byte, 700)
	_, err = b.ReadAt(got, size-700)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, b.(backend.ZeroWriter).WriteZeroes(size-600, 600, true))
	_, err = b.ReadAt(got, size-700)
	require.NoError(t, err)
	require.Equal(t, want[:100], got[:100])
	require.Equal(t, make([]byte, 600), got[100:])
	_, err = b.WriteAt(want, size-699)
	require.ErrorIs(t, err, backend.ErrOutOfRange)
}

func TestFileBackendBlockDeviceInUse(t *testing.T) {
	dev := loopDevice(t, 1<<20)
	b := openBlockDevice(t, dev, "", 1<<20, backend.Options{})
	defer b.Close()
	for _, ro := range []bool{false, true} {
		_, err := registry.Default().Open("file://"+dev, backend.Options{ReadOnly: ro})
		require.ErrorContains(t, err, "is in use", "read-only %v", ro)
	}
}

// TestFileBackendBlockDeviceTime: a block device reports the requests it completed (the file
// backend's own tests check a file on one, and a file on tmpfs, which has none).
func TestFileBackendBlockDeviceTime(t *testing.T) {
	b := openBlockDevice(t, loopDevice(t, 4<<20), "direct=true", 4<<20, backend.Options{})
	defer b.Close()
	backendtest.CheckDeviceTime(t, b)
}
