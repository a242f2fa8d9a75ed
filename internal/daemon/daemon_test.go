package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/trace"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

type running struct {
	addrs []string
	stop  func() error
}

// start runs the daemon in the background until stop is called; stop returns Run's error.
func start(t *testing.T, cfg config.Config) running {
	t.Helper()
	return startLogging(t, cfg, io.Discard)
}

// startLogging is start with the daemon's log going to log.
func startLogging(t *testing.T, cfg config.Config, log io.Writer) running {
	t.Helper()
	require.NoError(t, cfg.Validate(registry.Default().Schemes()))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan []string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, registry.Default(), slog.New(slog.NewTextHandler(log, nil)), Options{Ready: func(a []string) { ready <- a }})
	}()
	select {
	case a := <-ready:
		stopped := false
		stop := func() error {
			if stopped {
				return nil
			}
			stopped = true
			cancel()
			return <-done
		}
		t.Cleanup(func() { stop() })
		return running{addrs: a, stop: stop}
	case err := <-done:
		cancel()
		t.Fatalf("daemon did not start: %v", err)
	}
	return running{}
}

func dial(t *testing.T, sock, export string) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), client.Config{Network: "unix", Address: sock, Export: export})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestServeWriteStopFlushes(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	sock := filepath.Join(dir, "sub", "t.sock") // the socket's directory is created
	cfg := config.Defaults()
	cfg.Exports = []config.Export{
		{Name: "disk", Backend: "file://" + img + "?size=8MiB"},
		{Name: "ram", Backend: "mem://1MiB", ReadOnly: true},
	}
	cfg.Listen = []string{"unix:" + sock, "127.0.0.1:0"}
	d := start(t, cfg)
	require.Len(t, d.addrs, 2)

	c := dial(t, sock, "disk")
	require.EqualValues(t, 8<<20, c.Size())
	data := bytes.Repeat([]byte("tierblk!"), 512)
	_, err := c.WriteAt(data, 4096)
	require.NoError(t, err)

	// The default export is the first; the second is read-only.
	def := dial(t, sock, "")
	require.EqualValues(t, 8<<20, def.Size())
	ro := dial(t, sock, "ram")
	require.True(t, ro.ReadOnly())

	// Over TCP too.
	tc, err := client.Dial(context.Background(), client.Config{Network: "tcp", Address: d.addrs[1], Export: "disk"})
	require.NoError(t, err)
	got := make([]byte, len(data))
	_, err = tc.ReadAt(got, 4096)
	require.NoError(t, err)
	require.Equal(t, data, got)
	tc.Close()

	c.Close()
	def.Close()
	ro.Close()
	require.NoError(t, d.stop())
	_, err = os.Stat(sock)
	require.ErrorIs(t, err, os.ErrNotExist, "a clean stop removes the socket")
	onDisk, err := os.ReadFile(img)
	require.NoError(t, err)
	require.Equal(t, data, onDisk[4096:4096+len(data)])
}

func TestRecordTrace(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "t.sock")
	rec := filepath.Join(dir, "live.iolog")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Name: "disk", Backend: "mem://4MiB", RecordTrace: rec}}
	cfg.Listen = []string{"unix:" + sock}
	d := start(t, cfg)
	c := dial(t, sock, "")
	buf := make([]byte, 8192)
	_, err := c.WriteAt(buf, 65536)
	require.NoError(t, err)
	_, err = c.ReadAt(buf[:4096], 0)
	require.NoError(t, err)
	require.NoError(t, c.Trim(1<<20, 1<<20))
	c.Close()
	require.NoError(t, d.stop())

	r, err := trace.Open(rec, "auto")
	require.NoError(t, err)
	defer r.Close()
	var got []trace.Request
	for {
		q, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got = append(got, q)
	}
	require.Len(t, got, 3)
	require.Equal(t, [3]any{trace.OpWrite, int64(65536), int64(8192)}, [3]any{got[0].Op, got[0].Offset, got[0].Length})
	require.Equal(t, [3]any{trace.OpRead, int64(0), int64(4096)}, [3]any{got[1].Op, got[1].Offset, got[1].Length})
	require.Equal(t, [3]any{trace.OpOther, int64(1 << 20), int64(1 << 20)}, [3]any{got[2].Op, got[2].Offset, got[2].Length})

	// A second daemon refuses to overwrite the recording.
	cfg.Listen = []string{"unix:" + filepath.Join(dir, "u.sock")}
	err = Run(context.Background(), cfg, registry.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	require.ErrorContains(t, err, "exists")
}

