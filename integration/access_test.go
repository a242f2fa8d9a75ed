package integration

// Who may connect to `tierblk serve`: the TCP allow list (--allow) and the NBD unix sockets' mode
// and group (--socket-mode, --socket-group).

import (
	"bufio"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// refusedMetric is the line of /metrics that counts clients refused by --allow.
const refusedMetric = `tierblk_nbd_connections_refused_total{reason="not allowed"}`

// metricValue GETs /metrics from the admin endpoint at addr (HOST:PORT) and returns the value on
// the line that starts with series.
func metricValue(t *testing.T, addr, series string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	t.Fatalf("/metrics has no %s:\n%s", series, body)
	return ""
}

// TestAllowList: with --allow 127.0.0.1/32, a client from 127.0.0.2 (Linux routes all of 127/8 to
// lo, so a socket bound there stands for another host) is closed before the server sends it a
// byte, the log names its address and /metrics counts it; nbdinfo from 127.0.0.1 and over the unix
// socket is served.
func TestAllowList(t *testing.T) {
	requireTools(t, "nbdinfo")
	admin := freeTCPAddr(t)
	d := startServe(t, "--backend", "mem://16MiB", "--export", "disk0", "--allow", "127.0.0.1/32", "--admin", admin)
	require.Equal(t, "0", metricValue(t, admin, refusedMetric))

	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 10 * time.Second}
	nc, err := dialer.Dial("tcp", d.TCP)
	require.NoError(t, err, "the kernel accepts the connection; tierblk closes it")
	from := nc.LocalAddr().String()
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	n, err := io.Copy(io.Discard, nc)
	nc.Close()
	if err != nil {
		require.ErrorIs(t, err, syscall.ECONNRESET)
	}
	require.Zero(t, n, "bytes sent to a client that is not allowed")
	require.Eventually(t, func() bool {
		return strings.Contains(d.output.String(), `level=WARN msg="nbd: connection refused: its address is in none of the allowed networks" remote=`+from+"\n")
	}, 10*time.Second, 20*time.Millisecond, "a warning naming %s", from)
	require.Equal(t, "1", metricValue(t, admin, refusedMetric))

	for _, tr := range transports {
		out := mustRunTool(t, "nbdinfo", "--size", tr.uri(d, "disk0"))
		require.Equal(t, "16777216", strings.TrimSpace(out), tr.name)
	}
	require.Equal(t, "1", metricValue(t, admin, refusedMetric))
	warnings := 0
	for _, line := range strings.Split(d.output.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "connection refused") {
			warnings++
		}
	}
	require.Equal(t, 1, warnings, "one warning, for the one refused client")
}

// TestAllowListRefusesNbdinfo: a real client from an address not on the list fails to connect
// over TCP, and is served over the unix socket, which --allow does not govern.
func TestAllowListRefusesNbdinfo(t *testing.T) {
	requireTools(t, "nbdinfo")
	admin, tcp := freeTCPAddr(t), freeTCPAddr(t)
	sock := filepath.Join(shortTempDir(t), "t.sock")
	// Waiting on the unix socket alone, which listens after the TCP port (the order of --nbd):
	// startServe's check that the TCP port accepts would come from 127.0.0.1 and be refused too.
	startDaemon(t, tierblkPath, []string{"serve", "--backend", "mem://16MiB", "--allow", "192.0.2.0/24", "--allow", "fd00::/64",
		"--admin", admin, "--nbd", tcp, "--nbd", "unix:" + sock}, "unix:"+sock)
	require.Equal(t, "0", metricValue(t, admin, refusedMetric))
	out, err := runTool(t, "nbdinfo", "--size", tcpURI(tcp, ""))
	require.Error(t, err, "nbdinfo over TCP from 127.0.0.1:\n%s", out)
	require.Equal(t, "1", metricValue(t, admin, refusedMetric))
	require.Equal(t, "16777216", strings.TrimSpace(mustRunTool(t, "nbdinfo", "--size", unixURI(sock, ""))))
}

