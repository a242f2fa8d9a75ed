package file

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
)

func TestParseStat(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name, in string
		want     backend.DeviceTime
		err      string
	}{
		{"linux 6.x, 17 fields", " 75787949 11985509 4433185093 34369674 35457479 686032 722366104 37173554 28 4282668 73057812 23461584 28 560232448 1441671 979022 72912\n",
			backend.DeviceTime{Reads: 75787949, ReadTime: 34369674 * ms, Writes: 35457479, WriteTime: 37173554 * ms, InFlight: 28}, ""},
		{"linux 4.x, 11 fields", "10 0 80 7 3 1 24 50 0 57 57", backend.DeviceTime{Reads: 10, ReadTime: 7 * ms, Writes: 3, WriteTime: 50 * ms}, ""},
		{"idle device", "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0", backend.DeviceTime{}, ""},
		{"empty", "", backend.DeviceTime{}, "0 fields, want at least 11"},
		{"short", "1 2 3 4 5 6 7 8 9 10", backend.DeviceTime{}, "10 fields"},
		{"not a number", "1 2 3 x 5 6 7 8 9 10 11", backend.DeviceTime{}, "field 4"},
		{"negative", "1 2 3 4 -5 6 7 8 9 10 11", backend.DeviceTime{}, "field 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat([]byte(tc.in))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("10 0 80 7 3 1 24 50 0 57 57"))
	f.Add([]byte("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := parseStat(b)
		if err != nil && d != (backend.DeviceTime{}) {
			t.Fatalf("an error with a result: %+v", d)
		}
	})
}

// TestDeviceTime: a file on a block device reports the requests its device completed; a file on
// tmpfs, which has no device, says it cannot be timed. A block device itself (a loop device) is
// TestFileBackendBlockDeviceTime in integration/.
func TestDeviceTime(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(directDir(t), "f")
		f := mustOpen(t, fileURL(path, "direct=true&size=1MiB"), backend.Options{})
		defer f.Close()
		if f.statPath == "" {
			t.Skipf("no block device under %s", path)
		}
		backendtest.CheckDeviceTime(t, f)
	})
	t.Run("tmpfs", func(t *testing.T) {
		f := mustOpen(t, fileURL(filepath.Join(tmpfsDir(t), "f"), "size=1MiB"), backend.Options{})
		defer f.Close()
		_, err := f.DeviceTime()
		require.True(t, errors.Is(err, backend.ErrNotSupported), "DeviceTime on tmpfs: %v", err)
	})
}

// TestReadAtAsync: with direct reads through the ring, an aligned read starts and ends with the
// file's data; an unaligned one or one out of range is left to ReadAt, and a file without the
// ring does not start reads at all.
func TestReadAtAsync(t *testing.T) {
	dir := directDir(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 64<<10/16)
	path := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(path, want, 0o644))
	opened := mustOpen(t, fileURL(path, "direct=reads"), backend.Options{})
	defer opened.Close()
	if opened.ring == nil {
		testenv.Skip(t, testenv.IOUring, "no ring to read on")
	}
	f := opened.served().(ringFile)
	buf := bufpool.Aligned(8192)
	done := make(chan error, 1)
	require.True(t, f.ReadAtAsync(buf, 16384, func(err error) { done <- err }), "an aligned read")
	require.NoError(t, <-done)
	require.Equal(t, want[16384:16384+8192], buf)
	require.Zero(t, f.Waits(), "an asynchronous read keeps no goroutine waiting")
	never := func(error) { t.Error("done called for a read left to ReadAt") }
	require.False(t, f.ReadAtAsync(buf[1:4097], 0, never), "an unaligned buffer")
	require.False(t, f.ReadAtAsync(buf, 64<<10, never), "past the end")
	require.NoError(t, f.Close())
	for _, query := range []string{"direct=reads&uring=false", ""} {
		p := mustOpen(t, fileURL(path, query), backend.Options{})
		_, ok := p.served().(backend.AsyncReader)
		require.False(t, ok, "%q: without the ring, Open's file starts no read", query)
		require.NoError(t, p.Close())
	}
}

// TestDirectWritesOnRing: with direct=true, aligned writes other than FUA go through the file's
// ring, and FUA writes do not (RWF_DSYNC): with the ring closed under it, the first fail and the
// second still land.
func TestDirectWritesOnRing(t *testing.T) {
	path := filepath.Join(directDir(t), "f")
	require.NoError(t, os.WriteFile(path, make([]byte, 64<<10), 0o644))
	f := mustOpen(t, fileURL(path, "direct=true"), backend.Options{})
	defer f.Close()
	if f.ring == nil {
		testenv.Skip(t, testenv.IOUring, "no ring to write on")
	}
	buf := bufpool.Aligned(4096)
	copy(buf, "written")
	_, err := f.WriteAt(buf, 0)
	require.NoError(t, err)
	require.NoError(t, f.ring.Close())
	_, err = f.WriteAt(buf, 4096)
	require.ErrorIs(t, err, uring.ErrClosed, "an aligned write goes through the ring")
	_, err = f.WriteAtFUA(buf, 8192)
	require.NoError(t, err, "a FUA write does not")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, buf, got[0:4096])
	require.Equal(t, buf, got[8192:12288])
}
