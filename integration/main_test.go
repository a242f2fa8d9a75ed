// Package integration tests the tierblk binary as users run it: a separately built process
// driven over real sockets by real NBD peers (nbdinfo, qemu-io, nbdcopy, fio, nbdkit) and, in a
// virtual machine, by the Linux kernel's own NBD client.
//
// Every test of the other packages that runs one of these tools, qemu-nbd, tgtd or losetup lives here
// too, the others beside their packages:
//   - the NBD server and client (internal/nbd), in this process, against the same peers and
//     qemu-nbd (nbdserver_test.go, nbdclient_test.go);
//   - the NBD backend (pkg/backend/nbd) against nbdkit (nbdbackend_test.go);
//   - the iSCSI backend (pkg/backend/iscsi) against tgtd, alone and under `tierblk serve`
//     (iscsibackend_test.go, tgtd_test.go);
//   - the file backend (pkg/backend/file) on a loop device that losetup attaches
//     (filebackend_test.go);
//   - fio replaying a log of the trace recorder (internal/trace) (fiolog_test.go);
//   - `tierblk bench cache`, `writeback` and `cold` (internal/bench), which run fio against
//     tierblk, nbdkit and qemu-nbd (bench_test.go).
//
// Nothing here is mocked; a missing tool is a test failure, never a skip, because `make deps`
// (which `make test` runs) installs them all.
package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// tierblkPath is the binary TestMain builds for every test (and for the VM guest).
var tierblkPath string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tierblk-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	tierblkPath = filepath.Join(dir, "tierblk")
	// Static (CGO_ENABLED=0) so that the same binary runs inside the VM's initramfs.
	build := exec.Command("go", "build", "-o", tierblkPath, "./cmd/tierblk")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: building tierblk: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// toolPackages maps each external tool the tests run to the Debian package that has it.
var toolPackages = map[string]string{
	"nbdinfo":            "libnbd-bin",
	"nbdcopy":            "libnbd-bin",
	"qemu-io":            "qemu-utils",
	"qemu-nbd":           "qemu-utils",
	"qemu-img":           "qemu-utils",
	"fio":                "fio",
	"nbdkit":             "nbdkit",
	"qemu-system-x86_64": "qemu-system-x86",
	"losetup":            "mount",
	"certtool":           "gnutls-bin",
	"tgtd":               "tgt",
	"tgtadm":             "tgt",
	"prometheus":         "prometheus",
	"promtool":           "prometheus",
}

// requireTools fails the test (it does not skip: CI must run everything) when a tool is missing.
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: `make test` installs it through `make deps` (Debian package %s)",
				tool, toolPackages[tool])
		}
	}
}

// envCount returns the count in environment variable name, or def when it is unset: `make
// crash-campaign` raises the crash tests' numbers of kills and power cuts this way, while `make
// test` runs them as they are. A value that is not a whole number of at least 1 fails the test
// rather than running it some other number of times than asked.
func envCount(t *testing.T, name string, def int) int {
	t.Helper()
	s, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a whole number of at least 1 (unset: %d)", name, s, def)
	}
	return n
}

// sectorBytes is the unit in which the crash tests count what their checkers verified.
const sectorBytes = 512

// logCampaign logs the line of a crash test that `make crash-campaign` collects and sums: how many
// crashes (kind: "kill -9 cycles" or "power cuts") the test ran, and how many 512-byte sectors its
// checker compared with what the test's model allows after them.
func logCampaign(t *testing.T, crashes int, kind string, sectors int64) {
	t.Helper()
	t.Logf("crash-campaign: %s: %d %s, %d sectors verified", t.Name(), crashes, kind, sectors)
}

// openBackend opens rawURL through the daemon's registry of backends.
func openBackend(t *testing.T, rawURL string, opts backend.Options) backend.Backend {
	t.Helper()
	b, err := registry.Default().Open(rawURL, opts)
	require.NoError(t, err)
	return b
}

// shortTempDir is a temporary directory with a short path: unix socket paths are limited to
// 108 bytes, which t.TempDir's names (built from the test name) can exceed.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tb")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// freeTCPAddr returns a loopback address with a port that was free a moment ago.
func freeTCPAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// daemon is a running server: `tierblk serve`, or nbdkit as a backend.
type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	output *nbdtest.Buffer
	exited chan struct{} // closed when the process has been reaped
	err    error         // the result of Wait, valid once exited is closed
	// Unix and TCP are the listen addresses startServe chose (a socket path and HOST:PORT).
	Unix, TCP string
}

