package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/sim"
	"github.com/tierblk/tierblk/internal/trace"
)

// curvesMAE bounds the mean absolute error, over the sizes compared, of each live curve against
// an exact replay of the recorded trace, with room for the sample's luck; TestLiveCurves logs the
// figures (docs/operations.md gives them).
const curvesMAE = 0.015

// TestLiveCurves: the live miss-ratio curves of `tierblk serve` (cache.curves on by default),
// read from GET /stats after fio's skewed random reads ran through NBD over a working set far
// larger than the SSD tier, agree with `tierblk sim` replaying exactly, in the daemon's model, the
// trace the daemon recorded of the same requests (--record-trace): each policy's miniature curve
// and the SHARDS estimate of LRU are within curvesMAE of the exact curve, on average over the
// sizes simulated in miniature. The curves count exactly the requests recorded, and /metrics
// shows them too.
func TestLiveCurves(t *testing.T) {
	requireTools(t, "fio")
	dir := shortTempDir(t)
	// A 64 MiB SSD tier of 4 KiB lines (16384 lines: no reduction, which would pack more) over
	// 1 GiB (262144 lines) of file backend.
	o := cacheOpts{backend: "file://" + filepath.Join(dir, "backend.img") + "?size=1GiB", dir: dir, ram: "",
		ssdSize: "64MiB", line: "4KiB", mode: "writethrough", reduction: "off", adminAddr: freeTCPAddr(t)}
	tracePath := filepath.Join(dir, "rec.iolog")
	d := startServe(t, append(o.args(), "--record-trace", tracePath)...)

	// One request at a time, so that the recorder and the curves hear them in the same order.
	const ios = 200_000
	mustRunTool(t, "fio", "--name=zipf", "--ioengine=nbd", "--uri="+unixURI(d.Unix, ""), "--rw=randread",
		"--bs=4k", "--size=1g", "--random_distribution=zipf:1.1", "--randseed=49", "--number_ios="+strconv.Itoa(ios),
		"--iodepth=1")

	// Every request is observed before it is served, and /stats answers with every request
	// observed before it asked: fio's are all in.
	var stats struct {
		Exports []struct {
			Curves *sim.Curves `json:"curves"`
		} `json:"exports"`
	}
	body := httpGet(t, "http://"+o.adminAddr+"/stats")
	require.NoError(t, json.Unmarshal([]byte(body), &stats), "GET /stats:\n%s", body)
	require.Len(t, stats.Exports, 1)
	c := stats.Exports[0].Curves
	require.NotNil(t, c, "GET /stats: no curves with cache.curves on by default:\n%s", body)
	t.Logf("curves: %d lines of %d bytes, policy %s, admission %q, %d requests (%d reads), sampled %d, dropped %d, window %.1fs",
		c.Lines, c.LineSize, c.Policy, c.Admission, c.Requests[0], c.Requests[1], c.Sampled, c.Dropped, c.Window)
	require.Equal(t, int64(4<<10), c.LineSize)
	require.Equal(t, 16384, c.Lines)
	// The estimators' goroutine drops what it has no time for (the denominators leave the
	// dropped requests out): one request at a time, it keeps up.
	require.LessOrEqual(t, float64(c.Dropped), 0.05*float64(c.Sampled+c.Dropped), "the curves' goroutine dropped %d of %d sampled requests", c.Dropped, c.Sampled+c.Dropped)
	require.Equal(t, c.Requests[0], c.Requests[1], "fio only reads")
	require.GreaterOrEqual(t, c.Requests[0], int64(ios))

	mini := map[string][]float64{}
	var shards []float64
	for _, cv := range c.All {
		require.Len(t, cv.MissRatio, len(c.Sizes), "%s/%s", cv.Policy, cv.Method)
		switch cv.Method {
		case "mini":
			mini[cv.Policy] = cv.MissRatio
		case "shards":
			require.Equal(t, "lru", cv.Policy)
			shards = cv.MissRatio
		}
	}
	policies := []string{"lru", "s3fifo", "arc", "sieve", "wtinylfu", "2q"}
	for _, p := range policies {
		require.Contains(t, mini, p, "no miniature curve of %s", p)
	}
	require.NotNil(t, shards, "no lru/shards curve")

	// /metrics has the curves as gauges.
	metricsBody := httpGet(t, "http://"+o.adminAddr+"/metrics")
	found := false
	for _, line := range strings.Split(metricsBody, "\n") {
		found = found || strings.HasPrefix(line, "tierblk_mrc_miss_ratio{") && strings.Contains(line, `policy="s3fifo"`)
	}
	require.True(t, found, "GET /metrics has no tierblk_mrc_miss_ratio series of s3fifo")

	// The stop closes the recorder, which flushes the trace.
	d.requireStop(syscall.SIGTERM)
	recorded := countTraceRequests(t, tracePath)
	require.Equal(t, recorded, c.Requests[0], "the curves and the recorded trace saw different requests")

	// Every fourth of the curves' 37 sizes, from 1/64 of the tier to 8 times it: those simulated
	// in miniature (every eighth) and those interpolated halfway between them.
	var idx []int
	var sizes []string
	for i := 0; i < len(c.Sizes); i += 4 {
		idx = append(idx, i)
		sizes = append(sizes, strconv.Itoa(c.Sizes[i]))
	}
	admission := c.Admission
	if admission == "" {
		admission = "always"
	}
	exact := simExact(t, tracePath, "--model", "lines", "--block-size", "4KiB", "--admission", admission,
		"--policy", strings.Join(policies, ","), "--size", strings.Join(sizes, ","))
	exactLRU := simExact(t, tracePath, "--model", "object", "--block-size", "4KiB", "--admission", "always",
		"--policy", "lru", "--size", strings.Join(sizes, ","))

	compare := func(name string, live []float64, exact map[int]float64) {
		t.Helper()
		var sum, worst float64
		var rows []string
		for _, i := range idx {
			want, ok := exact[c.Sizes[i]]
			require.True(t, ok, "%s: no exact result at %d lines", name, c.Sizes[i])
			e := math.Abs(live[i] - want)
			sum += e
			worst = max(worst, e)
			rows = append(rows, fmt.Sprintf("%d:%.3f/%.3f", c.Sizes[i], live[i], want))
		}
		mae := sum / float64(len(idx))
		t.Logf("%-13s MAE %.4f, worst %.4f (lines:live/exact %s)", name, mae, worst, strings.Join(rows, " "))
		require.Less(t, mae, curvesMAE, "%s: the live curve's mean absolute error against the exact replay", name)
	}
	for _, p := range policies {
		compare(p+"/mini", mini[p], exact[p])
	}
	compare("lru/shards", shards, exactLRU["lru"])
}

