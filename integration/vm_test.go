package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// vmPassMarker is the line vm/init prints when the guest script succeeded.
const vmPassMarker = "TIERBLK-VM-RESULT: PASS"

// runVM boots the test kernel (vm/run.sh) with tierblk and guestScript in its initramfs and
// one blank raw virtio disk per size in disks (/dev/vda, /dev/vdb, ...), and fails the test,
// showing the guest's console, unless the script passed. Later kernel tests (ublk, crash
// recovery) add a script under vm/guest/ and call this.
func runVM(t *testing.T, guestScript string, disks ...string) {
	t.Helper()
	runVMWith(t, vmOptions{}, guestScript, disks...)
}

// vmOptions change the guest image and the machine it boots on.
type vmOptions struct {
	fio    bool // put fio in the image (a separate, larger cached image: VM_WITH_FIO=1)
	memMiB int  // the guest's RAM in MiB (run.sh --mem); 0: run.sh's default, 1024
}

func runVMWith(t *testing.T, o vmOptions, guestScript string, disks ...string) {
	t.Helper()
	requireTools(t, "qemu-system-x86_64")
	// Software emulation: a boot takes seconds, a test in the guest up to minutes, and several
	// times that beside the race-detector tests of other packages on CI's two cores (a guest
	// that takes 20 s alone took 300 s there): the timeout is only for a guest that hangs.
	const guestTimeout = 10 * time.Minute
	args := []string{"--script", guestScript, "--tierblk", tierblkPath, "--timeout", strconv.Itoa(int(guestTimeout.Seconds()))}
	for _, size := range disks {
		args = append(args, "--disk", size)
	}
	if o.memMiB > 0 {
		args = append(args, "--mem", strconv.Itoa(o.memMiB))
	}
	ctx, cancel := context.WithTimeout(context.Background(), guestTimeout+2*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "vm/run.sh", args...)
	if o.fio {
		cmd.Env = append(os.Environ(), "VM_WITH_FIO=1")
	}
	out, err := cmd.CombinedOutput()
	console := strings.ReplaceAll(string(out), "\r", "")
	if err != nil || !strings.Contains(console, "\n"+vmPassMarker) {
		t.Fatalf("guest script %s did not pass (%v):\n%s", guestScript, err, console)
	}
	t.Logf("guest script %s passed in %v", guestScript, time.Since(start).Round(time.Second))
}

func TestKernelNBDClient(t *testing.T) {
	runVM(t, "vm/guest/nbd-client.sh", "64M")
}

// TestKernelNBDClientTLS: the kernel's client (nbd-client with its certificate) over TLS, ext4 on
// top, against --tls require --tls-verify-peer; plain clients and clients without a certificate
// refused (vm/guest/nbd-client-tls.sh).
func TestKernelNBDClientTLS(t *testing.T) {
	ca := newPKI(t, "tierblk VM test CA")
	dirs := map[string]string{"server": ca.issue(serverCert, false, ca), "client": ca.issue(clientCert, false, ca)}
	var script strings.Builder
	for _, name := range []string{"server", "client"} {
		fmt.Fprintf(&script, "mkdir -p /tmp/%s\n", name)
		files, err := os.ReadDir(dirs[name])
		require.NoError(t, err)
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(dirs[name], f.Name()))
			require.NoError(t, err)
			fmt.Fprintf(&script, "cat >/tmp/%s/%s <<'EOF'\n%sEOF\n", name, f.Name(), b)
		}
	}
	guest, err := os.ReadFile("vm/guest/nbd-client-tls.sh")
	require.NoError(t, err)
	script.Write(guest)
	path := filepath.Join(t.TempDir(), "nbd-client-tls.sh")
	require.NoError(t, os.WriteFile(path, []byte(script.String()), 0o644))
	runVM(t, path, "64M")
}
