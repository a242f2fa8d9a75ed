// Package nbdkit runs nbdkit, the reference NBD server, as a real peer in tests of tierblk's NBD
// client and backend. It is for tests only: nothing the daemon builds may import it.
package nbdkit

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Server is one nbdkit process listening on a unix socket or a loopback TCP port.
type Server struct {
	Network string // "unix" or "tcp"
	Addr    string // the socket's path, or host:port
	t       testing.TB
	args    []string
	cmd     *exec.Cmd
}

// Start runs `nbdkit args...` (options, the plugin and its parameters) on a new unix socket
// (network "unix") or a free loopback port ("tcp"), waits until it listens, and kills it when the
// test ends.
func Start(t testing.TB, network string, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("nbdkit"); err != nil {
		t.Fatalf("nbdkit is not installed: run `make deps` (Debian package nbdkit)")
	}
	s := &Server{Network: network, t: t, args: args}
	switch network {
	case "unix":
		s.Addr = filepath.Join(t.TempDir(), "nbd.sock")
	case "tcp":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.Addr = l.Addr().String()
		l.Close()
	default:
		t.Fatalf("nbdkit: network %q is neither unix nor tcp", network)
	}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// Restart starts nbdkit again on the same address, after Kill.
func (s *Server) Restart() {
	t := s.t
	t.Helper()
	pidfile := filepath.Join(t.TempDir(), "pid")
	argv := []string{"-f", "--exit-with-parent", "-P", pidfile}
	if s.Network == "unix" {
		os.Remove(s.Addr) // left behind by a killed server
		argv = append(argv, "-U", s.Addr)
	} else {
		host, port, _ := net.SplitHostPort(s.Addr)
		argv = append(argv, "-i", host, "-p", port)
	}
	s.cmd = exec.Command("nbdkit", append(argv, s.args...)...)
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("nbdkit: %v", err)
	}
	// nbdkit writes its pid file once it is listening.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(pidfile); err == nil && len(b) > 0 {
			return
		}
	}
	s.Kill()
	t.Fatalf("nbdkit %v did not start within 10s", s.args)
}

// Kill stops the server without warning, as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}
