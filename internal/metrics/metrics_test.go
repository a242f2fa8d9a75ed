package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/replica"
	"github.com/tierblk/tierblk/internal/sim"
)

// fakeStats is a snapshot with distinct numbers everywhere, so a value read from the wrong field
// shows up.
func fakeStats() cache.Stats {
	return cache.Stats{
		Mode:     "write-back",
		LineSize: 65536,
		Tiers: []cache.TierStats{
			{Name: "ram", Policy: "s3fifo", Admission: "always", Hits: 900, Misses: 100, HitBytes: 900 * 65536,
				Promotions: 7, Evictions: 5, Invalidations: 3, Lines: 512, Capacity: 1024, LineBytes: 512 * 65536, Errors: 0,
				LogicalBytes: 30 << 20, PhysicalBytes: 30 << 20, ReductionRatio: 1},
			{Name: "ssd", Policy: "lru", Admission: "nhit:2", Hits: 60, Misses: 40, HitBytes: 60 * 65536,
				Promotions: 11, Evictions: 13, Invalidations: 17, Lines: 4000, Capacity: 16384, LineBytes: 4000 * 65536,
				Errors: 2, Failed: true, Reason: "write: input/output error", Rejected: 19, Congested: 5, CongestedNow: true,
				LogicalBytes: 200 << 20, PhysicalBytes: 80 << 20, ReductionRatio: 2.5, Reduction: "zero",
				ChecksumErrors: 23, Adopted: 29},
		},
		Lost: cache.LostStats{Bytes: 3 * 4096, Ranges: []meta.Range{{Off: 65536, Len: 4096}, {Off: 1 << 20, Len: 8192}}, Blocks: 31},
		// A scrub cut short a quarter of the way.
		Scrub: cache.ScrubStats{Lines: 4000, Done: 1000, Bytes: 1000 * 65536, Damaged: 37, Lost: 3,
			Started: 1.7e9, Ended: 1.7e9 + 120, Err: "context canceled"},
		Backend: cache.IOStats{Reads: 40, Writes: 20, ReadBytes: 40 * 65536, WriteBytes: 20 * 4096, Errors: 1},
		Dirty: cache.DirtyStats{Lines: 300, Bytes: 300 * 65536, Ratio: 0.125, High: 0.5, Low: 0.25, Max: 0.9,
			Destaging: true, DestagedBytes: 7 << 20, DestageWrites: 21, DestageErrors: 4, ThrottledWrites: 33, ThrottleSeconds: 2.5,
			DestageRate: 1 << 20, ThrottleDelay: 0.003},
		ReadLatency: cache.Histogram{Bounds: []float64{0.001, 0.01, 0.1}, Counts: []uint64{5, 3, 0, 2},
			Count: 10, Sum: 1.5},
		WriteLatency: cache.Histogram{Bounds: []float64{0.001, 0.01, 0.1}, Counts: []uint64{0, 0, 4, 0},
			Count: 4, Sum: 0.2},
	}
}

func fakeSources() []Source {
	return []Source{{Export: "disk0", Stats: fakeStats}}
}

func get(t *testing.T, h http.Handler, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, nil)
	req.Host = "127.0.0.1:9810" // as the CLI names a TCP endpoint (guard)
	h.ServeHTTP(rec, req)
	return rec
}

// addrCase is an address, and what a parser of addresses makes of it.
type addrCase struct {
	in, network, address string
	wantErr              string
}

func (tc addrCase) check(t *testing.T, parse func(string) (string, string, error)) {
	t.Run(tc.in, func(t *testing.T) {
		network, address, err := parse(tc.in)
		if tc.wantErr != "" {
			require.ErrorContains(t, err, tc.wantErr)
			require.ErrorContains(t, err, tc.in)
			return
		}
		require.NoError(t, err)
		require.Equal(t, tc.network, network)
		require.Equal(t, tc.address, address)
	})
}

