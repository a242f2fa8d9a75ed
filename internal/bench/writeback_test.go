package bench

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/metrics"
)

func TestWriteBackTargets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  cacheSetup
		tb, nk string
	}{
		{"the rows' tierblk", cacheSetup{mode: "writeback", ssdSize: CacheSSD, admin: "/w/a.sock"},
			"--ssd-size 512MiB --mode writeback --log-level warn --admin unix:/w/a.sock", "cache=writeback"},
		{"the burst's tierblk", cacheSetup{mode: "writeback", ssdSize: BurstSSD, admin: "/w/b.sock"},
			"--ssd-size 64MiB --mode writeback --log-level warn --admin unix:/w/b.sock", "cache=writeback"},
		{"no admin endpoint", cacheSetup{mode: "writethrough", ssdSize: CacheSSD},
			"--ssd-size 512MiB --mode writethrough --log-level warn", "cache=writethrough"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			targets := cacheTargetsFor("/bin/tierblk", "/w", "/w/s0.sock", tc.setup)
			require.Len(t, targets, 3)
			tb := strings.Join(targets[0].Command("/t.sock").Args, " ")
			require.Equal(t, "/bin/tierblk serve --backend nbd+unix:///?socket=/w/s0.sock --nbd unix:/t.sock --ram 256MiB --ssd /w/ssd.img "+tc.tb, tb)
			nk := targets[1].Command("/t.sock").Args
			require.Equal(t, tc.nk, nk[len(nk)-1], "nbdkit's cache mode is tierblk's")
		})
	}
}

func TestWriteBackRows(t *testing.T) {
	rows := append(WriteBackRows(), BurstRow("256m"))
	names := map[string]bool{}
	for _, r := range rows {
		require.False(t, names[r.Name], "two rows named %q", r.Name)
		names[r.Name] = true
		require.Contains(t, r.FioArgs, "--iodepth=32", r.Name)
		require.Contains(t, []string{"IOPS", "MiB/s"}, r.Unit, r.Name)
	}
	b := BurstRow("256m")
	require.Contains(t, b.Name, "256m")
	require.Contains(t, b.Name, BurstSSD)
	require.Equal(t, []string{"flush", "--admin", "unix:/w/a.sock"}, flushArgs("/w/a.sock"))
}

func statsBody(t *testing.T, mode string, dirty ...cache.DirtyStats) []byte {
	var resp metrics.StatsResponse
	for _, d := range dirty {
		resp.Exports = append(resp.Exports, metrics.ExportStats{Stats: cache.Stats{Mode: mode, Dirty: d}})
	}
	b, err := json.Marshal(resp)
	require.NoError(t, err)
	return b
}

