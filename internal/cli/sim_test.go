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
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/ulikunitz/xz"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/sim"
	"github.com/tierblk/tierblk/internal/units"
)

// traces is the repository's directory of real traces (see its README).
const traces = "../../testdata/traces"

// simCmd runs runSim with o, whose empty fields take libCacheSim's object model (one key per
// request, admission always) and reduction-mode zero: the tests that use it are about that model,
// and ask for the daemon's lines explicitly. They are not the command's defaults, which
// simCommand's tests check as a user types them.
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
		{"bad sample", simOpts{tracePath: good, policies: "lru", sizes: "10", sample: "often"}, "--sample", true},
		{"sample rate above 1", simOpts{tracePath: good, policies: "lru", sizes: "10", sample: "1.5"}, "at most 1", true},
		{"sample of no keys", simOpts{tracePath: good, policies: "lru", sizes: "10", sample: "0"}, "at least 1", true},
		{"SHARDS of arc", simOpts{tracePath: good, policies: "lru,arc", sizes: "10", sample: "8192"}, "lru only, not arc", true},
		{"SHARDS of lines", simOpts{tracePath: good, policies: "lru", sizes: "10", sample: "8192", model: "lines", blockSize: "64KiB"}, "object model only", true},
		{"SHARDS with admission", simOpts{tracePath: good, policies: "lru", sizes: "10", sample: "8192", admission: "nhit:2"}, "--admission always", true},
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

// simCommand runs `tierblk sim args...` as a user types it, through the command tree.
func simCommand(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := NewRoot("test")
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"sim", "--workers", "2"}, args...))
	err = root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// TestSimDefaultsAreTheDaemons: with no flags, tierblk sim simulates what the daemon runs for an
// export whose cache section sets nothing: its line size, policy, admission and reduction.
func TestSimDefaultsAreTheDaemons(t *testing.T) {
	var cc config.Cache // an export's cache with nothing set
	sizes, err := cc.Sizes()
	require.NoError(t, err)
	reduction, err := cc.ReductionLevel()
	require.NoError(t, err)
	_, _, ssdPolicy, ssdAdmission := cc.TierPolicies()
	require.Empty(t, ssdPolicy+ssdAdmission, "the config leaves them to the cache, whose defaults follow")

	f := newSimCmd().Flags()
	def := func(flag string) string { return f.Lookup(flag).DefValue }
	require.Equal(t, "lines", def("model"), "the daemon's cache lines")
	line, err := units.ParseSize(def("block-size"))
	require.NoError(t, err)
	require.Equal(t, sizes.Line, line)
	require.Equal(t, cache.DefaultPolicy, def("policy"))
	require.Equal(t, cache.DefaultAdmission, def("admission"))
	require.Equal(t, reduction.String(), def("reduction-mode"))

	help, _, err := simCommand(t, "--help")
	require.NoError(t, err)
	for _, want := range []string{
		"By default it simulates the cache the daemon runs",
		"--model object simulates libCacheSim's model instead",
		`(default "` + cache.DefaultPolicy + `")`,
		`(default "` + cache.DefaultAdmission + `")`,
		`(default "` + units.FormatSize(sizes.Line) + `")`,
		`(default "` + reduction.String() + `")`,
	} {
		require.Contains(t, help, want)
	}
}

// TestSimCommandDefaults: what each model gives unless told otherwise, as a user types it. The
// lines model's defaults are the daemon's settings spelt out; the object model's are libCacheSim's,
// one key per request and no admission policy, each still settable.
func TestSimCommandDefaults(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	daemon := []string{"--model", "lines", "--block-size", units.FormatSize(cache.DefaultLineSize),
		"--policy", cache.DefaultPolicy, "--admission", cache.DefaultAdmission, "--reduction-mode", cache.DefaultReduction.String()}
	// rows are the CSV rows of a run, less the throughput, which varies.
	rows := func(args ...string) [][]string {
		out, _, err := simCommand(t, append([]string{"--trace", path, "--size", "0.01,489", "--output", "csv"}, args...)...)
		require.NoError(t, err, "%v", args)
		rs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
		require.NoError(t, err)
		for _, r := range rs {
			r[5] = ""
		}
		return rs
	}
	for _, tc := range []struct {
		name       string
		args, same []string
		policy     string // the CSV's policy column
	}{
		{"the daemon's", nil, daemon, cache.DefaultPolicy + "+" + cache.DefaultAdmission},
		{"object", []string{"--model", "object"}, []string{"--model", "object", "--block-size", "0", "--admission", "always"}, cache.DefaultPolicy},
		{"object in blocks", []string{"--model", "object", "--block-size", "4KiB"}, []string{"--model", "object", "--block-size", "4096", "--admission", "always"}, cache.DefaultPolicy},
		{"object with admission", []string{"--model", "object", "--admission", "nhit:2"}, []string{"--model", "object", "--block-size", "0", "--admission", "nhit:2"}, cache.DefaultPolicy + "+nhit:2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rows(tc.args...)
			require.Equal(t, rows(tc.same...), got)
			require.Len(t, got, 3)
			require.Equal(t, tc.policy, got[1][0])
		})
	}
	require.NotEqual(t, rows(), rows("--model", "object"), "the two models differ on this trace")
}

