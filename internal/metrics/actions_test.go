package metrics

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

const testLine = 4 << 10

// writeBackCache is a write-back cache of 64 lines over a mem backend, holding lines dirty lines
// of seeded random data; it returns the backend and the data, written at offset 0.
func writeBackCache(t *testing.T, lines int) (*cache.Cache, *mem.Mem, []byte) {
	t.Helper()
	b := mem.New(1 << 20)
	c, err := cache.New(b, cache.Config{LineSize: testLine, Mode: cache.WriteBack, BackendID: "test",
		SSD: cache.TierConfig{Size: 64 * testLine}, SSDDevice: mem.New(64 * testLine), Meta: meta.NewMem(),
		WriteBack: cache.WriteBackConfig{Throttle: "none"}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	data := make([]byte, lines*testLine)
	rand.NewChaCha8([32]byte{1}).Read(data) // seeded: the same data every run
	_, err = c.WriteAt(data, 0)
	require.NoError(t, err)
	return c, b, data
}

// post runs a request and splits a 200 answer into its lines.
func post(t *testing.T, h http.Handler, method, target string) (*httptest.ResponseRecorder, []ActionLine) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, target, nil)
	req.Host = "127.0.0.1:9810" // as the CLI names a TCP endpoint (guard)
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec, nil
	}
	require.Equal(t, "application/jsonl", rec.Header().Get("Content-Type"))
	var lines []ActionLine
	sc := bufio.NewScanner(bytes.NewReader(rec.Body.Bytes()))
	for sc.Scan() {
		var l ActionLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), sc.Text())
		lines = append(lines, l)
	}
	require.NotEmpty(t, lines)
	return rec, lines
}

func TestFlushWritesBack(t *testing.T) {
	c, b, data := writeBackCache(t, 8)
	h := NewHandler(func() []Source { return []Source{CacheSource("disk0", c)} })
	_, lines := post(t, h, "POST", "/flush?export=disk0")
	require.Equal(t, ActionLine{OK: true}, lines[len(lines)-1])
	for _, l := range lines[:len(lines)-1] {
		require.False(t, l.Final(), "a final line before the end: %+v", l)
		require.LessOrEqual(t, l.Done, l.Total)
	}
	require.Zero(t, c.Stats().Dirty.Lines)
	got := make([]byte, len(data))
	_, err := b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, data, got, "the backend does not hold what was written")
}

func TestModeDrainsWhenLeavingWriteBack(t *testing.T) {
	c, b, data := writeBackCache(t, 8)
	h := NewHandler(func() []Source { return []Source{CacheSource("disk0", c)} })
	// No export named: the default export, the first.
	_, lines := post(t, h, "POST", "/mode?mode=writethrough")
	require.Equal(t, ActionLine{OK: true}, lines[len(lines)-1])
	require.Equal(t, cache.WriteThrough, c.Mode())
	require.Zero(t, c.Stats().Dirty.Lines)
	got := make([]byte, len(data))
	_, err := b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, data, got)

	_, lines = post(t, h, "POST", "/mode?export=disk0&mode=writeback")
	require.Equal(t, []ActionLine{{OK: true}}, lines)
	require.Equal(t, cache.WriteBack, c.Mode())
}

