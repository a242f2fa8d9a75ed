package process

import (
	"errors"
	"os"
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
