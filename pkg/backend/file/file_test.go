package file

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
)

func openURL(t *testing.T, raw string, opts backend.Options) (*File, error) {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	b, err := Open(u, opts)
	if err != nil {
		return nil, err
	}
	if r, ok := b.(ringFile); ok {
		return r.File, nil
	}
	return b.(*File), nil
}

func mustOpen(t *testing.T, raw string, opts backend.Options) *File {
	t.Helper()
	f, err := openURL(t, raw, opts)
	require.NoError(t, err)
	return f
}

// makeFile creates path with size bytes of content (a hole if content is nil).
func makeFile(t *testing.T, path string, size int64, content []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, content, 0o644))
	require.NoError(t, os.Truncate(path, size))
}

// directDir returns a directory whose file system supports O_DIRECT, or skips the test.
func directDir(t *testing.T) string {
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	fd, err := unix.Open(probe, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o644)
	if err != nil {
		testenv.Skip(t, testenv.DirectIO, fmt.Sprintf("the file system of %s refuses O_DIRECT: %v", dir, err))
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, bufpool.Aligned(dioAlign), 0); err != nil {
		testenv.Skip(t, testenv.DirectIO, fmt.Sprintf("the file system of %s refuses direct writes: %v", dir, err))
	}
	return dir
}

// tmpfsDir returns a fresh directory on tmpfs (/dev/shm), or skips the test.
func tmpfsDir(t *testing.T) string {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Skip("/dev/shm is not a tmpfs here")
	}
	dir, err := os.MkdirTemp("/dev/shm", "tierblk-file-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func fileURL(path, query string) string {
	return (&url.URL{Scheme: "file", Path: path, RawQuery: query}).String()
}

// TestConformance runs the suite on files; on a block device (a loop device, which needs losetup
// and root) it is TestFileBackendBlockDeviceConformance in integration/.
func TestConformance(t *testing.T) {
	sized := func(dir func(*testing.T) string, query string) backendtest.Opener {
		return func(t *testing.T, size int64) backend.Backend {
			path := filepath.Join(dir(t), "disk.img")
			return mustOpen(t, fileURL(path, query+"size="+strconv.FormatInt(size, 10)), backend.Options{})
		}
	}
	cases := []struct {
		name string
		open backendtest.Opener
	}{
		{"created sparse", sized((*testing.T).TempDir, "")},
		{"tmpfs", sized(tmpfsDir, "")},               // refuses FALLOC_FL_ZERO_RANGE: the fallback runs
		{"direct", sized(directDir, "direct=true&")}, // reads and writes through io_uring
		{"direct reads", sized(directDir, "direct=reads&")},
		{"direct, pread", sized(directDir, "direct=true&uring=false&")},
		{"direct reads, pread", sized(directDir, "direct=reads&uring=false&")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { backendtest.Run(t, c.open) })
	}
}

func TestReadOnlyConformance(t *testing.T) {
	backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
		path := filepath.Join(t.TempDir(), "disk.img")
		require.NoError(t, os.WriteFile(path, content, 0o444))
		return mustOpen(t, fileURL(path, ""), backend.Options{ReadOnly: true})
	})
}

