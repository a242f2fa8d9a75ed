package uring

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/testenv"
)

// testFile opens path with flags through a File of depth entries, or skips where io_uring is
// refused.
func testFile(t *testing.T, path string, flags, depth int) (*File, *os.File) {
	return testFileWaits(t, path, flags, depth, true)
}

// testFileWaits is testFile with a reaper that waits for completions on the eventfd (events) or in
// io_uring_enter.
func testFileWaits(t *testing.T, path string, flags, depth int, events bool) (*File, *os.File) {
	t.Helper()
	osf, err := os.OpenFile(path, flags, 0o600)
	require.NoError(t, err)
	t.Cleanup(func() { osf.Close() })
	f, err := newFile(int(osf.Fd()), path, depth, events)
	if Unavailable(err) {
		testenv.Skip(t, testenv.IOUring, err.Error())
	}
	require.NoError(t, err)
	require.Equal(t, events, f.events != nil, "the reaper waits on an eventfd")
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	return f, osf
}

// Many goroutines read and write disjoint blocks at once, more than the ring holds; every read
// returns what was written there, and the file holds it afterwards. The reaper waits for
// completions either way it can.
func TestFileConcurrent(t *testing.T) {
	for _, events := range []bool{true, false} {
		t.Run(map[bool]string{true: "eventfd", false: "enter"}[events], func(t *testing.T) {
			testFileConcurrent(t, events)
		})
	}
}

func testFileConcurrent(t *testing.T, events bool) {
	const blocks, bs = 256, 4096
	path := filepath.Join(t.TempDir(), "f")
	f, osf := testFileWaits(t, path, os.O_RDWR|os.O_CREATE, 8, events)
	want := make([]byte, blocks*bs)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for b := w; b < blocks; b += 16 {
				n, err := f.WriteAt(want[b*bs:(b+1)*bs], int64(b*bs))
				if err != nil || n != bs {
					t.Errorf("write block %d: %d, %v", b, n, err)
					return
				}
				got := make([]byte, bs)
				if n, err := f.ReadAt(got, int64(b*bs)); err != nil || n != bs || !bytes.Equal(got, want[b*bs:(b+1)*bs]) {
					t.Errorf("read block %d: %d, %v, same data: %v", b, n, err, bytes.Equal(got, want[b*bs:(b+1)*bs]))
					return
				}
			}
		})
	}
	wg.Wait()
	got := make([]byte, len(want))
	_, err := osf.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// Reads through O_DIRECT, the SSD tier's case, with aligned buffers.
func TestFileDirect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	data := bytes.Repeat([]byte("tierblk!"), 64<<10/8)
	require.NoError(t, os.WriteFile(path, data, 0o600))
	f, _ := testFile(t, path, os.O_RDONLY|unix.O_DIRECT, 4)
	buf := alignedBuf(4096, 8192)
	n, err := f.ReadAt(buf, 16384)
	if n == 0 && err != nil {
		testenv.Skip(t, testenv.DirectIO, err.Error())
	}
	require.NoError(t, err)
	require.Equal(t, data[16384:16384+8192], buf)
}

func alignedBuf(align, n int) []byte {
	b := make([]byte, n+align)
	off := 0
	for uintptr(unsafe.Pointer(&b[off]))%uintptr(align) != 0 {
		off++
	}
	return b[off : off+n]
}

// A read that runs past the end of the file returns what is there and io.EOF, as os.File does.
func TestFileShortRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, []byte("0123456789"), 0o600))
	f, _ := testFile(t, path, os.O_RDONLY, 2)
	buf := make([]byte, 8)
	n, err := f.ReadAt(buf, 6)
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, 4, n)
	require.Equal(t, "6789", string(buf[:n]))
}

// An error the kernel returns for a request reaches its caller, named, and the File goes on.
func TestFileError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, []byte("0123456789"), 0o600))
	f, _ := testFile(t, path, os.O_WRONLY, 2)
	_, err := f.ReadAt(make([]byte, 4), 0)
	require.ErrorIs(t, err, unix.EBADF)
	require.ErrorContains(t, err, path)
	n, err := f.WriteAt([]byte("ab"), 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

func TestFileClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, []byte("0123"), 0o600))
	f, _ := testFile(t, path, os.O_RDONLY, 2)
	require.NoError(t, f.Close())
	_, err := f.ReadAt(make([]byte, 2), 0)
	require.ErrorIs(t, err, ErrClosed)
}

// asyncResult is what ReadAtAsync's done was called with.
type asyncResult struct {
	n   int
	err error
}

// readAsync reads p at off through ReadAtAsync and waits for its done.
func readAsync(t *testing.T, f *File, p []byte, off int64) asyncResult {
	t.Helper()
	ch := make(chan asyncResult, 1)
	require.NoError(t, f.ReadAtAsync(p, off, func(n int, err error) { ch <- asyncResult{n, err} }))
	return <-ch
}

// ReadAtAsync: more reads at once than the ring holds each get their data, a read past the end
// gets what is there and io.EOF, an error the kernel returns reaches done, and a closed File
// refuses at once.
func TestFileReadAsync(t *testing.T) {
	const blocks, bs = 64, 4096
	path := filepath.Join(t.TempDir(), "f")
	want := make([]byte, blocks*bs)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	require.NoError(t, os.WriteFile(path, want, 0o600))
	f, _ := testFile(t, path, os.O_RDONLY, 4)
	got := make([]byte, len(want))
	var wg sync.WaitGroup
	for b := range blocks {
		wg.Add(1)
		require.NoError(t, f.ReadAtAsync(got[b*bs:(b+1)*bs], int64(b*bs), func(n int, err error) {
			defer wg.Done()
			if n != bs || err != nil {
				t.Errorf("block %d: %d, %v", b, n, err)
			}
		}))
	}
	wg.Wait()
	require.Equal(t, want, got)

	r := readAsync(t, f, make([]byte, 2*bs), int64(len(want)-bs))
	require.ErrorIs(t, r.err, io.EOF)
	require.Equal(t, bs, r.n)

	w, _ := testFile(t, path, os.O_WRONLY, 2)
	r = readAsync(t, w, make([]byte, 4), 0)
	require.ErrorIs(t, r.err, unix.EBADF)
	require.ErrorContains(t, r.err, path)

	require.NoError(t, f.Close())
	require.ErrorIs(t, f.ReadAtAsync(make([]byte, 4), 0, func(int, error) { t.Error("done called after Close") }), ErrClosed)
}
