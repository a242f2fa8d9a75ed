package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMemoryPressure runs vm/guest/memory-pressure.sh in a guest of 512 MiB, with backend
// /dev/vda (2G) and SSD tier /dev/vdb (256M): `tierblk serve --ram 32MiB`, ext4 on its device and
// one process writing a file of 128 MiB with ordinary buffered writes, then sync, alone and then
// with a memory hog holding all but 96 MiB of what was available; one boot (about two minutes under
// TCG) for each frontend (ublk, kernel NBD) and mode (write-through, write-back). After each run:
// no hung task (20 s; with the hog, which drives the guest to the OOM killer, the kernel's default
// of 120 s), no I/O error, no ext4 error and no OOM kill of tierblk in dmesg (none at all without
// the hog); `e2fsck -fn` clean after the unmount and the file's checksums right after a remount
// with the page cache dropped; tierblk alive, its oom_score_adj below 0, every one of its threads
// with the flags PR_SET_IO_FLUSHER sets (so that it is never throttled for the dirty pages of the
// device it serves), the peak of what it holds within the bound `tierblk stats --json` reports
// ("memory": "held_peak_bytes", "bound_bytes"), and a SIGTERM that stops it cleanly. The guest's
// console, shown when a check fails, has each run's figures (VmHWM, VmRSS, the memory object,
// oom_score_adj, the time of each phase).
func TestMemoryPressure(t *testing.T) {
	guest, err := os.ReadFile("vm/guest/memory-pressure.sh")
	require.NoError(t, err)
	for _, frontend := range []string{"ublk", "nbd"} {
		for _, mode := range []string{"writethrough", "writeback"} {
			t.Run(frontend+"/"+mode, func(t *testing.T) {
				script := fmt.Sprintf("frontends=%s\nmodes=%s\n%s", frontend, mode, guest)
				path := filepath.Join(t.TempDir(), "memory-pressure.sh")
				require.NoError(t, os.WriteFile(path, []byte(script), 0o644))
				runVMWith(t, vmOptions{memMiB: 512}, path, "2G", "256M")
			})
		}
	}
}
