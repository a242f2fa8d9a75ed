package nbd

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The raw reader and writer behave as the connection itself: whole writes, reads of what
// arrived, io.EOF at the end; pending sees unread bytes without consuming them.
func TestRawIO(t *testing.T) {
	a, b := unixPair(t)
	r, _, pending := rawIO(a)
	_, w, _ := rawIO(b)
	require.NotNil(t, pending)
	require.False(t, pending.any(), "nothing sent yet")

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
	_, w2, _ := rawIO(d)
	_, err = w2.Write([]byte("x"))
	require.NoError(t, err)
	_, _, pending2 := rawIO(c)
	require.Eventually(t, pending2.any, 5*time.Second, time.Millisecond)
	require.True(t, pending2.any(), "asking must not consume the byte")
}

// Not a socket (net.Pipe): the connection itself, and no pending check.
func TestRawIOPipe(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	r, w, pending := rawIO(a)
	require.Equal(t, a, r)
	require.Equal(t, a, w)
	require.Nil(t, pending)
	require.False(t, pending.any())
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
