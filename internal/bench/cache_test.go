package bench

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFioArgs(t *testing.T) {
	base := []string{"--name=bench", "--ioengine=nbd", "--uri=nbd+unix:///?socket=/s.sock", "--size=128m",
		"--numjobs=1", "--output-format=json", "--random_generator=tausworthe64", "--rw=randread"}
	for _, tc := range []struct {
		name          string
		runtime, ramp time.Duration
		tail          []string
	}{
		{"once over the size", 0, 0, nil},
		{"once over the size ignores the ramp", 0, time.Second, nil},
		{"timed with a ramp", 10 * time.Second, time.Second, []string{"--time_based", "--runtime=10s", "--ramp_time=1s"}},
		{"timed without a ramp", 3 * time.Second, 0, []string{"--time_based", "--runtime=3s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fioArgs("/s.sock", "128m", tc.runtime, tc.ramp, []string{"--rw=randread"})
			require.Equal(t, append(append([]string{}, base...), tc.tail...), got)
		})
	}
}

func TestCacheTargets(t *testing.T) {
	targets := cacheTargets("/bin/tierblk", "/work", "/work/s0.sock")
	names := []string{nameTierblk, nameNbdkit, nameSlow}
	slow := "--filter=noparallel --filter=delay memory 1G delay-read=5ms delay-write=5ms"
	want := []string{
		"/bin/tierblk serve --backend nbd+unix:///?socket=/work/s0.sock --nbd unix:/t.sock --ram 256MiB --ssd /work/ssd.img --ssd-size 512MiB --mode writethrough --log-level warn",
		// The cache filter first: hits never wait behind noparallel and delay.
		"nbdkit -f -U /t.sock --filter=cache " + slow + " cache-on-read=true cache=writethrough",
		"nbdkit -f -U /t.sock " + slow,
	}
	require.Len(t, targets, len(want))
	for i, tg := range targets {
		require.Equal(t, names[i], tg.Name)
		cmd := tg.Command("/t.sock")
		require.Equal(t, want[i], strings.Join(cmd.Args, " "), tg.Name)
	}
	require.Contains(t, targets[1].Command("/t.sock").Env, "TMPDIR=/work", "nbdkit's cache file beside the SSD tier")
}

func TestCacheRows(t *testing.T) {
	rows := CacheRows()
	require.Len(t, rows, 3)
	r := RestartRow()
	require.Equal(t, rows[0].FioArgs, r.FioArgs, "after a restart, the warm row's workload")
	require.NotEqual(t, rows[0].Name, r.Name)
	for _, row := range append(rows, r) {
		require.Contains(t, []string{"IOPS", "MiB/s"}, row.Unit, row.Name)
	}
}

func TestCacheTable(t *testing.T) {
	got := CacheTable([]Result{
		{Row: "4K", Unit: "IOPS", Medians: map[string]float64{nameTierblk: 30000, nameNbdkit: 20000, nameSlow: 200}},
		{Row: "1M", Unit: "MiB/s", Medians: map[string]float64{nameTierblk: 500, nameNbdkit: 1000, nameSlow: 100}},
	})
	require.Equal(t, `| workload | tierblk | nbdkit cache | slow disk | ratio tierblk/nbdkit cache | ratio tierblk/slow disk |
|---|---:|---:|---:|---:|---:|
| 4K | 30000 IOPS | 20000 IOPS | 200 IOPS | 1.50 | 150.00 |
| 1M | 500 MiB/s | 1000 MiB/s | 100 MiB/s | 0.50 | 5.00 |
`, got)
}

func TestCacheOptionsRejected(t *testing.T) {
	ok := CacheOptions{Rounds: 1, Runtime: time.Second, SlowRuntime: time.Second, WorkDir: t.TempDir()}
	for _, mut := range []func(*CacheOptions){
		func(o *CacheOptions) { o.Rounds = 0 },
		func(o *CacheOptions) { o.Runtime = 500 * time.Millisecond },
		func(o *CacheOptions) { o.SlowRuntime = 0 },
		func(o *CacheOptions) { o.WorkDir = filepath.Join(o.WorkDir, "missing") },
	} {
		o := ok
		mut(&o)
		_, err := RunCache(t.Context(), o)
		require.Error(t, err, "%+v", o)
	}
}

func isTmpfs(t *testing.T, dir string) bool {
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	return st.Type == tmpfsMagic
}

func TestCheckDirectIO(t *testing.T) {
	if dir := t.TempDir(); !isTmpfs(t, dir) {
		require.NoError(t, checkDirectIO(dir))
	}
	if _, err := os.Stat("/dev/shm"); err != nil || !isTmpfs(t, "/dev/shm") {
		t.Skip("no tmpfs at /dev/shm to check the refusal on")
	}
	dir, err := os.MkdirTemp("/dev/shm", "tierblk-bench-test")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.ErrorContains(t, checkDirectIO(dir), "in RAM")
}

// smokeSetup skips a smoke test where it cannot run, builds tierblk into a work directory on a
// file system with O_DIRECT and returns the binary and the directory.
func smokeSetup(t *testing.T) (bin, work string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts nbdkit, tierblk and fio for about a minute")
	}
	for _, tool := range []string{"fio", "nbdkit", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	work = t.TempDir()
	if isTmpfs(t, work) {
		t.Skip("the temporary directory is on tmpfs, which the SSD tier refuses")
	}
	return buildTierblk(t, work), work
}

// buildTierblk builds tierblk into dir and returns the binary.
func buildTierblk(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "tierblk")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tierblk")
	_, file, _, _ := runtime.Caller(0)
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// TestBenchCacheSmoke runs `tierblk bench cache` with a tiny working set and run times: it proves
// the servers start, restart and answer, not how fast they are.
func TestBenchCacheSmoke(t *testing.T) {
	bin, work := smokeSetup(t)

	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), bin, "bench", "cache", "--rounds", "1", "--runtime", "1s",
		"--slow-runtime", "1s", "--size", "8m", "--work", work)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr:\n%s", stderr.String())
	require.Contains(t, stderr.String(), "restarted tierblk")
	// Every row has a non-zero figure for every server, and both ratios.
	row := regexp.MustCompile(`(?m)^\| ([^|]+) \| ([1-9]\d*) (IOPS|MiB/s) \| ([1-9]\d*) (IOPS|MiB/s) \| ([1-9]\d*) (IOPS|MiB/s) \| \d+\.\d\d \| \d+\.\d\d \|$`)
	var got []string
	for _, m := range row.FindAllStringSubmatch(stdout.String(), -1) {
		got = append(got, m[1])
	}
	want := []string{CacheRows()[0].Name, RestartRow().Name, CacheRows()[1].Name, CacheRows()[2].Name}
	require.Equal(t, want, got, "stdout:\n%s", stdout.String())
	// The hit rows: three servers, and two paired ratios with their spread.
	fig, ratio := `([1-9]\d*) (IOPS|MiB/s)`, `\d+\.\d\d \(\d+\.\d\d-\d+\.\d\d\)`
	hitRow := regexp.MustCompile(`(?m)^\| ([^|]+) \| ` + fig + ` \| ` + fig + ` \| ` + fig + ` \| ` + ratio + ` \| ` + ratio + ` \|$`)
	got = nil
	for _, m := range hitRow.FindAllStringSubmatch(stdout.String(), -1) {
		got = append(got, m[1])
	}
	require.Equal(t, []string{HitRows()[0].Name, HitRows()[1].Name}, got, "stdout:\n%s", stdout.String())
	entries, err := os.ReadDir(work)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the binary is left in the work directory: %v", entries)
}
