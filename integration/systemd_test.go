package integration

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func init() {
	toolPackages["systemd-socket-activate"] = "systemd"
	toolPackages["systemd-analyze"] = "systemd"
	toolPackages["make"] = "make"
}

// notifySocket is the service manager's end of NOTIFY_SOCKET: a unix datagram socket that, as
// systemd does, asks the kernel for each sender's credentials, so that a test can check the
// states came from the daemon's main process (what NotifyAccess=main accepts).
type notifySocket struct {
	Path  string
	conn  *net.UnixConn
	mu    sync.Mutex
	msgs  []notifyMsg
	added chan struct{} // signalled after each datagram
}

type notifyMsg struct {
	state string
	pid   int32
	at    time.Time
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(shortTempDir(t), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	raw, err := c.SyscallConn()
	require.NoError(t, err)
	require.NoError(t, raw.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}))
	require.NoError(t, err)
	n := &notifySocket{Path: path, conn: c, added: make(chan struct{}, 1)}
	go func() {
		buf, oob := make([]byte, 4096), make([]byte, 1024)
		for {
			m, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			msg := notifyMsg{state: string(buf[:m]), pid: -1, at: time.Now()}
			if scms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, scm := range scms {
					if cred, err := unix.ParseUnixCredentials(&scm); err == nil {
						msg.pid = cred.Pid
					}
				}
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, msg)
			n.mu.Unlock()
			select {
			case n.added <- struct{}{}:
			default:
			}
		}
	}()
	return n
}

func (n *notifySocket) states() []string {
	var s []string
	for _, m := range n.all() {
		s = append(s, m.state)
	}
	return s
}

// waitCount waits until at least count datagrams from index from on are exactly state.
func (n *notifySocket) waitCount(t *testing.T, state string, from, count int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		got := 0
		for _, m := range n.all()[from:] {
			if m.state == state {
				got++
			}
		}
		if got >= count {
			return
		}
		select {
		case <-n.added:
		case <-deadline:
			t.Fatalf("%d of %d %q after state %d: %q", got, count, state, from, n.states())
		}
	}
}

func (n *notifySocket) all() []notifyMsg {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]notifyMsg(nil), n.msgs...)
}

// waitFor waits until a datagram holds the assignment line, and returns its index.
func (n *notifySocket) waitFor(t *testing.T, line string) int {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		for i, m := range n.all() {
			for _, l := range strings.Split(m.state, "\n") {
				if l == line || (strings.HasSuffix(line, "*") && strings.HasPrefix(l, strings.TrimSuffix(line, "*"))) {
					return i
				}
			}
		}
		select {
		case <-n.added:
		case <-deadline:
			t.Fatalf("no %q among the states sent: %q", line, n.states())
		}
	}
}