func TestParseAdminAddr(t *testing.T) {
	for _, tc := range []addrCase{
		{in: "127.0.0.1:9180", network: "tcp", address: "127.0.0.1:9180"},
		{in: "127.0.0.1:0", network: "tcp", address: "127.0.0.1:0"},
		{in: "127.1.2.3:9180", network: "tcp", address: "127.1.2.3:9180"},
		{in: "[::1]:9180", network: "tcp", address: "[::1]:9180"},
		{in: "localhost:9180", network: "tcp", address: "localhost:9180"},
		{in: "unix:/run/tierblk-admin.sock", network: "unix", address: "/run/tierblk-admin.sock"},
		{in: "0.0.0.0:9180", wantErr: "loopback"},
		{in: "[::]:9180", wantErr: "loopback"},
		{in: "192.168.1.5:9180", wantErr: "loopback"},
		{in: "example.com:9180", wantErr: "loopback"},
		{in: ":9000", wantErr: "loopback"},
		{in: "", wantErr: "neither unix:/path/to.sock nor HOST:PORT"},
		{in: "127.0.0.1", wantErr: "neither unix:/path/to.sock nor HOST:PORT"},
		{in: "127.0.0.1:http", wantErr: "not a number"},
		{in: "127.0.0.1:70000", wantErr: "not a number"},
		{in: "unix:", wantErr: "no socket path"},
	} {
		tc.check(t, ParseAdminAddr)
	}
}

func TestHandlerRoutes(t *testing.T) {
	h := NewHandler(fakeSources)
	for _, tc := range []struct {
		method, path string
		code         int
		contentType  string
	}{
		{"GET", "/", http.StatusOK, "text/plain"},
		{"GET", "/metrics", http.StatusOK, "text/plain"},
		{"GET", "/stats", http.StatusOK, "application/json"},
		{"HEAD", "/stats", http.StatusOK, "application/json"},
		{"GET", "/nope", http.StatusNotFound, ""},
		{"GET", "/stats/x", http.StatusNotFound, ""},
		{"POST", "/stats", http.StatusMethodNotAllowed, ""},
		{"DELETE", "/metrics", http.StatusMethodNotAllowed, ""},
		{"PUT", "/", http.StatusMethodNotAllowed, ""},
		{"GET", "/debug/pprof/", http.StatusOK, "text/html"},
		{"GET", "/debug/pprof/goroutine?debug=1", http.StatusOK, "text/plain"},
		{"GET", "/debug/pprof/mutex?debug=1", http.StatusOK, "text/plain"},
		{"POST", "/debug/pprof/heap", http.StatusMethodNotAllowed, ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			rec := get(t, h, tc.method, tc.path)
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			if tc.contentType != "" {
				require.Contains(t, rec.Header().Get("Content-Type"), tc.contentType)
			}
		})
	}
}

func TestHandlerStatsJSONRoundTrip(t *testing.T) {
	sources := []Source{
		{Export: "disk0", Stats: fakeStats},
		{Export: "empty", Stats: func() cache.Stats { return cache.Stats{Mode: "write-through"} }},
	}
	rec := get(t, NewHandler(func() []Source { return sources }), "GET", "/stats")
	require.Equal(t, http.StatusOK, rec.Code)
	var got StatsResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Equal(t, StatsResponse{Exports: []ExportStats{
		{Name: "disk0", Stats: fakeStats()},
		{Name: "empty", Stats: cache.Stats{Mode: "write-through"}},
	}}, got)
}

func TestHandlerLeavesOutExportsWithoutCache(t *testing.T) {
	h := NewHandler(func() []Source { return []Source{{Export: "plain"}, {Export: "disk0", Stats: fakeStats}} })
	var got StatsResponse
	require.NoError(t, json.Unmarshal(get(t, h, "GET", "/stats").Body.Bytes(), &got))
	require.Len(t, got.Exports, 1)
	require.Equal(t, "disk0", got.Exports[0].Name)
	require.NotContains(t, get(t, h, "GET", "/metrics").Body.String(), `export="plain"`)
}

func TestHandlerStatsNoExports(t *testing.T) {
	rec := get(t, NewHandler(func() []Source { return nil }), "GET", "/stats")
	require.JSONEq(t, `{"exports":[]}`, rec.Body.String())
}

// scrape parses GET /metrics into metric families.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := get(t, h, "GET", "/metrics")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	require.NoError(t, err)
	return fams
}

