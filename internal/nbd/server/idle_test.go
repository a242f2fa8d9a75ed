package server

import (
	"bytes"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/volume"
)

// With no room left in the kernel, a read and a write wait in the idle poller: the read until the
// peer sends, the write until the peer drains the socket, and stopReading wakes a read there.
func TestSockIdleWait(t *testing.T) {
	kernelWaits.Add(maxKernelWaits)
	defer kernelWaits.Add(-maxKernelWaits)
	a, b := detachedPair(t)
	require.NotNil(t, a.idle, "the kernel gave no idle poller")
	waitsIdle := func(s *sock, ev uint32) bool {
		s.idle.mu.Lock()
		defer s.idle.mu.Unlock()
		return s.want&ev != 0
	}

	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 8)
		n, err := a.Read(buf)
		require.NoError(t, err)
		got <- buf[:n]
	}()
	require.Eventually(t, func() bool { return waitsIdle(a, unix.EPOLLIN) }, 5*time.Second, time.Millisecond)
	_, err := b.Write([]byte("idle"))
	require.NoError(t, err)
	require.Equal(t, "idle", string(<-got))

	// More than the socket holds: the writer waits for the reader.
	msg := bytes.Repeat([]byte("tierblk!"), 1<<18)
	wrote := make(chan error, 1)
	go func() { wrote <- a.writev(msg[:1<<20], msg[1<<20:]) }()
	require.Eventually(t, func() bool { return waitsIdle(a, unix.EPOLLOUT) }, 5*time.Second, time.Millisecond)
	full := make([]byte, len(msg))
	require.NoError(t, b.readFull(full))
	require.NoError(t, <-wrote)
	require.Equal(t, msg, full)

	stopped := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 8))
		stopped <- err
	}()
	require.Eventually(t, func() bool { return waitsIdle(b, unix.EPOLLIN) }, 5*time.Second, time.Millisecond)
	b.stopReading()
	select {
	case err := <-stopped:
		require.ErrorIs(t, err, errReadStopped)
	case <-time.After(5 * time.Second):
		t.Fatal("stopReading did not wake the read waiting in the idle poller")
	}
}

// TestIdleConnections: 5,000 clients connected and quiet, and one that sends large READs and never
// takes the replies. The server holds a bounded number of OS threads (the calls that may sleep in
// the kernel, not one a connection) and memory (each connection's buffers, and the payload budget
// of the one that does not read); it serves another client meanwhile, and every quiet client when
// it comes back, after its wait in the kernel has run out.
func TestIdleConnections(t *testing.T) {
	const quiet = 5000
	var limit unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &limit))
	if limit.Cur < 2*quiet+1000 { // both ends of each connection are in this process
		t.Skipf("%d quiet connections need %d open files; the limit is %d", quiet, 2*quiet+1000, limit.Cur)
	}
	dev, _ := nbdtest.NewVolume(1<<20, 0x5a, volume.Options{})
	ts := startServer(t, Config{
		Exports:        []Export{{Name: "disk", Device: dev}},
		MaxConnections: quiet + 2,
		Logger:         slog.New(slog.DiscardHandler),
	})
	threadsBefore := threads(t)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	read := func(c *nbdtest.RawClient, cookie uint64) {
		t.Helper()
		// A deadline for this exchange: the one DialRaw set ran from the dial, and dialing
		// thousands of clients on a busy machine takes longer than it.
		require.NoError(t, c.NC.SetDeadline(time.Now().Add(time.Minute)))
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: cookie, Length: 4096}, nil)
		r := c.Reply()
		require.Equal(t, cookie, r.Cookie)
		require.Zero(t, r.Errno)
	}
	clients := make([]*nbdtest.RawClient, quiet)
	for i := range clients {
		clients[i] = nbdtest.DialRaw(t, "unix", ts.Sock)
		clients[i].Connect("disk", false)
		read(clients[i], 1) // in transmission: the server's reader waits for the next request
	}
	deaf := nbdtest.DialRaw(t, "unix", ts.Sock)
	deaf.Connect("disk", false)
	for i := range defaultMaxInFlight {
		deaf.Request(proto.Request{Type: proto.CmdRead, Cookie: uint64(i + 1), Length: 512 << 10}, nil)
	}

	other := nbdtest.DialRaw(t, "tcp", ts.TCP)
	other.Connect("disk", false)
	read(other, 1)

	grew := threads(t) - threadsBefore
	t.Logf("%d connections: %d more OS threads", quiet+2, grew)
	// The calls sleeping in the kernel, the Ps and the runtime's own: a tenth of the connections is
	// far more than that, and far fewer than one thread each.
	require.Less(t, grew, quiet/10, "OS threads for %d quiet connections", quiet)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	held := int64(after.HeapInuse+after.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	perConn := int64(2*connBufSize + 32<<10) // the buffers, the goroutine, the bookkeeping
	t.Logf("%d connections hold %d MiB", quiet+2, held>>20)
	require.Less(t, held, (quiet+2)*perConn+payloadBudget, "memory for %d quiet connections", quiet)

	time.Sleep(kernelWaitMax + 200*time.Millisecond) // the sleepers in the kernel move to the poller
	for _, c := range clients {
		read(c, 2)
	}
	read(other, 2)
	for _, c := range clients {
		c.NC.Close()
	}
	deaf.NC.Close()
	other.NC.Close()
	ts.waitIdle(t)
}

// threads is the number of OS threads of this process.
func threads(t *testing.T) int {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no Threads: line in /proc/self/status")
	return 0
}
