package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/replica"
)

func statsFixture() cache.Stats {
	return cache.Stats{
		Mode:     "write-back",
		LineSize: 65536,
		Tiers: []cache.TierStats{
			{Name: "ram", Policy: "s3fifo", Admission: "always", Hits: 900, Misses: 100, HitBytes: 900 * 65536,
				Promotions: 7, Evictions: 5, Lines: 512, Capacity: 1024, LineBytes: 512 * 65536, Admitted: 100,
				LogicalBytes: 30 << 20, PhysicalBytes: 30 << 20, ReductionRatio: 1},
			{Name: "ssd", Policy: "lru", Admission: "nhit:2", Hits: 60, Misses: 40, HitBytes: 60 * 65536,
				Promotions: 11, Evictions: 13, Lines: 4000, Capacity: 16384, LineBytes: 4000 * 65536,
				Errors: 2, Failed: true, Reason: "write: input/output error", SetAside: 3990, RetryIn: 19.6,
				Admitted: 12, Rejected: 28, Congested: 20, CongestedNow: true, DeviceLatency: 0.0125,
				LogicalBytes: 200 << 20, PhysicalBytes: 80 << 20, ReductionRatio: 2.5, Reduction: "zero"},
		},
		ReadBytes: 60 << 20, FetchedBytes: 40 * 65536,
		Backend: cache.IOStats{Reads: 40, Writes: 20, ReadBytes: 40 * 65536, WriteBytes: 20*4096 + 512, Errors: 1},
		Dirty: cache.DirtyStats{Lines: 2048, Bytes: 96 << 20, Ratio: 0.125, High: 0.5, Low: 0.25, Max: 0.9, Destaging: true,
			DestagedBytes: 3 << 30, DestageErrors: 2, DestageRate: 12.5 * (1 << 20), ThrottledWrites: 17, ThrottleSeconds: 1.25,
			ThrottleDelay: 0.0021},
		// 100 reads: 50 at most 1ms, 40 more at most 10ms, 10 above 100ms.
		ReadLatency: cache.Histogram{Bounds: []float64{0.001, 0.01, 0.1}, Counts: []uint64{50, 40, 0, 10},
			Count: 100, Sum: 3},
		WriteLatency: cache.Histogram{Bounds: []float64{0.001, 0.01, 0.1}, Counts: []uint64{0, 0, 0, 0}},
	}
}

// serveAdmin runs a real admin endpoint over sources on a unix socket until the test ends, and
// returns its address.
func serveAdmin(t *testing.T, sources []metrics.Source) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	bound, wait, err := metrics.Serve(ctx, "unix:"+filepath.Join(t.TempDir(), "admin.sock"),
		metrics.NewHandler(func() []metrics.Source { return sources }), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		require.NoError(t, wait())
	})
	return bound
}

// replicasFixture is disk0's replicas: one in service, one lost.
func replicasFixture() []replica.PeerStats {
	return []replica.PeerStats{
		{Name: "nbd://b:10810/nas", State: "ok", LagBytes: 3 << 20, Flushes: 4, FlushNS: 6e6},
		{Name: "nbd://c:10810/nas", State: "lost", LastError: "write: connection refused", Losses: 1},
	}
}

// serveStats runs a real admin endpoint on a unix socket with exports disk0, disk1 and remote,
// the last without a cache.
func serveStats(t *testing.T) string {
	t.Helper()
	var remote cache.Meter
	remote.Read(4096, time.Millisecond, nil)
	remote.Write(512, time.Second, errors.New("the backend failed"))
	sources := []metrics.Source{
		{Export: "disk0", Stats: statsFixture, Replicas: replicasFixture},
		{Export: "disk1", Stats: func() cache.Stats { return cache.Stats{Mode: "write-through", LineSize: 4096} }},
		{Export: "remote", Stats: remote.Stats},
	}
	bound := serveAdmin(t, sources)
	return bound
}

func statsCmd(o statsOpts) (string, error) {
	var out bytes.Buffer
	o.stdout = &out
	err := runStats(context.Background(), o)
	return out.String(), err
}