// series finds the metric of family name whose labels are exactly labels.
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "no metric family %s", name)
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) == len(labels) {
			match := true
			for k, v := range labels {
				match = match && got[k] == v
			}
			if match {
				return m
			}
		}
	}
	t.Fatalf("%s has no series %v", name, labels)
	return nil
}

func TestHandlerMetricsTiersAndBackend(t *testing.T) {
	fams := scrape(t, NewHandler(fakeSources))
	for _, tc := range []struct {
		name  string
		tier  string
		typ   dto.MetricType
		value float64
	}{
		{"tierblk_cache_hits_total", "ram", dto.MetricType_COUNTER, 900},
		{"tierblk_cache_misses_total", "ram", dto.MetricType_COUNTER, 100},
		{"tierblk_cache_hit_bytes_total", "ram", dto.MetricType_COUNTER, 900 * 65536},
		{"tierblk_cache_promotions_total", "ssd", dto.MetricType_COUNTER, 11},
		{"tierblk_cache_evictions_total", "ssd", dto.MetricType_COUNTER, 13},
		{"tierblk_cache_invalidations_total", "ssd", dto.MetricType_COUNTER, 17},
		{"tierblk_cache_errors_total", "ssd", dto.MetricType_COUNTER, 2},
		{"tierblk_cache_checksum_errors_total", "ssd", dto.MetricType_COUNTER, 23},
		{"tierblk_cache_checksum_errors_total", "ram", dto.MetricType_COUNTER, 0},
		{"tierblk_cache_checksums_adopted_total", "ssd", dto.MetricType_COUNTER, 29},
		{"tierblk_cache_lines", "ssd", dto.MetricType_GAUGE, 4000},
		{"tierblk_cache_capacity_lines", "ssd", dto.MetricType_GAUGE, 16384},
		{"tierblk_cache_bytes", "ram", dto.MetricType_GAUGE, 512 * 65536},
		{"tierblk_cache_logical_bytes", "ssd", dto.MetricType_GAUGE, 200 << 20},
		{"tierblk_cache_physical_bytes", "ssd", dto.MetricType_GAUGE, 80 << 20},
		{"tierblk_cache_reduction_ratio", "ssd", dto.MetricType_GAUGE, 2.5},
		{"tierblk_cache_reduction_ratio", "ram", dto.MetricType_GAUGE, 1},
		{"tierblk_cache_tier_failed", "ram", dto.MetricType_GAUGE, 0},
		{"tierblk_cache_tier_failed", "ssd", dto.MetricType_GAUGE, 1},
		{"tierblk_cache_bypassed_bytes_total", "ram", dto.MetricType_COUNTER, 0},
		{"tierblk_cache_bypassed_bytes_total", "ssd", dto.MetricType_COUNTER, 19 * 65536},
		{"tierblk_cache_tier_congested", "ram", dto.MetricType_GAUGE, 0},
		{"tierblk_cache_tier_congested", "ssd", dto.MetricType_GAUGE, 1},
		{"tierblk_backend_reads_total", "", dto.MetricType_COUNTER, 40},
		{"tierblk_backend_writes_total", "", dto.MetricType_COUNTER, 20},
		{"tierblk_backend_read_bytes_total", "", dto.MetricType_COUNTER, 40 * 65536},
		{"tierblk_backend_write_bytes_total", "", dto.MetricType_COUNTER, 20 * 4096},
		{"tierblk_backend_errors_total", "", dto.MetricType_COUNTER, 1},
		{"tierblk_cache_lost_bytes", "", dto.MetricType_GAUGE, 3 * 4096},
		{"tierblk_cache_lost_blocks_total", "", dto.MetricType_COUNTER, 31},
		{"tierblk_cache_scrub_running", "", dto.MetricType_GAUGE, 0},
		{"tierblk_cache_scrub_progress_ratio", "", dto.MetricType_GAUGE, 0.25},
		{"tierblk_cache_scrub_damaged_blocks", "", dto.MetricType_GAUGE, 37},
		{"tierblk_cache_scrub_last_end_time_seconds", "", dto.MetricType_GAUGE, 1.7e9 + 120},
	} {
		t.Run(tc.name+"/"+tc.tier, func(t *testing.T) {
			labels := map[string]string{"export": "disk0"}
			if tc.tier != "" {
				labels["tier"] = tc.tier
			}
			require.Equal(t, tc.typ, fams[tc.name].GetType())
			m := series(t, fams, tc.name, labels)
			if tc.typ == dto.MetricType_COUNTER {
				require.Equal(t, tc.value, m.GetCounter().GetValue())
			} else {
				require.Equal(t, tc.value, m.GetGauge().GetValue())
			}
		})
	}
}

