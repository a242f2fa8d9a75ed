package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/metrics"
)

// The write-back benchmark's setup: the cache benchmark's servers with both caches in
// write-back (nbdkit's default: fast, and everything not flushed is lost on a crash), and for the
// burst a second tierblk whose SSD tier is smaller than the burst.
const (
	// BurstSSD is the burst tierblk's SSD tier.
	BurstSSD = "64MiB"
	// burstSample is how often the burst's dirty ratio is sampled.
	burstSample = 100 * time.Millisecond
)

// WriteBackOptions control `tierblk bench writeback`; CacheOptions as for `tierblk bench cache`.
type WriteBackOptions struct {
	CacheOptions
	// Burst is how much the burst row writes (fio size syntax); it should exceed BurstSSD.
	Burst string
}

// WriteBackRows are the rows measured on the warm caches, in the order of the table; BurstRow
// goes last.
func WriteBackRows() []Row {
	return []Row{
		{Name: "4K random write, QD32", FioArgs: []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "8K random 80/20 read/write, QD32", FioArgs: []string{"--rw=randrw", "--rwmixread=80", "--bs=8k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "64K sequential write, QD32", FioArgs: []string{"--rw=write", "--bs=64k", "--iodepth=32"}, Unit: "MiB/s"},
	}
}

// BurstRow writes size once, sequentially: on tierblk, more than its SSD tier (BurstSSD).
func BurstRow(size string) Row {
	return Row{
		Name:    fmt.Sprintf("%s burst, 64K sequential write, QD32, SSD tier %s", size, BurstSSD),
		FioArgs: []string{"--rw=write", "--bs=64k", "--iodepth=32"},
		Unit:    "MiB/s",
	}
}

// BurstDirty is what the dirty-ratio samples of the burst row showed.
type BurstDirty struct {
	Samples int
	// Peak is the highest dirty ratio seen; Max the ratio tierblk must hold writes at.
	Peak, Max float64
	// ThrottledWrites counts the writes tierblk slowed down, over the whole burst row.
	ThrottledWrites uint64
}

// Held reports whether the dirty ratio never passed its maximum.
func (d BurstDirty) Held() bool { return d.Samples > 0 && d.Peak <= d.Max }

// WriteBackReport is RunWriteBack's outcome: the table's rows and the burst's dirty ratio.
type WriteBackReport struct {
	Results []Result
	Burst   BurstDirty
}

// RunWriteBack measures tierblk in write-back against nbdkit's cache filter in write-back and the
// slow disk alone, in the same run, alternating as Run does: the WriteBackRows on caches warmed by
// one read of the working set, then BurstRow on a second tierblk with a BurstSSD SSD tier while its
// dirty ratio is sampled every 100 ms.
//
// Fairness: nbdkit's write-back cache has no size limit and writes back only when a client
// flushes, which fio never does, so it never writes to its slow disk during the run. tierblk is
// flushed (`tierblk flush`) before each of its measurements, so that no round inherits another's
// dirty data; the flush is not timed. The burst is where tierblk's bound shows: nbdkit's cache file
// grows without limit (into the page cache), tierblk's dirty data stays within its SSD tier.
func RunWriteBack(ctx context.Context, o WriteBackOptions) (WriteBackReport, error) {
	if err := o.check(); err != nil {
		return WriteBackReport{}, err
	}
	if o.Burst == "" {
		return WriteBackReport{}, errors.New("the burst size is empty; give one larger than the SSD tier, " + BurstSSD)
	}
	dir, err := os.MkdirTemp(o.WorkDir, "run")
	if err != nil {
		return WriteBackReport{}, err
	}
	defer os.RemoveAll(dir)
	burstDir := filepath.Join(dir, "burst")
	if err := os.Mkdir(burstDir, 0o755); err != nil {
		return WriteBackReport{}, err
	}
	sock := func(name string) string { return filepath.Join(dir, name+".sock") }
	admin, burstAdmin := sock("admin"), sock("burst-admin")
	main := cacheTargetsFor(o.Tierblk, dir, sock("backend"), cacheSetup{mode: "writeback", ssdSize: CacheSSD, admin: admin})
	burst := cacheTargetsFor(o.Tierblk, burstDir, sock("burst-backend"), cacheSetup{mode: "writeback", ssdSize: BurstSSD, admin: burstAdmin})[0]
	var servers []*server
	defer func() {
		// Every tierblk before its backend.
		for _, s := range slices.Backward(servers) {
			s.close()
		}
	}()
	for _, s := range []struct {
		target  Target
		sock    string
		prefill bool
	}{
		// Each tierblk's backend is prefilled before the tierblk starts.
		{Target{Name: "tierblk's slow disk", Command: slowDisk}, sock("backend"), true},
		{main[0], sock("tierblk"), false},
		{main[1], sock("nbdkit"), true},
		{main[2], sock("slow"), true},
		// The burst only writes: its backend needs no data.
		{Target{Name: "the burst tierblk's slow disk", Command: slowDisk}, sock("burst-backend"), false},
		{burst, sock("burst"), false},
	} {
		srv := &server{Target: s.target, sock: s.sock}
		if err := srv.start(ctx); err != nil {
			return WriteBackReport{}, err
		}
		servers = append(servers, srv)
		if s.prefill {
			if err := o.pass(ctx, srv, "prefilling", "--rw=write"); err != nil {
				return WriteBackReport{}, err
			}
		}
	}
	tb, nk, slow, tbBurst := servers[1], servers[2], servers[3], servers[5]
	for _, s := range []*server{tb, nk} {
		if err := o.pass(ctx, s, "warming up", "--rw=read"); err != nil {
			return WriteBackReport{}, err
		}
	}
	var rep WriteBackReport
	for _, row := range WriteBackRows() {
		probes := []probe{
			{name: tb.Name, ep: tb.endpoint(), runtime: o.Runtime, ramp: time.Second},
			{name: nk.Name, ep: nk.endpoint(), runtime: o.Runtime, ramp: time.Second},
			{name: slow.Name, ep: slow.endpoint(), runtime: o.SlowRuntime, ramp: time.Second},
		}
		r, err := measure(ctx, row, probes, o.Rounds, o.Size, o.Log, func() error { return o.flush(ctx, tb.Name, admin) })
		if err != nil {
			return WriteBackReport{}, err
		}
		rep.Results = append(rep.Results, r)
	}
	// The burst: once over o.Burst on each, the burst tierblk under the tierblk column.
	probes := []probe{
		{name: nameTierblk, ep: tbBurst.endpoint()},
		{name: nk.Name, ep: nk.endpoint()},
		{name: slow.Name, ep: slow.endpoint()},
	}
	sampler := startDirtySampler(ctx, burstAdmin, burstSample)
	r, err := measure(ctx, BurstRow(o.Burst), probes, o.Rounds, o.Burst, o.Log, func() error { return o.flush(ctx, "the burst tierblk", burstAdmin) })
	dirty, serr := sampler.stop()
	if err != nil {
		return WriteBackReport{}, err
	}
	if serr != nil {
		return WriteBackReport{}, fmt.Errorf("sampling the burst tierblk's dirty ratio: %w", serr)
	}
	fmt.Fprintf(o.Log, "burst: peak dirty ratio %.3f (max %.2f) in %d samples, %d throttled writes\n",
		dirty.Peak, dirty.Max, dirty.Samples, dirty.ThrottledWrites)
	rep.Results = append(rep.Results, r)
	rep.Burst = dirty
	return rep, nil
}

// flush makes the tierblk at the admin socket write back all its dirty data, with `tierblk flush`.
func (o WriteBackOptions) flush(ctx context.Context, name, admin string) error {
	return flushTierblk(ctx, o.Tierblk, name, admin, o.Log)
}

// flushTierblk makes the tierblk called name at the admin socket write back all its dirty data,
// with `bin flush`, and logs how long that took.
func flushTierblk(ctx context.Context, bin, name, admin string, log io.Writer) error {
	began := time.Now()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, flushArgs(admin)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("flush %s: %w: %s", name, err, strings.TrimSpace(out.String()))
	}
	fmt.Fprintf(log, "flushed %s in %.1fs\n", name, time.Since(began).Seconds())
	return nil
}

func flushArgs(admin string) []string { return []string{"flush", "--admin", "unix:" + admin} }

// dirtySampler polls a tierblk's /stats in the background and keeps the peak dirty ratio.
type dirtySampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	dirty  BurstDirty
	err    error
}