const disk0Table = `export disk0: mode write-back, line size 64KiB
tier  policy  hits  misses  hit ratio  lines/capacity  occupancy  bytes   promotions  evictions  errors  state
ram   s3fifo  900   100     90.0%      512/1024        50.0%      32MiB   7           5          0       ok
ssd   lru     60    40      60.0%      4000/16384      24.4%      250MiB  11          13         2       BYPASSED (3990 lines set aside; retry in 20s): write: input/output error
backend: 40 reads (2.5MiB), 20 writes (80.5KiB), 1 errors
reads: 60MiB asked, 2.5MiB fetched by misses (amplification 0.04); ram admission always: 100 admitted, 0 rejected; ssd admission nhit:2: 12 admitted, 28 rejected (20 while its device was congested), device 12.50 ms a request, congested
stored: ram 30MiB logical, 30MiB physical (1.00x); ssd 200MiB logical, 80MiB physical (2.50x, reduction zero)
dirty: 2048 lines (12.5%; high 50%, low 25%, max 90%), 96MiB; destaging at 12.5MiB/s, 3GiB destaged, 2 destage errors; 17 throttled writes (1.25s), delay now 2.1ms a line
replica nbd://b:10810/nas: ok; 3MiB of log not released, flush 1.5ms on average; 0 losses, 0 resyncs
replica nbd://c:10810/nas: lost; 0B of log not released, no flush yet; 1 losses, 0 resyncs; last error: write: connection refused
latency: read p50 1ms p99 >100ms (100 requests); write no requests
`

func TestStatsTable(t *testing.T) {
	bound := serveStats(t)
	out, err := statsCmd(statsOpts{admin: bound})
	require.NoError(t, err)
	require.Equal(t, disk0Table+`
export disk1: mode write-through, line size 4KiB
no cache tiers
backend: 0 reads (0B), 0 writes (0B), 0 errors
latency: read no requests; write no requests

export remote: no cache, its backend served as it is
backend: 1 reads (4KiB), 1 writes (512B), 1 errors
latency: read p50 781µs p99 996µs (1 requests); write p50 781ms p99 996ms (1 requests)
`, out)

	out, err = statsCmd(statsOpts{admin: bound, export: "remote"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "export remote: no cache"), out)

	out, err = statsCmd(statsOpts{admin: bound, export: "disk0"})
	require.NoError(t, err)
	require.Equal(t, disk0Table, out)
}

func TestStatsJSON(t *testing.T) {
	bound := serveStats(t)
	out, err := statsCmd(statsOpts{admin: bound, json: true, export: "disk0"})
	require.NoError(t, err)
	var got metrics.StatsResponse
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Equal(t, metrics.StatsResponse{Exports: []metrics.ExportStats{{Name: "disk0", Stats: statsFixture(), Replicas: replicasFixture()}}}, got)
}

func TestStatsOverTCP(t *testing.T) {
	srv := httptest.NewServer(metrics.NewHandler(func() []metrics.Source {
		return []metrics.Source{{Export: "disk0", Stats: statsFixture, Replicas: replicasFixture}}
	}))
	defer srv.Close()
	out, err := statsCmd(statsOpts{admin: strings.TrimPrefix(srv.URL, "http://")})
	require.NoError(t, err)
	require.Equal(t, disk0Table, out)
}

func TestStatsErrors(t *testing.T) {
	notTierblk := httptest.NewServer(http.NotFoundHandler())
	defer notTierblk.Close()
	notJSON := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("<html>")) }))
	defer notJSON.Close()
	bound := serveStats(t)
	dead := "unix:" + filepath.Join(t.TempDir(), "nobody.sock")

	for _, tc := range []struct {
		name    string
		o       statsOpts
		code    int
		wantErr string
	}{
		{"no admin", statsOpts{}, 2, "--admin is required"},
		{"any address", statsOpts{admin: "0.0.0.0:9180"}, 2, "loopback"},
		{"LAN address", statsOpts{admin: "192.168.1.5:9180"}, 2, "loopback"},
		{"not an address", statsOpts{admin: "localhost"}, 2, "neither unix:/path/to.sock nor HOST:PORT"},
		{"nothing listening", statsOpts{admin: dead}, 1, "no tierblk admin endpoint at " + dead + ": dial unix "},
		{"not tierblk", statsOpts{admin: strings.TrimPrefix(notTierblk.URL, "http://")}, 1, "404 Not Found"},
		{"not JSON", statsOpts{admin: strings.TrimPrefix(notJSON.URL, "http://")}, 1, "the answer is not tierblk stats"},
		{"unknown export", statsOpts{admin: bound, export: "disk9"}, 1, `--export "disk9": the daemon at ` + bound + " has no such export; it serves: disk0, disk1, remote"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := statsCmd(tc.o)
			require.ErrorContains(t, err, tc.wantErr)
			require.Equal(t, tc.code, ExitCode(err))
			require.Empty(t, out)
		})
	}
}