func TestParseURL(t *testing.T) {
	cases := []struct {
		url     string
		want    config
		wantErr string
	}{
		{"file:///srv/disk.img", config{path: "/srv/disk.img"}, ""},
		{"file://localhost/srv/disk.img", config{path: "/srv/disk.img"}, ""},
		{"file:///srv/../srv/disk.img?direct=true&size=1GiB", config{path: "/srv/disk.img", direct: directAll, size: 1 << 30}, ""},
		{"file:///srv/disk.img?direct=reads", config{path: "/srv/disk.img", direct: directReads}, ""},
		{"file:///srv/disk%20one.img?direct=0", config{path: "/srv/disk one.img"}, ""},
		{"file://nas/srv/disk.img", config{}, `host "nas": only local files`},
		{"file:disk.img", config{}, "absolute path"},
		{"file://", config{}, "absolute path"},
		{"file://user@/srv/disk.img", config{}, "no user name"},
		{"file:///srv/disk#1.img", config{}, "%23"},
		{"file:///srv/disk.img?sync=1&cache=none", config{}, "unknown parameter cache, sync; valid: allocate, direct, size, uring"},
		{"file:///srv/disk.img?direct=reads&uring=false", config{path: "/srv/disk.img", direct: directReads, noRing: true}, ""},
		{"file:///srv/disk.img?uring=maybe", config{}, `uring="maybe": want true or false`},
		{"file:///srv/disk.img?allocate=true", config{path: "/srv/disk.img", allocate: true}, ""},
		{"file:///srv/disk.img?allocate=some", config{}, `allocate="some": want true or false`},
		{"file:///srv/disk.img?direct=yes", config{}, `direct="yes": want true, false or reads`},
		{"file:///srv/disk.img?direct=true&direct=false", config{}, "direct given 2 times"},
		{"file:///srv/disk.img?size=12X", config{}, "size: size \"12X\" is not a number"},
		{"file:///srv/disk.img?size=0", config{}, "at least one byte"},
		{"nbd:///srv/disk.img", config{}, "not file"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			u, err := url.Parse(c.url)
			require.NoError(t, err)
			got, err := parseURL(u)
			if c.wantErr != "" {
				require.ErrorContains(t, err, c.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.img")
	makeFile(t, existing, 1<<20, []byte("keep me"))
	odd := filepath.Join(dir, "odd.img")
	makeFile(t, odd, 5000, nil)
	empty := filepath.Join(dir, "empty.img")
	makeFile(t, empty, 0, nil)
	missing := filepath.Join(dir, "missing.img")
	cases := []struct {
		name    string
		url     string
		ro      bool
		wantErr string
	}{
		{"missing without size", fileURL(missing, ""), false, "does not exist; add ?size=SIZE"},
		{"missing read-only", fileURL(missing, "size=1MiB"), true, "read-only backend does not create it"},
		{"missing directory", fileURL(filepath.Join(dir, "nodir", "x.img"), "size=1MiB"), false,
			"directory " + filepath.Join(dir, "nodir") + " does not exist"},
		{"parent is a file", fileURL(filepath.Join(existing, "x.img"), "size=1MiB"), false, "not a directory"},
		{"size mismatch", fileURL(existing, "size=2MiB"), false,
			"is 1MiB (1048576 bytes) but size=2MiB (2097152 bytes) was asked; it is not resized"},
		{"directory", fileURL(dir, ""), false, "is a directory, not a regular file or block device"},
		{"character device", fileURL("/dev/null", ""), true, "is a character device"},
		{"empty file", fileURL(empty, ""), false, "is empty"},
		{"direct on an odd size", fileURL(odd, "direct=true"), false, "multiple of 4096"},
		{"creating an odd size", fileURL(missing, "size=5000"), false,
			"cannot create " + missing + " of 5000 bytes (size=): a new file must be a whole number of 4KiB blocks; use 4KiB (4096 bytes) or 8KiB (8192 bytes)"},
		{"creating a decimal gigabyte", fileURL(missing, "size=1000000000"), false,
			"use 976560KiB (999997440 bytes) or 976564KiB (1000001536 bytes)"},
		{"creating less than a block", fileURL(missing, "size=512"), false, "use 4KiB (4096 bytes)"},
		{"direct creating an odd size", fileURL(missing, "direct=true&size=5000"), false, "whole number of 4KiB blocks"},
		{"decimal unit", fileURL(missing, "size=1GB"), false, `size "1GB": decimal units are not accepted`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := openURL(t, c.url, backend.Options{ReadOnly: c.ro})
			require.ErrorContains(t, err, c.wantErr)
		})
	}
	// An existing file of a size no new one may have is served as it is.
	f := mustOpen(t, fileURL(odd, "size=5000"), backend.Options{})
	require.Equal(t, int64(5000), f.Size())
	require.NoError(t, f.Close())
	// Nothing was created, resized or truncated on the way.
	_, err := os.Stat(missing)
	require.ErrorIs(t, err, os.ErrNotExist)
	got, err := os.ReadFile(existing)
	require.NoError(t, err)
	require.Len(t, got, 1<<20)
	require.Equal(t, "keep me", string(got[:7]))
}

func allocatedBytes(t *testing.T, path string) int64 {
	var st unix.Stat_t
	require.NoError(t, unix.Stat(path, &st))
	return st.Blocks * 512
}

func TestCreateSparseAndPunch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	f := mustOpen(t, fileURL(path, "size=1TiB"), backend.Options{})
	defer f.Close()
	require.Equal(t, int64(1<<40), f.Size())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, int64(1<<40), fi.Size())
	require.Zero(t, allocatedBytes(t, path), "created sparse")

	_, err = f.WriteAt(make([]byte, 1<<20), 1<<39)
	require.NoError(t, err)
	require.NoError(t, f.Flush())
	require.GreaterOrEqual(t, allocatedBytes(t, path), int64(1<<20))
	require.NoError(t, f.Trim(0, f.Size()))
	require.Zero(t, allocatedBytes(t, path), "trim punches holes")

	require.NoError(t, f.WriteZeroes(0, 1<<20, false))
	require.GreaterOrEqual(t, allocatedBytes(t, path), int64(1<<20), "zeroes without unmap stay allocated")
	require.NoError(t, f.WriteZeroes(0, 1<<20, true))
	require.Zero(t, allocatedBytes(t, path), "zeroes with unmap punch a hole")
}

func TestZeroFallbackOnTmpfs(t *testing.T) {
	f := mustOpen(t, fileURL(filepath.Join(tmpfsDir(t), "disk.img"), "size=1MiB"), backend.Options{})
	defer f.Close()
	data := []byte("not zero yet")
	_, err := f.WriteAt(data, 4000)
	require.NoError(t, err)
	require.NoError(t, f.WriteZeroes(4001, 5, false))
	got := make([]byte, len(data))
	_, err = f.ReadAt(got, 4000)
	require.NoError(t, err)
	require.Equal(t, "n\x00\x00\x00\x00\x00ro yet", string(got))
	require.True(t, f.noZeroRange.Load(), "tmpfs was expected to refuse FALLOC_FL_ZERO_RANGE")
}

func TestLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	makeFile(t, path, 1<<20, nil)
	u := fileURL(path, "")
	w := mustOpen(t, u, backend.Options{})
	for _, ro := range []bool{false, true} {
		_, err := openURL(t, u, backend.Options{ReadOnly: ro})
		require.ErrorContains(t, err, "is in use", "read-only %v while open for writing", ro)
	}
	require.NoError(t, w.Close())

	r1 := mustOpen(t, u, backend.Options{ReadOnly: true})
	r2 := mustOpen(t, u, backend.Options{ReadOnly: true}) // readers share
	_, err := openURL(t, u, backend.Options{})
	require.ErrorContains(t, err, "is in use")
	require.NoError(t, r1.Close())
	require.NoError(t, r2.Close())
	w = mustOpen(t, u, backend.Options{}) // Close released the lock
	require.NoError(t, w.Close())
}

