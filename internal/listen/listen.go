// Package listen opens the daemon's listening sockets (NBD and admin) the same way: a unix socket's
// directory is created, and a socket file left by a process that died is replaced.
//
// It must never remove a socket that another live process is listening on, nor a path that is
// not a socket.
package listen

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Listen listens on network ("tcp" or "unix") at address.
func Listen(network, address string) (net.Listener, error) {
	if network == "unix" {
		if err := os.MkdirAll(filepath.Dir(address), 0o755); err != nil {
			return nil, err
		}
		if err := removeStale(address); err != nil {
			return nil, err
		}
	}
	return net.Listen(network, address)
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