func TestActionErrorsAfterStartAreTheFinalLine(t *testing.T) {
	// A RAM-only cache has no room for write-back: SetMode refuses once the answer has started.
	c, err := cache.New(mem.New(1<<20), cache.Config{LineSize: testLine, BackendID: "test", RAM: cache.TierConfig{Size: 8 * testLine}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	h := NewHandler(func() []Source { return []Source{CacheSource("ram", c)} })
	_, lines := post(t, h, "POST", "/mode?export=ram&mode=writeback")
	require.Len(t, lines, 1)
	require.Contains(t, lines[0].Error, "write-back needs an SSD tier")
	require.Equal(t, cache.WriteThrough, c.Mode())
}

// TestHealAction bypasses an SSD tier by failing its device, and brings it back with POST /heal:
// refused, with the reason, while the device fails; done once it works.
func TestHealAction(t *testing.T) {
	ssd := fault.New(mem.New(64*testLine), fault.Options{Seed: 1})
	c, err := cache.New(mem.New(1<<20), cache.Config{LineSize: testLine, BackendID: "test",
		SSD: cache.TierConfig{Size: 64 * testLine}, SSDDevice: ssd, Meta: meta.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	buf := make([]byte, 32*testLine)
	_, err = c.ReadAt(buf, 0) // caches 32 lines
	require.NoError(t, err)
	ssd.SetFailing(true)
	for i := range 32 {
		_, err = c.ReadAt(buf[:testLine], int64(i)*testLine)
		require.NoError(t, err, "reads go on from the backend")
	}
	require.True(t, c.Stats().Tiers[0].Failed)

	h := NewHandler(func() []Source { return []Source{CacheSource("disk0", c)} })
	_, lines := post(t, h, "POST", "/heal")
	require.Len(t, lines, 1)
	require.Contains(t, lines[0].Error, "the SSD tier stays bypassed")
	require.True(t, c.Stats().Tiers[0].Failed)

	ssd.SetFailing(false)
	_, lines = post(t, h, "POST", "/heal?export=disk0")
	require.Equal(t, []ActionLine{{OK: true}}, lines)
	st := c.Stats().Tiers[0]
	require.False(t, st.Failed)
	require.Equal(t, uint64(1), st.Heals)
	require.Positive(t, st.Lines, "the lines the errors did not drop are back")
}

func TestActionHTTPErrors(t *testing.T) {
	c, _, _ := writeBackCache(t, 1)
	h := NewHandler(func() []Source {
		return []Source{CacheSource("disk0", c), {Export: "plain"}}
	})
	for _, tc := range []struct {
		method, target string
		code           int
		want           string
	}{
		{"POST", "/flush?export=nope", http.StatusNotFound, `no export "nope"; the daemon serves "disk0", "plain"`},
		{"POST", "/flush?export=plain", http.StatusConflict, `export "plain" has no cache`},
		{"POST", "/mode?export=plain&mode=writethrough", http.StatusConflict, `export "plain" has no cache`},
		{"POST", "/mode?export=disk0&mode=fast", http.StatusBadRequest, "unknown cache mode"},
		{"POST", "/mode?export=disk0", http.StatusBadRequest, "no mode given"},
		{"GET", "/flush?export=disk0", http.StatusMethodNotAllowed, "takes POST only"},
		{"GET", "/mode?export=disk0&mode=writethrough", http.StatusMethodNotAllowed, "takes POST only"},
		{"GET", "/heal?export=disk0", http.StatusMethodNotAllowed, "takes POST only"},
		{"POST", "/heal?export=plain", http.StatusConflict, `export "plain" has no cache`},
	} {
		t.Run(tc.method+" "+tc.target, func(t *testing.T) {
			rec, _ := post(t, h, tc.method, tc.target)
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), tc.want)
		})
	}
	// None of the refused requests touched the cache.
	require.Equal(t, cache.WriteBack, c.Mode())
}

func TestActionNoExports(t *testing.T) {
	rec, _ := post(t, NewHandler(func() []Source { return nil }), "POST", "/flush")
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.Contains(t, rec.Body.String(), "serves no exports")
}

func TestStoppingCancelsActions(t *testing.T) {
	started := make(chan struct{})
	src := Source{Export: "disk0", Stats: func() cache.Stats { return cache.Stats{} },
		FlushAll: func(ctx context.Context, _ func(done, total int64)) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		},
		SetMode: func(context.Context, cache.Mode, func(done, total int64)) error { return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	bound, wait, err := Serve(ctx, "unix:"+filepath.Join(t.TempDir(), "a.sock"), NewHandler(func() []Source { return []Source{src} }), quietLog())
	require.NoError(t, err)
	_, address, err := ParseAdminAddr(bound)
	require.NoError(t, err)
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", address)
	}}}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://admin/flush", "", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	<-started
	cancel()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, `{"error":"context canceled"}`+"\n", string(body))
	require.NoError(t, wait())
}

