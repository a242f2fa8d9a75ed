package integration

// Smoke tests of `tierblk bench nbd`, `bench cache` (its reduction part too), `bench writeback` and `bench cold`
// (internal/bench), which run fio against tierblk, nbdkit and qemu-nbd: with tiny working sets and run times they prove
// that the servers start, restart, flush and answer and that every row of the tables comes out,
// not how fast anything is. The benchmarks' arguments, tables and parsers are tested beside them.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/bench"
)

// benchWorkDir is a work directory for `tierblk bench`, which refuses one in RAM (its SSD tier
// would be a second RAM tier): under the temporary directory, or under /var/tmp where that is a
// tmpfs (as Fedora's /tmp is).
func benchWorkDir(t *testing.T) string {
	t.Helper()
	for _, parent := range []string{os.TempDir(), "/var/tmp"} {
		var st unix.Statfs_t
		if err := unix.Statfs(parent, &st); err != nil || st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC {
			continue
		}
		dir, err := os.MkdirTemp(parent, "tierblk-bench-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	t.Fatalf("neither %s nor /var/tmp is on a disk, which `tierblk bench` needs for its SSD tier: set TMPDIR to a directory on one", os.TempDir())
	return ""
}

// runBench runs `tierblk bench args...` and returns its standard output and error; the benchmark
// must succeed and leave its work directory empty.
func runBench(t *testing.T, work string, args ...string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), tierblkPath, append(append([]string{"bench"}, args...), "--work", work)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "stderr:\n%s", errOut.String())
	entries, err := os.ReadDir(work)
	require.NoError(t, err)
	require.Empty(t, entries, "the benchmark left files in its work directory")
	return out.String(), errOut.String()
}

// benchRow matches a row of the cache and write-back tables: a non-zero figure for every server,
// and both ratios.
var benchRow = regexp.MustCompile(`(?m)^\| ([^|]+) \| ([1-9]\d*) (IOPS|MiB/s) \| ([1-9]\d*) (IOPS|MiB/s) \| ([1-9]\d*) (IOPS|MiB/s) \| \d+\.\d\d \| \d+\.\d\d \|$`)

// rowNames returns the first group of every match of re in s.
func rowNames(re *regexp.Regexp, s string) []string {
	var names []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		names = append(names, m[1])
	}
	return names
}

// TestBenchNBDSmoke runs `tierblk bench nbd` with a tiny region and run time: both parts, the
// unix sockets and TLS over TCP (a certificate made by the benchmark, ports it picked).
func TestBenchNBDSmoke(t *testing.T) {
	requireTools(t, "fio", "nbdkit")
	stdout, _ := runBench(t, benchWorkDir(t), "nbd", "--rounds", "1", "--runtime", "1s", "--size", "8m")
	var want []string
	for _, r := range bench.DefaultRows() {
		want = append(want, r.Name)
	}
	// Each part: its caption, then the rows with both servers' figures and the paired ratio.
	parts := regexp.MustCompile(`(?m)^fio, nbd engine, one job, (.+), 8m of a 1 GiB RAM disk, `).FindAllStringSubmatch(stdout, -1)
	require.Len(t, parts, 2, "stdout:\n%s", stdout)
	require.Equal(t, "unix socket", parts[0][1])
	require.Equal(t, "TCP on 127.0.0.1 with "+bench.TLSCipher, parts[1][1])
	fig := `([1-9]\d*) (IOPS|MiB/s)`
	row := regexp.MustCompile(`(?m)^\| ([^|]+) \| ` + fig + ` \| ` + fig + ` \| \d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\) \|$`)
	require.Equal(t, append(want, want...), rowNames(row, stdout), "stdout:\n%s", stdout)
}

// TestBenchCacheSmoke runs `tierblk bench cache` with a tiny working set and run times.
func TestBenchCacheSmoke(t *testing.T) {
	requireTools(t, "fio", "nbdkit", "qemu-nbd", "qemu-img")
	stdout, stderr := runBench(t, benchWorkDir(t), "cache", "--rounds", "1", "--runtime", "1s",
		"--slow-runtime", "1s", "--size", "8m")
	require.Contains(t, stderr, "restarted tierblk")
	want := []string{bench.CacheRows()[0].Name, bench.RestartRow().Name, bench.CacheRows()[1].Name, bench.CacheRows()[2].Name}
	require.Equal(t, want, rowNames(benchRow, stdout), "stdout:\n%s", stdout)
	// The hit rows: three servers, and two paired ratios with their spread.
	fig, ratio := `([1-9]\d*) (IOPS|MiB/s)`, `\d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\)`
	hitRow := regexp.MustCompile(`(?m)^\| ([^|]+) \| ` + fig + ` \| ` + fig + ` \| ` + fig + ` \| ` + ratio + ` \| ` + ratio + ` \|$`)
	require.Equal(t, []string{bench.HitRows()[0].Name, bench.HitRows()[1].Name}, rowNames(hitRow, stdout), "stdout:\n%s", stdout)
}