// httpGet GETs url, requires 200 OK and returns the body.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s:\n%s", url, body)
	return string(body)
}

// countTraceRequests counts the requests with a range (reads, writes, trims; not flushes) in a
// fio iolog, the requests the live curves count.
func countTraceRequests(t *testing.T, path string) int64 {
	t.Helper()
	r, err := trace.Open(path, "fio")
	require.NoError(t, err)
	defer r.Close()
	var n int64
	for {
		req, err := r.Next()
		if errors.Is(err, io.EOF) {
			return n
		}
		require.NoError(t, err)
		if req.Length > 0 {
			n++
		}
	}
}

// simExact runs `tierblk sim` on a fio iolog with args, an exact replay, and returns each
// policy's miss ratio by size.
func simExact(t *testing.T, tracePath string, args ...string) map[string]map[int]float64 {
	t.Helper()
	args = append([]string{"sim", "--trace", tracePath, "--format", "fio", "--output", "json", "--quiet"}, args...)
	out := mustRunTool(t, tierblkPath, args...)
	var res []sim.Result
	// The JSON, then perhaps a note on stderr (the sizes that hold the working set).
	start := strings.IndexByte(out, '[')
	require.GreaterOrEqual(t, start, 0, "tierblk %s:\n%s", strings.Join(args, " "), out)
	require.NoError(t, json.NewDecoder(strings.NewReader(out[start:])).Decode(&res), "tierblk %s:\n%s", strings.Join(args, " "), out)
	m := map[string]map[int]float64{}
	for _, r := range res {
		require.Empty(t, r.Estimate, "an exact replay")
		if m[r.Policy] == nil {
			m[r.Policy] = map[int]float64{}
		}
		m[r.Policy][r.CacheSize] = r.MissRatio
	}
	return m
}
