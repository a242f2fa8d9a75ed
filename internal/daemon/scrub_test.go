package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/metrics"
)

// logBuffer is a log the daemon's goroutines write to and a test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// fakeScrubber hands each scrub to the test (calls) and returns what the test answers (results);
// a scrub the schedule's stop cancels returns at once.
type fakeScrubber struct {
	calls   chan int64
	results chan error
}

func (f fakeScrubber) Scrub(ctx context.Context, rate int64) (cache.ScrubStats, error) {
	f.calls <- rate
	select {
	case err := <-f.results:
		return cache.ScrubStats{}, err
	case <-ctx.Done():
		return cache.ScrubStats{}, ctx.Err()
	}
}

// TestScheduleScrubs drives a schedule with a ticker of the test's: a scrub each turn, at the
// schedule's rate; a turn while another scrub runs is skipped, whether that one was started by
// hand (the cache says so) or is the last turn's running past its time; the stop cancels the scrub
// under way and waits for it.
func TestScheduleScrubs(t *testing.T) {
	turns := make(chan time.Time, 1) // as a time.Ticker's: one turn waits, the rest are dropped
	var period time.Duration
	tick := func(d time.Duration) (<-chan time.Time, func()) { period = d; return turns, func() {} }
	f := fakeScrubber{calls: make(chan int64), results: make(chan error)}
	var log logBuffer
	stop := scheduleScrubs([]scheduledScrub{{export: "disk", c: f, every: time.Hour, rate: 1 << 20}}, tick,
		slog.New(slog.NewTextHandler(&log, nil)))

	// The turns the test gives are an hour ahead, so that none comes before the last scrub's end.
	next := func() time.Time { return time.Now().Add(time.Hour) }
	turns <- next()
	require.Equal(t, int64(1<<20), <-f.calls)
	require.Equal(t, time.Hour, period)
	f.results <- nil

	// A scrub by hand is running: the cache refuses, and the turn is skipped.
	turns <- next()
	<-f.calls
	f.results <- cache.ErrScrubRunning
	require.Eventually(t, func() bool {
		return strings.Contains(log.String(), "scheduled scrub skipped: a scrub of the SSD tier is already running")
	}, 5*time.Second, time.Millisecond)

	// This turn's scrub runs past the next turn, which is skipped: the one after it scrubs.
	turns <- next()
	<-f.calls
	turns <- time.Now()
	f.results <- nil
	turns <- next()
	<-f.calls
	require.Contains(t, log.String(), "scheduled scrub skipped: the last one ran past its turn")

	// The stop cancels the scrub under way.
	stop()
	require.Equal(t, 4, strings.Count(log.String(), `msg="scheduled scrub of the SSD tier"`))
}

// TestScrubSchedules: only the exports with an SSD tier and a scrub every so often are scheduled,
// with the defaults where the config says nothing.
func TestScrubSchedules(t *testing.T) {
	dummy := &cache.Cache{} // never scrubbed here: only its place in caches matters
	cfg := config.Defaults()
	cfg.Exports = []config.Export{
		{Name: "default", Cache: &config.Cache{SSD: "/a"}},
		{Name: "ram", Cache: &config.Cache{RAM: "1GiB"}},
		{Name: "never", Cache: &config.Cache{SSD: "/b", Scrub: config.Scrub{Every: "0"}}},
		{Name: "plain"},
		{Name: "daily", Cache: &config.Cache{SSD: "/c", Scrub: config.Scrub{Every: "24h", Rate: "0"}}},
	}
	got := scrubSchedules(cfg, []*cache.Cache{dummy, dummy, dummy, nil, dummy}, slog.New(slog.DiscardHandler))
	require.Len(t, got, 2)
	require.Equal(t, scheduledScrub{export: "default", c: dummy, every: 168 * time.Hour, rate: 64 << 20}, got[0])
	require.Equal(t, scheduledScrub{export: "daily", c: dummy, every: 24 * time.Hour, rate: 0}, got[1])
}

// scrubAnswer POSTs /scrub to the admin endpoint on sock and returns the answer's lines.
func scrubAnswer(t *testing.T, sock, target string) []metrics.ActionLine {
	t.Helper()
	code, body := adminPost(t, sock, target)
	require.Equal(t, http.StatusOK, code, body)
	var lines []metrics.ActionLine
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		var l metrics.ActionLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), sc.Text())
		lines = append(lines, l)
	}
	require.NotEmpty(t, lines)
	return lines
}