// TestBenchReductionSmoke runs `tierblk bench cache --parts reduction` on an 8 MiB image whose
// first half is lines of text and second half zeros: the SSD tier with reduction zero stores half
// of what it holds, the one with reduction off all of it, the one with compress less than half
// (its first half compresses too), the random bytes do not compress, and every row comes out. The
// dedupe rows: four clones of the image with dedupe store more than clone 0 alone and less than
// with compress, every tier holds all of its clones, and the ratios come out.
func TestBenchReductionSmoke(t *testing.T) {
	requireTools(t, "fio", "nbdkit")
	image := filepath.Join(t.TempDir(), "half-zero.img")
	// Text whose every line differs, so that the clones' rewrites (the image's bytes read at an
	// offset that is not a multiple of 4 KiB) find data that matches none of its blocks.
	var text bytes.Buffer
	for i := 0; text.Len() < 4<<20; i++ {
		fmt.Fprintf(&text, "line %d of the smoke image, words that compress\n", i)
	}
	data := make([]byte, 8<<20)
	copy(data, text.Bytes()[:4<<20])
	require.NoError(t, os.WriteFile(image, data, 0o600))
	stdout, _ := runBench(t, benchWorkDir(t), "cache", "--parts", "reduction", "--image", image, "--rounds", "1", "--runtime", "1s")
	require.Contains(t, stdout, "| tierblk --reduction off | 8.0 MiB | 8.0 MiB | 1.000 |")
	require.Contains(t, stdout, "| tierblk --reduction zero | 8.0 MiB | 4.0 MiB | 0.500 |")
	stored := regexp.MustCompile(`(?m)^\| ([^|]+) \| (\d+\.\d) MiB \| (\d+\.\d) MiB \| (\d\.\d{3}) \| \d+\.\d s \|$`)
	physical := map[string]float64{}
	for _, m := range stored.FindAllStringSubmatch(stdout, -1) {
		require.Equal(t, "8.0", m[2], "every SSD tier holds all of its image: %s", m[0])
		physical[m[1]], _ = strconv.ParseFloat(m[3], 64)
	}
	require.Len(t, physical, 5, "stdout:\n%s", stdout)
	require.Less(t, physical["tierblk --reduction compress"], 4.0, "compress stores no zero block and compresses the others")
	require.Greater(t, physical["tierblk --reduction compress"], 0.0)
	require.Equal(t, 8.0, physical["random bytes, --reduction off"])
	require.Equal(t, 8.0, physical["random bytes, --reduction compress"], "random bytes are stored as they are")
	fig, ratio := `([1-9]\d*) (IOPS|MiB/s)`, `\d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\)`
	// The image's rows and the write row: compress, zero and off, then compress/off and zero/off.
	threeRow := regexp.MustCompile(`(?m)^\| ([^|]+) \| ` + fig + ` \| ` + fig + ` \| ` + fig + ` \| ` + ratio + ` \| ` + ratio + ` \|$`)
	require.Equal(t, []string{bench.ReductionRows()[0].Name, bench.ReductionRows()[1].Name, bench.ReductionWriteRow().Name}, rowNames(threeRow, stdout), "stdout:\n%s", stdout)
	// The random bytes' row: compress and off, then compress/off.
	twoRow := regexp.MustCompile(`(?m)^\| ([^|]+) \| ` + fig + ` \| ` + fig + ` \| ` + ratio + ` \|$`)
	require.Equal(t, []string{bench.ReductionRandomRow().Name}, rowNames(twoRow, stdout), "stdout:\n%s", stdout)

	// The dedupe rows: 102 of each clone's 2048 blocks rewritten, one run.
	require.Contains(t, stdout, "Dedupe: 4 clones of the image (8.0 MiB each), 102 of each one's 2048 blocks of 4 KiB (5 %) rewritten")
	dd := regexp.MustCompile(`(?m)^\| ([^|]+) \| (\d+\.\d) MiB \| (\d+\.\d) MiB \| (\d+\.\d) MiB \| (\d+) \| (\d+) \| \d+\.\d s \|$`)
	type tier struct{ logical, physical, expect, hits float64 }
	tiers := map[string]tier{}
	for _, m := range dd.FindAllStringSubmatch(stdout, -1) {
		var tr tier
		for i, p := range []*float64{&tr.logical, &tr.physical, &tr.expect, &tr.hits} {
			*p, _ = strconv.ParseFloat(m[2+i], 64)
		}
		tiers[m[1]] = tr
	}
	require.Len(t, tiers, 3, "stdout:\n%s", stdout)
	one, four, four4c := tiers["clone 0, --reduction dedupe"], tiers["four clones, --reduction dedupe"], tiers["four clones, --reduction compress"]
	require.Equal(t, 8.0, one.logical)
	require.Equal(t, 32.0, four.logical)
	require.Equal(t, 32.0, four4c.logical)
	require.Greater(t, four.physical, one.physical, "each clone's rewritten blocks are stored")
	require.Less(t, four.physical, four4c.physical/2, "the clones' blocks in common are stored once")
	require.Positive(t, four.hits)
	require.Zero(t, four4c.hits)
	require.Regexp(t, `(?m)^Physical bytes of the four clones over clone 0's: dedupe 1\.\d{3} \(goal: at most 1\.4\), compress [34]\.\d{3}$`, stdout)
}