func TestHandlerMetricsHistogramsAreCumulative(t *testing.T) {
	fams := scrape(t, NewHandler(fakeSources))
	require.Equal(t, dto.MetricType_HISTOGRAM, fams["tierblk_request_duration_seconds"].GetType())
	for _, tc := range []struct {
		op      string
		buckets []uint64 // cumulative, at 0.001, 0.01, 0.1 and +Inf
		count   uint64
		sum     float64
	}{
		{"read", []uint64{5, 8, 8, 10}, 10, 1.5},
		{"write", []uint64{0, 0, 4, 4}, 4, 0.2},
	} {
		t.Run(tc.op, func(t *testing.T) {
			h := series(t, fams, "tierblk_request_duration_seconds", map[string]string{"export": "disk0", "op": tc.op}).GetHistogram()
			var bounds []float64
			var counts []uint64
			for _, b := range h.GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
				counts = append(counts, b.GetCumulativeCount())
			}
			require.Equal(t, []float64{0.001, 0.01, 0.1, math.Inf(1)}, bounds)
			require.Equal(t, tc.buckets, counts)
			require.Equal(t, tc.count, h.GetSampleCount())
			require.Equal(t, tc.sum, h.GetSampleSum())
		})
	}
}

func TestHandlerMetricsExactLines(t *testing.T) {
	body := get(t, NewHandler(fakeSources), "GET", "/metrics").Body.String()
	for _, line := range []string{
		`tierblk_cache_hits_total{export="disk0",tier="ram"} 900`,
		`tierblk_request_duration_seconds_bucket{export="disk0",op="read",le="0.01"} 8`,
		`tierblk_request_duration_seconds_bucket{export="disk0",op="read",le="+Inf"} 10`,
		`tierblk_request_duration_seconds_count{export="disk0",op="read"} 10`,
		`tierblk_cache_dirty_lines{export="disk0"} 300`,
		`tierblk_cache_dirty_data_bytes{export="disk0"} 1.96608e+07`,
		`tierblk_cache_destage_writes_total{export="disk0"} 21`,
		`tierblk_cache_destaging{export="disk0"} 1`,
		`tierblk_cache_dirty_watermark_ratio{export="disk0",watermark="low"} 0.25`,
		`tierblk_cache_dirty_watermark_ratio{export="disk0",watermark="high"} 0.5`,
		`tierblk_cache_dirty_watermark_ratio{export="disk0",watermark="max"} 0.9`,
		`tierblk_cache_mode_info{export="disk0",mode="write-back"} 1`,
		`tierblk_cache_flushes_in_progress{export="disk0"} 0`,
		`tierblk_cache_flush_start_time_seconds{export="disk0"} 0`,
		`tierblk_cache_dirty_ratio{export="disk0"} 0.125`,
		`tierblk_cache_destaged_bytes_total{export="disk0"} 7.340032e+06`,
		`tierblk_cache_destage_errors_total{export="disk0"} 4`,
		`tierblk_cache_throttled_writes_total{export="disk0"} 33`,
		`tierblk_cache_throttle_seconds_total{export="disk0"} 2.5`,
		`tierblk_cache_destage_bytes_per_second{export="disk0"} 1.048576e+06`,
		`tierblk_cache_throttle_delay_seconds{export="disk0"} 0.003`,
		`tierblk_cache_checksum_errors_total{export="disk0",tier="ssd"} 23`,
		`tierblk_cache_lost_bytes{export="disk0"} 12288`,
		`tierblk_cache_scrub_last_end_time_seconds{export="disk0"} 1.70000012e+09`,
	} {
		require.Contains(t, body, line+"\n")
	}
	// The Go and process collectors are registered too.
	require.Contains(t, body, "\ngo_goroutines ")
	require.Contains(t, body, "\nprocess_")
}

