package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/ulikunitz/xz"
)

// traces is the repository's directory of real traces (see its README).
const traces = "../../testdata/traces"

func simCmd(t *testing.T, o simOpts) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	o.stdout, o.stderr = &out, &errOut
	if o.format == "" {
		o.format = "auto"
	}
	if o.admission == "" {
		o.admission = "always"
	}
	if o.blockSize == "" {
		o.blockSize = "0"
	}
	if o.ops == "" {
		o.ops = "all"
	}
	if o.output == "" {
		o.output = "table"
	}
	if o.model == "" {
		o.model = "object"
	}
	if o.workers == 0 {
		o.workers = 2
	}
	if o.reduceMode == "" {
		o.reduceMode = "zero"
	}
	err := runSim(context.Background(), o)
	return out.String(), err
}

func TestSimCSVMatchesLibCacheSim(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the trace is missing (%v): tests read it from testdata/traces", err)
	}
	plot := filepath.Join(t.TempDir(), "mrc.svg")
	out, err := simCmd(t, simOpts{tracePath: path, policies: "lru,fifo", sizes: "489,0.1", output: "csv", plot: plot})
	require.NoError(t, err)
	rows, err := csv.NewReader(bytes.NewReader([]byte(out))).ReadAll()
	require.NoError(t, err)
	require.Equal(t, []string{"policy", "cache_size", "requests", "miss_ratio", "byte_miss_ratio", "throughput_mqps", "fetch_ratio"}, rows[0])
	require.Len(t, rows, 5)
	// libCacheSim's figures from testdata/traces/README.md.
	want := map[[2]string]float64{{"lru", "489"}: 0.8380, {"lru", "4897"}: 0.8049, {"fifo", "489"}: 0.8476, {"fifo", "4897"}: 0.8054}
	for _, r := range rows[1:] {
		mr, err := strconv.ParseFloat(r[3], 64)
		require.NoError(t, err)
		require.InDelta(t, want[[2]string{r[0], r[1]}], mr, 0.0005, r)
		require.Equal(t, "113872", r[2])
	}
	svg, err := os.ReadFile(plot)
	require.NoError(t, err)
	require.Contains(t, string(svg), "<svg")
}

func TestSimBadInput(t *testing.T) {
	dir := t.TempDir()
	trunc := filepath.Join(dir, "cut.vscsi")
	f, err := os.Open(filepath.Join(traces, "cloudPhysicsIO.vscsi.xz"))
	require.NoError(t, err)
	defer f.Close()
	xr, err := xz.NewReader(f)
	require.NoError(t, err)
	head := make([]byte, 32*10+17) // ten records and part of the eleventh
	_, err = io.ReadFull(xr, head)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(trunc, head, 0o644))
	good := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")

	for _, tc := range []struct {
		name  string
		o     simOpts
		want  string
		usage bool
	}{
		{"no trace", simOpts{policies: "lru", sizes: "10"}, "--trace is required", true},
		{"unknown policy", simOpts{tracePath: good, policies: "lru,mru", sizes: "10"}, `unknown eviction policy "mru"`, true},
		{"bad size", simOpts{tracePath: good, policies: "lru", sizes: "huge"}, "--size", true},
		{"bad block size", simOpts{tracePath: good, policies: "lru", sizes: "10", blockSize: "big"}, "--block-size", true},
		{"bad ops", simOpts{tracePath: good, policies: "lru", sizes: "10", ops: "writes"}, "--ops", true},
		{"bad model", simOpts{tracePath: good, policies: "lru", sizes: "10", model: "bytes"}, "--model", true},
		{"lines without a line size", simOpts{tracePath: good, policies: "lru", sizes: "10", model: "lines"}, "--model lines", true},
		{"lines of 6KiB", simOpts{tracePath: good, policies: "lru", sizes: "10", model: "lines", blockSize: "6KiB"}, "multiple of 4KiB", true},
		{"bad output", simOpts{tracePath: good, policies: "lru", sizes: "10", output: "xml"}, "--output", true},
		{"bad plot", simOpts{tracePath: good, policies: "lru", sizes: "10", plot: "x.gif"}, "--plot", true},
		{"bad admission", simOpts{tracePath: good, policies: "lru", sizes: "10", admission: "nhit:zero"}, "--admission", true},
		{"bytes without block size", simOpts{tracePath: good, policies: "lru", sizes: "1GiB"}, "--block-size", true},
		{"warm-up past the end", simOpts{tracePath: good, policies: "lru", sizes: "0.1", warmup: 113872}, "--warmup 113872 must be below the 113872 requests", true},
		{"warm-up past the end, absolute sizes", simOpts{tracePath: good, policies: "lru", sizes: "10", warmup: 113872}, "--warmup 113872 must be below the 113872 requests", true},
		{"missing file", simOpts{tracePath: filepath.Join(dir, "nope"), policies: "lru", sizes: "10"}, "nope", false},
		{"truncated", simOpts{tracePath: trunc, policies: "lru", sizes: "10", format: "vscsi"}, "record 11", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := simCmd(t, tc.o)
			require.ErrorContains(t, err, tc.want)
			if tc.usage {
				require.Equal(t, 2, ExitCode(err))
			} else {
				require.Equal(t, 1, ExitCode(err))
			}
		})
	}
}