func TestStatsQuantile(t *testing.T) {
	h := cache.Histogram{Bounds: []float64{0.001, 0.01, 0.1}, Counts: []uint64{50, 40, 0, 10}, Count: 100}
	for _, tc := range []struct {
		q    float64
		want float64
		ok   bool
	}{
		{0.25, 0.0005, true},        // halfway through the first bucket, from 0
		{0.5, 0.001, true},          // the end of the first bucket
		{0.7, 0.001 + 0.0045, true}, // halfway through the second bucket
		{0.9, 0.01, true},
		{0.95, 0.1, false}, // above the last bound
	} {
		got, ok := quantile(h, tc.q)
		require.Equal(t, tc.ok, ok, "q=%v", tc.q)
		require.InDelta(t, tc.want, got, 1e-12, "q=%v", tc.q)
	}
	_, ok := quantile(cache.Histogram{}, 0.5)
	require.False(t, ok, "an empty histogram has no quantiles")
}

func TestStatsHumanBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0:             "0B",
		1000:          "1000B",
		4096:          "4KiB",
		1536:          "1.5KiB",
		250 << 20:     "250MiB",
		(3 << 30) / 2: "1.5GiB",
		1<<40 + 1<<38: "1.2TiB",
		1<<62 + 1<<50: "4.0EiB",
	} {
		require.Equal(t, want, humanBytes(n), "%d", n)
	}
}

func TestWriteDirty(t *testing.T) {
	marks := cache.DirtyStats{High: 0.5, Low: 0.25, Max: 0.9}
	withRate := marks
	withRate.DestageRate = 1 << 20
	waited := marks
	waited.BackendWaits = 7
	ordered := marks
	ordered.Order, ordered.PendingEpochs, ordered.OldestEpoch, ordered.BackendBehind = cache.OrderFlush, 3, 41, 12.5
	halted := ordered
	halted.LostEpoch = 42
	ghosts := ordered
	ghosts.Ghosts, ghosts.GhostBytes = 3, 3<<12
	const tail = ", 0B destaged, 0 destage errors; 0 throttled writes (0s), delay now 0s a line\n"
	cases := []struct {
		name string
		d    cache.DirtyStats
		want string
	}{
		{"no SSD tier", cache.DirtyStats{}, ""},
		{"idle", marks, "dirty: 0 lines (0.0%; high 50%, low 25%, max 90%), 0B; idle" + tail},
		{"idle, having destaged a moment ago", withRate, "dirty: 0 lines (0.0%; high 50%, low 25%, max 90%), 0B; idle at 1MiB/s" + tail},
		{"writes waited for the backend", waited, "dirty: 0 lines (0.0%; high 50%, low 25%, max 90%), 0B; idle" +
			strings.TrimSuffix(tail, "\n") + "; 7 retries of writes waiting for the backend\n"},
		{"flush order", ordered, "dirty: 0 lines (0.0%; high 50%, low 25%, max 90%), 0B; idle" + tail +
			"write-back order: flush; 3 epochs pending, the oldest 41: the backend is consistent as of 12.5s ago\n"},
		{"flush order, with ghosts", ghosts, "dirty: 0 lines (0.0%; high 50%, low 25%, max 90%), 0B; idle" + tail +
			"write-back order: flush; 3 epochs pending, the oldest 41: the backend is consistent as of 12.5s ago; 3 older versions of blocks written over kept for it (12KiB)\n"},
		{"flush order, halted by a lost block", halted, "dirty: 0 lines (0.0%; high 50%, low 25%, max 90%), 0B; idle" + tail +
			"write-back order: flush; 3 epochs pending, the oldest 41: the backend is consistent as of 12.5s ago; " +
			"WRITE BACK HALTED at epoch 42, which lost a dirty block: the backend takes nothing of it or later (restart with write_back.order: address to write back the rest without it)\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			writeDirty(&out, tc.d)
			require.Equal(t, tc.want, out.String())
		})
	}
}