// A replicated export has a series of each replica metric per replica; others have none.
func TestHandlerMetricsReplicas(t *testing.T) {
	reps := func() []replica.PeerStats {
		return []replica.PeerStats{
			{Name: "nbd://b:10810/nas", State: "ok", LagBytes: 4096, Flushes: 4, FlushNS: 2e6, Resyncs: 1, Losses: 1},
			{Name: "nbd://c:10810/nas", State: "lost", Losses: 2},
		}
	}
	body := get(t, NewHandler(func() []Source {
		return []Source{{Export: "disk0", Stats: fakeStats, Replicas: reps}, {Export: "disk1", Stats: fakeStats}}
	}), "GET", "/metrics").Body.String()
	for _, line := range []string{
		`tierblk_replica_up{export="disk0",replica="nbd://b:10810/nas"} 1`,
		`tierblk_replica_up{export="disk0",replica="nbd://c:10810/nas"} 0`,
		`tierblk_replica_lag_bytes{export="disk0",replica="nbd://b:10810/nas"} 4096`,
		`tierblk_replica_losses_total{export="disk0",replica="nbd://c:10810/nas"} 2`,
		`tierblk_replica_resyncs_total{export="disk0",replica="nbd://b:10810/nas"} 1`,
		`tierblk_replica_flushes_total{export="disk0",replica="nbd://b:10810/nas"} 4`,
		`tierblk_replica_flush_seconds_total{export="disk0",replica="nbd://b:10810/nas"} 0.002`,
	} {
		require.Contains(t, body, line+"\n")
	}
	require.NotContains(t, body, `tierblk_replica_up{export="disk1"`)
}

// A cache without write-back has no watermarks, rather than watermarks of 0 that its dirty ratio
// of 0 would stand at.
func TestHandlerMetricsNoWatermarksWithoutWriteBack(t *testing.T) {
	stats := func() cache.Stats {
		s := fakeStats()
		s.Dirty = cache.DirtyStats{}
		return s
	}
	fams := scrape(t, NewHandler(func() []Source { return []Source{{Export: "disk0", Stats: stats}} }))
	require.NotContains(t, fams, "tierblk_cache_dirty_watermark_ratio")
	require.Zero(t, series(t, fams, "tierblk_cache_dirty_ratio", map[string]string{"export": "disk0"}).GetGauge().GetValue())
}

func TestHandlerMetricsReadsSourcesPerScrape(t *testing.T) {
	var srcs []Source
	h := NewHandler(func() []Source { return srcs })
	require.NotContains(t, scrape(t, h), "tierblk_cache_hits_total")
	srcs = fakeSources()
	series(t, scrape(t, h), "tierblk_cache_hits_total", map[string]string{"export": "disk0", "tier": "ram"})
}

// The NBD server's refused connections are counters by reason, read at every scrape.
func TestRefusedConnections(t *testing.T) {
	counts := map[string]uint64{"not allowed": 3, "too many connections": 0}
	h := NewHandler(fakeSources, RefusedConnections(func() map[string]uint64 { return counts }))
	fams := scrape(t, h)
	require.Equal(t, dto.MetricType_COUNTER, fams["tierblk_nbd_connections_refused_total"].GetType())
	for reason, n := range counts {
		m := series(t, fams, "tierblk_nbd_connections_refused_total", map[string]string{"reason": reason})
		require.Equal(t, float64(n), m.GetCounter().GetValue(), reason)
	}
	counts = map[string]uint64{"not allowed": 4, "too many connections": 1}
	require.Contains(t, get(t, h, "GET", "/metrics").Body.String(), `tierblk_nbd_connections_refused_total{reason="not allowed"} 4`+"\n")
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// fetch GETs path from an admin endpoint at bound, a ParseAdminAddr address.
func fetch(t *testing.T, bound, path string) string {
	t.Helper()
	network, address, err := ParseAdminAddr(bound)
	require.NoError(t, err)
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}}}
	defer c.CloseIdleConnections()
	host := "admin" // any, on a unix socket
	if network == "tcp" {
		host = address
	}
	resp, err := c.Get("http://" + host + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func TestServeTCP(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	bound, wait, err := Serve(ctx, "127.0.0.1:0", NewHandler(fakeSources), quietLog())
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(bound, "127.0.0.1:"), bound)
	require.NotEqual(t, "127.0.0.1:0", bound, "bound must name the real port")
	require.Contains(t, fetch(t, bound, "/stats"), `"name": "disk0"`)
	cancel()
	require.NoError(t, wait())
	_, err = net.Dial("tcp", bound)
	require.Error(t, err, "still listening after shutdown")
}

func TestServeUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "admin.sock") // run/ does not exist yet
	ctx, cancel := context.WithCancel(context.Background())
	bound, wait, err := Serve(ctx, "unix:"+path, NewHandler(fakeSources), quietLog())
	require.NoError(t, err)
	require.Equal(t, "unix:"+path, bound)
	require.Contains(t, fetch(t, bound, "/metrics"), "tierblk_cache_hits_total")

	// A second server must not steal a live socket.
	_, _, err = Serve(context.Background(), "unix:"+path, NewHandler(fakeSources), quietLog())
	require.ErrorContains(t, err, "in use by another server")

	cancel()
	require.NoError(t, wait())
	_, err = os.Lstat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "socket left behind after shutdown")
}

func TestServeReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.sock")
	// A listener that is closed without unlinking leaves the socket file of a dead process.
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	_, err = os.Lstat(path)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	bound, wait, err := Serve(ctx, "unix:"+path, NewHandler(fakeSources), quietLog())
	require.NoError(t, err)
	require.Contains(t, fetch(t, bound, "/"), "/metrics")
	cancel()
	require.NoError(t, wait())
}

func TestServeRefuses(t *testing.T) {
	notSocket := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notSocket, []byte("x"), 0o644))
	for _, tc := range []struct{ addr, wantErr string }{
		{"0.0.0.0:0", "loopback"},
		{"unix:" + notSocket, "is not a socket"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			_, _, err := Serve(context.Background(), tc.addr, NewHandler(fakeSources), quietLog())
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
	data, err := os.ReadFile(notSocket)
	require.NoError(t, err)
	require.Equal(t, "x", string(data), "a file that is not a socket must be left alone")
}

func TestParseMetricsAddr(t *testing.T) {
	for _, tc := range []addrCase{
		{in: ":9810", network: "tcp", address: ":9810"},
		{in: "0.0.0.0:9810", network: "tcp", address: "0.0.0.0:9810"},
		{in: "192.168.1.5:9810", network: "tcp", address: "192.168.1.5:9810"},
		{in: "[::]:9810", network: "tcp", address: "[::]:9810"},
		{in: "unix:/run/tierblk/metrics.sock", network: "unix", address: "/run/tierblk/metrics.sock"},
		{in: "9810", wantErr: "neither unix:/path/to.sock nor HOST:PORT"},
		{in: ":http", wantErr: "not a number"},
		{in: "unix:", wantErr: "no socket path"},
	} {
		tc.check(t, ParseMetricsAddr)
	}
}

// TestMetricsHandler: the metrics endpoint serves /metrics and /stats to a request naming any
// host (a Prometheus scraping the host's address), and nothing that acts or profiles.
func TestMetricsHandler(t *testing.T) {
	h := NewHandlers(fakeSources).Metrics
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/", http.StatusOK},
		{"GET", "/metrics", http.StatusOK},
		{"GET", "/stats", http.StatusOK},
		{"POST", "/flush?export=disk0", http.StatusNotFound},
		{"POST", "/mode?export=disk0&mode=writethrough", http.StatusNotFound},
		{"POST", "/heal?export=disk0", http.StatusNotFound},
		{"POST", "/scrub?export=disk0", http.StatusNotFound},
		{"GET", "/debug/pprof/", http.StatusNotFound},
		{"POST", "/stats", http.StatusMethodNotAllowed},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(tc.method, tc.path, nil)
			req.Host = "192.168.1.5:9810"
			req.RemoteAddr = "192.168.1.9:40000"
			h.ServeHTTP(rec, req)
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			if tc.path == "/metrics" {
				require.Contains(t, rec.Body.String(), `export="disk0"`)
			}
		})
	}
}