func TestReadOnlyFileSystem(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, 0) })
	path := filepath.Join(dir, "disk.img")
	makeFile(t, path, 1<<20, []byte("data"))
	require.NoError(t, unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""))

	_, err := openURL(t, fileURL(path, ""), backend.Options{})
	require.ErrorContains(t, err, "cannot be opened for writing")
	require.ErrorContains(t, err, "open it read-only")
	require.ErrorIs(t, err, syscall.EROFS)

	f := mustOpen(t, fileURL(path, ""), backend.Options{ReadOnly: true})
	defer f.Close()
	got := make([]byte, 4)
	_, err = f.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, "data", string(got))
}

func TestFileShrunkUnderneath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	f := mustOpen(t, fileURL(path, "size=1MiB"), backend.Options{})
	defer f.Close()
	require.NoError(t, os.Truncate(path, 4096))
	_, err := f.ReadAt(make([]byte, 4096), 8192)
	require.ErrorContains(t, err, "ends early")
	require.True(t, backend.IsRetryable(err), "a disk error, not a caller's mistake")
}

// TestDirectFlag checks which descriptor has O_DIRECT: direct=reads reads through a second one.
func TestDirectFlag(t *testing.T) {
	dir := directDir(t)
	direct := func(f *os.File) bool {
		flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
		require.NoError(t, err)
		return flags&unix.O_DIRECT != 0
	}
	for _, c := range []struct {
		param         string
		writes, reads bool
	}{
		{"false", false, false},
		{"true", true, true},
		{"reads", false, true},
	} {
		f := mustOpen(t, fileURL(filepath.Join(dir, "disk-"+c.param+".img"), "size=1MiB&direct="+c.param), backend.Options{})
		require.Equal(t, c.writes, direct(f.f), "direct=%s: the descriptor that writes", c.param)
		require.Equal(t, c.reads, direct(f.r), "direct=%s: the descriptor that reads", c.param)
		// Direct reads go through io_uring, where the kernel allows it.
		if r, err := uring.New(1, 0); err == nil {
			require.NoError(t, r.Close())
			require.Equal(t, c.reads, f.ring != nil, "direct=%s: reads through io_uring", c.param)
		}
		// What waits on the disk counts in Waits (backend.Waiter); copies through the page cache do not.
		buf := make([]byte, 4096)
		_, err := f.ReadAt(buf, 0)
		require.NoError(t, err)
		_, err = f.WriteAt(buf, 0)
		require.NoError(t, err)
		want := map[bool]uint64{false: 0, true: 1}
		require.Equal(t, want[c.reads]+want[c.writes], f.Waits(), "direct=%s: a read and a write", c.param)
		require.NoError(t, f.Flush())
		require.Equal(t, want[c.reads]+want[c.writes]+1, f.Waits(), "direct=%s: and a flush", c.param)
		require.NoError(t, f.Close())
	}
}

