package server

import (
	"bytes"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/require"
)

// A detached socket behaves as the connection did: whole writes, reads of what arrived, io.EOF
// at the end; beforeWait runs when a read finds nothing to read, and only then.
func TestSock(t *testing.T) {
	a, b := detachedPair(t)

	// More than a unix socket's buffer: the writer must wait for the reader, not drop bytes.
	msg := bytes.Repeat([]byte("tierblk!"), 1<<17)
	done := make(chan error, 1)
	go func() {
		n, err := b.Write(msg)
		if err == nil && n != len(msg) {
			err = io.ErrShortWrite
		}
		b.hangUp()
		done <- err
	}()
	got, err := io.ReadAll(a)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, msg, got)

	c, d := detachedPair(t)
	waits := 0
	wrote := make(chan error, 1)
	c.beforeWait = func() {
		waits++
		if waits == 1 {
			// The client answers only once the reader has said it waits, as a client waits
			// for the replies the reader sends there.
			go func() {
				_, err := d.Write([]byte("x"))
				wrote <- err
			}()
		}
	}
	buf := make([]byte, 8)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "x", string(buf[:n]))
	require.Equal(t, 1, waits, "the read found the socket empty")
	require.NoError(t, <-wrote)

	// A unix socket's write lands in the peer's queue before it returns.
	_, err = d.Write([]byte("yz"))
	require.NoError(t, err)
	n, err = c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "yz", string(buf[:n]))
	require.Equal(t, 1, waits, "bytes already there: no wait")

	// readFull waits for all of p, across writes and a vectored write.
	big := bytes.Repeat([]byte{7}, 3<<20)
	go func() {
		wrote <- d.writev([]byte("hdr"), big[:1<<20], big[1<<20:])
	}()
	full := make([]byte, 3+len(big))
	require.NoError(t, c.readFull(full))
	require.NoError(t, <-wrote)
	require.Equal(t, "hdr", string(full[:3]))
	require.Equal(t, big, full[3:])

	// recv2 fills its first buffer, then the second, in one call, with what has arrived.
	_, err = d.Write([]byte("headpay"))
	require.NoError(t, err)
	head, pay := make([]byte, 4), make([]byte, 8)
	n, err = c.recv2(head, pay)
	require.NoError(t, err)
	require.Equal(t, 7, n)
	require.Equal(t, "head", string(head))
	require.Equal(t, "pay", string(pay[:3]))

	// The end in the middle of a readFull is unexpected; before it, plain EOF.
	_, err = d.Write([]byte("ab"))
	require.NoError(t, err)
	d.hangUp()
	require.ErrorIs(t, c.readFull(make([]byte, 4)), io.ErrUnexpectedEOF)
	require.ErrorIs(t, c.readFull(make([]byte, 4)), io.EOF)
}

// stopReading wakes a read sleeping in the kernel and fails every later one, while writes go on;
// hangUp and close may race, and close is final.
func TestSockStop(t *testing.T) {
	a, b := detachedPair(t)
	got := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 8))
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("read returned before anything was sent: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	a.stopReading()
	select {
	case err := <-got:
		require.ErrorIs(t, err, errReadStopped)
	case <-time.After(5 * time.Second):
		t.Fatal("stopReading did not wake the read")
	}
	// Bytes the client sent after the stop are not read.
	_, err := b.Write([]byte("late"))
	if err == nil {
		_, err = a.Read(make([]byte, 8))
		require.ErrorIs(t, err, errReadStopped)
	}
	// The replies still go out.
	_, err = a.Write([]byte("reply"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	require.NoError(t, b.readFull(buf))
	require.Equal(t, "reply", string(buf))

	a.hangUp()
	_, err = a.Write([]byte("after"))
	require.Error(t, err, "a hung-up socket takes no more writes")
	a.close()
	a.hangUp() // after close: nothing happens to whatever file takes the number
	a.close()
}

// Not a socket (net.Pipe): nothing to detach, and the connection stays usable.
func TestDetachPipe(t *testing.T) {
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	sk, err := detach(p)
	require.NoError(t, err)
	require.Nil(t, sk)
	go q.Write([]byte("ok"))
	buf := make([]byte, 2)
	_, err = io.ReadFull(p, buf)
	require.NoError(t, err)
}

// A connection asks for a send buffer as large as the kernel allows, up to what it asks for.
func TestSetSendBuffer(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/net/core/wmem_max")
	require.NoError(t, err)
	limit, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	a, _ := detachedPair(t)
	a.setSendBuffer(sendBufSize)
	got, err := unix.GetsockoptInt(a.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	require.NoError(t, err)
	// Linux doubles the value asked for, to leave room for its bookkeeping.
	require.Equal(t, 2*min(sendBufSize, limit), got)
}

// detachedPair returns the two ends of a unix socket connection, detached.
func detachedPair(t *testing.T) (*sock, *sock) {
	t.Helper()
	a, b := unixPair(t)
	sa, err := detach(a)
	require.NoError(t, err)
	sb, err := detach(b)
	require.NoError(t, err)
	t.Cleanup(func() { sa.close(); sb.close() })
	return sa, sb
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