// TestSimReduction: a reduction ratio, given or measured on a data file, multiplies what each
// cache holds, and the miss ratio falls with it; bad ratios and files are usage errors.
func TestSimReduction(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	csvRows := func(o simOpts) [][]string {
		o.tracePath, o.policies, o.sizes, o.output = path, "lru", "489", "csv"
		out, err := simCmd(t, o)
		require.NoError(t, err)
		rows, err := csv.NewReader(bytes.NewReader([]byte(out))).ReadAll()
		require.NoError(t, err)
		return rows
	}
	plain := csvRows(simOpts{})
	halfZeros := filepath.Join(t.TempDir(), "half-zeros.img")
	data := make([]byte, 8*4096)
	for i := 4 * 4096; i < len(data); i++ {
		data[i] = byte(i*7 + i>>9)
	}
	require.NoError(t, os.WriteFile(halfZeros, data, 0o644))
	for _, o := range []simOpts{{reduction: "2"}, {reducedBy: halfZeros}} {
		rows := csvRows(o)
		require.Equal(t, "978", rows[1][1], "a 2:1 reduction doubles what the cache holds (%+v)", o)
		plainMiss, _ := strconv.ParseFloat(plain[1][3], 64)
		miss, _ := strconv.ParseFloat(rows[1][3], 64)
		require.Less(t, miss, plainMiss)
	}
	out, err := simCmd(t, simOpts{tracePath: path, policies: "lru", sizes: "489", reducedBy: halfZeros})
	require.NoError(t, err)
	require.Contains(t, out, "reduction 2.00:1 (half-zeros.img, reduction-mode zero: 8 blocks of 4 KiB, 50.0 % zeros;")

	zeros := filepath.Join(t.TempDir(), "zeros.img")
	require.NoError(t, os.WriteFile(zeros, make([]byte, 4096), 0o644))
	for _, tc := range []struct {
		o   simOpts
		msg string
	}{
		{simOpts{reduction: "0.9"}, `--reduction "0.9": give a ratio`},
		{simOpts{reduction: "2", reducedBy: zeros}, "give one"},
		{simOpts{reducedBy: zeros}, "holds no block that is not zeros"},
		{simOpts{reducedBy: filepath.Join(t.TempDir(), "missing")}, "--reduction-of: open"},
		{simOpts{reduction: "2", reduceMode: "dedup"}, `--reduction-mode "dedup": use zero, compress or dedupe`},
	} {
		tc.o.tracePath, tc.o.sizes = path, "489"
		_, err := simCmd(t, tc.o)
		require.ErrorContains(t, err, tc.msg)
		require.Equal(t, 2, ExitCode(err), tc.msg)
	}
}

// TestSimReductionDedupe: --reduction-mode dedupe counts each distinct block of the data file once.
// The file is two random blocks (which S2 stores as they are) four times each, and one block of
// zeros: 9 blocks, 8 not zero, 2 unique.
func TestSimReductionDedupe(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	rng := rand.New(rand.NewPCG(5, 6))
	a, b := make([]byte, 4096), make([]byte, 4096)
	for i := range a {
		a[i], b[i] = byte(rng.Uint32()), byte(rng.Uint32())
	}
	img := filepath.Join(t.TempDir(), "repeats.img")
	require.NoError(t, os.WriteFile(img, bytes.Join([][]byte{a, b, a, b, make([]byte, 4096), a, b, a, b}, nil), 0o644))
	for _, tc := range []struct {
		mode, ratio, objects string
	}{
		{"zero", "1.12", "550"},     // 9 blocks over the 8 not zero
		{"compress", "1.12", "550"}, // random blocks do not compress
		{"dedupe", "4.50", "2200"},  // 9 blocks over the 2 unique
	} {
		t.Run(tc.mode, func(t *testing.T) {
			o := simOpts{tracePath: path, policies: "lru", sizes: "489", reducedBy: img, reduceMode: tc.mode}
			out, err := simCmd(t, o)
			require.NoError(t, err)
			require.Contains(t, out, "reduction "+tc.ratio+":1 (repeats.img, reduction-mode "+tc.mode+": 9 blocks of 4 KiB, 11.1 % zeros;")
			if tc.mode == "dedupe" {
				require.Contains(t, out, ", 4.50:1 with duplicates stored once (2 unique of 8 non-zero blocks))")
			}
			o.output = "csv"
			out, err = simCmd(t, o)
			require.NoError(t, err)
			rows, err := csv.NewReader(bytes.NewReader([]byte(out))).ReadAll()
			require.NoError(t, err)
			require.Equal(t, tc.objects, rows[1][1], "what a cache of 489 holds at %s:1", tc.ratio)
		})
	}
}