// TestSystemdNotify runs serve as systemd runs a Type=notify service with WatchdogSec=, and checks
// the states it sends through NOTIFY_SOCKET, their order, their sender, and that READY=1 means a
// client can connect at once.
func TestSystemdNotify(t *testing.T) {
	requireTools(t, "nbdinfo")
	ns := listenNotify(t)
	sock := filepath.Join(shortTempDir(t), "tierblk.sock")
	cmd := exec.Command(tierblkPath, "serve", "--backend", "mem://64MiB", "--ram", "8MiB", "--nbd", "unix:"+sock)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+ns.Path, "WATCHDOG_USEC=400000")
	var out bytes.Buffer
	var outMu sync.Mutex
	cmd.Stdout, cmd.Stderr = lockedWriter{&out, &outMu}, lockedWriter{&out, &outMu}
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			outMu.Lock()
			t.Logf("tierblk output:\n%s", out.String())
			outMu.Unlock()
		}
	})

	ready := ns.waitFor(t, "READY=1")
	// At once: no polling, the socket must already answer.
	mustRunTool(t, "nbdinfo", "--size", unixURI(sock, ""))
	msgs := ns.all()
	require.Contains(t, msgs[ready].state, "STATUS=serving 1 export on "+sock)
	opening := ns.waitFor(t, "STATUS=opening 1 export")
	require.Less(t, opening, ready)

	// Watchdog pings keep coming after READY=1, every half of WATCHDOG_USEC.
	ns.waitCount(t, "WATCHDOG=1", ready, 3)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-exited:
		require.NoError(t, waitErr, "exit status after SIGTERM")
	case <-time.After(time.Minute):
		t.Fatal("tierblk did not exit within a minute of SIGTERM")
	}
	stopping := ns.waitFor(t, "STOPPING=1")
	flushing := ns.waitFor(t, "STATUS=stopping: flushing 1 export")
	require.Greater(t, stopping, ready)
	require.Greater(t, flushing, stopping)
	readies := 0
	for _, m := range ns.all() {
		require.Equal(t, int32(cmd.Process.Pid), m.pid, "state %q sent by another process than the main one", m.state)
		if strings.Contains(m.state, "READY=1") {
			readies++
		}
	}
	require.Equal(t, 1, readies)
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestSocketActivation serves NBD on sockets systemd-socket-activate passes (LISTEN_FDS) to
// nbdinfo, over TCP and a unix socket; the --nbd address given as well is not opened, and --allow
// still governs the passed TCP socket.
func TestSocketActivation(t *testing.T) {
	requireTools(t, "systemd-socket-activate", "nbdinfo")
	tests := []struct {
		name    string
		unix    bool
		allow   string
		refused bool
	}{
		{name: "tcp"},
		{name: "unix", unix: true},
		{name: "tcp, allowed", allow: "127.0.0.0/8"},
		{name: "tcp, not allowed", allow: "10.0.0.0/8", refused: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := shortTempDir(t)
			listen, uri := freeTCPAddr(t), ""
			if tt.unix {
				listen = filepath.Join(dir, "activated.sock")
				uri = unixURI(listen, "")
			} else {
				uri = tcpURI(listen, "")
			}
			ignored := filepath.Join(dir, "ignored.sock")
			args := []string{"-l", listen, tierblkPath, "serve", "--backend", "mem://64MiB", "--nbd", "unix:" + ignored}
			if tt.allow != "" {
				args = append(args, "--allow", tt.allow)
			}
			addr := listen
			if tt.unix {
				addr = "unix:" + listen
			}
			// The first connection (startDaemon's check) starts tierblk.
			d := startDaemon(t, "systemd-socket-activate", args, addr)
			out, err := runTool(t, "nbdinfo", "--size", uri)
			if tt.refused {
				require.Error(t, err, "nbdinfo from 127.0.0.1 with --allow %s:\n%s", tt.allow, out)
			} else {
				require.NoError(t, err, "nbdinfo %s:\n%s", uri, out)
				require.Equal(t, strconv.Itoa(64<<20), strings.TrimSpace(out))
			}
			require.NoFileExists(t, ignored, "an --nbd address was opened though the daemon was socket-activated")
			d.requireStop(syscall.SIGTERM)
			require.Contains(t, d.output.String(), "socket-activated")
			if tt.unix {
				_, err := os.Stat(listen)
				require.NoError(t, err, "the socket file belongs to the service manager; tierblk must leave it")
			}
		})
	}
}

// TestSocketActivationBadInput gives serve malformed activation and watchdog variables: each gets
// exit status 2 and an error naming the variable, before anything is served.
func TestSocketActivationBadInput(t *testing.T) {
	dir := shortTempDir(t)
	file := filepath.Join(dir, "notasocket")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	tests := []struct {
		name  string
		env   []string // LISTEN_PID=$$ is added, the process's own ID
		file  bool     // pass a regular file as fd 3
		msg   []string
		noPID bool
	}{
		{name: "count not a number", env: []string{"LISTEN_FDS=two"}, msg: []string{"LISTEN_FDS", "two"}},
		{name: "negative count", env: []string{"LISTEN_FDS=-1"}, msg: []string{"LISTEN_FDS", "-1"}},
		{name: "more counted than passed", env: []string{"LISTEN_FDS=1"}, msg: []string{"LISTEN_FDS", "fd 3", "counts more sockets than were passed"}},
		{name: "not a socket", env: []string{"LISTEN_FDS=1"}, file: true, msg: []string{"fd 3", "not a socket"}},
		{name: "names do not match", env: []string{"LISTEN_FDS=1", "LISTEN_FDNAMES=a:b"}, file: true, msg: []string{"LISTEN_FDNAMES"}},
		{name: "pid not a number", env: []string{"LISTEN_FDS=1", "LISTEN_PID=me"}, noPID: true, msg: []string{"LISTEN_PID", "me"}},
		{name: "watchdog not a number", env: []string{"WATCHDOG_USEC=30s"}, msg: []string{"WATCHDOG_USEC", "30s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(dir, "t.sock")
			// exec keeps the shell's process ID, which $$ names: LISTEN_PID is tierblk's own.
			script := `exec "$@"`
			if !tt.noPID {
				script = `LISTEN_PID=$$; export LISTEN_PID; exec "$@"`
			}
			cmd := exec.Command("sh", "-c", script, "sh", tierblkPath, "serve", "--backend", "mem://1MiB", "--nbd", "unix:"+sock)
			cmd.Env = append(os.Environ(), tt.env...)
			if tt.file {
				f, err := os.Open(file)
				require.NoError(t, err)
				defer f.Close()
				cmd.ExtraFiles = []*os.File{f}
			}
			timer := time.AfterFunc(20*time.Second, func() { _ = cmd.Process.Kill() })
			defer timer.Stop()
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "tierblk served with %v:\n%s", tt.env, out)
			require.Equal(t, 2, exit.ExitCode(), "%s", out)
			for _, m := range tt.msg {
				require.Contains(t, string(out), m)
			}
			require.NotContains(t, string(out), "goroutine")
			require.NoFileExists(t, sock, "a bad activation still served")
		})
	}
}

