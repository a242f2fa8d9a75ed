package uring

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// opsResult is what an op's done was given.
type opsResult struct {
	n   int
	err error
}

// reapOps submits and reaps on r until o has nothing in flight, as a ublk queue's loop does; it
// fails on a completion that is not an op's.
func reapOps(t *testing.T, r *Ring, o *Ops) {
	t.Helper()
	for o.InFlight() > 0 {
		require.NoError(t, r.Submit(1))
		r.Reap(func(c CQE) { require.True(t, o.Complete(c), "a completion that is not an op's: %+v", c) })
	}
}

// Ops reads and writes a file on a ring its caller reaps: whole transfers, a read that meets the
// file's end (the short read asked for again, then io.EOF with what was read), an errno, and
// no start where every op is in flight.
func TestOps(t *testing.T) {
	r := testRing(t, 8, 0)
	o := NewOps(r, 2)
	path := filepath.Join(t.TempDir(), "f")
	data := bytes.Repeat([]byte("tierblk!"), 2048) // 16 KiB
	require.NoError(t, os.WriteFile(path, make([]byte, len(data)), 0o600))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	fd := int(f.Fd())

	var got []opsResult
	record := func(n int, err error) { got = append(got, opsResult{n, err}) }
	require.True(t, o.WriteFile(fd, data, 0, true, record))
	require.Equal(t, 1, o.InFlight())
	reapOps(t, r, o)
	require.Equal(t, []opsResult{{len(data), nil}}, got)

	got = nil
	whole, tail := make([]byte, len(data)), make([]byte, 8192)
	require.True(t, o.ReadFile(fd, whole, 0, record))
	require.True(t, o.ReadFile(fd, tail, int64(len(data)-4096), record))
	require.False(t, o.ReadFile(fd, make([]byte, 4096), 0, record), "every op in flight: no start")
	reapOps(t, r, o)
	require.ElementsMatch(t, []opsResult{{len(data), nil}, {4096, io.EOF}}, got)
	require.Equal(t, data, whole)
	require.Equal(t, data[len(data)-4096:], tail[:4096])

	got = nil
	require.True(t, o.ReadFile(-1, whole, 0, record))
	reapOps(t, r, o)
	require.Equal(t, []opsResult{{0, unix.EBADF}}, got)

	require.False(t, o.Complete(CQE{UserData: 7}), "the owner's own completion")
}

// A short transfer asked for again while the owner's own entries fill the submission queue is
// finished with plain system calls: a read across the file's end gets what is there, then io.EOF.
func TestOpsRestWhenQueueFull(t *testing.T) {
	r := testRing(t, 2, 0)
	o := NewOps(r, 1)
	path := filepath.Join(t.TempDir(), "f")
	data := bytes.Repeat([]byte("tierblk!"), 1024) // 8 KiB
	require.NoError(t, os.WriteFile(path, data, 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()

	var got []opsResult
	tail := make([]byte, 8192)
	require.True(t, o.ReadFile(int(f.Fd()), tail, int64(len(data)-4096), func(n int, err error) {
		got = append(got, opsResult{n, err})
	}))
	require.NoError(t, r.Submit(1)) // the read's first, short, completion is in
	for range 2 {
		s, _, err := r.Get()
		require.NoError(t, err)
		s.Opcode, s.UserData = OpNop, 1
	}
	_, _, err = r.Get()
	require.Error(t, err, "the submission queue is full")
	r.Reap(func(c CQE) { require.True(t, o.Complete(c)) })
	require.Equal(t, []opsResult{{4096, io.EOF}}, got)
	require.Equal(t, data[len(data)-4096:], tail[:4096])
	require.Zero(t, o.InFlight())

	nops := 0
	for nops < 2 {
		require.NoError(t, r.Submit(1))
		r.Reap(func(c CQE) { require.False(t, o.Complete(c)); nops++ })
	}
}