// TestBenchWriteBackSmoke runs `tierblk bench writeback` with a tiny working set, burst and run
// times: the burst is sampled too.
func TestBenchWriteBackSmoke(t *testing.T) {
	requireTools(t, "fio", "nbdkit")
	// The burst (96m) is larger than the burst tierblk's SSD tier (64MiB).
	stdout, stderr := runBench(t, benchWorkDir(t), "writeback", "--rounds", "1", "--runtime", "1s",
		"--slow-runtime", "1s", "--size", "8m", "--burst", "96m")
	require.Contains(t, stderr, "flushed tierblk")
	require.Contains(t, stderr, "flushed the burst tierblk")
	var want []string
	for _, r := range append(bench.WriteBackRows(), bench.BurstRow("96m")) {
		want = append(want, r.Name)
	}
	require.Equal(t, want, rowNames(benchRow, stdout), "stdout:\n%s", stdout)
	require.Regexp(t, `peaked at 0\.\d{3} of its SSD tier; the maximum is 0\.90, and it stayed at or below it`, stdout)
}

// TestBenchColdSmoke runs `tierblk bench cold` with one round of one second on a small region and
// a short trace.
func TestBenchColdSmoke(t *testing.T) {
	requireTools(t, "fio", "nbdkit")
	// An MSR Cambridge trace (timestamp,host,disk,op,offset,size,latency) of enough requests that
	// even the NAS alone takes more than the table's 0.01 s.
	var tr strings.Builder
	for i := range 2000 {
		op := "Read"
		if i%2 == 1 {
			op = "Write"
		}
		fmt.Fprintf(&tr, "%d,host,0,%s,%d,4096,100\n", 128166372003061629+int64(i), op, i*65536)
	}
	msr := filepath.Join(t.TempDir(), "small.msr.csv")
	require.NoError(t, os.WriteFile(msr, []byte(tr.String()), 0o644))

	// --settle 0: a fair burst matters to the figures, not to this test.
	stdout, stderr := runBench(t, benchWorkDir(t), "cold", "--rounds", "1", "--runtime", "1s", "--slow-runtime", "1s",
		"--settle", "0s", "--size", "16m", "--trace", msr)
	require.Contains(t, stderr, "read amplification", "the cache's counters after its measurements")

	// Every row: both sides' figures, three ratios, and the NAS alone where the backend is the NAS.
	fig := `([0-9.]*[1-9][0-9.]*) (IOPS|s)`
	row := regexp.MustCompile(`(?m)^\| ([^|]+) \| (NAS|slow disk) \| ` + fig + ` \| ` + fig +
		` \| (\d+\.\d\d) \| (\d+\.\d\d) \| (\d+\.\d\d) \| (` + fig + `|—) \|$`)
	var got []string
	for _, m := range row.FindAllStringSubmatch(stdout, -1) {
		got = append(got, m[2]+": "+m[1])
		for _, ratio := range m[7:10] {
			v, err := strconv.ParseFloat(ratio, 64)
			require.NoError(t, err)
			require.Positive(t, v, "row %q", m[1])
		}
		require.Equal(t, m[2] == bench.ColdNAS, m[10] != "—", "row %q: the bound is measured on the NAS only", m[1])
	}
	require.Equal(t, []string{
		"NAS: cold 4K random read, QD32, over 16m",
		"NAS: cold 4K random 50/50 read/write, QD32, over 16m, write-through",
		"slow disk: cold 4K random read, QD32, over 16m",
		"NAS: replay of small.msr.csv (2000 requests, 32 in flight): time, lower is better",
	}, got, "stdout:\n%s", stdout)
	require.Contains(t, stdout, "NAS: nbdkit -f -U WORK/nas.sock --filter=rate memory 1T rate=1G")
	require.Contains(t, stdout, "--ram 1GiB --ssd WORK/ROUND/ssd.img --ssd-size 8GiB")
}
