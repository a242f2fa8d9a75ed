package bench

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseVmRSS(t *testing.T) {
	rss, err := parseVmRSS([]byte("Name:\ttierblk\nVmPeak:\t  900 kB\nVmRSS:\t   20480 kB\nThreads:\t7\n"))
	require.NoError(t, err)
	require.Equal(t, int64(20<<20), rss)
	for _, in := range []string{"", "VmRSS:\t12 MB\n", "VmRSS:\tmany kB\n", "VmSize:\t12 kB\n"} {
		_, err := parseVmRSS([]byte(in))
		require.Error(t, err, in)
	}
	rss, err = vmRSS(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, rss)
}

func TestShellJoin(t *testing.T) {
	require.Equal(t, `/bin/tierblk serve --backend 'file:///w/disk.img?size=8192' --nbd unix:/w/s.sock --line 4KiB '' 'it'\''s'`,
		shellJoin([]string{"/bin/tierblk", "serve", "--backend", "file:///w/disk.img?size=8192", "--nbd", "unix:/w/s.sock", "--line", "4KiB", "", "it's"}))
}

func TestStartupSSDSize(t *testing.T) {
	for _, n := range []int{1, 2000, 1 << 20, 10 << 20} {
		s := startupSSDSize(n)
		require.Zero(t, s%(1<<20), "%d lines: a whole number of MiB", n)
		// Room for the lines and the largest reserve the cache keeps (4,096 slots).
		require.GreaterOrEqual(t, s/StartupLineSize-4096, int64(n), "%d lines", n)
	}
}

func TestStartupTable(t *testing.T) {
	r := StartupResult{Lines: 1 << 20, SSDSize: 4176 << 20,
		Serving:     []time.Duration{600 * time.Millisecond, 500 * time.Millisecond, 700 * time.Millisecond},
		Warm:        []time.Duration{598 * time.Millisecond, 499 * time.Millisecond, 697 * time.Millisecond},
		BaseServing: []time.Duration{30 * time.Millisecond, 40 * time.Millisecond, 35 * time.Millisecond},
		RSS:         []int64{140 << 20, 130 << 20, 120 << 20},
		BaseRSS:     []int64{40 << 20, 42 << 20, 41 << 20},
	}
	// Per round: 100, 88 and 79 MiB for the lines; the median is 88 MiB, 88 bytes a line.
	require.InDelta(t, 88.0, r.LineBytes(), 1e-9)
	require.Equal(t, `| cached lines | SSD tier | to serving, empty tier | to serving | SSD tier warm logged | VmRSS, empty tier | VmRSS | RSS per cached line | RSS of the lines |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 1048576 | 4176MiB | 0.035 s | 0.600 s | 0.598 s | 41.0 MiB | 130.0 MiB | 88.0 B | 88.0 MiB |
`, StartupTable([]StartupResult{r}))
}

func TestStartupOptionsRejected(t *testing.T) {
	ok := StartupOptions{Tierblk: "/nonexistent/tierblk", Lines: []int{2000}, Rounds: 1, WorkDir: t.TempDir(), Log: &bytes.Buffer{}}
	for _, mut := range []func(*StartupOptions){
		func(o *StartupOptions) { o.Rounds = 0 },
		func(o *StartupOptions) { o.Lines = nil },
		func(o *StartupOptions) { o.Lines = []int{0} },
		func(o *StartupOptions) { o.WorkDir = filepath.Join(o.WorkDir, "missing") },
		// The binary cannot start: the error says so, and the work files go.
		func(o *StartupOptions) {},
	} {
		o := ok
		mut(&o)
		_, err := RunStartup(t.Context(), o)
		require.Error(t, err, "%+v", o)
	}
	entries, err := os.ReadDir(ok.WorkDir)
	require.NoError(t, err)
	require.Empty(t, entries)
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

// TestBenchStartupSmoke runs the start-up benchmark on tiny tiers with a real tierblk: every start
// loads the lines it must (RunStartup fails otherwise), and the figures are there. The larger tier
// is large enough for its lines' memory (about 40 MB) to stand out of the noise of a Go process's
// RSS, which the collector's timing moves by about 10 MB on a loaded machine (a tier of 100,000
// lines read negative there); the smaller one's is noise and may be negative.
func TestBenchStartupSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tierblk and starts it four times")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go is not installed")
	}
	work := t.TempDir()
	bin := buildTierblk(t, work)
	var log bytes.Buffer
	res, err := RunStartup(t.Context(), StartupOptions{Tierblk: bin, Lines: []int{2000, 400_000}, Rounds: 1, WorkDir: work, Log: &log})
	require.NoError(t, err, "log:\n%s", log.String())
	require.Len(t, res, 2)
	for i, n := range []int{2000, 400_000} {
		r := res[i]
		require.Equal(t, n, r.Lines)
		for _, s := range [][]time.Duration{r.Serving, r.Warm, r.BaseServing} {
			require.Len(t, s, 1)
			require.Positive(t, s[0])
		}
		for _, s := range [][]int64{r.RSS, r.BaseRSS} {
			require.Len(t, s, 1)
			require.Positive(t, s[0])
		}
		require.Contains(t, r.Command, "--ssd-size "+strconv.FormatInt(r.SSDSize, 10))
		require.Contains(t, r.BaseCommand, "meta-empty")
	}
	require.Greater(t, res[1].LineBytes(), 0.0)
	require.Less(t, res[1].LineBytes(), 10_000.0)
	require.Contains(t, StartupTable(res), "| 400000 |")
	entries, err := os.ReadDir(work)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the binary is left in the work directory: %v", entries)

	// A start that loads another number of lines than the tier was built with, or that refuses
	// the tier, fails the benchmark with tierblk's log.
	tier, err := buildStartupTier(bin, filepath.Join(work, "tier"), 1000, &log)
	require.NoError(t, err)
	_, err = serveStart(t.Context(), tier.full, tier.sock, 1001)
	require.ErrorContains(t, err, "it loaded 1000 lines")
	require.ErrorContains(t, err, `msg="SSD tier warm"`)
	other := append(slices.Clone(tier.full[:len(tier.full)-1]), "8KiB") // --line
	_, err = serveStart(t.Context(), other, tier.sock, 1000)
	require.ErrorContains(t, err, "exited before serving")
	require.ErrorContains(t, err, "line size 4096, configured 8192")
}