// TestSimHeading: the table's heading says which cache was simulated, and that the daemon's SSD
// tier would hold more than a run without a reduction ratio shows.
func TestSimHeading(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	for _, tc := range []struct {
		args   []string
		want   []string // the lines before the table's
		column string   // what the table's third column counts
	}{
		{column: "lines", want: []string{
			"cloudPhysicsIO.vscsi.xz: 113872 requests, 19372 distinct lines",
			"model lines (the daemon's cache): 64KiB lines, admission auto",
			"reduction: none counted; an SSD tier with reduction compress holds more (--reduction-of IMAGE measures how much)",
		}},
		{args: []string{"--reduction", "2"}, column: "lines", want: []string{
			"cloudPhysicsIO.vscsi.xz: 113872 requests, 19372 distinct lines",
			"model lines (the daemon's cache): 64KiB lines, admission auto",
			"reduction 2.00:1: each cache holds 2.00 times its size",
		}},
		{args: []string{"--reduction", "5"}, column: "lines", want: []string{
			"cloudPhysicsIO.vscsi.xz: 113872 requests, 19372 distinct lines",
			"model lines (the daemon's cache): 64KiB lines, admission auto",
			"reduction 3.00:1; the daemon's SSD tier holds at most 3 lines a line of room (5.00:1 is its data's): each cache holds 3.00 times its size",
		}},
		{args: []string{"--model", "object"}, column: "objects", want: []string{
			"cloudPhysicsIO.vscsi.xz: 113872 requests, 48974 distinct keys",
			"model object (libCacheSim's): one key per request, admission always",
		}},
		{args: []string{"--model", "object", "--block-size", "512", "--admission", "nhit:2"}, column: "blocks", want: []string{
			"cloudPhysicsIO.vscsi.xz: 113872 requests, 2125107 distinct blocks",
			"model object (libCacheSim's): 512-byte blocks, one key each, admission nhit:2",
		}},
	} {
		out, _, err := simCommand(t, append([]string{"--trace", path, "--size", "0.1"}, tc.args...)...)
		require.NoError(t, err, "%v", tc.args)
		lines := strings.Split(out, "\n")
		require.Equal(t, tc.want, lines[:len(tc.want)], "%v", tc.args)
		require.Equal(t, []string{"policy", "size", tc.column, "requests"}, strings.Fields(lines[len(tc.want)])[:4], "%v: the table follows", tc.args)
	}
}

// TestSimWorkingSetNote: sizes at which no cache evicted anything say so, rather than repeating
// the rows of a smaller size without a word; the note goes with a table, and to stderr beside CSV.
func TestSimWorkingSetNote(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	for _, tc := range []struct {
		name string
		args []string
		note string // "" for none; else it names the last two sizes
	}{
		{"object, always", []string{"--model", "object", "--policy", "lru,fifo", "--size", "489,48974,100000"},
			"note: sizes 48974, 100000 >= the trace's working set of 48974 keys: nothing was evicted, so every miss is a cold miss, and a larger size gives the same rows"},
		{"the daemon's", []string{"--size", "1GiB,64GiB,1TiB"},
			"note: at sizes 64GiB, 1TiB nothing was evicted: the cache held all 19372 lines (1.2GiB) that admission auto let in, so every miss is a cold miss or one the admission turned away, and a larger size gives the same rows"},
		{"lines, always", []string{"--admission", "always", "--size", "64GiB,1TiB"},
			"note: sizes 64GiB, 1TiB >= the trace's working set of 19372 lines (1.2GiB): nothing was evicted, so every miss is a cold miss, and a larger size gives the same rows"},
		{"every size evicts", []string{"--policy", "lru,s3fifo", "--size", "0.01,1GiB"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--trace", path}, tc.args...)
			out, _, err := simCommand(t, args...)
			require.NoError(t, err)
			if tc.note == "" {
				require.NotContains(t, out, "note:")
				return
			}
			require.True(t, strings.HasSuffix(out, "\n"+tc.note+"\n"), "the note follows the table:\n%s", out)

			out, errOut, err := simCommand(t, append(args, "--output", "csv")...)
			require.NoError(t, err)
			require.NotContains(t, out, "note:", "CSV is for scripts")
			require.Equal(t, tc.note+"\n", errOut)
			rs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
			require.NoError(t, err)
			last, before := rs[len(rs)-1], rs[len(rs)-2]
			require.Equal(t, before[3:5], last[3:5], "the sizes the note names miss alike")
		})
	}
}