// A flush (and a mode switch) of the admin endpoint shows in /metrics while it runs, with the time
// it started, and is gone once it has returned.
func TestFlushInProgressMetrics(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	wait := func(ctx context.Context, _ func(done, total int64)) error {
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	src := Source{Export: "disk0", Stats: fakeStats, FlushAll: wait,
		SetMode: func(ctx context.Context, _ cache.Mode, p func(done, total int64)) error { return wait(ctx, p) }}
	h := NewHandler(func() []Source { return []Source{src} })
	labels := map[string]string{"export": "disk0"}
	gauge := func(name string) float64 {
		return series(t, scrape(t, h), name, labels).GetGauge().GetValue()
	}
	require.Zero(t, gauge("tierblk_cache_flushes_in_progress"))
	require.Zero(t, gauge("tierblk_cache_flush_start_time_seconds"))

	before := float64(time.Now().UnixNano()) / 1e9
	// The requests run in goroutines of their own, which must not fail the test (post would):
	// their answers are checked here.
	done := make(chan *httptest.ResponseRecorder, 2)
	serve := func(target string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", target, nil)
		req.Host = "127.0.0.1:9810"
		h.ServeHTTP(rec, req)
		done <- rec
	}
	go serve("/flush?export=disk0")
	<-started
	after := float64(time.Now().UnixNano()) / 1e9
	require.Equal(t, 1.0, gauge("tierblk_cache_flushes_in_progress"))
	start := gauge("tierblk_cache_flush_start_time_seconds")
	require.GreaterOrEqual(t, start, before)
	require.LessOrEqual(t, start, after)

	go serve("/mode?export=disk0&mode=writethrough")
	<-started
	require.Equal(t, 2.0, gauge("tierblk_cache_flushes_in_progress"))
	require.Equal(t, start, gauge("tierblk_cache_flush_start_time_seconds"), "the oldest flush's start")

	close(release)
	for range 2 {
		rec := <-done
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		lines := strings.Split(strings.TrimSpace(rec.Body.String()), "\n")
		require.True(t, strings.HasPrefix(lines[len(lines)-1], `{"ok":true`), rec.Body.String())
	}
	require.Zero(t, gauge("tierblk_cache_flushes_in_progress"))
	require.Zero(t, gauge("tierblk_cache_flush_start_time_seconds"))
}

// scrubCache is a cache of 64 lines over a mem backend, with an SSD tier that admits every line
// on a mem device it returns: in write-through it holds lines clean lines, read; in write-back
// lines dirty lines, written. The data is at offset 0.
func scrubCache(t *testing.T, mode cache.Mode, lines int) (*cache.Cache, *mem.Mem, []byte) {
	t.Helper()
	b, ssd := mem.New(1<<20), mem.New(64*testLine)
	data := make([]byte, lines*testLine)
	rand.NewChaCha8([32]byte{2}).Read(data)
	c, err := cache.New(b, cache.Config{LineSize: testLine, Mode: mode, BackendID: "test",
		SSD: cache.TierConfig{Size: 64 * testLine, Admission: "always"}, SSDDevice: ssd, Meta: meta.NewMem(),
		WriteBack: cache.WriteBackConfig{Throttle: "none"}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	if mode == cache.WriteBack {
		_, err = c.WriteAt(data, 0)
	} else {
		_, err = b.WriteAt(data, 0)
		require.NoError(t, err)
		_, err = c.ReadAt(make([]byte, len(data)), 0)
	}
	require.NoError(t, err)
	require.EqualValues(t, lines, c.Stats().Tiers[0].Lines)
	return c, ssd, data
}

// rot flips a byte in every 16 of dev, as bit rot would: every block stored there fails its sum.
func rot(t *testing.T, dev *mem.Mem) {
	t.Helper()
	buf := make([]byte, dev.Size())
	_, err := dev.ReadAt(buf, 0)
	require.NoError(t, err)
	for i := 7; i < len(buf); i += 16 {
		buf[i] ^= 0x5a
	}
	_, err = dev.WriteAt(buf, 0)
	require.NoError(t, err)
}

// TestScrubAction scrubs an SSD tier whose device rotted: clean blocks are found damaged and read
// from the backend again; dirty ones are lost, and the final line lists their range. The scrub is
// paced (?rate=), so progress lines come, each with the figures so far.
func TestScrubAction(t *testing.T) {
	defer func(p time.Duration) { scrubPoll = p }(scrubPoll)
	scrubPoll = 10 * time.Millisecond
	const lines = 8
	for _, tc := range []struct {
		mode cache.Mode
		lost bool
	}{{cache.WriteThrough, false}, {cache.WriteBack, true}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			c, ssd, data := scrubCache(t, tc.mode, lines)
			rot(t, ssd)
			h := NewHandler(func() []Source { return []Source{CacheSource("disk0", c)} })
			// 8 blocks of 4 KiB at 64 KiB/s: half a second.
			_, answer := post(t, h, "POST", "/scrub?export=disk0&rate=64KiB/s")
			final := answer[len(answer)-1]
			require.True(t, final.OK, "%+v", final)
			require.NotNil(t, final.Scrub)
			require.NotNil(t, final.Lost)
			sc := *final.Scrub
			require.False(t, sc.Running)
			require.EqualValues(t, lines, sc.Lines)
			require.EqualValues(t, lines, sc.Done)
			require.EqualValues(t, lines*testLine, sc.Bytes)
			require.EqualValues(t, lines, sc.Damaged)
			require.Positive(t, sc.Ended)
			require.Empty(t, sc.Err)

			progress := answer[:len(answer)-1]
			require.NotEmpty(t, progress, "a paced scrub reports its progress")
			for _, l := range progress {
				require.False(t, l.Final(), "a final line before the end: %+v", l)
				require.NotNil(t, l.Scrub)
				require.True(t, l.Scrub.Running)
				require.EqualValues(t, lines, l.Total)
				require.EqualValues(t, l.Scrub.Done, l.Done)
				require.LessOrEqual(t, l.Scrub.Damaged, sc.Damaged)
			}

			buf := make([]byte, testLine)
			if tc.lost {
				require.EqualValues(t, lines, sc.Lost)
				require.Equal(t, cache.LostStats{Bytes: lines * testLine, Ranges: []meta.Range{{Off: 0, Len: lines * testLine}}, Blocks: lines}, *final.Lost)
				_, err := c.ReadAt(buf, 0)
				require.ErrorIs(t, err, cache.ErrLost)
				return
			}
			require.Zero(t, sc.Lost)
			require.Zero(t, final.Lost.Bytes)
			require.Empty(t, final.Lost.Ranges)
			got := make([]byte, len(data))
			_, err := c.ReadAt(got, 0)
			require.NoError(t, err)
			require.Equal(t, data, got, "clean data is read from the backend again")
		})
	}
}

// TestScrubRefused: what cannot be scrubbed is refused before the answer starts, with a status
// that says why; a scrub that finds another one running once started ends with the error.
func TestScrubRefused(t *testing.T) {
	ram, err := cache.New(mem.New(1<<20), cache.Config{LineSize: testLine, BackendID: "test", RAM: cache.TierConfig{Size: 8 * testLine}})
	require.NoError(t, err)
	t.Cleanup(func() { ram.Close() })
	ssdStats := func() cache.Stats { return cache.Stats{Tiers: []cache.TierStats{{Name: "ssd"}}} }
	fake := func(name string, stats func() cache.Stats, scrub func(context.Context, int64) (cache.ScrubStats, error)) Source {
		return Source{Export: name, Stats: stats, Scrub: scrub,
			FlushAll: func(context.Context, func(done, total int64)) error { return nil },
			SetMode:  func(context.Context, cache.Mode, func(done, total int64)) error { return nil }}
	}
	running := fake("running", func() cache.Stats {
		s := ssdStats()
		s.Scrub = cache.ScrubStats{Running: true, Lines: 400, Done: 100}
		return s
	}, func(context.Context, int64) (cache.ScrubStats, error) {
		panic("scrubbed while a scrub runs")
	})
	raced := fake("raced", ssdStats, func(context.Context, int64) (cache.ScrubStats, error) {
		return cache.ScrubStats{Running: true}, cache.ErrScrubRunning
	})
	h := NewHandler(func() []Source {
		return []Source{CacheSource("ram", ram), running, raced, fake("old", ssdStats, nil), {Export: "plain"}}
	})
	for _, tc := range []struct {
		method, target string
		code           int
		want           string
	}{
		{"POST", "/scrub?export=ram", http.StatusConflict, `export "ram" has no SSD tier to scrub`},
		{"POST", "/scrub?export=running", http.StatusConflict, `export "running": a scrub of its SSD tier is already running (100 of 400 lines checked)`},
		{"POST", "/scrub?export=old", http.StatusConflict, `export "old": its cache cannot be scrubbed`},
		{"POST", "/scrub?export=plain", http.StatusConflict, `export "plain" has no cache`},
		{"POST", "/scrub?export=nope", http.StatusNotFound, `no export "nope"`},
		{"POST", "/scrub?export=raced&rate=fast", http.StatusBadRequest, `rate "fast" is not a size a second`},
		{"GET", "/scrub?export=raced", http.StatusMethodNotAllowed, "takes POST only"},
	} {
		t.Run(tc.method+" "+tc.target, func(t *testing.T) {
			rec, _ := post(t, h, tc.method, tc.target)
			require.Equal(t, tc.code, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), tc.want)
		})
	}
	_, lines := post(t, h, "POST", "/scrub?export=raced")
	require.Equal(t, []ActionLine{{Error: cache.ErrScrubRunning.Error()}}, lines)
}

