package cli

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// actionDaemon is an admin endpoint over exports "disk0", a write-back cache holding dirty data
// over backend; "plain", without a cache; "fake", whose flush reports fixed progress and whose
// mode switches fail; and "lossy", whose flush succeeds over a lost range.
type actionDaemon struct {
	admin   string
	cache   *cache.Cache
	backend *mem.Mem
	data    []byte // written at offset 0 of disk0
}

func serveActions(t *testing.T) actionDaemon {
	t.Helper()
	const line = 4 << 10
	d := actionDaemon{backend: mem.New(1 << 20)}
	var err error
	d.cache, err = cache.New(d.backend, cache.Config{LineSize: line, Mode: cache.WriteBack, BackendID: "test",
		SSD: cache.TierConfig{Size: 64 * line}, SSDDevice: mem.New(64 * line), Meta: meta.NewMem(),
		WriteBack: cache.WriteBackConfig{Throttle: "none"}})
	require.NoError(t, err)
	t.Cleanup(func() { d.cache.Close() })
	d.data = make([]byte, 8*line)
	rand.NewChaCha8([32]byte{7}).Read(d.data) // seeded: the same data every run
	_, err = d.cache.WriteAt(d.data, 0)
	require.NoError(t, err)

	fake := metrics.Source{Export: "fake", Stats: func() cache.Stats { return cache.Stats{} },
		FlushAll: func(_ context.Context, progress func(done, total int64)) error {
			for _, done := range []int64{1 << 20, 2 << 20, 4 << 20} {
				progress(done, 4<<20)
			}
			return nil
		},
		SetMode: func(context.Context, cache.Mode, func(done, total int64)) error {
			return errors.New("backend unreachable")
		},
		Heal: func() error { return errors.New("the SSD tier stays bypassed: probe write: input/output error") },
	}
	lossy := metrics.Source{Export: "lossy",
		Stats: func() cache.Stats {
			return cache.Stats{Lost: cache.LostStats{Bytes: 4096, Ranges: []meta.Range{{Off: 8192, Len: 4096}}, Blocks: 1}}
		},
		FlushAll: func(context.Context, func(done, total int64)) error { return nil },
		SetMode:  func(context.Context, cache.Mode, func(done, total int64)) error { return nil },
	}
	sources := []metrics.Source{metrics.CacheSource("disk0", d.cache), {Export: "plain"}, fake, lossy}
	bound := serveAdmin(t, sources)
	d.admin = bound
	return d
}

func (d actionDaemon) backendHoldsData(t *testing.T) {
	t.Helper()
	got := make([]byte, len(d.data))
	_, err := d.backend.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, d.data, got, "the backend does not hold what was written")
}

func flushCmd(o actionOpts) (string, error) {
	var out bytes.Buffer
	o.stdout = &out
	err := runFlush(context.Background(), o)
	return out.String(), err
}

func TestFlushWritesEverythingBack(t *testing.T) {
	d := serveActions(t)
	out, err := flushCmd(actionOpts{admin: d.admin, export: "disk0"})
	require.NoError(t, err)
	require.Contains(t, out, `export "disk0": dirty data written back; the backend holds every write acknowledged before the flush`)
	require.Zero(t, d.cache.Stats().Dirty.Lines)
	d.backendHoldsData(t)
}

func TestFlushDefaultExport(t *testing.T) {
	d := serveActions(t)
	out, err := flushCmd(actionOpts{admin: d.admin})
	require.NoError(t, err)
	require.Contains(t, out, "the default export: dirty data written back")
	d.backendHoldsData(t)
}

// TestFlushReportsLostData: a flush of a cache that lost data (the SSD tier damaged it before it
// was written back) lists the lost ranges and fails: the backend does not hold every write.
func TestFlushReportsLostData(t *testing.T) {
	d := serveActions(t)
	out, err := flushCmd(actionOpts{admin: d.admin, export: "lossy"})
	require.ErrorContains(t, err, `export "lossy": dirty data written back, but for 4KiB the SSD tier damaged before it could be`)
	require.Contains(t, out, "8192 (8KiB)")
	require.NotContains(t, out, "the backend holds every write acknowledged")
}

