package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"io"
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