// TestScrubCancelledWithTheRequest: a client that goes away stops its scrub.
func TestScrubCancelledWithTheRequest(t *testing.T) {
	started := make(chan int64, 1)
	stopped := make(chan error, 1)
	src := Source{Export: "disk0", Stats: func() cache.Stats { return cache.Stats{Tiers: []cache.TierStats{{Name: "ssd"}}} },
		FlushAll: func(context.Context, func(done, total int64)) error { return nil },
		SetMode:  func(context.Context, cache.Mode, func(done, total int64)) error { return nil },
		Scrub: func(ctx context.Context, rate int64) (cache.ScrubStats, error) {
			started <- rate
			<-ctx.Done()
			stopped <- ctx.Err()
			return cache.ScrubStats{}, ctx.Err()
		}}
	h := NewHandler(func() []Source { return []Source{src} })
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, "POST", "/scrub?rate=100MiB", nil)
	req.Host = "127.0.0.1:9810"
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { h.ServeHTTP(rec, req); close(done) }()
	require.Equal(t, int64(100<<20), <-started)
	cancel()
	require.ErrorIs(t, <-stopped, context.Canceled)
	<-done
	require.True(t, strings.HasSuffix(rec.Body.String(), `{"error":"context canceled"}`+"\n"), rec.Body.String())
}