// TestUnixSocketMode: --socket-mode and --socket-group give the NBD unix socket that mode and
// group before clients connect; without them it has the mode the umask leaves. A group that does
// not exist, or that the daemon may not give the socket to, stops the start with an error naming
// the flag, and leaves no socket behind.
func TestUnixSocketMode(t *testing.T) {
	requireTools(t, "nbdinfo")
	stat := func(t *testing.T, path string) (fs.FileMode, uint32) {
		t.Helper()
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.NotZero(t, fi.Mode()&fs.ModeSocket, "%s is a socket", path)
		return fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid
	}

	t.Run("default", func(t *testing.T) {
		d := startServe(t, "--backend", "mem://1MiB")
		mode, gid := stat(t, d.Unix)
		require.Equal(t, 0o777&^umask(t), mode, "the umask's mode")
		require.Equal(t, uint32(os.Getegid()), gid)
	})
	t.Run("mode and group", func(t *testing.T) {
		g := otherGroup(t)
		d := startServe(t, "--backend", "mem://1MiB", "--socket-mode", "0600", "--socket-group", g.Name)
		mode, gid := stat(t, d.Unix)
		require.Equal(t, fs.FileMode(0o600), mode)
		require.Equal(t, g.Gid, strconv.FormatUint(uint64(gid), 10), "the group of %s", g.Name)
		require.Equal(t, "1048576", strings.TrimSpace(mustRunTool(t, "nbdinfo", "--size", unixURI(d.Unix, ""))))
	})
	t.Run("no such group", func(t *testing.T) {
		sock := filepath.Join(shortTempDir(t), "t.sock")
		code, out := runTierblk(t, "serve", "--backend", "mem://1MiB", "--nbd", "unix:"+sock, "--socket-group", "no-such-group-tierblk")
		require.Equal(t, 2, code, "a setting refused: a usage error\n%s", out)
		require.Contains(t, out, `--socket-group: no group "no-such-group-tierblk" on this machine`)
		require.NoFileExists(t, sock)
	})
	t.Run("group not permitted", func(t *testing.T) {
		// As a user that is not root and not in group 0, chown(2) to it is refused (EPERM).
		dir := shortTempDir(t)
		sock := filepath.Join(dir, "t.sock")
		cmd := exec.Command(tierblkPath, "serve", "--backend", "mem://1MiB", "--nbd", "unix:"+sock, "--socket-group", "0")
		if os.Geteuid() == 0 {
			// nobody, with a copy of the binary and a directory it may use.
			bin := filepath.Join(dir, "tierblk")
			data, err := os.ReadFile(tierblkPath)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(bin, data, 0o755))
			require.NoError(t, os.Chown(dir, 65534, 65534))
			cmd = exec.Command(bin, cmd.Args[1:]...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s", out)
		require.Equal(t, 2, exit.ExitCode(), "a setting the daemon may not apply: a usage error\n%s", out)
		require.Contains(t, string(out), `--socket-group: group "0": chown `+sock+": operation not permitted (a daemon not run as root")
		require.NoFileExists(t, sock)
	})
}

// umask is this process's umask, which `tierblk serve` inherits (from /proc: reading it with
// umask(2) would change it).
func umask(t *testing.T) fs.FileMode {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "Umask:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			require.NoError(t, err)
			return fs.FileMode(m)
		}
	}
	t.Fatal("no Umask in /proc/self/status")
	return 0
}

// otherGroup is a group other than this process's own that tierblk, run by it, may give its socket
// to: as root any (one Debian always has), else one of the user's supplementary groups.
func otherGroup(t *testing.T) *user.Group {
	t.Helper()
	var ids []string
	if os.Geteuid() == 0 {
		for _, name := range []string{"nogroup", "daemon", "users"} {
			if g, err := user.LookupGroup(name); err == nil {
				ids = append(ids, g.Gid)
			}
		}
	}
	gids, err := os.Getgroups()
	require.NoError(t, err)
	for _, gid := range gids {
		ids = append(ids, strconv.Itoa(gid))
	}
	for _, id := range ids {
		if g, err := user.LookupGroupId(id); err == nil && id != strconv.Itoa(os.Getegid()) {
			return g
		}
	}
	t.Fatalf("no group other than %d that this user may give a file to", os.Getegid())
	return nil
}