// TestScrubDamagedSSD runs a daemon with a write-back cache on a file SSD tier, damages the file
// behind its back, and scrubs it with POST /scrub: the summary counts the damaged blocks and
// lists the lost range; reads of it fail, /stats shows it, and a write clears it.
func TestScrubDamagedSSD(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "t.sock")
	admin := filepath.Join(dir, "admin.sock")
	ssd := filepath.Join(dir, "ssd.img")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Name: "disk", Backend: "file://" + filepath.Join(dir, "disk.img") + "?size=8MiB", Cache: &config.Cache{
		Mode: "writeback", Line: "4KiB", SSD: ssd, SSDSize: "1MiB", Admission: "always", Reduction: "off",
		WriteBack: config.WriteBack{Throttle: "none", Order: "address"}, Scrub: config.Scrub{Every: "0"}}}} // dirty until scrubbed
	cfg.Listen = []string{"unix:" + sock}
	cfg.Admin = "unix:" + admin
	cfg.RunDir = filepath.Join(dir, "run")
	d := start(t, cfg)

	c := dial(t, sock, "disk")
	data := bytes.Repeat([]byte("dirty..."), 4096) // 32 KiB: 8 blocks, dirty
	const at = 64 << 10
	_, err := c.WriteAt(data, at)
	require.NoError(t, err)
	require.NoError(t, c.Flush())

	// Bit rot: a byte in every 16 of the SSD tier's file flipped.
	img, err := os.ReadFile(ssd)
	require.NoError(t, err)
	for i := 7; i < len(img); i += 16 {
		img[i] ^= 0x5a
	}
	require.NoError(t, os.WriteFile(ssd, img, 0o644))

	lines := scrubAnswer(t, admin, "/scrub?export=disk&rate=64MiB/s")
	final := lines[len(lines)-1]
	require.True(t, final.OK, "%+v", final)
	require.NotNil(t, final.Scrub)
	require.NotNil(t, final.Lost)
	require.EqualValues(t, 8, final.Scrub.Lines)
	require.EqualValues(t, 8, final.Scrub.Done)
	require.EqualValues(t, 8, final.Scrub.Damaged)
	require.EqualValues(t, 8, final.Scrub.Lost)
	require.Equal(t, cache.LostStats{Bytes: uint64(len(data)), Ranges: []meta.Range{{Off: at, Len: int64(len(data))}}, Blocks: 8}, *final.Lost)

	_, err = c.ReadAt(make([]byte, 4096), at)
	require.Error(t, err, "a read of a lost range fails")
	resp, err := adminClient(t, admin).Get("http://admin/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var stats metrics.StatsResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	s := stats.Exports[0].Stats
	require.EqualValues(t, len(data), s.Lost.Bytes)
	require.EqualValues(t, 8, s.Tiers[0].ChecksumErrors)
	require.EqualValues(t, 8, s.Scrub.Damaged)

	// Written again, the range is no longer lost.
	_, err = c.WriteAt(data, at)
	require.NoError(t, err)
	got := make([]byte, len(data))
	_, err = c.ReadAt(got, at)
	require.NoError(t, err)
	require.Equal(t, data, got)
	lines = scrubAnswer(t, admin, "/scrub?export=disk")
	require.Zero(t, lines[len(lines)-1].Lost.Bytes)
	require.Zero(t, lines[len(lines)-1].Scrub.Damaged)
	c.Close()
	require.NoError(t, d.stop())
}

// TestScheduledScrub: a daemon scrubs its SSD tier on its own, the first scrub every after the
// start.
func TestScheduledScrub(t *testing.T) {
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.sock")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Name: "disk", Backend: "file://" + filepath.Join(dir, "disk.img") + "?size=8MiB", Cache: &config.Cache{
		Line: "4KiB", SSD: filepath.Join(dir, "ssd.img"), SSDSize: "1MiB", Scrub: config.Scrub{Every: "100ms", Rate: "0"}}}}
	cfg.Listen = []string{"unix:" + filepath.Join(dir, "t.sock")}
	cfg.Admin = "unix:" + admin
	cfg.RunDir = filepath.Join(dir, "run")
	var log logBuffer
	started := time.Now()
	d := startLogging(t, cfg, &log)
	scrub := func() cache.ScrubStats {
		resp, err := adminClient(t, admin).Get("http://admin/stats")
		require.NoError(t, err)
		defer resp.Body.Close()
		var stats metrics.StatsResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
		return stats.Exports[0].Stats.Scrub
	}
	require.Eventually(t, func() bool { return scrub().Ended > 0 }, 10*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, scrub().Started, float64(started.Add(100*time.Millisecond).UnixNano())/1e9,
		"the first scrub comes every after the start")
	require.NoError(t, d.stop())
	require.Contains(t, log.String(), `msg="scrub of the SSD tier scheduled" export=disk every=100ms rate=none`)
	require.Contains(t, log.String(), `msg="SSD tier scrub ended"`)
}
