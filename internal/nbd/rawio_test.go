package nbd

import (
	"bytes"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/require"
)

// The raw reader and writer behave as the connection itself: whole writes, reads of what
// arrived, io.EOF at the end; beforeWait runs when a read finds nothing to read, and only then.
func TestRawIO(t *testing.T) {
	a, b := unixPair(t)
	r, _ := rawIO(a)
	_, w := rawIO(b)
	_, ok := r.(*rawReader)
	require.True(t, ok, "a socket's reader is a raw reader")

	// More than a unix socket's buffer: the writer must wait for the reader, not drop bytes.
	msg := bytes.Repeat([]byte("tierblk!"), 1<<17)
	done := make(chan error, 1)
	go func() {
		n, err := w.Write(msg)
		if err == nil && n != len(msg) {
			err = io.ErrShortWrite
		}
		b.Close()
		done <- err
	}()
	got, err := io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, msg, got)

	c, d := unixPair(t)
	_, w2 := rawIO(d)
	r2, _ := rawIO(c)
	rr2 := r2.(*rawReader)
	waits := 0
	wrote := make(chan error, 1)
	rr2.beforeWait = func() {
		waits++
		if waits == 1 {
			// The client answers only once the reader has said it waits, as a client waits
			// for the replies the reader sends there.
			go func() {
				_, err := w2.Write([]byte("x"))
				wrote <- err
			}()
		}
	}
	buf := make([]byte, 8)
	n, err := rr2.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "x", string(buf[:n]))
	require.GreaterOrEqual(t, waits, 1, "the read found the socket empty")
	require.NoError(t, <-wrote)

	// A unix socket's write lands in the peer's queue before it returns.
	_, err = w2.Write([]byte("yz"))
	require.NoError(t, err)
	before := waits
	n, err = rr2.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "yz", string(buf[:n]))
	require.Equal(t, before, waits, "bytes already there: no wait")
}

// Not a socket (net.Pipe): the connection itself, and no raw reader.
func TestRawIOPipe(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	r, w := rawIO(a)
	require.Equal(t, a, r)
	require.Equal(t, a, w)
	_, ok := r.(*rawReader)
	require.False(t, ok)
}

// The server's sockets get a send buffer as large as the kernel allows, up to what it asks for.
func TestSetSendBuffer(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/net/core/wmem_max")
	require.NoError(t, err)
	limit, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	a, _ := unixPair(t)
	setSendBuffer(a, sendBufSize)
	rc, err := a.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	var got int
	var gerr error
	require.NoError(t, rc.Control(func(fd uintptr) {
		got, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	}))
	require.NoError(t, gerr)
	// Linux doubles the value asked for, to leave room for its bookkeeping.
	require.Equal(t, 2*min(sendBufSize, limit), got)

	p, q := net.Pipe() // not a socket: nothing to set, nothing breaks
	defer p.Close()
	defer q.Close()
	setSendBuffer(p, sendBufSize)
}

func unixPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("unix", t.TempDir()+"/s")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	a, err := net.Dial("unix", l.Addr().String())
	require.NoError(t, err)
	b := <-accepted
	require.NotNil(t, b)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
