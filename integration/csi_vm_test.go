package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests of `tierblk csi`'s Node service, which stages volumes as kernel devices: in the VM
// (vm/run.sh), with csi-sanity and the tests' own CSI client (csiclient) copied into the guest.

var (
	csiToolsOnce sync.Once
	csiToolsDir  string
	csiToolsErr  error
)

// csiTools builds, once, static binaries of csi-sanity (go.mod's tool) and csiclient for the guest.
func csiTools(t *testing.T) (sanity, client string) {
	t.Helper()
	csiToolsOnce.Do(func() {
		csiToolsDir, csiToolsErr = os.MkdirTemp(filepath.Dir(tierblkPath), "csi-tools-")
		if csiToolsErr != nil {
			return
		}
		for pkg, name := range map[string]string{
			"github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity": "csi-sanity",
			"./integration/csiclient":                              "csiclient",
		} {
			build := exec.Command("go", "build", "-o", filepath.Join(csiToolsDir, name), pkg)
			build.Dir = ".."
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := build.CombinedOutput(); err != nil {
				csiToolsErr = fmt.Errorf("building %s: %w\n%s", pkg, err, out)
				return
			}
		}
	})
	require.NoError(t, csiToolsErr)
	return filepath.Join(csiToolsDir, "csi-sanity"), filepath.Join(csiToolsDir, "csiclient")
}

// runCSIVM boots the VM with guest script vm/guest/NAME.sh after vm/guest/csi-lib.sh, the plugin
// attaching volumes as attach (ublk or nbd), csi-sanity and csiclient in /bin, and fails the
// test unless the script passed.
func runCSIVM(t *testing.T, name, attach string, timeout time.Duration) {
	t.Helper()
	requireTools(t, "qemu-system-x86_64")
	sanity, client := csiTools(t)
	var script strings.Builder
	script.WriteString("attach=" + attach + "\n")
	for _, f := range []string{"vm/guest/csi-lib.sh", "vm/guest/" + name + ".sh"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		script.Write(b)
	}
	path := filepath.Join(t.TempDir(), name+"-"+attach+".sh")
	require.NoError(t, os.WriteFile(path, []byte(script.String()), 0o644))
	secs := strconv.Itoa(int(timeout.Seconds()))
	ctx, cancel := context.WithTimeout(context.Background(), timeout+2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "vm/run.sh", "--script", path, "--tierblk", tierblkPath, "--timeout", secs,
		"--file", sanity+":/bin/csi-sanity", "--file", client+":/bin/csiclient").CombinedOutput()
	console := strings.ReplaceAll(string(out), "\r", "")
	if err != nil || !strings.Contains(console, "\n"+vmPassMarker) {
		t.Fatalf("guest script %s (--attach %s) did not pass (%v):\n%s", name, attach, err, console)
	}
	t.Logf("guest script %s (--attach %s) passed in %v:\n%s", name, attach, time.Since(start).Round(time.Second), console)
}

// TestCSISanityNode: csi-sanity's whole suite, node included, passes against `tierblk csi
// --controller --node` with file system and block volumes, served as ublk devices and as kernel
// NBD devices; nothing is left staged after it (vm/guest/csi-sanity.sh).
func TestCSISanityNode(t *testing.T) {
	for _, attach := range []string{"ublk", "nbd"} {
		t.Run(attach, func(t *testing.T) { runCSIVM(t, "csi-sanity", attach, 9*time.Minute) })
	}
}

// TestCSINodeRestart: the node plugin stopped (SIGTERM) and killed (kill -9) under a writer of a
// published volume: the next plugin serves it again from its record, the writer sees no error,
// and every file reads back, also after an unstage and a new stage from the backing file alone;
// expanded while unstaged, the volume's next stage grows its file system (vm/guest/csi-restart.sh).
func TestCSINodeRestart(t *testing.T) {
	for _, attach := range []string{"ublk", "nbd"} {
		t.Run(attach, func(t *testing.T) { runCSIVM(t, "csi-restart", attach, 8*time.Minute) })
	}
}

// TestCSIUnstageWritesBack: unstaging a published block volume is refused; unstaging a write-back
// block volume whose backing store is full fails and keeps its record and SSD tier; once there is
// room, the retried unstage leaves every byte written to the volume in its backing file, and its
// device, SSD tier and record gone (vm/guest/csi-writeback.sh).
func TestCSIUnstageWritesBack(t *testing.T) {
	for _, attach := range []string{"ublk", "nbd"} {
		t.Run(attach, func(t *testing.T) { runCSIVM(t, "csi-writeback", attach, 5*time.Minute) })
	}
}

// TestCSIManyVolumes: three volumes staged at once get a device each; of two stages of one volume
// at once, one succeeds and the other is ABORTED (or finds it staged); a restarted plugin serves
// all three again and its admin endpoint shows each under its PV's name; they unstage at once and
// leave nothing; staged and published read-only, a volume reads back and refuses writes
// (vm/guest/csi-many.sh).
func TestCSIManyVolumes(t *testing.T) {
	for _, attach := range []string{"ublk", "nbd"} {
		t.Run(attach, func(t *testing.T) { runCSIVM(t, "csi-many", attach, 5*time.Minute) })
	}
}
