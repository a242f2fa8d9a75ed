package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHasPortal(t *testing.T) {
	out := "Portal: 127.0.0.1:3260,1\nPortal: [::1]:3261,1\n"
	require.True(t, hasPortal(out, "127.0.0.1:3260"))
	require.True(t, hasPortal(out, "[::1]:3261"))
	require.False(t, hasPortal(out, "127.0.0.1:326"))
	require.False(t, hasPortal("", "127.0.0.1:3260"))
}

func TestTGTDCommands(t *testing.T) {
	cmd := tgtdCommand("127.0.0.1:3260", 21000)
	require.Equal(t, "tgtd -f --iscsi portal=127.0.0.1:3260 --control-port 21000", strings.Join(cmd.Args, " "))
	require.True(t, cmd.SysProcAttr.Setpgid, "a process group of its own")
	var lines []string
	for _, c := range lunCommands(ISCSIIQN, "/w/lun.img") {
		lines = append(lines, strings.Join(c, " "))
	}
	require.Equal(t, []string{
		"--op new --mode target --tid 1 -T iqn.2026-11.org.tierblk:bench",
		"--op new --mode logicalunit --tid 1 --lun 1 -b /w/lun.img",
		"--op bind --mode target --tid 1 -I ALL",
	}, lines)
	_, err := (&tgtdServer{}).AddLUN(ISCSIIQN, "/w,x/lun.img", 1<<20)
	require.ErrorContains(t, err, "comma")
}

// TestISCSISetup starts the iSCSI part's tgtd (where this runs as root; `make deps` installs the
// tools, so a missing one fails the test):
// it serves the LUN on a sparse file of ISCSISize, the servers' URL names it, and Close stops tgtd
// and removes its control socket.
func TestISCSISetup(t *testing.T) {
	for _, tool := range []string{"tgtd", "tgtadm", "qemu-nbd"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: `make deps` installs it (Debian packages tgt, qemu-utils, qemu-block-extra)", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("tgtd needs root")
	}
	dir := t.TempDir()
	s, err := NBDTargets(NBDISCSI, "/bin/tierblk", dir)
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	require.Equal(t, ISCSIRows(), s.Rows)
	require.Equal(t, "unix socket", s.Transport)
	require.Len(t, s.Watch, 1)
	require.Equal(t, "tgtd", s.Watch[0].Name)
	args := s.Targets[1].Command("/q.sock").Args
	url := args[len(args)-1]
	require.Regexp(t, `^iscsi://127\.0\.0\.1:[0-9]+/`+regexp.QuoteMeta(ISCSIIQN)+`/1$`, url)
	require.Contains(t, s.Disk, url)
	fi, err := os.Stat(filepath.Join(dir, "lun.img"))
	require.NoError(t, err)
	require.Equal(t, int64(ISCSISize), fi.Size())

	// The tgtd behind it, found by its process: its control port and what it serves.
	pid := s.Watch[0].PID
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.NoError(t, err)
	argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	require.Equal(t, "--control-port", argv[len(argv)-2])
	control, err := strconv.Atoi(argv[len(argv)-1])
	require.NoError(t, err)
	portal := strings.TrimPrefix(argv[3], "portal=")
	require.Contains(t, url, "//"+portal+"/")
	srv := &tgtdServer{Portal: portal, Control: control}
	out, err := srv.adm("--op", "show", "--mode", "target")
	require.NoError(t, err)
	require.Contains(t, out, "Target 1: "+ISCSIIQN)
	require.Contains(t, out, "Backing store path: "+filepath.Join(dir, "lun.img"))
	require.Contains(t, out, "ALL")
	sock := filepath.Join(tgtdSocketDir, fmt.Sprintf("socket.%d", control))
	require.FileExists(t, sock)

	s.Close()
	closed = true
	_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
	require.ErrorIs(t, err, os.ErrNotExist, "tgtd is gone")
	require.NoFileExists(t, sock)
	require.NoFileExists(t, sock+".lock")
}