func startDirtySampler(ctx context.Context, admin string, every time.Duration) *dirtySampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &dirtySampler{cancel: cancel, done: make(chan struct{})}
	client := adminClient(admin)
	var base uint64
	go func() {
		defer close(s.done)
		defer client.CloseIdleConnections()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			d, err := getDirty(ctx, client)
			s.mu.Lock()
			switch {
			case ctx.Err() != nil:
			case err != nil:
				s.err = err
			default:
				if s.dirty.Samples == 0 {
					base = d.ThrottledWrites
				}
				s.dirty = s.dirty.add(d, base)
			}
			stop := s.err != nil
			s.mu.Unlock()
			if stop {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and returns what it saw, or the error that ended it early.
func (s *dirtySampler) stop() (BurstDirty, error) {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dirty, s.err
}

// add folds one sample into d. base is the throttled-write counter (counted since tierblk
// started) at the first sample.
func (d BurstDirty) add(st cache.DirtyStats, base uint64) BurstDirty {
	d.Samples++
	d.Peak = max(d.Peak, st.Ratio)
	d.Max = st.Max
	d.ThrottledWrites = st.ThrottledWrites - base
	return d
}

// adminClient is an HTTP client that dials the unix socket whatever the URL's host says.
func adminClient(sock string) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

// getDirty fetches /stats and returns its write-back figures.
func getDirty(ctx context.Context, client *http.Client) (cache.DirtyStats, error) {
	body, err := fetchStats(ctx, client)
	if err != nil {
		return cache.DirtyStats{}, err
	}
	return parseDirty(body)
}

// getStats fetches /stats and returns the figures of its one export.
func getStats(ctx context.Context, client *http.Client) (cache.Stats, error) {
	body, err := fetchStats(ctx, client)
	if err != nil {
		return cache.Stats{}, err
	}
	return parseStats(body)
}

// fetchStats returns the body of a GET /stats.
func fetchStats(ctx context.Context, client *http.Client) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://tierblk-admin/stats", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /stats: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// parseStats picks the figures of the benchmark's one export out of a /stats answer.
func parseStats(body []byte) (cache.Stats, error) {
	var resp metrics.StatsResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return cache.Stats{}, fmt.Errorf("GET /stats: the answer is not tierblk stats: %w", err)
	}
	if len(resp.Exports) != 1 {
		return cache.Stats{}, fmt.Errorf("GET /stats: %d exports, want the benchmark's one", len(resp.Exports))
	}
	return resp.Exports[0].Stats, nil
}

// parseDirty picks the write-back figures out of a /stats answer for one export in write-back.
func parseDirty(body []byte) (cache.DirtyStats, error) {
	st, err := parseStats(body)
	if err != nil {
		return cache.DirtyStats{}, err
	}
	if st.Mode != cache.WriteBack.String() {
		return cache.DirtyStats{}, fmt.Errorf("GET /stats: the export is in mode %q, want %q", st.Mode, cache.WriteBack.String())
	}
	return st.Dirty, nil
}

// WriteBackTable renders RunWriteBack's report: the table with the ratios tierblk/nbdkit cache and
// tierblk/slow disk, then what the burst did to the dirty ratio.
func WriteBackTable(rep WriteBackReport) string {
	held := "stayed at or below it"
	if !rep.Burst.Held() {
		held = "PASSED it"
	}
	return Table(rep.Results, cacheTargets("", "", "")) + fmt.Sprintf(
		"\nDuring the burst, tierblk's dirty ratio (sampled every %s, %d samples) peaked at %.3f of its SSD tier; "+
			"the maximum is %.2f, and it %s (%d writes throttled).\n",
		burstSample, rep.Burst.Samples, rep.Burst.Peak, rep.Burst.Max, held, rep.Burst.ThrottledWrites)
}
