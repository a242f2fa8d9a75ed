package bench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// tgtd, the Linux SCSI target framework's user-space iSCSI target (Debian package tgt), serves the
// LUN of the iSCSI part of `tierblk bench nbd`. It runs as root: it keeps its control socket in
// /var/run/tgtd.

// tgtdSocketDir is where tgtd keeps the Unix socket tgtadm reaches it on, socket.N for control
// port N, and the lock file socket.N.lock that a running tgtd holds.
const tgtdSocketDir = "/var/run/tgtd"

// tgtdServer is one running tgtd.
type tgtdServer struct {
	Portal  string // the iSCSI portal, 127.0.0.1:PORT
	Control int    // tgtadm's --control-port
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has been waited for
	log     string        // the file its output goes to
}

// startTGTD starts tgtd in its own process group on a free port of 127.0.0.1, with a control port
// no other tgtd holds, its output in dir/tgtd.log, and waits until it answers tgtadm and listens
// on its portal. CheckISCSI says whether it can.
func startTGTD(dir string) (*tgtdServer, error) {
	control := 20000 + os.Getpid()%5000
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		// A control port whose lock file another tgtd holds makes tgtd exit at once; a portal that
		// was taken between choosing and binding it makes it run on without a portal.
		control = nextTGTDControl(control)
		ports, err := FreePorts(1)
		if err != nil {
			return nil, err
		}
		s, err := tryTGTD(dir, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), control)
		if err == nil {
			return s, nil
		}
		last = err
		control++
	}
	return nil, last
}

// nextTGTDControl is the first control port from port on whose lock file is not there: another
// tgtd's, or one a killed tgtd left behind (tgtd would take that over, but it may be another
// user's that is still starting).
func nextTGTDControl(port int) int {
	for ; ; port++ {
		if _, err := os.Stat(filepath.Join(tgtdSocketDir, fmt.Sprintf("socket.%d.lock", port))); errors.Is(err, os.ErrNotExist) {
			return port
		}
	}
}

func tryTGTD(dir, portal string, control int) (*tgtdServer, error) {
	s := &tgtdServer{Portal: portal, Control: control, exited: make(chan struct{}), log: filepath.Join(dir, "tgtd.log")}
	out, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	s.cmd = tgtdCommand(portal, control)
	s.cmd.Stdout, s.cmd.Stderr = out, out
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start tgtd: %w", err)
	}
	go func() { s.cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(15 * time.Second); err != nil {
		s.Stop()
		b, _ := os.ReadFile(s.log)
		return nil, fmt.Errorf("tgtd (portal %s, control port %d; it needs root): %w\n%s", portal, control, err, b)
	}
	return s, nil
}

// tgtdCommand is tgtd in the foreground, serving iSCSI on portal only, and tgtadm's on control,
// in a process group of its own (Ctrl-C on the benchmark must not reach it before the servers
// using it are stopped; Stop kills the group).
func tgtdCommand(portal string, control int) *exec.Cmd {
	cmd := exec.Command("tgtd", "-f", "--iscsi", "portal="+portal, "--control-port", strconv.Itoa(control))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// waitReady waits until tgtd lists its portal to tgtadm: it has bound it.
func (s *tgtdServer) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("tgtd exited: %v", s.cmd.ProcessState)
		default:
		}
		out, err := s.adm("--op", "show", "--mode", "portal")
		if err == nil && hasPortal(out, s.Portal) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("tgtd does not list portal %s: %q", s.Portal, out)
			}
			return fmt.Errorf("not ready within %s: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hasPortal says whether tgtadm's --op show --mode portal output lists portal ("Portal:
// 127.0.0.1:3260,1" for each, the target portal group after the comma).
func hasPortal(out, portal string) bool {
	for _, line := range strings.Split(out, "\n") {
		p, ok := strings.CutPrefix(strings.TrimSpace(line), "Portal: ")
		if ok && strings.HasPrefix(p, portal+",") {
			return true
		}
	}
	return false
}

// adm runs tgtadm on this tgtd's control port.
func (s *tgtdServer) adm(args ...string) (string, error) {
	out, err := exec.Command("tgtadm", append([]string{"-C", strconv.Itoa(s.Control), "--lld", "iscsi"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("tgtadm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// lunCommands are the tgtadm arguments that make target 1, named iqn, whose LUN 1 is the file img,
// open to every initiator.
func lunCommands(iqn, img string) [][]string {
	return [][]string{
		{"--op", "new", "--mode", "target", "--tid", "1", "-T", iqn},
		{"--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", img},
		{"--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"},
	}
}

// AddLUN makes target 1, named iqn, with LUN 1 on a new sparse file img of size bytes, and returns
// the LUN's iSCSI URL.
func (s *tgtdServer) AddLUN(iqn, img string, size int64) (string, error) {
	// tgtadm splits its parameters at commas.
	if strings.Contains(img, ",") {
		return "", fmt.Errorf("the LUN's file %s has a comma in its path, which tgtadm cannot take", img)
	}
	f, err := os.Create(img)
	if err != nil {
		return "", err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	for _, args := range lunCommands(iqn, img) {
		if _, err := s.adm(args...); err != nil {
			return "", err
		}
	}
	return iscsiURL(s.Portal, iqn, 1), nil
}

// iscsiURL is the URL of a LUN as tierblk's iSCSI backend and libiscsi (qemu's) read it.
func iscsiURL(portal, iqn string, lun int) string {
	return fmt.Sprintf("iscsi://%s/%s/%d", portal, iqn, lun)
}

// Stop kills tgtd's process group (tgtd catches SIGTERM and serves on, even with no targets) and
// removes its control socket and lock file, which a kill leaves behind.
func (s *tgtdServer) Stop() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	for _, f := range []string{"", ".lock"} {
		os.Remove(filepath.Join(tgtdSocketDir, fmt.Sprintf("socket.%d%s", s.Control, f)))
	}
}
