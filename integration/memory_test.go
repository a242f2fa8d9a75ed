package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMemoryPressure runs vm/guest/memory-pressure.sh (issue 52) in a guest of 512 MiB, with
// backend /dev/vda (2G) and SSD tier /dev/vdb (256M): `tierblk serve --ram 32MiB`, ext4 on its
// device and one process writing a file of 256 MiB with ordinary buffered writes, then sync; one
// boot for each frontend (ublk, kernel NBD) and mode (write-through, write-back), alone and with a
// memory hog holding all but 128 MiB of what was available: eight boots of one to three minutes
// under TCG (more than go test's default -timeout of 10 minutes: run it with -timeout 30m). After
// each run: no hung task (20 s), no I/O error, no ext4 error and no OOM kill of tierblk in dmesg
// (none at all without the hog); `e2fsck -fn` clean after the unmount and the file's checksums
// right after a remount with the page cache dropped; tierblk alive, every one of its threads with
// the flags PR_SET_IO_FLUSHER sets (so that it is never throttled for the dirty pages of the
// device it serves), its peak RSS (VmHWM) within the bound `tierblk stats --json` reports
// ("memory": "bound_bytes"; from a daemon that reports none, the RAM tier + the SSD tier's index
// + 64 MiB), and a SIGTERM that stops it cleanly. The guest's console, shown when a run fails,
// has each run's figures (VmHWM, VmRSS, the memory object, oom_score_adj, the time of each phase).
func TestMemoryPressure(t *testing.T) {
	guest, err := os.ReadFile("vm/guest/memory-pressure.sh")
	require.NoError(t, err)
	for _, frontend := range []string{"ublk", "nbd"} {
		for _, mode := range []string{"writethrough", "writeback"} {
			for _, hog := range []string{"no", "yes"} {
				name := frontend + "/" + mode
				if hog == "yes" {
					name += "/hog"
				}
				t.Run(name, func(t *testing.T) {
					script := fmt.Sprintf("frontends=%s\nmodes=%s\nhogs=%s\n%s", frontend, mode, hog, guest)
					path := filepath.Join(t.TempDir(), "memory-pressure.sh")
					require.NoError(t, os.WriteFile(path, []byte(script), 0o644))
					runVMWith(t, vmOptions{memMiB: 512}, path, "2G", "256M")
				})
			}
		}
	}
}