// TestFlushProgress: the progress of the fake export's flush (1, 2, then 4 MiB of 4), read one
// second apart on a fake clock: the estimate of the time left comes from the rate since the first
// report (1 MiB/s, 2 MiB left: 2s), and goes once done.
func TestFlushProgress(t *testing.T) {
	d := serveActions(t)
	clock := func() func() time.Time {
		t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		n := -1
		return func() time.Time { n++; return t0.Add(time.Duration(n) * time.Second) }
	}
	t.Run("lines", func(t *testing.T) {
		out, err := flushCmd(actionOpts{admin: d.admin, export: "fake", now: clock()})
		require.NoError(t, err)
		require.Equal(t, "written back 1MiB of 4MiB (25%)\nwritten back 2MiB of 4MiB (50%), about 2s left\n"+
			"written back 4MiB of 4MiB (100%)\n"+
			`export "fake": dirty data written back; the backend holds every write acknowledged before the flush`+"\n", out)
	})
	t.Run("bar", func(t *testing.T) {
		out, err := flushCmd(actionOpts{admin: d.admin, export: "fake", bar: true, now: clock()})
		require.NoError(t, err)
		require.Contains(t, out, "\r[##########                              ]  25% 1MiB of 4MiB\r")
		require.Contains(t, out, "\r[####################                    ]  50% 2MiB of 4MiB, about 2s left\r")
		// Spaces over the estimate of the line before.
		require.Contains(t, out, "\r[########################################] 100% 4MiB of 4MiB"+
			strings.Repeat(" ", len(", about 2s left"))+"\n"+`export "fake": dirty data`)
	})
}

func TestRoughDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "1s", 300 * time.Millisecond: "1s", 1500 * time.Millisecond: "2s", 83 * time.Second: "1m23s",
		59*time.Minute + 59*time.Second: "59m59s", 2*time.Hour + 10*time.Minute + 31*time.Second: "2h11m",
	} {
		require.Equal(t, want, roughDuration(d), "%v", d)
	}
}

func TestActionErrors(t *testing.T) {
	d := serveActions(t)
	for _, tc := range []struct {
		name string
		run  func() error
		want string
		code int
	}{
		{"flush: no admin", func() error { _, err := flushCmd(actionOpts{}); return err }, "--admin is required", 2},
		{"flush: public admin", func() error { _, err := flushCmd(actionOpts{admin: "0.0.0.0:1"}); return err }, "--admin: ", 2},
		{"flush: nobody there", func() error {
			_, err := flushCmd(actionOpts{admin: "unix:" + filepath.Join(t.TempDir(), "none.sock")})
			return err
		}, "no tierblk admin endpoint at unix:", 1},
		{"flush: unknown export", func() error { _, err := flushCmd(actionOpts{admin: d.admin, export: "nope"}); return err },
			`flush: no export "nope"; the daemon serves "disk0", "plain", "fake"`, 1},
		{"flush: no cache", func() error { _, err := flushCmd(actionOpts{admin: d.admin, export: "plain"}); return err },
			`flush: export "plain" has no cache`, 1},
		{"mode: bad mode", func() error { _, err := modeCmd(actionOpts{admin: d.admin}, "fast"); return err }, `unknown cache mode "fast"`, 2},
		{"mode: no cache", func() error {
			_, err := modeCmd(actionOpts{admin: d.admin, export: "plain"}, "writethrough")
			return err
		},
			`mode: export "plain" has no cache`, 1},
		{"mode: fails", func() error {
			_, err := modeCmd(actionOpts{admin: d.admin, export: "fake"}, "writethrough")
			return err
		},
			`export "fake": mode failed: backend unreachable`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, tc.code, ExitCode(err))
		})
	}
	require.Equal(t, cache.WriteBack, d.cache.Mode(), "a refused request changed the cache")
}

// TestHeal: heal reports a tier in service, or the daemon's reason why it stays bypassed.
func TestHeal(t *testing.T) {
	d := serveActions(t)
	for _, tc := range []struct {
		export, want, err string
	}{
		{"disk0", `export "disk0": the SSD tier is in service` + "\n", ""},
		{"fake", "", `export "fake": heal failed: the SSD tier stays bypassed: probe write: input/output error`},
		{"plain", "", `export "plain" has no cache`},
	} {
		var out bytes.Buffer
		err := runHeal(context.Background(), actionOpts{admin: d.admin, export: tc.export, stdout: &out})
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, out.String())
	}
}
