package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The test here checks the SSD tier's data reduction (--reduction) as a new user would: fio
// writes and verifies data that is half zeros through every setting, in both a mode that keeps
// the backend current (writethrough) and one that holds data only on the SSD tier (writeback),
// over a data set larger than the tier, so that lines are evicted and, with compress, segments
// reclaimed while the data is still being checked. A warm restart must find the same data, and
// what tierblk serves must be what the backend holds once the dirty data is written back.

// reductions are the --reduction settings that are built.
var reductions = []string{"off", "zero", "compress"}

// reductionFio are the fio workloads of TestCacheReduction, each run by fioVerify and again
// with --verify_only after a restart. fio seeds its generators the same way on every run
// (randrepeat), so a run writes the same offsets and data each time, and --verify_only can check
// them again. --buffer_compress_percentage=50 makes the first half of every write random and the
// second half zeros; --refill_buffers gives each write new data.
var reductionFio = []struct {
	jobs int
	args []string
}{
	// Four connections write 5 MiB each at random (0..20M of the 32M disk, more than twice the
	// 8 MiB SSD tier), in block sizes of which 6k and 20k end inside a 4 KiB block. fio puts its
	// verify header at the start of every 4 KiB (the smallest block size), so no block is all
	// zeros: about half the blocks are random, the others a header and zeros, which compress well.
	{4, []string{"--name=mixed", "--rw=randwrite", "--bssplit=4k/25:6k/20:20k/20:64k/20:192k/15",
		"--iodepth=16", "--size=5m", "--offset_increment=5m", "--buffer_compress_percentage=50", "--refill_buffers"}},
	// One connection writes 20M..24M in 64k blocks, with one header each: the second half of
	// every write is eight 4 KiB blocks of zeros, written as data.
	{1, []string{"--name=zeros", "--rw=randwrite", "--bs=64k", "--iodepth=8", "--offset=20m", "--size=4m",
		"--buffer_compress_percentage=50", "--refill_buffers"}},
}

// reductionWrites are qemu-io writes in the region fio leaves alone (24M..32M): zeroing written
// as WRITE_ZEROES and as data, whole lines, blocks inside a line and a range that starts and ends
// inside 4 KiB blocks, and zeroing data that is cached. reductionReads check what they leave,
// and that never-written blocks (zeros on the backend) read back as zeros.
var (
	reductionWrites = []string{
		"write -P 0xc1 24M 2M",
		"write -z 24640k 64k", // a whole line
		"write -z 24708k 8k",  // two blocks inside a line
		fmt.Sprintf("write -z %d %d", 24896<<10+1000, 10000),
		"write -P 0 26M 64k", // zeros written as data
		"write -P 0xc2 27M 256k",
		"write -z 27M 256k", // cached data zeroed
		fmt.Sprintf("write -P 0x79 %d 4k", 32<<20-4096),
	}
	reductionReads = []string{
		"read -P 0xc1 24M 64k",
		"read -P 0 24640k 64k",
		"read -P 0xc1 24704k 4k",
		"read -P 0 24708k 8k",
		fmt.Sprintf("read -P 0xc1 24716k %d", 24896<<10+1000-24716<<10),
		fmt.Sprintf("read -P 0 %d %d", 24896<<10+1000, 10000),
		fmt.Sprintf("read -P 0xc1 %d %d", 24896<<10+11000, 26<<20-(24896<<10+11000)),
		"read -P 0 26M 1M",
		"read -P 0 27M 256k",
		fmt.Sprintf("read -P 0 28M %d", 4<<20-4096),
		fmt.Sprintf("read -P 0x79 %d 4k", 32<<20-4096),
	}
)

func TestCacheReduction(t *testing.T) {
	requireTools(t, "nbdkit", "fio", "qemu-io", "nbdcopy")
	for _, reduction := range reductions {
		t.Run(reduction, func(t *testing.T) {
			for _, mode := range []string{"writethrough", "writeback"} {
				t.Run(mode, func(t *testing.T) { checkReduction(t, reduction, mode) })
			}
		})
	}

	t.Run("dedupe refused", func(t *testing.T) {
		o := cacheOpts{backend: "mem://32MiB", dir: shortTempDir(t), ram: "2MiB", ssdSize: "8MiB", line: "64KiB",
			mode: "writethrough", reduction: "dedupe"}
		args := append(append([]string{"serve"}, o.args()...), "--nbd", "unix:"+filepath.Join(o.dir, "s.sock"))
		code, out := runTierblk(t, args...)
		require.Equal(t, 2, code, "tierblk serve --reduction dedupe: a usage error:\n%s", out)
		require.Contains(t, out, `reduction "dedupe" is not built yet; use off, zero or compress`)
		require.NotContains(t, out, "goroutine", "a refusal must not be a crash")
		// Refused before anything was made.
		require.NoFileExists(t, o.ssd())
		require.NoDirExists(t, o.meta())
	})

	t.Run("compress on a zero tier refused", checkLayoutRefused)
}