func TestWriteStored(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tiers []cache.TierStats
		want  string
	}{
		{"no tiers", nil, ""},
		{"empty", []cache.TierStats{{Name: "ssd", ReductionRatio: 1, Reduction: "off"}},
			"stored: ssd 0B logical, 0B physical (1.00x, reduction off)\n"},
		{"only zero blocks", []cache.TierStats{{Name: "ssd", LogicalBytes: 1 << 20, Reduction: "zero"}},
			"stored: ssd 1MiB logical, 0B physical (-, reduction zero)\n"},
		{"nearly all zero blocks", []cache.TierStats{{Name: "ssd", LogicalBytes: 256 << 20, PhysicalBytes: 160,
			ReductionRatio: float64(256<<20) / 160, Reduction: "compress"}},
			"stored: ssd 256MiB logical, 160B physical (>100x, reduction compress)\n"},
		{"dedupe", []cache.TierStats{{Name: "ram", LogicalBytes: 1 << 20, PhysicalBytes: 1 << 20, ReductionRatio: 1},
			{Name: "ssd", LogicalBytes: 8 << 20, PhysicalBytes: 2 << 20, ReductionRatio: 4, Reduction: "dedupe", DedupeHits: 1024}},
			"stored: ram 1MiB logical, 1MiB physical (1.00x); ssd 8MiB logical, 2MiB physical (4.00x, reduction dedupe, 1024 blocks deduped)\n"},
		{"dedupe collisions", []cache.TierStats{{Name: "ssd", LogicalBytes: 8 << 20, PhysicalBytes: 4 << 20, ReductionRatio: 2, Reduction: "dedupe",
			DedupeHits: 3, DedupeCollisions: 2}},
			"stored: ssd 8MiB logical, 4MiB physical (2.00x, reduction dedupe, 3 blocks deduped, 2 hash collisions)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			writeStored(&out, tc.tiers)
			require.Equal(t, tc.want, out.String())
		})
	}
}

// statsNow is the clock of the scrub tests: 2025-01-01 12:00 UTC.
var statsNow = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// damagedFixture is statsFixture after the SSD damaged data: blocks failed their checksums, some
// dirty (lost), and a scrub found them.
func damagedFixture() cache.Stats {
	s := statsFixture()
	s.Tiers[1].ChecksumErrors = 5
	s.Tiers[1].Adopted = 2
	s.Lost = cache.LostStats{Bytes: 12 << 10, Ranges: []meta.Range{{Off: 65536, Len: 4096}, {Off: 1 << 20, Len: 8192}}, Blocks: 3}
	start := float64(statsNow.Add(-3 * time.Hour).Unix())
	s.Scrub = cache.ScrubStats{Lines: 4000, Done: 4000, Bytes: 250 << 20, Damaged: 5, Lost: 3, Started: start, Ended: start + 125}
	return s
}

// TestStatsDamage: the lines of checksum errors, lost data and the scrub come after the dirty
// line, and only with something to say (TestStatsTable has none).
func TestStatsDamage(t *testing.T) {
	sources := []metrics.Source{{Export: "disk0", Stats: damagedFixture, Replicas: replicasFixture}}
	bound := serveAdmin(t, sources)
	out, err := statsCmd(statsOpts{admin: bound, now: func() time.Time { return statsNow }})
	require.NoError(t, err)
	latency := disk0Table[strings.Index(disk0Table, "latency:"):]
	require.Equal(t, strings.TrimSuffix(disk0Table, latency)+
		"checksums: ssd 5 blocks failed theirs (clean: read from the backend again; dirty: lost), 2 dirty blocks taken as they were after an unclean stop\n"+
		"LOST: 12KiB in 2 ranges (at 65536, 4KiB; at 1048576, 8KiB): reads of them fail until they are written again; write them, or restore their data from a backup (tierblk scrub lists them)\n"+
		"scrub: last ended 2025-01-01 09:02:05 UTC (2h58m ago) after 2m5s: 4000 of 4000 lines, 250MiB read, 5 damaged blocks (3 lost), 0 read errors\n"+
		latency, out)
}

func TestWriteChecksums(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tiers []cache.TierStats
		want  string
	}{
		{"none", []cache.TierStats{{Name: "ram"}, {Name: "ssd"}}, ""},
		{"failed", []cache.TierStats{{Name: "ram"}, {Name: "ssd", ChecksumErrors: 1}},
			"checksums: ssd 1 blocks failed theirs (clean: read from the backend again; dirty: lost)\n"},
		{"adopted", []cache.TierStats{{Name: "ssd", Adopted: 4}},
			"checksums: ssd 4 dirty blocks taken as they were after an unclean stop\n"},
		{"two tiers", []cache.TierStats{{Name: "ram", ChecksumErrors: 2}, {Name: "ssd", ChecksumErrors: 3}},
			"checksums: ram 2 blocks failed theirs (clean: read from the backend again; dirty: lost); ssd 3 blocks failed theirs (clean: read from the backend again; dirty: lost)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			writeChecksums(&out, tc.tiers)
			require.Equal(t, tc.want, out.String())
		})
	}
}

