package systemd

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// listenGram binds a unix datagram socket at addr, as the service manager does for NOTIFY_SOCKET.
func listenGram(t *testing.T, addr string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestNotify(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "notify.sock")
	abstract := fmt.Sprintf("@tierblk-test-%d", os.Getpid())
	tests := []struct {
		name   string
		listen string // where the test's manager listens; "" for nowhere
		socket string // NOTIFY_SOCKET
		state  string
		err    string // a substring of the error; "" for none
	}{
		{name: "unset: a no-op", socket: "", state: "READY=1"},
		{name: "path", listen: path, socket: path, state: "READY=1"},
		{name: "abstract", listen: abstract, socket: abstract, state: "STATUS=serving\nREADY=1"},
		{name: "relative path refused", socket: "notify.sock", state: "READY=1", err: "absolute path"},
		{name: "nobody listening", socket: filepath.Join(dir, "none.sock"), state: "READY=1", err: "NOTIFY_SOCKET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c *net.UnixConn
			if tt.listen != "" {
				c = listenGram(t, tt.listen)
			}
			t.Setenv("NOTIFY_SOCKET", tt.socket)
			err := Notify(tt.state)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.socket, os.Getenv("NOTIFY_SOCKET"), "Notify must leave the environment alone")
			if c == nil {
				return
			}
			buf := make([]byte, 4096)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
			n, err := c.Read(buf)
			require.NoError(t, err)
			require.Equal(t, tt.state, string(buf[:n]))
		})
	}
}

// passFD puts a duplicate of f's descriptor at fd, as the service manager places passed sockets,
// and closes it at cleanup.
func passFD(t *testing.T, fd int, f *os.File) {
	t.Helper()
	require.NoError(t, unix.Dup3(int(f.Fd()), fd, 0))
	t.Cleanup(func() { unix.Close(fd) })
}

func listenerFile(t *testing.T, network, addr string) *os.File {
	t.Helper()
	l, err := net.Listen(network, addr)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	f, err := l.(interface{ File() (*os.File, error) }).File()
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func TestListeners(t *testing.T) {
	// Descriptors far above those this test process uses, standing for 3, 4, ...
	const start = 200
	pid := os.Getpid()
	self := strconv.Itoa(pid)
	dir := t.TempDir()

	type passed func(t *testing.T, fd int)
	unixSock := func(t *testing.T, fd int) {
		passFD(t, fd, listenerFile(t, "unix", filepath.Join(t.TempDir(), "s.sock")))
	}
	tcpSock := func(t *testing.T, fd int) { passFD(t, fd, listenerFile(t, "tcp", "127.0.0.1:0")) }
	regularFile := func(t *testing.T, fd int) {
		f, err := os.Create(filepath.Join(dir, "file"))
		require.NoError(t, err)
		defer f.Close()
		passFD(t, fd, f)
	}
	udpSock := func(t *testing.T, fd int) {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(t, err)
		defer c.Close()
		f, err := c.(*net.UDPConn).File()
		require.NoError(t, err)
		defer f.Close()
		passFD(t, fd, f)
	}
	unlistened := func(t *testing.T, fd int) {
		s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		require.NoError(t, err)
		defer unix.Close(s)
		require.NoError(t, unix.Dup3(s, fd, 0))
		t.Cleanup(func() { unix.Close(fd) })
	}

	tests := []struct {
		name   string
		env    map[string]string
		passed []passed
		want   int      // listeners returned
		names  []string // their names
		err    string
	}{
		{name: "not activated", env: map[string]string{}},
		{name: "another process's sockets", env: map[string]string{"LISTEN_PID": strconv.Itoa(pid + 1), "LISTEN_FDS": "1"}},
		{name: "no count", env: map[string]string{"LISTEN_PID": self}},
		{name: "zero sockets", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "0"}},
		{name: "unix and tcp", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "2"},
			passed: []passed{unixSock, tcpSock}, want: 2, names: []string{"", ""}},
		{name: "named", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "2", "LISTEN_FDNAMES": "local:net"},
			passed: []passed{unixSock, tcpSock}, want: 2, names: []string{"local", "net"}},
		{name: "bad pid", env: map[string]string{"LISTEN_PID": "me", "LISTEN_FDS": "1"}, err: `LISTEN_PID="me"`},
		{name: "bad count", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "one"}, err: `LISTEN_FDS="one"`},
		{name: "negative count", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "-1"}, err: `LISTEN_FDS="-1"`},
		{name: "huge count", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "99999999"}, err: `LISTEN_FDS="99999999"`},
		{name: "names do not match the count", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "a:b"},
			passed: []passed{unixSock}, err: "LISTEN_FDNAMES"},
		{name: "more counted than passed", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "2"},
			passed: []passed{unixSock}, err: "not an open descriptor"},
		{name: "a file", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "1"},
			passed: []passed{regularFile}, err: "not a socket"},
		{name: "a datagram socket", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "1"},
			passed: []passed{udpSock}, err: "not a stream socket"},
		{name: "not listening (Accept=yes)", env: map[string]string{"LISTEN_PID": self, "LISTEN_FDS": "1"},
			passed: []passed{unlistened}, err: "Accept=no"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, p := range tt.passed {
				p(t, start+i)
			}
			ls, err := listeners(func(k string) string { return tt.env[k] }, pid, start)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				require.Nil(t, ls)
				return
			}
			require.NoError(t, err)
			require.Len(t, ls, tt.want)
			for i, l := range ls {
				defer l.Close()
				require.Equal(t, tt.names[i], l.Name)
				// Each accepts a connection made to its address.
				c, err := net.Dial(l.Addr().Network(), l.Addr().String())
				require.NoError(t, err)
				a, err := l.Accept()
				require.NoError(t, err)
				a.Close()
				c.Close()
			}
			for i := range tt.want {
				// Once a listener holds its own duplicate, the passed descriptor is closed, and a
				// descriptor that stays open has close-on-exec set.
				_, err := unix.FcntlInt(uintptr(start+i), unix.F_GETFD, 0)
				require.ErrorIs(t, err, unix.EBADF, "fd %d left open", start+i)
			}
			if tt.want > 0 {
				fd, err := ls[0].Listener.(interface{ File() (*os.File, error) }).File()
				require.NoError(t, err)
				flags, err := unix.FcntlInt(fd.Fd(), unix.F_GETFD, 0)
				require.NoError(t, err)
				require.NotZero(t, flags&unix.FD_CLOEXEC)
				fd.Close()
			}
		})
	}
}

func TestWatchdogInterval(t *testing.T) {
	pid := os.Getpid()
	tests := []struct {
		name string
		env  map[string]string
		want time.Duration
		err  string
	}{
		{name: "unset", env: map[string]string{}},
		{name: "ours", env: map[string]string{"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": strconv.Itoa(pid)}, want: 30 * time.Second},
		{name: "no pid: ours", env: map[string]string{"WATCHDOG_USEC": "500000"}, want: 500 * time.Millisecond},
		{name: "another process's", env: map[string]string{"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": strconv.Itoa(pid + 1)}},
		{name: "zero", env: map[string]string{"WATCHDOG_USEC": "0"}, err: `WATCHDOG_USEC="0"`},
		{name: "not a number", env: map[string]string{"WATCHDOG_USEC": "30s"}, err: `WATCHDOG_USEC="30s"`},
		{name: "bad pid", env: map[string]string{"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}, err: `WATCHDOG_PID="x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := watchdogInterval(func(k string) string { return tt.env[k] }, pid)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