func TestSocketPaths(t *testing.T) {
	dir := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	runOnce := func(listen string) error {
		cfg := config.Defaults()
		cfg.Exports = []config.Export{{Backend: "mem://1MiB"}}
		cfg.Listen = []string{listen}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // stop as soon as it is serving
		return Run(ctx, cfg, registry.Default(), quiet, Options{})
	}

	// A stale socket left by a killed daemon is replaced.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	require.NoError(t, runOnce("unix:"+stale))

	// A live one is not.
	live := filepath.Join(dir, "live.sock")
	l, err = net.Listen("unix", live)
	require.NoError(t, err)
	defer l.Close()
	require.ErrorContains(t, runOnce("unix:"+live), "in use")

	// Nor is a regular file.
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, []byte("keep me"), 0o644))
	require.ErrorContains(t, runOnce("unix:"+file), "not a socket")
	b, _ := os.ReadFile(file)
	require.Equal(t, "keep me", string(b))
}

func TestBackendFailureClosesOthers(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{
		{Name: "a", Backend: "file://" + img + "?size=1MiB"},
		{Name: "b", Backend: "file://" + filepath.Join(dir, "missing.img")},
	}
	cfg.Listen = []string{"unix:" + filepath.Join(dir, "t.sock")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := Run(ctx, cfg, registry.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	require.ErrorContains(t, err, `exports[1] ("b")`)
	// The first file was closed (its lock released): it opens again.
	cfg.Exports = cfg.Exports[:1]
	cancelled, stop := context.WithCancel(context.Background())
	stop()
	require.NoError(t, Run(cancelled, cfg, registry.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{}))
}

// adminClient talks to the admin endpoint on the unix socket sock.
func adminClient(t *testing.T, sock string) *http.Client {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// adminPost POSTs to the admin endpoint on a unix socket and returns the status and body.
func adminPost(t *testing.T, sock, target string) (int, string) {
	t.Helper()
	resp, err := adminClient(t, sock).Post("http://admin"+target, "", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestWriteBackFlushAndMode(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	sock := filepath.Join(dir, "t.sock")
	admin := filepath.Join(dir, "admin.sock")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{
		{Name: "disk", Backend: "file://" + img + "?size=8MiB", Cache: &config.Cache{
			Mode: "writeback", Line: "4KiB", SSD: filepath.Join(dir, "ssd.img"), SSDSize: "1MiB",
			WriteBack: config.WriteBack{High: config.Ratio(0.6), Low: config.Ratio(0.3), Max: config.Ratio(0.95), Throttle: "none"}}},
		{Name: "plain", Backend: "mem://1MiB"},
	}
	cfg.Listen = []string{"unix:" + sock}
	cfg.Admin = "unix:" + admin
	cfg.RunDir = filepath.Join(dir, "run")
	d := start(t, cfg)

	c := dial(t, sock, "disk")
	data := bytes.Repeat([]byte("dirty..."), 4096)
	_, err := c.WriteAt(data, 64<<10)
	require.NoError(t, err)

	code, body := adminPost(t, admin, "/flush?export=disk")
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, strings.HasSuffix(body, `{"ok":true}`+"\n"), body)
	onDisk, err := os.ReadFile(img)
	require.NoError(t, err)
	require.Equal(t, data, onDisk[64<<10:64<<10+len(data)], "after /flush the backend holds what was written")

	pc := dial(t, sock, "plain")
	_, err = pc.WriteAt(data[:4096], 0)
	require.NoError(t, err)
	_, err = pc.ReadAt(make([]byte, 8192), 0)
	require.NoError(t, err)
	pc.Close()
	code, body = adminPost(t, admin, "/flush?export=plain")
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, body, `export "plain" has no cache`)

	code, body = adminPost(t, admin, "/mode?export=disk&mode=writethrough")
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, strings.HasSuffix(body, `{"ok":true}`+"\n"), body)

	// The watermarks came from the configuration.
	resp, err := adminClient(t, admin).Get("http://admin/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var stats metrics.StatsResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	require.Len(t, stats.Exports, 2)
	dirty := stats.Exports[0].Stats.Dirty
	require.Equal(t, [3]float64{0.6, 0.3, 0.95}, [3]float64{dirty.High, dirty.Low, dirty.Max})
	require.Zero(t, dirty.Lines)
	// The export without a cache is in the statistics too, with what reached its backend.
	plain := stats.Exports[1]
	require.Equal(t, "plain", plain.Name)
	require.Equal(t, cache.StatsModeNone, plain.Stats.Mode)
	require.Equal(t, cache.IOStats{Reads: 1, ReadBytes: 8192, Writes: 1, WriteBytes: 4096}, plain.Stats.Backend)
	require.Equal(t, uint64(1), plain.Stats.ReadLatency.Count)
	require.Equal(t, uint64(1), plain.Stats.WriteLatency.Count)
	c.Close()
	require.NoError(t, d.stop())
}

// TestFinalStopWritesBack: a stop that Options.Final calls the last of the exports here (a CSI
// unstage) writes a write-back cache's dirty data to the backend, though its config keeps it on
// the SSD tier at a stop; Opened was given the export's source while it served.
func TestFinalStopWritesBack(t *testing.T) {
	for _, final := range []bool{false, true} {
		t.Run(map[bool]string{false: "not-final", true: "final"}[final], func(t *testing.T) {
			dir := t.TempDir()
			img := filepath.Join(dir, "disk.img")
			sock := filepath.Join(dir, "t.sock")
			cfg := config.Defaults()
			cfg.Exports = []config.Export{{Name: "pvc-1", Backend: "file://" + img + "?size=8MiB", Cache: &config.Cache{
				Mode: "writeback", Line: "4KiB", SSD: filepath.Join(dir, "ssd.img"), SSDSize: "1MiB",
				// Address order: the write stays dirty below the watermarks (FLUSH order writes
				// back each epoch as soon as a FLUSH, such as the stop's, ends it).
				WriteBack: config.WriteBack{High: config.Ratio(0.9), Low: config.Ratio(0.8), Max: config.Ratio(0.95), Throttle: "none", Order: "address"}}}}
			cfg.Listen = []string{"unix:" + sock}
			cfg.RunDir = filepath.Join(dir, "run")
			require.NoError(t, cfg.Validate(registry.Default().Schemes()))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ready := make(chan struct{})
			done := make(chan error, 1)
			var opened []metrics.Source
			go func() {
				done <- Run(ctx, cfg, registry.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{
					Ready:  func([]string) { close(ready) },
					Final:  func() bool { return final },
					Opened: func(s []metrics.Source) { opened = s },
				})
			}()
			select {
			case <-ready:
			case err := <-done:
				t.Fatalf("daemon did not start: %v", err)
			}
			require.Len(t, opened, 1)
			require.Equal(t, "pvc-1", opened[0].Export)

			c := dial(t, sock, "pvc-1")
			data := bytes.Repeat([]byte("unstage!"), 4096)
			_, err := c.WriteAt(data, 64<<10)
			require.NoError(t, err)
			require.NotZero(t, opened[0].Stats().Dirty.Lines, "the write waits on the SSD tier")
			c.Close()
			cancel()
			require.NoError(t, <-done)

			onDisk, err := os.ReadFile(img)
			require.NoError(t, err)
			if final {
				require.Equal(t, data, onDisk[64<<10:64<<10+len(data)], "a final stop writes the dirty data back")
			} else {
				require.NotEqual(t, data, onDisk[64<<10:64<<10+len(data)], "a stop that is not final keeps it on the SSD tier")
			}
		})
	}
}