// checkReduction runs fio and qemu-io through one reduction setting and mode, checks the SSD
// tier's logical and physical bytes, restarts tierblk on the same SSD tier and checks the data
// again, then requires tierblk and the backend to hold the same image.
func checkReduction(t *testing.T, reduction, mode string) {
	sock := startNbdkit(t, slowDisk("32M")...)
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "2MiB", ssdSize: "8MiB", line: "64KiB",
		mode: mode, reduction: reduction}
	d := startServe(t, o.args()...)
	written := make([]int64, len(reductionFio))
	for i, f := range reductionFio {
		written[i] = fioVerify(t, tcpURI(d.TCP, ""), f.jobs, f.args...)
	}
	mustQemuIO(t, unixURI(d.Unix, ""), append(reductionWrites, reductionReads...)...)

	st := adminStats(t, o.admin())
	require.Equal(t, mode, st.Mode)
	require.Zero(t, st.Backend.Errors)
	for _, name := range []string{"ram", "ssd"} {
		ts := st.tier(t, name)
		require.False(t, ts.Failed, "%s tier failed: %+v", name, ts)
		require.Zero(t, ts.Errors, "%s tier errors", name)
	}
	ssd := st.tier(t, "ssd")
	require.Equal(t, reduction, ssd.Reduction)
	require.Positive(t, ssd.Evictions, "SSD tier evictions: the data set is larger than the tier")
	require.Positive(t, ssd.LogicalBytes, "SSD tier logical bytes")
	t.Logf("SSD tier: %d lines, %d logical bytes, %d physical bytes, ratio %.3f",
		ssd.Lines, ssd.LogicalBytes, ssd.PhysicalBytes, ssd.ReductionRatio)
	switch reduction {
	case "off":
		require.Equal(t, ssd.LogicalBytes, ssd.PhysicalBytes, "reduction off stores every block as it is")
	case "zero":
		// The tier holds zero blocks at no cost: fio's and qemu-io's, and the 4 MiB of zeros that
		// qemu-io read last.
		require.Less(t, ssd.PhysicalBytes, ssd.LogicalBytes, "reduction zero stores no zero block")
	case "compress":
		// Half of what fio wrote is zeros, in blocks of their own or of a header and zeros: the
		// tier holds more than its size.
		require.Less(t, ssd.PhysicalBytes, ssd.LogicalBytes, "reduction compress on data that is half zeros")
		require.Greater(t, ssd.LogicalBytes, uint64(8<<20), "logical bytes on an 8 MiB SSD tier with reduction compress")
	}
	if ssd.PhysicalBytes > 0 {
		require.InDelta(t, float64(ssd.LogicalBytes)/float64(ssd.PhysicalBytes), ssd.ReductionRatio, 1e-6,
			"reduction_ratio is logical_bytes / physical_bytes")
	}
	if mode == "writeback" {
		_, dirty := adminDirty(t, o.admin())
		t.Logf("dirty lines at stop: %d", dirty.Lines) // a second idle may have written them back
	}

	// A stop keeps the SSD tier (and in writeback the dirty data on it: --dirty-on-stop keep);
	// the next start must find the same lines holding the same bytes, before any client request.
	d.requireStop(syscall.SIGTERM)
	d = startServe(t, o.args()...)
	warm := adminStats(t, o.admin()).tier(t, "ssd")
	if warm.Lines == ssd.Lines {
		require.Equal(t, ssd.LogicalBytes, warm.LogicalBytes, "SSD logical bytes after a restart")
		require.Equal(t, ssd.PhysicalBytes, warm.PhysicalBytes, "SSD physical bytes after a restart")
	} else {
		// Write-back can fill the slots the tier keeps out of its policy's capacity (1/8 of a tier
		// this small) while its dirty lines cannot be evicted; the restart evicts clean lines down
		// to that capacity, as the policy would have.
		require.Equal(t, "writeback", mode, "SSD lines after a restart: %d, before the stop %d", warm.Lines, ssd.Lines)
		require.Less(t, warm.Lines, ssd.Lines, "SSD lines after a restart")
		require.GreaterOrEqual(t, warm.Lines, ssd.Capacity-ssd.Capacity/8, "SSD lines after a restart: the policy's capacity")
		require.Less(t, warm.LogicalBytes, ssd.LogicalBytes, "SSD logical bytes after a restart that evicted lines")
		require.LessOrEqual(t, warm.PhysicalBytes, ssd.PhysicalBytes, "SSD physical bytes after a restart that evicted lines")
	}

	// fio --verify_only reads back and checks everything the first runs wrote, writing nothing.
	var verified int64
	for i, f := range reductionFio {
		args, report := fioVerifyArgs(t, tcpURI(d.TCP, ""), f.jobs, append(f.args, "--verify_only")...)
		require.Equal(t, written[i], checkFioVerify(t, report, mustRunTool(t, "fio", args...), f.jobs),
			"bytes fio verified after the restart (%s)", f.args[0])
		verified += written[i]
	}
	mustQemuIO(t, unixURI(d.Unix, ""), reductionReads...)
	st = adminStats(t, o.admin())
	require.Zero(t, st.WriteLatency.Count, "client writes after the restart: fio --verify_only must only read")
	require.GreaterOrEqual(t, st.ReadBytes, uint64(verified), "bytes clients read after the restart")

	if mode == "writeback" {
		flushAdmin(t, o.admin())
	}
	sameImage(t, unixURI(d.Unix, ""), unixURI(sock, ""))
	d.requireStop(syscall.SIGTERM)
	mustQemuIO(t, unixURI(sock, ""), reductionReads...)
}