// TestSystemdUnits checks configs/'s units with systemd-analyze verify, on copies whose
// ExecStart= names the binary under test (verify requires the program to exist), and that a
// mistake in a unit is caught the same way.
func TestSystemdUnits(t *testing.T) {
	requireTools(t, "systemd-analyze")
	units, err := filepath.Glob("../configs/*@.s*")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"../configs/tierblk@.service", "../configs/tierblk@.socket"}, units)
	tests := []struct {
		name   string
		edit   func(string) string
		broken bool
	}{
		{name: "as shipped", edit: func(s string) string { return s }},
		{name: "an unknown key", edit: func(s string) string { return strings.Replace(s, "NotifyAccess=", "NotifyAcces=", 1) }, broken: true},
		{name: "a missing program", edit: func(s string) string { return strings.ReplaceAll(s, tierblkPath, "/nonexistent/tierblk") }, broken: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, u := range units {
				b, err := os.ReadFile(u)
				require.NoError(t, err)
				s := strings.ReplaceAll(string(b), "/usr/local/bin/tierblk", tierblkPath)
				require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(u)), []byte(tt.edit(s)), 0o644))
			}
			cmd := exec.Command("systemd-analyze", "verify", "tierblk@test.service", "tierblk@test.socket")
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if tt.broken {
				// verify exits 0 on an unknown key, only warning: any output is a failure.
				require.True(t, err != nil || len(out) > 0, "systemd-analyze verify accepted a broken unit")
				return
			}
			require.NoError(t, err, "%s", out)
			require.Empty(t, string(out), "systemd-analyze verify warned")
		})
	}
}

// TestMakeInstall runs `make install` twice: into a DESTDIR (checking the tree, and that an
// existing example config is kept), and with PREFIX and SYSCONFDIR under a temporary directory,
// whose installed units then pass systemd-analyze verify with the installed binary.
func TestMakeInstall(t *testing.T) {
	requireTools(t, "make", "systemd-analyze")
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "build", "tierblk")
	makeInstall := func(vars ...string) string {
		t.Helper()
		cmd := exec.Command("make", append([]string{"-s", "install", "BIN=" + bin}, vars...)...)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "make install %v:\n%s", vars, out)
		return string(out)
	}

	dest := filepath.Join(tmp, "dest")
	makeInstall("DESTDIR=" + dest)
	var files []string
	require.NoError(t, filepath.Walk(dest, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dest, p)
			files = append(files, rel+" "+fi.Mode().Perm().String())
		}
		return err
	}))
	require.ElementsMatch(t, []string{
		"usr/local/bin/tierblk -rwxr-xr-x",
		"usr/local/lib/systemd/system/tierblk@.service -rw-r--r--",
		"usr/local/lib/systemd/system/tierblk@.socket -rw-r--r--",
		"etc/tierblk/example.yaml -rw-r--r--",
	}, files)
	unit, err := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system/tierblk@.service"))
	require.NoError(t, err)
	require.Contains(t, string(unit), "\nExecStart=/usr/local/bin/tierblk serve --config /etc/tierblk/%i.yaml\n")
	example := filepath.Join(dest, "etc/tierblk/example.yaml")
	require.NoError(t, os.WriteFile(example, []byte("# edited\n"), 0o644))
	out := makeInstall("DESTDIR=" + dest)
	require.Contains(t, out, "keeping the existing")
	b, err := os.ReadFile(example)
	require.NoError(t, err)
	require.Equal(t, "# edited\n", string(b), "make install overwrote an existing config")

	prefix := filepath.Join(tmp, "prefix")
	makeInstall("PREFIX="+prefix, "SYSCONFDIR="+filepath.Join(prefix, "etc"))
	unitDir := filepath.Join(prefix, "lib/systemd/system")
	unit, err = os.ReadFile(filepath.Join(unitDir, "tierblk@.service"))
	require.NoError(t, err)
	require.Contains(t, string(unit), "\nExecStart="+prefix+"/bin/tierblk serve --config "+prefix+"/etc/tierblk/%i.yaml\n")
	cmd := exec.Command("systemd-analyze", "verify", "tierblk@test.service", "tierblk@test.socket")
	cmd.Dir = unitDir
	vout, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", vout)
	require.Empty(t, string(vout))
	code, vers := runCommand(t, filepath.Join(prefix, "bin/tierblk"), "version")
	require.Zero(t, code, vers)
}

func runCommand(t *testing.T, program string, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(program, args...).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}
