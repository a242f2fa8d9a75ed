package process

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStatFlags(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       uint64
		err        bool
	}{
		{"plain", "12 (tierblk) S 1 12 12 0 -1 4194624 100 0", 4194624, false},
		{"name with spaces and parentheses", "12 (a (b) c) R 1 12 12 0 -1 1573184 0", 1573184, false},
		{"no name", "12 tierblk S 1", 0, true},
		{"short", "12 (tierblk) S 1 12", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statFlags([]byte(tc.stat))
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// LowerOOMScore lowers, never raises, and says what it found.
func TestLowerOOMScore(t *testing.T) {
	old := OOMScoreFile
	t.Cleanup(func() { OOMScoreFile = old })
	OOMScoreFile = filepath.Join(t.TempDir(), "oom_score_adj")
	for _, tc := range []struct{ have, to, want int }{
		{0, -900, -900},
		{-1000, -900, -1000}, // a unit's lower setting stays
		{-900, -900, -900},
		{500, -900, -900},
	} {
		require.NoError(t, os.WriteFile(OOMScoreFile, []byte(strconv.Itoa(tc.have)+"\n"), 0o644))
		from, err := LowerOOMScore(tc.to)
		require.NoError(t, err)
		require.Equal(t, tc.have, from)
		b, err := os.ReadFile(OOMScoreFile)
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(tc.want), strings.TrimSpace(string(b)))
	}
	require.NoError(t, os.WriteFile(OOMScoreFile, []byte("x\n"), 0o644))
	_, err := LowerOOMScore(-900)
	require.ErrorContains(t, err, "oom_score_adj")
}

// ReadMemory reads figures that hang together: a resident set made of its kinds, a peak no lower,
// and a Go heap that holds what this test allocated.
func TestReadMemory(t *testing.T) {
	keep := make([]byte, 8<<20)
	for i := range keep {
		keep[i] = byte(i)
	}
	m, err := ReadMemory()
	require.NoError(t, err)
	require.NotZero(t, m.RSS)
	require.GreaterOrEqual(t, m.Peak, m.RSS)
	require.Equal(t, m.RSS, m.Anon+m.File+m.Shmem)
	require.Equal(t, m.Held, m.Anon+m.Shmem-m.Binary)
	require.GreaterOrEqual(t, m.GoHeap, uint64(len(keep)))
	runtime.KeepAlive(keep)
}

// Where the binary has no cgo (tierblk's builds; `go test -race` has it), every thread, those
// started after the call included, carries the flags. Where the kernel lets it (root outside a
// container).
func TestSetIOFlusher(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("PR_SET_IO_FLUSHER needs root")
	}
	err := SetIOFlusher()
	switch {
	case errors.Is(err, syscall.ENOTSUP):
		t.Skip("a cgo build (go test -race): the kernel VM tests check tierblk's own binary")
	case errors.Is(err, syscall.EPERM):
		t.Skip("not privileged in the initial namespace (a container): the kernel VM tests check it")
	}
	require.NoError(t, err)
	done := make(chan struct{})
	for range 4 {
		go func() { // a locked goroutine's thread is new or dedicated
			runtime.LockOSThread()
			<-done
		}()
	}
	without, err := ThreadsWithoutIOFlusher()
	close(done)
	require.NoError(t, err)
	require.Empty(t, without)
}

// smapsFileShmem counts, of the mappings of one file (by device and inode), the resident pages
// less the copied ones; other files' mappings, and anonymous ones, not at all.
func TestSmapsFileShmem(t *testing.T) {
	const smaps = `00400000-00c00000 r-xp 00000000 00:19 1234                       /bin/tierblk
Size:               8192 kB
Rss:                6000 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
00c00000-01000000 rw-p 00800000 00:19 1234                       /bin/tierblk (deleted)
Size:               4096 kB
Rss:                1000 kB
Anonymous:           600 kB
VmFlags: rd wr mr mw me ac
01000000-02000000 rw-s 00000000 00:1a 1234                       /run/tierblk/runlog-1
Rss:                4000 kB
Anonymous:             0 kB
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Rss:                4096 kB
Anonymous:          4096 kB
`
	for _, c := range []struct {
		name         string
		major, minor uint32
		ino          uint64
		want         uint64
	}{
		{"the binary's two mappings", 0, 0x19, 1234, (6000 + 1000 - 600) << 10},
		{"the same inode on another device", 0, 0x1a, 1234, 4000 << 10},
		{"a file not mapped", 0, 0x19, 99, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := smapsFileShmem(strings.NewReader(smaps), c.major, c.minor, c.ino)
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
	_, err := smapsFileShmem(strings.NewReader("00400000-00c00000 r-xp 00000000 zz 1234 /bin/x\n"), 0, 0x19, 1234)
	require.ErrorContains(t, err, "device")
}

// A binary run from a tmpfs (an initramfs, a live system) maps its pages as shared memory, which
// ReadMemory leaves out of what the process holds. This test's own binary, copied to /dev/shm and
// run there, reports its pages apart; where it runs from a disk, it reports none.
func TestBinaryOnTmpfs(t *testing.T) {
	if os.Getenv("TIERBLK_READ_MEMORY") != "" {
		m, err := ReadMemory()
		require.NoError(t, err)
		require.NoError(t, json.NewEncoder(os.Stdout).Encode(m))
		return
	}
	m, err := ReadMemory()
	require.NoError(t, err)
	if exeOnTmpfs() == nil {
		require.Zero(t, m.Binary, "a binary on a disk")
	}

	var fs syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &fs); err != nil || fs.Type != 0x01021994 { // TMPFS_MAGIC
		t.Skip("no tmpfs at /dev/shm")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("/dev/shm", "process-test")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "process.test")
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	cmd := exec.Command(bin, "-test.run=^TestBinaryOnTmpfs$")
	cmd.Env = append(os.Environ(), "TIERBLK_READ_MEMORY=1")
	out, err := cmd.Output()
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		t.Skipf("/dev/shm does not let programs run: %v", err)
	}
	require.NoError(t, err, "%s", out)
	var got Memory
	require.NoError(t, json.NewDecoder(bytes.NewReader(out)).Decode(&got), "%s", out)
	t.Logf("run from %s: its binary's pages %d KiB of its shared memory %d KiB", dir, got.Binary>>10, got.Shmem>>10)
	require.NotZero(t, got.Binary, "the pages of a binary on a tmpfs: %+v", got)
	require.LessOrEqual(t, got.Binary, got.Shmem)
	require.Equal(t, got.Anon+got.Shmem-got.Binary, got.Held)
}