// TestSimPlotInBytes: a plot of sizes given in bytes is marked in binary units, not in keys.
func TestSimPlotInBytes(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	for _, tc := range []struct {
		size      string
		want, not string
	}{
		{"256MiB,1GiB,4GiB", ">1GiB</text>", "64KiB lines"},
		{"0.01,1GiB", ">cache size (64KiB lines), log scale</text>", "GiB</text>"},
	} {
		plot := filepath.Join(t.TempDir(), "mrc.svg")
		_, errOut, err := simCommand(t, "--trace", path, "--size", tc.size, "--plot", plot)
		require.NoError(t, err)
		require.Contains(t, errOut, "plot: "+plot)
		svg, err := os.ReadFile(plot)
		require.NoError(t, err)
		require.Contains(t, string(svg), tc.want, tc.size)
		require.NotContains(t, string(svg), tc.not, tc.size)
		require.NotContains(t, string(svg), "objects", tc.size)
	}
}

// The daemon's SSD tier holds at most cache.PackedLinesPerLine lines a line of room, and no more
// lines with reduction zero, whatever the data's ratio.
func TestDaemonReduction(t *testing.T) {
	for _, tc := range []struct {
		ratio    float64
		mode     string
		want     float64
		measured string
	}{
		{1, "compress", 1, ""},
		{2.5, "compress", 2.5, ""},
		{5, "dedupe", 3, "; the daemon's SSD tier holds at most 3 lines a line of room (5.00:1 is its data's)"},
		{2, "zero", 1, "; the daemon's SSD tier with reduction zero holds no more lines for it (2.00:1 is its data's, not its lines')"},
		{1, "zero", 1, ""},
	} {
		got, measured := daemonReduction(tc.ratio, "", tc.mode)
		require.Equal(t, tc.want, got, "%v %s", tc.ratio, tc.mode)
		require.Equal(t, tc.measured, measured, "%v %s", tc.ratio, tc.mode)
	}
}

// TestSimSample: --sample says in every output that the figures are estimates, and how they were
// made; they come near the exact replay's.
func TestSimSample(t *testing.T) {
	path := filepath.Join(traces, "cloudPhysicsIO.vscsi.xz")
	exact, err := simCmd(t, simOpts{tracePath: path, policies: "lru", sizes: "0.05", output: "csv"})
	require.NoError(t, err)
	for _, tc := range []struct {
		sample, policies, heading, estimate string
	}{
		{"0.1", "lru,arc", "estimated (sampled at 10%): each cache simulated at 10% of its size, fed only the keys sampled", "sampled at 10%"},
		{"8192", "lru", "estimated (SHARDS, at most 8192 sampled keys): LRU's reuse distances of a sample of the keys, scaled; miss ratios only", "SHARDS, at most 8192 sampled keys"},
	} {
		out, err := simCmd(t, simOpts{tracePath: path, policies: tc.policies, sizes: "0.05", sample: tc.sample})
		require.NoError(t, err)
		require.Equal(t, tc.heading, strings.Split(out, "\n")[2], "the table's heading says so")

		out, err = simCmd(t, simOpts{tracePath: path, policies: tc.policies, sizes: "0.05", sample: tc.sample, output: "csv"})
		require.NoError(t, err)
		rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
		require.NoError(t, err)
		require.Equal(t, append(append([]string{}, sim.CSVHeader...), "estimate"), rows[0])
		require.Equal(t, tc.estimate, rows[1][len(rows[1])-1])
		exactRows, err := csv.NewReader(strings.NewReader(exact)).ReadAll()
		require.NoError(t, err)
		want, _ := strconv.ParseFloat(exactRows[1][3], 64)
		got, _ := strconv.ParseFloat(rows[1][3], 64)
		require.InDelta(t, want, got, 0.04, "lru's estimate is near its exact miss ratio (docs/simulator.md: its error on this small trace)")

		out, err = simCmd(t, simOpts{tracePath: path, policies: tc.policies, sizes: "0.05", sample: tc.sample, output: "json"})
		require.NoError(t, err)
		require.Contains(t, out, `"estimate": "`+tc.estimate+`"`)
	}
}
