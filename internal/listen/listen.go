// Package listen opens the daemon's listening sockets (NBD and admin) the same way: a unix socket's
// directory is created, a socket file left by a process that died is replaced, and a unix socket's
// file can be given its mode and owner before any client can connect.
//
// It must never remove a socket that another live process is listening on, nor a path that is
// not a socket, and never let a client connect to a unix socket before its file is prepared.
package listen

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listen listens on network ("tcp" or "unix") at address.
func Listen(network, address string) (net.Listener, error) {
	if network == "unix" {
		return ListenUnix(address, nil)
	}
	return net.Listen(network, address)
}

// backlog is the queue of connections not yet accepted that a unix socket asks for: the kernel
// cuts it to net.core.somaxconn, which is what Go's own listeners get.
const backlog = 1<<16 - 1

// ListenUnix listens on a unix socket at path. prepare, if not nil, is called with path once the
// socket's file exists and before the socket listens, so that the mode and group it gives the
// file hold for every client (net.Listen creates the file and listens at once: a client could
// connect in between while the file has the umask's mode). If prepare fails, the file is removed
// and its error returned as it is. The listener removes the file when it is closed.
func ListenUnix(path string, prepare func(path string) error) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	fail := func(call string, err error) error {
		return &net.OpError{Op: "listen", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: os.NewSyscallError(call, err)}
	}
	unbind := func() {
		if !strings.HasPrefix(path, "@") { // an abstract socket (Linux) has no file
			os.Remove(path)
		}
	}
	// Close-on-exec set under ForkLock, as the net package does where socket(2) cannot set it.
	syscall.ForkLock.RLock()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, fail("socket", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // the listener holds a copy of its own
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, fail("bind", err)
	}
	if prepare != nil {
		if err = prepare(path); err != nil {
			unbind()
			return nil, err
		}
	}
	if err := unix.Listen(fd, backlog); err != nil {
		unbind()
		return nil, fail("listen", err)
	}
	l, err := net.FileListener(f)
	if err != nil {
		unbind()
		return nil, err
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(true) // as net.Listen's listeners do; one made from a file would not
	return ul, nil
}

// removeStale deletes a socket file left by a process that died, but refuses to touch one that
// still answers or a path that is not a socket.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; remove it or choose another path", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("%s is in use by another server", path)
	}
	return os.Remove(path)
}