// checkLayoutRefused starts tierblk with --reduction compress on an SSD tier made with --reduction
// zero, whose layout differs (packed segments against one slot per line): the start must be
// refused with an error naming the layout, and change nothing. The data is written in writeback
// mode while the backend refuses writes, so the SSD tier holds the only copy: after a restart with
// zero it must all read back, and reach the backend once that takes writes again.
func checkLayoutRefused(t *testing.T) {
	inject := filepath.Join(shortTempDir(t), "refuse-writes")
	require.NoError(t, os.WriteFile(inject, nil, 0o644))
	sock := startNbdkit(t, "--filter=error", "memory", "32M",
		"error-pwrite-rate=100%", "error-pwrite-file="+inject,
		"error-zero-rate=100%", "error-zero-file="+inject,
		"error-trim-rate=100%", "error-trim-file="+inject)
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "2MiB", ssdSize: "8MiB", line: "64KiB",
		mode: "writeback", reduction: "zero"}
	writes := []string{
		"write -P 0xd1 0 4M",
		"write -z 1M 64k",
		fmt.Sprintf("write -P 0xd2 %d 10", 2<<20+100),
	}
	reads := []string{
		"read -P 0xd1 0 1M",
		"read -P 0 1M 64k",
		fmt.Sprintf("read -P 0xd1 %d %d", 1<<20+64<<10, 1<<20-64<<10+100),
		fmt.Sprintf("read -P 0xd2 %d 10", 2<<20+100),
		fmt.Sprintf("read -P 0xd1 %d %d", 2<<20+110, 2<<20-110),
	}
	d := startServe(t, o.args()...)
	mustQemuIO(t, unixURI(d.Unix, ""), append(writes, reads...)...)
	before := adminStats(t, o.admin()).tier(t, "ssd")
	_, dirty := adminDirty(t, o.admin())
	require.Positive(t, dirty.Lines, "dirty lines: the backend refuses writes")
	d.requireStop(syscall.SIGTERM)
	ssdSum := fileSHA256(t, o.ssd())

	c := o
	c.reduction = "compress"
	args := append(append([]string{"serve"}, c.args()...), "--nbd", "unix:"+filepath.Join(shortTempDir(t), "s.sock"))
	code, out := runTierblk(t, args...)
	require.NotZero(t, code, "tierblk serve --reduction compress on an SSD tier made with zero:\n%s", out)
	require.Contains(t, out, "SSD tier layout")
	require.Regexp(t, `(?i)compress`, out, "the error names the setting that chose each layout")
	require.Regexp(t, `(?i)zero`, out, "the error names the setting that chose each layout")
	require.NotContains(t, out, "goroutine", "a refusal must not be a crash")
	require.Equal(t, ssdSum, fileSHA256(t, o.ssd()), "the refused start changed the SSD image")

	// Started again with the setting it was made with, the SSD tier holds what it held, dirty.
	d = startServe(t, o.args()...)
	after := adminStats(t, o.admin()).tier(t, "ssd")
	require.Equal(t, before.Lines, after.Lines, "SSD lines after the refused start")
	require.Equal(t, before.LogicalBytes, after.LogicalBytes, "SSD logical bytes after the refused start")
	_, again := adminDirty(t, o.admin())
	require.Equal(t, dirty.Lines, again.Lines, "dirty lines after the refused start")
	mustQemuIO(t, unixURI(d.Unix, ""), reads...)

	require.NoError(t, os.Remove(inject))
	flushAdmin(t, o.admin())
	sameImage(t, unixURI(d.Unix, ""), unixURI(sock, ""))
	d.requireStop(syscall.SIGTERM)
	mustQemuIO(t, unixURI(sock, ""), reads...)
}