// TestReadAtCached checks the page-cache read of each direct mode: it returns what was written, at
// any offset into any buffer (with direct=reads it does not go through the O_DIRECT descriptor,
// which would refuse an unaligned buffer), and refuses a range past the end.
func TestReadAtCached(t *testing.T) {
	dir := directDir(t)
	for _, param := range []string{"false", "true", "reads"} {
		f := mustOpen(t, fileURL(filepath.Join(dir, "cached-"+param+".img"), "size=1MiB&direct="+param), backend.Options{})
		data := bytes.Repeat([]byte("tierblk!"), 1000)
		_, err := f.WriteAt(data, 4096)
		require.NoError(t, err, "direct=%s", param)
		raw := make([]byte, len(data)+1)
		got := raw[1:] // never aligned
		_, err = f.ReadAtCached(got[:len(data)-3], 4096+3)
		require.NoError(t, err, "direct=%s", param)
		require.Equal(t, data[3:], got[:len(data)-3], "direct=%s", param)
		_, err = f.ReadAtCached(make([]byte, 4096), 1<<20-1)
		require.ErrorIs(t, err, backend.ErrOutOfRange, "direct=%s", param)
		require.NoError(t, f.Close())
	}
}

// A buffered write allocates nothing: the SSD tier makes one for every request it absorbs.
func TestWriteAllocatesNothing(t *testing.T) {
	f := mustOpen(t, fileURL(filepath.Join(t.TempDir(), "disk.img"), "size=1MiB"), backend.Options{})
	defer f.Close()
	p := make([]byte, 64<<10)
	n := testing.AllocsPerRun(100, func() {
		if _, err := f.WriteAt(p, 4096); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, n, "allocations a write")
}

// TestAllocate: allocate=true reserves the file's blocks at open, and on a file system without
// room the open fails, saying how much the file needs, and leaves no file behind.
func TestAllocate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ssd.img")
	f := mustOpen(t, fileURL(path, "size=1MiB&allocate=true"), backend.Options{})
	require.GreaterOrEqual(t, allocatedBytes(t, path), int64(1<<20))
	require.NoError(t, f.Close())

	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(small, 0) })
	full := filepath.Join(small, "ssd.img")
	_, err := openURL(t, fileURL(full, "size=4MiB&allocate=true"), backend.Options{})
	require.ErrorIs(t, err, unix.ENOSPC)
	require.ErrorContains(t, err, "needs 4MiB on its file system")
	require.NoFileExists(t, full)
}