func TestScrubProgress(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    cache.ScrubStats
		want float64
	}{
		{"never", cache.ScrubStats{}, 0},
		{"starting", cache.ScrubStats{Running: true, Lines: 8}, 0},
		{"halfway", cache.ScrubStats{Running: true, Lines: 8, Done: 4}, 0.5},
		{"done", cache.ScrubStats{Lines: 8, Done: 8, Ended: 1}, 1},
		{"cut short", cache.ScrubStats{Lines: 8, Done: 2, Ended: 1, Err: "context canceled"}, 0.25},
		{"empty tier", cache.ScrubStats{Ended: 1}, 1},
	} {
		require.Equal(t, tc.want, scrubProgress(tc.s), tc.name)
	}
}

// An export served without a cache (its statistics a cache.Meter's) has its backend's series, its
// request durations and the mode "none", so that the backend-errors alert sees it.
func TestHandlerMetricsExportWithoutCache(t *testing.T) {
	var m cache.Meter
	m.Read(4096, time.Millisecond, errors.New("gone"))
	h := NewHandler(func() []Source { return []Source{{Export: "remote", Stats: m.Stats}} })
	body := get(t, h, "GET", "/metrics").Body.String()
	for _, line := range []string{
		`tierblk_cache_mode_info{export="remote",mode="none"} 1`,
		`tierblk_backend_errors_total{export="remote"} 1`,
		`tierblk_backend_read_bytes_total{export="remote"} 4096`,
		`tierblk_request_duration_seconds_count{export="remote",op="read"} 1`,
	} {
		require.Contains(t, body, line+"\n")
	}
	require.NotContains(t, body, `tier="`, "no tiers")
}

// TestHandlerMetricsCurves: an export's live curves as gauges: the miss ratio per stream, policy
// and size, the best hit ratios, and the advised sizes of the curves' tier and of the RAM tier in
// front of it, each from its own advice.
func TestHandlerMetricsCurves(t *testing.T) {
	c := &sim.Curves{
		LineSize: 4096, Lines: 4, Tier: "ssd", Policy: "s3fifo", Sizes: []int{2, 4},
		All:     []sim.Curve{{Policy: "s3fifo", Method: "mini", MissRatio: []float64{0.5, 0.25}}},
		Reads:   []sim.Curve{{Policy: "lru", Method: "shards", MissRatio: []float64{0.75, 0.5}}},
		BestHit: [2]float64{0.8, 0.6},
		Advice:  sim.Advice{For90: 4, For95: 8},
		RAM:     &sim.RAMCurve{Lines: 2, Sizes: []int{1, 2}, MissRatio: []float64{0.9, 0.7}, Advice: sim.Advice{For90: 16}},
	}
	fams := scrape(t, NewHandler(func() []Source {
		return []Source{{Export: "nas", Stats: fakeStats, Curves: func() *sim.Curves { return c }}}
	}))
	for _, tc := range []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"tierblk_mrc_miss_ratio", map[string]string{"export": "nas", "stream": "all", "policy": "s3fifo", "method": "mini", "size_bytes": "16384"}, 0.25},
		{"tierblk_mrc_miss_ratio", map[string]string{"export": "nas", "stream": "reads", "policy": "lru", "method": "shards", "size_bytes": "8192"}, 0.75},
		{"tierblk_mrc_best_hit_ratio", map[string]string{"export": "nas", "stream": "all"}, 0.8},
		{"tierblk_mrc_best_hit_ratio", map[string]string{"export": "nas", "stream": "reads"}, 0.6},
		{"tierblk_mrc_advised_size_bytes", map[string]string{"export": "nas", "tier": "ssd", "share": "0.9"}, 4 * 4096},
		{"tierblk_mrc_advised_size_bytes", map[string]string{"export": "nas", "tier": "ssd", "share": "0.95"}, 8 * 4096},
		{"tierblk_mrc_advised_size_bytes", map[string]string{"export": "nas", "tier": "ssd", "share": "0.99"}, 0},
		{"tierblk_mrc_advised_size_bytes", map[string]string{"export": "nas", "tier": "ram", "share": "0.9"}, 16 * 4096},
	} {
		require.Equal(t, tc.value, series(t, fams, tc.name, tc.labels).GetGauge().GetValue(), "%s %v", tc.name, tc.labels)
	}
}