func TestParseDirty(t *testing.T) {
	d := cache.DirtyStats{Lines: 10, Ratio: 0.5, Max: 0.9, ThrottledWrites: 3}
	got, err := parseDirty(statsBody(t, "writeback", d))
	require.NoError(t, err)
	require.Equal(t, d, got)
	for _, tc := range []struct {
		name, want string
		body       []byte
	}{
		{"not JSON", "not tierblk stats", []byte("<html>")},
		{"no export", "0 exports", statsBody(t, "writeback")},
		{"two exports", "2 exports", statsBody(t, "writeback", d, d)},
		{"not write-back", `mode "writethrough"`, statsBody(t, "writethrough", d)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseDirty(tc.body)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestBurstDirty(t *testing.T) {
	var d BurstDirty
	require.False(t, d.Held(), "no samples prove nothing")
	for _, s := range []cache.DirtyStats{
		{Ratio: 0.1, Max: 0.9, ThrottledWrites: 5},
		{Ratio: 0.9, Max: 0.9, ThrottledWrites: 50},
		{Ratio: 0.4, Max: 0.9, ThrottledWrites: 70},
	} {
		d = d.add(s, 5)
	}
	require.Equal(t, BurstDirty{Samples: 3, Peak: 0.9, Max: 0.9, ThrottledWrites: 65}, d)
	require.True(t, d.Held(), "at the maximum is held")
	d = d.add(cache.DirtyStats{Ratio: 0.95, Max: 0.9, ThrottledWrites: 70}, 5)
	require.False(t, d.Held())
}

func TestWriteBackTable(t *testing.T) {
	rep := WriteBackReport{
		Results: []Result{{Row: "4K", Unit: "IOPS", Medians: map[string]float64{nameTierblk: 40000, nameNbdkit: 20000, nameSlow: 200}}},
		Burst:   BurstDirty{Samples: 12, Peak: 0.9, Max: 0.9, ThrottledWrites: 7},
	}
	require.Equal(t, `| workload | tierblk | nbdkit cache | slow disk | ratio tierblk/nbdkit cache | ratio tierblk/slow disk |
|---|---:|---:|---:|---:|---:|
| 4K | 40000 IOPS | 20000 IOPS | 200 IOPS | 2.00 | 200.00 |

During the burst, tierblk's dirty ratio (sampled every 100ms, 12 samples) peaked at 0.900 of its SSD tier; the maximum is 0.90, and it stayed at or below it (7 writes throttled).
`, WriteBackTable(rep))
	rep.Burst.Peak = 0.95
	require.Contains(t, WriteBackTable(rep), "and it PASSED it")
}

// serveStats answers /stats on a unix socket from answer, called with the request's number.
func serveStats(t *testing.T, answer func(n int) (int, []byte)) string {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/stats", r.URL.Path)
		code, body := answer(int(n.Add(1)))
		w.WriteHeader(code)
		w.Write(body)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestDirtySampler(t *testing.T) {
	ratios := []float64{0.2, 0.9, 0.5}
	served := make(chan struct{})
	sock := serveStats(t, func(n int) (int, []byte) {
		if n > len(ratios) {
			<-t.Context().Done() // keep the sampler waiting until it is stopped
			return http.StatusServiceUnavailable, nil
		}
		if n == len(ratios) {
			defer close(served)
		}
		return http.StatusOK, statsBody(t, "writeback", cache.DirtyStats{Ratio: ratios[n-1], Max: 0.9, ThrottledWrites: uint64(10 * n)})
	})
	s := startDirtySampler(t.Context(), sock, time.Millisecond)
	<-served
	// The answer to the last request may still be on its way: wait for the sampler to take it.
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.dirty.Samples == len(ratios)
	}, 10*time.Second, time.Millisecond)
	got, err := s.stop()
	require.NoError(t, err, "stopping mid-request is no error")
	require.Equal(t, BurstDirty{Samples: 3, Peak: 0.9, Max: 0.9, ThrottledWrites: 20}, got)
}

func TestDirtySamplerError(t *testing.T) {
	sock := serveStats(t, func(int) (int, []byte) { return http.StatusInternalServerError, []byte("broken") })
	s := startDirtySampler(t.Context(), sock, time.Millisecond)
	<-s.done // an error ends the sampling by itself
	_, err := s.stop()
	require.ErrorContains(t, err, "500 Internal Server Error: broken")

	s = startDirtySampler(t.Context(), filepath.Join(t.TempDir(), "none.sock"), time.Millisecond)
	<-s.done
	_, err = s.stop()
	require.ErrorContains(t, err, "none.sock")
}

func TestWriteBackOptionsRejected(t *testing.T) {
	ok := WriteBackOptions{CacheOptions: CacheOptions{Rounds: 1, Runtime: time.Second, SlowRuntime: time.Second, WorkDir: t.TempDir()}, Burst: "256m"}
	for _, mut := range []func(*WriteBackOptions){
		func(o *WriteBackOptions) { o.Rounds = 0 },
		func(o *WriteBackOptions) { o.Runtime = 500 * time.Millisecond },
		func(o *WriteBackOptions) { o.WorkDir = filepath.Join(o.WorkDir, "missing") },
		func(o *WriteBackOptions) { o.Burst = "" },
	} {
		o := ok
		mut(&o)
		_, err := RunWriteBack(t.Context(), o)
		require.Error(t, err, "%+v", o)
	}
}