func TestWriteLost(t *testing.T) {
	const tail = ": reads of them fail until they are written again; write them, or restore their data from a backup (tierblk scrub lists them)\n"
	r := func(off, n int64) meta.Range { return meta.Range{Off: off, Len: n} }
	for _, tc := range []struct {
		name string
		l    cache.LostStats
		want string
	}{
		{"none", cache.LostStats{Blocks: 7}, ""}, // lost once, written since
		{"one", cache.LostStats{Bytes: 4096, Ranges: []meta.Range{r(0, 4096)}}, "LOST: 4KiB in 1 range (at 0, 4KiB)" + tail},
		{"four", cache.LostStats{Bytes: 16 << 10, Ranges: []meta.Range{r(0, 4096), r(8192, 4096), r(16384, 4096), r(1<<30, 4096)}},
			"LOST: 16KiB in 4 ranges (at 0, 4KiB; at 8192, 4KiB; at 16384, 4KiB; ...)" + tail},
		{"more than listed", cache.LostStats{Bytes: 1 << 20, Ranges: []meta.Range{r(512, 512)}},
			"LOST: 1MiB in over 1 ranges (at 512, 512B)" + tail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			writeLost(&out, tc.l)
			require.Equal(t, tc.want, out.String())
		})
	}
}

func TestWriteScrub(t *testing.T) {
	at := func(d time.Duration) float64 { return float64(statsNow.Add(-d).UnixNano()) / 1e9 }
	for _, tc := range []struct {
		name string
		s    cache.ScrubStats
		want string
	}{
		{"never", cache.ScrubStats{}, ""},
		{"running", cache.ScrubStats{Running: true, Lines: 400, Done: 100, Bytes: 100 << 16, Damaged: 1, Started: at(90 * time.Second)},
			"scrub: running since 2025-01-01 11:58:30 UTC (1m30s ago): 100 of 400 lines (25.0%), 6.2MiB read, 1 damaged blocks so far\n"},
		{"clean", cache.ScrubStats{Lines: 400, Done: 400, Bytes: 400 << 16, Started: at(26 * time.Hour), Ended: at(26*time.Hour - 300*time.Millisecond)},
			"scrub: last ended 2024-12-31 10:00:00 UTC (26h0m ago) after 300ms: 400 of 400 lines, 25MiB read, 0 damaged blocks (0 lost), 0 read errors\n"},
		{"stopped", cache.ScrubStats{Lines: 400, Done: 10, Bytes: 10 << 16, Errors: 1, Started: at(time.Minute), Ended: at(50 * time.Second), Err: "context canceled"},
			"scrub: last ended 2025-01-01 11:59:10 UTC (50s ago) after 10s: 10 of 400 lines, 640KiB read, 0 damaged blocks (0 lost), 1 read errors; stopped: context canceled\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			writeScrub(&out, tc.s, statsNow)
			require.Equal(t, tc.want, out.String())
		})
	}
}

// The process line says whether the daemon is an I/O flusher and, where it is not, the reason
// the kernel gave, which names the fix.
func TestWriteDaemonProcess(t *testing.T) {
	cases := []struct {
		name string
		p    metrics.ProcessStats
		want string
	}{
		{"an I/O flusher", metrics.ProcessStats{IOFlusher: true, OOMScoreAdj: -900},
			"process: I/O flusher yes, oom_score_adj -900\n"},
		{"refused, with the reason", metrics.ProcessStats{IOFlusherError: "PR_SET_IO_FLUSHER: operation not supported (a binary built with cgo)", MemoryLocked: true},
			"process: I/O flusher no (PR_SET_IO_FLUSHER: operation not supported (a binary built with cgo)): " +
				"a writer on a device it serves may stall it, oom_score_adj 0, memory locked\n"},
		{"refused, by a daemon that does not say why", metrics.ProcessStats{},
			"process: I/O flusher no (not root, or in a container): a writer on a device it serves may stall it, oom_score_adj 0\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			writeDaemon(&out, &tc.p, nil)
			require.Equal(t, tc.want, out.String())
		})
	}
}
