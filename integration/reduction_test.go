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
// writes and verifies data that is half zeros, and data that repeats, through every setting, in
// both a mode that keeps the backend current (writethrough) and one that holds data only on the
// SSD tier (writeback), over a data set larger than the tier, so that lines are evicted and, with
// compress and dedupe, segments reclaimed while the data is still being checked. A warm restart
// must find the same data, and what tierblk serves must be what the backend holds once the dirty
// data is written back.

// reductions are the --reduction settings.
var reductions = []string{"off", "zero", "compress", "dedupe"}

// reductionFio are the fio workloads of TestCacheReduction, each run by fioVerify and again
// with --verify_only after a restart. fio seeds its generators the same way on every run
// (randrepeat), so a run writes the same offsets and data each time, and --verify_only can check
// them again. --buffer_compress_percentage=50 makes the first half of every write random and the
// second half zeros; --refill_buffers gives each write new data. Every setting gets the same data,
// so that the others show what dedupe alone shares.
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
	// One connection writes 20M..22M in 64k blocks, with one header each: the second half of
	// every write is eight 4 KiB blocks of zeros, written as data.
	{1, []string{"--name=zeros", "--rw=randwrite", "--bs=64k", "--iodepth=8", "--offset=20m", "--size=2m",
		"--buffer_compress_percentage=50", "--refill_buffers"}},
	// One connection writes 22M..24M in 128k blocks of data that repeats: every 4 KiB block is
	// a constant and the write's offset, 16 bytes over and over, so each write's two lines hold
	// the same block 15 times besides the block with the header (one every 64k): dedupe shares
	// them within a line and the second line's with the first's, a block of one write never with
	// another write's (its
	// offset differs; fio's crc32c of each 64k would catch a block shared wrongly). fio's own
	// --dedupe_percentage cannot serve here: with --verify, fio fills each write from a seed of
	// its own and makes no repeats (tierblk sim --reduction-mode dedupe measures none in a file
	// fio wrote so).
	{1, []string{"--name=repeats", "--rw=randwrite", "--bs=128k", "--iodepth=8", "--offset=22m", "--size=2m",
		"--verify_pattern=0x0123456789abcdef%o", "--verify_interval=64k"}},
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

	t.Run("compress on a zero tier refused", checkLayoutRefused)
	t.Run("compress and dedupe switched", checkDedupeSwitch)
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
	// What fio wrote repeats (the repeats job): dedupe shares it, before qemu-io writes runs of
	// one byte that would share too.
	fioShared := adminStats(t, o.admin()).tier(t, "ssd")
	t.Logf("SSD tier after fio: %d blocks deduped, %d hash collisions", fioShared.DedupeHits, fioShared.DedupeCollisions)
	if reduction == "dedupe" {
		require.Positive(t, fioShared.DedupeHits, "SSD tier dedupe_hits after fio wrote blocks that repeat")
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
	t.Logf("SSD tier: %d lines, %d logical bytes, %d physical bytes, ratio %.3f, %d blocks deduped",
		ssd.Lines, ssd.LogicalBytes, ssd.PhysicalBytes, ssd.ReductionRatio, ssd.DedupeHits)
	switch reduction {
	case "off":
		require.Equal(t, ssd.LogicalBytes, ssd.PhysicalBytes, "reduction off stores every block as it is")
	case "zero":
		// The tier holds zero blocks at no cost: fio's and qemu-io's, and the 4 MiB of zeros that
		// qemu-io read last.
		require.Less(t, ssd.PhysicalBytes, ssd.LogicalBytes, "reduction zero stores no zero block")
	case "compress", "dedupe":
		// Half of what fio wrote is zeros, in blocks of their own or of a header and zeros: the
		// tier holds more than its size.
		require.Less(t, ssd.PhysicalBytes, ssd.LogicalBytes, "reduction %s on data that is half zeros", reduction)
		require.Greater(t, ssd.LogicalBytes, uint64(8<<20), "logical bytes on an 8 MiB SSD tier with reduction %s", reduction)
	}
	if reduction == "dedupe" {
		require.GreaterOrEqual(t, ssd.DedupeHits, fioShared.DedupeHits, "dedupe_hits is a counter")
	} else {
		require.Zero(t, ssd.DedupeHits, "dedupe_hits with reduction %s", reduction)
		require.Zero(t, ssd.DedupeCollisions, "dedupe_collisions with reduction %s", reduction)
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

// startRefusingBackend starts nbdkit's memory plugin of 32M refusing every write while the file
// inject exists: the SSD tier of a write-back cache over it holds the only copy of what is written.
func startRefusingBackend(t *testing.T) (sock, inject string) {
	inject = filepath.Join(shortTempDir(t), "refuse-writes")
	require.NoError(t, os.WriteFile(inject, nil, 0o644))
	sock = startNbdkit(t, "--filter=error", "memory", "32M",
		"error-pwrite-rate=100%", "error-pwrite-file="+inject,
		"error-zero-rate=100%", "error-zero-file="+inject,
		"error-trim-rate=100%", "error-trim-file="+inject)
	return sock, inject
}

// checkLayoutRefused starts tierblk with --reduction compress on an SSD tier made with --reduction
// zero, whose layout differs (packed segments against one slot per line): the start must be
// refused with an error naming the layout, and change nothing. The data is written in writeback
// mode while the backend refuses writes, so the SSD tier holds the only copy: after a restart with
// zero it must all read back, and reach the backend once that takes writes again.
func checkLayoutRefused(t *testing.T) {
	sock, inject := startRefusingBackend(t)
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
	out := requireLayoutRefused(t, o, "compress")
	require.Regexp(t, `(?i)compress`, out, "the error names the setting that chose each layout")
	require.Regexp(t, `(?i)zero`, out, "the error names the setting that chose each layout")

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

// requireLayoutRefused starts tierblk on o's stopped SSD tier with reduction, whose layout is not
// the tier's: the start must fail naming the layout, and leave the SSD image as it was. It returns
// what tierblk printed.
func requireLayoutRefused(t *testing.T, o cacheOpts, reduction string) string {
	t.Helper()
	sum := fileSHA256(t, o.ssd())
	c := o
	c.reduction = reduction
	args := append(append([]string{"serve"}, c.args()...), "--nbd", "unix:"+filepath.Join(shortTempDir(t), "s.sock"))
	code, out := runTierblk(t, args...)
	require.NotZero(t, code, "tierblk serve --reduction %s on an SSD tier of the other layout:\n%s", reduction, out)
	require.Contains(t, out, "SSD tier layout")
	require.NotContains(t, out, "goroutine", "a refusal must not be a crash")
	require.Equal(t, sum, fileSHA256(t, o.ssd()), "the refused start changed the SSD image")
	return out
}

// checkDedupeSwitch switches an SSD tier between compress and dedupe, which share the packed
// layout, and back: each start must keep what the tier holds, the dirty data with it, and dedupe
// must share blocks written after the switch. As in checkLayoutRefused the backend refuses writes
// until the end, so the SSD tier holds the only copy of the data: a start that dropped or misread
// a line loses it. Going back to compress, the units dedupe shared must read back (the references
// counted from the records), and a start with zero must be refused, the layout differing.
func checkDedupeSwitch(t *testing.T) {
	sock, inject := startRefusingBackend(t)
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "1MiB", ssdSize: "8MiB", line: "64KiB",
		mode: "writeback", reduction: "compress"}
	// Written with compress: runs of one byte, which compress holds once per block.
	writes := []string{
		"write -P 0xe1 0 2M",
		"write -z 1M 64k",
		fmt.Sprintf("write -P 0xe2 %d 10", 2<<20+100),
		"write -P 0xe3 3M 1M",
	}
	reads := []string{
		"read -P 0xe1 0 1M",
		"read -P 0 1M 64k",
		fmt.Sprintf("read -P 0xe1 %d %d", 1<<20+64<<10, 1<<20-64<<10),
		"read -P 0 2M 100",
		fmt.Sprintf("read -P 0xe2 %d 10", 2<<20+100),
		fmt.Sprintf("read -P 0 %d %d", 2<<20+110, 1<<20-110),
		"read -P 0xe3 3M 1M",
	}
	// Written with dedupe after the switch: blocks with the bytes of 0xe1's and 0xe3's.
	dupWrites := []string{"write -P 0xe1 4M 1M", "write -P 0xe3 5M 512k", "write -P 0xe1 6M 64k"}
	dupReads := []string{"read -P 0xe1 4M 1M", "read -P 0xe3 5M 512k", "read -P 0xe1 6M 64k"}

	d := startServe(t, o.args()...)
	mustQemuIO(t, unixURI(d.Unix, ""), append(writes, reads...)...)
	before := adminStats(t, o.admin()).tier(t, "ssd")
	_, dirty := adminDirty(t, o.admin())
	require.Positive(t, dirty.Lines, "dirty lines: the backend refuses writes")
	require.Zero(t, before.DedupeHits, "dedupe_hits with compress")
	d.requireStop(syscall.SIGTERM)

	// compress → dedupe: the same lines, the same bytes, still dirty.
	o.reduction = "dedupe"
	d = startServe(t, o.args()...)
	st := adminStats(t, o.admin())
	after := st.tier(t, "ssd")
	require.Equal(t, "dedupe", after.Reduction)
	require.Equal(t, before.Lines, after.Lines, "SSD lines after switching compress to dedupe")
	require.Equal(t, before.LogicalBytes, after.LogicalBytes, "SSD logical bytes after switching compress to dedupe")
	require.Equal(t, before.PhysicalBytes, after.PhysicalBytes, "SSD physical bytes after switching compress to dedupe")
	_, again := adminDirty(t, o.admin())
	require.Equal(t, dirty.Lines, again.Lines, "dirty lines after switching compress to dedupe")
	mustQemuIO(t, unixURI(d.Unix, ""), reads...)

	// Blocks written now share: the table of hashes starts empty at each start and fills with
	// what is written, so the second line of each run shares the first's unit.
	mustQemuIO(t, unixURI(d.Unix, ""), append(dupWrites, append(reads, dupReads...)...)...)
	shared := adminStats(t, o.admin()).tier(t, "ssd")
	t.Logf("dedupe after the switch: %d blocks deduped, %d hash collisions, %d logical bytes, %d physical bytes",
		shared.DedupeHits, shared.DedupeCollisions, shared.LogicalBytes, shared.PhysicalBytes)
	require.Positive(t, shared.DedupeHits, "dedupe_hits after writing blocks the tier holds")
	require.Greater(t, shared.LogicalBytes, after.LogicalBytes, "SSD logical bytes after the writes")
	_, dirty = adminDirty(t, o.admin())
	d.requireStop(syscall.SIGTERM)

	// dedupe → zero: refused, the layout differs, and nothing changed.
	requireLayoutRefused(t, o, "zero")

	// dedupe → compress: the shared units read back, every line still dirty.
	o.reduction = "compress"
	d = startServe(t, o.args()...)
	back := adminStats(t, o.admin()).tier(t, "ssd")
	require.Equal(t, shared.Lines, back.Lines, "SSD lines after switching dedupe to compress")
	require.Equal(t, shared.LogicalBytes, back.LogicalBytes, "SSD logical bytes after switching dedupe to compress")
	require.Equal(t, shared.PhysicalBytes, back.PhysicalBytes, "SSD physical bytes after switching dedupe to compress")
	_, again = adminDirty(t, o.admin())
	require.Equal(t, dirty.Lines, again.Lines, "dirty lines after switching dedupe to compress")
	mustQemuIO(t, unixURI(d.Unix, ""), append(reads, dupReads...)...)

	require.NoError(t, os.Remove(inject))
	flushAdmin(t, o.admin())
	sameImage(t, unixURI(d.Unix, ""), unixURI(sock, ""))
	d.requireStop(syscall.SIGTERM)
	mustQemuIO(t, unixURI(sock, ""), append(reads, dupReads...)...)
}
