package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// scratchDir is a directory for gigabytes of sparse images that the test fills: on tmpfs
// (/dev/shm) where there is one with room, so that the fill runs at the CPU's speed rather than the
// disk's; else a temporary directory.
func scratchDir(t *testing.T, need int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err == nil && int64(st.Bavail)*int64(st.Bsize) > need {
		dir, err := os.MkdirTemp("/dev/shm", "tb")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return shortTempDir(t)
}

// ssdTierState is the SSD tier's part of `tierblk stats --json` that the scale test checks.
type ssdTierState struct {
	Lines             uint64 `json:"lines"`
	Failed            bool   `json:"failed"`
	Reason            string `json:"reason"`
	Checkpoints       uint64 `json:"checkpoints"`
	LargestCheckpoint uint64 `json:"largest_checkpoint_records"`
}

func ssdState(t *testing.T, admin string) ssdTierState {
	t.Helper()
	var resp struct {
		Exports []struct {
			Stats struct {
				Tiers []struct {
					Name string `json:"name"`
					ssdTierState
				} `json:"tiers"`
			} `json:"stats"`
		} `json:"exports"`
	}
	out := statsJSON(t, admin, &resp)
	require.Len(t, resp.Exports, 1)
	for _, tier := range resp.Exports[0].Stats.Tiers {
		if tier.Name == "ssd" {
			return tier.ssdTierState
		}
	}
	t.Fatalf("no SSD tier in the stats:\n%s", out)
	return ssdTierState{}
}

// TestCacheMillionLines fills an SSD tier of 4 KiB lines with more than a million lines as fast as
// fio can: sequential 1 MiB reads in write-through (every read caches 256 new lines), 4 KiB random
// writes in write-back. The checkpoints of the tier's index then hold tens of thousands of records
// each, more than one metadata transaction takes. The tier must stay in service, and a restart
// after kill -9 (once the index has been checkpointed) and after a clean stop must find every line.
//
// In write-through the backend holds fio's verification pattern, and the first fill is cut short by
// kill -9 while its checkpoints land: after the restart every byte must still verify, served from
// the lines the tier found or from the backend.
func TestCacheMillionLines(t *testing.T) {
	requireTools(t, "fio")
	const (
		lines = 1 << 20
		fill  = lines * 4096
	)
	// verified is fio's sequential write of a crc32c-verified pattern over the first 4 GiB, 1 MiB at
	// a time; with --verify_only it reads and checks it instead.
	verified := []string{"--rw=write", "--bs=1m", "--iodepth=8", "--verify=crc32c", "--verify_fatal=1"}
	// Each mode with a layout of the SSD tier: slots (reduction zero), and packed (compress, the
	// default), whose tier keeps up to 1/16 of its room free for reclaim: fio's data does not
	// compress, so it needs that much more room for the same lines.
	for _, tc := range []struct {
		mode, reduction, ssdSize string
		fio                      []string
	}{
		{"writethrough", "zero", "4200MiB", append([]string{"--verify_only"}, verified...)},
		{"writeback", "", "4480MiB", []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			dir := scratchDir(t, 3*fill)
			disk := filepath.Join(dir, "disk.img")
			o := cacheOpts{backend: "file://" + disk + "?size=5GiB", dir: dir,
				ram: "0", ssdSize: tc.ssdSize, line: "4KiB", mode: tc.mode, reduction: tc.reduction}
			fioArgs := func(d *daemon) []string {
				return append([]string{"--name=fill", "--ioengine=nbd", "--uri=" + unixURI(d.Unix, ""), "--size=4g"}, tc.fio...)
			}
			if tc.mode == "writethrough" {
				f, err := os.Create(disk)
				require.NoError(t, err)
				require.NoError(t, f.Truncate(5<<30))
				require.NoError(t, f.Close())
				mustRunTool(t, "fio", append([]string{"--name=fill", "--ioengine=psync", "--filename=" + disk,
					"--size=4g", "--do_verify=0"}, verified...)...)
				d := startServe(t, o.args()...)
				cut := exec.Command("fio", fioArgs(d)...)
				require.NoError(t, cut.Start())
				time.Sleep(3 * time.Second)
				s := ssdState(t, o.admin())
				d.stop(syscall.SIGKILL)
				_ = cut.Wait() // it fails: its server was killed
				t.Logf("killed with %d lines cached; %d checkpoints, the largest %d records", s.Lines, s.Checkpoints, s.LargestCheckpoint)
				require.Greater(t, s.LargestCheckpoint, uint64(4096), "no checkpoint before the kill needed more than one metadata transaction")
			}
			d := startServe(t, o.args()...)
			start := time.Now()
			mustRunTool(t, "fio", fioArgs(d)...)
			took := time.Since(start)
			s := ssdState(t, o.admin())
			require.False(t, s.Failed, "the SSD tier failed during the fill: %s", s.Reason)
			require.GreaterOrEqual(t, s.Lines, uint64(lines))
			t.Logf("%s: %d lines in %v (%.0f lines/s); %d checkpoints, the largest %d records",
				tc.mode, s.Lines, took.Round(time.Millisecond), float64(s.Lines)/took.Seconds(), s.Checkpoints, s.LargestCheckpoint)
			require.Greater(t, s.LargestCheckpoint, uint64(4096), "no checkpoint needed more than one metadata transaction")

			// The index is checkpointed every second: after that, kill -9 loses none of it.
			time.Sleep(2500 * time.Millisecond)
			d.stop(syscall.SIGKILL)
			for _, how := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
				start := time.Now()
				d = startServe(t, o.args()...)
				ready := time.Since(start)
				after := ssdState(t, o.admin())
				require.False(t, after.Failed, after.Reason)
				require.Equal(t, s.Lines, after.Lines, "lines found after a restart that followed %v", how)
				t.Logf("restart after %v: serving %d lines after %v", how, after.Lines, ready.Round(time.Millisecond))
				d.requireStop(syscall.SIGTERM)
			}
		})
	}
}
