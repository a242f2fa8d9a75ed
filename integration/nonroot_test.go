package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend/backendtest"
)

// nobody is the user the tests of a daemon not run by root run it as.
const nobody = 65534

// asNobody skips t unless the test runs as root, and returns a directory of nobody's with a copy
// of tierblk nobody may run (the built one is in a directory of root's alone) and a command that
// runs it as nobody with args, without XDG_RUNTIME_DIR, as from a bare login.
func asNobody(t *testing.T) (dir string, command func(args ...string) *exec.Cmd) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run the daemon as nobody")
	}
	dir = shortTempDir(t)
	require.NoError(t, os.Chown(dir, nobody, nobody))
	bin := filepath.Join(dir, "tierblk")
	data, err := os.ReadFile(tierblkPath)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, data, 0o755))
	return dir, func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent"}
		return cmd
	}
}

// TestNonRootKill9 runs tierblk serve as a user other than root (nobody), as a fresh clone's `make
// run` by a user would, with no --run-dir and no XDG_RUNTIME_DIR: the daemon must find a run
// directory it may write by itself and keep its run log there, so that a kill -9 of a write-back
// cache loses no acknowledged write, as root's does. The write is never flushed: only the run log
// brings its record back.
func TestNonRootKill9(t *testing.T) {
	dir, command := asNobody(t)
	runDir := "/dev/shm/tierblk-65534"
	t.Cleanup(func() { os.RemoveAll(runDir) })
	args := []string{"serve", "--backend", "file://" + filepath.Join(dir, "disk.img") + "?size=16MiB",
		"--ssd", filepath.Join(dir, "ssd.img"), "--ssd-size", "8MiB", "--mode", "writeback"}
	serve := func() *daemon {
		sock := filepath.Join(dir, "tierblk.sock")
		d := startCmd(t, command(append(args, "--nbd", "unix:"+sock)...), "unix:"+sock)
		d.Unix = sock
		return d
	}

	d := serve()
	c := dialNBD(t, d.Unix)
	want := backendtest.Pattern(45, 64<<10)
	_, err := c.WriteAt(want, 1<<20)
	require.NoError(t, err)
	d.stop(syscall.SIGKILL)
	c.Close()
	out := d.output.String()
	require.Contains(t, out, "run_dir="+runDir, "the run directory it chose, in its log")
	require.NotContains(t, out, "no run log")

	d = serve()
	c = dialNBD(t, d.Unix)
	got := make([]byte, len(want))
	_, err = c.ReadAt(got, 1<<20)
	require.NoError(t, err)
	require.Equal(t, want, got, "the write acknowledged before the kill")
	require.NoError(t, c.Close())
	require.Zero(t, d.stop(syscall.SIGTERM))
	require.False(t, strings.Contains(d.output.String(), "no run log"))
}

// An SSD tier its user may not write is refused saying so, not with the file backend's advice to
// open it read-only, which a tier cannot be.
func TestNonRootSSDNotWritable(t *testing.T) {
	dir, command := asNobody(t)
	ssd := filepath.Join(dir, "ssd.img")
	require.NoError(t, os.WriteFile(ssd, make([]byte, 8<<20), 0o644)) // root's
	out, err := command("serve", "--backend", "file://"+filepath.Join(dir, "disk.img")+"?size=16MiB", "--ssd", ssd,
		"--nbd", "unix:"+filepath.Join(dir, "s.sock")).CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 1, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), ssd+" cannot be opened for writing (permission denied); an SSD tier is written to: fix its permissions (the daemon runs as uid 65534)")
	require.NotContains(t, string(out), "read-only")
}
