package bench

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The smoke tests that run `tierblk bench cache`, `bench writeback` and `bench cold` (fio against
// tierblk, nbdkit and qemu-nbd) are in integration/bench_test.go.

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
			got := fioArgs("nbd+unix:///?socket=/s.sock", "128m", tc.runtime, tc.ramp, []string{"--rw=randread"})
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