// startServe starts `tierblk serve ARGS... --nbd unix:SOCK --nbd 127.0.0.1:PORT` with a fresh
// socket and port, and waits until both accept connections.
func startServe(t *testing.T, args ...string) *daemon {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "tierblk.sock")
	tcp := freeTCPAddr(t)
	args = append(append([]string{"serve"}, args...), "--nbd", "unix:"+sock, "--nbd", tcp)
	d := startDaemon(t, tierblkPath, args, "unix:"+sock, tcp)
	d.Unix, d.TCP = sock, tcp
	return d
}

// startDaemon runs the server program with args and waits until every listen address accepts
// connections. At cleanup it stops the daemon with SIGTERM (if the test has not), requires exit
// status 0, and logs the daemon's output when the test failed.
func startDaemon(t *testing.T, program string, args []string, listen ...string) *daemon {
	t.Helper()
	return startCmd(t, exec.Command(program, args...), listen...)
}

// startCmd is startDaemon for a command the caller set up (another user, say).
func startCmd(t *testing.T, cmd *exec.Cmd, listen ...string) *daemon {
	t.Helper()
	program, args := cmd.Path, cmd.Args[1:]
	d := &daemon{t: t, output: &nbdtest.Buffer{}, exited: make(chan struct{}), cmd: cmd}
	// Registered first so it runs last, after the stop below has collected everything.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s %s output:\n%s", program, strings.Join(args, " "), d.output.String())
		}
	})
	d.cmd.Stdout, d.cmd.Stderr = d.output, d.output
	require.NoError(t, d.cmd.Start())
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-d.exited:
			return // the test stopped it and checked the status
		default:
		}
		if code := d.stop(syscall.SIGTERM); code != 0 {
			t.Errorf("%s exited with status %d after SIGTERM at cleanup, want 0", program, code)
		}
	})
	for _, addr := range listen {
		d.waitListening(addr)
	}
	return d
}

// waitListening polls addr ("unix:PATH" or HOST:PORT) until it accepts a connection.
func (d *daemon) waitListening(addr string) {
	d.t.Helper()
	network, address := "tcp", addr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, address = "unix", path
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-d.exited:
			d.t.Fatalf("%s exited before listening on %s: %v\n%s", d.cmd.Path, addr, d.err, d.output.String())
		default:
		}
		c, err := net.DialTimeout(network, address, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s does not accept connections on %s: %v", d.cmd.Path, addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends sig and returns the exit status. A daemon that does not exit within a minute is
// killed and fails the test.
func (d *daemon) stop(sig syscall.Signal) int {
	d.t.Helper()
	require.NoError(d.t, d.cmd.Process.Signal(sig))
	select {
	case <-d.exited:
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.t.Fatalf("%s did not exit within a minute of %v", d.cmd.Path, sig)
	}
	var exit *exec.ExitError
	if errors.As(d.err, &exit) {
		return exit.ExitCode()
	}
	require.NoError(d.t, d.err)
	return 0
}

// requireStop sends sig and requires exit status 0.
func (d *daemon) requireStop(sig syscall.Signal) {
	d.t.Helper()
	require.Zero(d.t, d.stop(sig), "exit status of %s after %v", d.cmd.Path, sig)
}

// unixURI and tcpURI are NBD URIs (as libnbd, qemu and fio take them) for an export.
func unixURI(sock, export string) string { return "nbd+unix:///" + export + "?socket=" + sock }
func tcpURI(addr, export string) string  { return "nbd://" + addr + "/" + export }

// transports lists the two ways every test reaches a daemon started by startServe.
var transports = []struct {
	name string
	uri  func(d *daemon, export string) string
}{
	{"unix", func(d *daemon, export string) string { return unixURI(d.Unix, export) }},
	{"tcp", func(d *daemon, export string) string { return tcpURI(d.TCP, export) }},
}

// runTool runs an external program with a timeout and returns its combined output and error.
func runTool(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// mustRunTool is runTool that fails the test, showing the output, when the program fails.
func mustRunTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := runTool(t, name, args...)
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	return out
}

// qemuIO runs qemu-io on a raw NBD URI with one -c per command.
func qemuIO(t *testing.T, uri string, cmds ...string) (string, error) {
	t.Helper()
	args := []string{"-f", "raw", uri}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	return runTool(t, "qemu-io", args...)
}

// mustQemuIO requires every command to succeed: qemu-io exits non-zero when one failed, and a
// failed pattern check prints "Pattern verification failed".
func mustQemuIO(t *testing.T, uri string, cmds ...string) {
	t.Helper()
	out, err := qemuIO(t, uri, cmds...)
	require.NoError(t, err, "qemu-io on %s:\n%s", uri, out)
	require.NotContains(t, out, "failed", "qemu-io on %s", uri)
}
