package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/nbd/client"
)

// The cold benchmark's setup: the cache's default tiers of a modest machine over two backends of
// a terabyte, far larger than the cache, so that the cache stays cold for a whole measurement.
const (
	// ColdRAM and ColdSSD are the cached tierblk's tiers; everything else is tierblk's default.
	ColdRAM = "1GiB"
	ColdSSD = "8GiB"
	// coldBackendSize is both backends' size (nbdkit's memory plugin is sparse: it costs only what
	// is written).
	coldBackendSize = "1T"
	// coldRate is the NAS's link, in bits per second as nbdkit's rate filter takes it (binary
	// units: 2^30 bits/s, 128 MiB/s each way, 32,768 4K transfers a second).
	coldRate = "1G"
	// ColdBurst is how long nbdkit's rate filter lets an idle link run unlimited: its bucket holds
	// 2 s of the rate each way (65,536 4K transfers), full once the link was idle 2 s. It is the
	// default ColdOptions.Settle.
	ColdBurst = 2 * time.Second
)

// The cold benchmark's backends and targets, as the table and the log name them.
const (
	ColdNAS       = "NAS"
	ColdSlow      = "slow disk"
	nameColdCache = "tierblk, cache"
	nameColdNone  = "tierblk, no cache"
	nameColdBound = "NAS alone"
	coldUnitTime  = "s"
	coldRowReplay = "replay"
)

// ColdOptions control `tierblk bench cold`.
type ColdOptions struct {
	// Tierblk is the tierblk binary measured, with and without a cache.
	Tierblk string
	// CacheFlags are more `tierblk serve` flags for the cached tierblk (another admission policy
	// or line size, say), to compare settings or builds on the same rows.
	CacheFlags []string
	Rounds     int
	// Runtime is fio's time per measurement on the NAS, SlowRuntime on the slow disk (about 190
	// IOPS: a short run counts enough requests).
	Runtime, SlowRuntime time.Duration
	// Size is the region the fio rows work on (fio size syntax), far larger than the cache.
	Size string
	// Settle is how long the NAS is left idle before each measurement on it. ColdBurst gives each
	// the same full burst; less would give the measurement right after another less than the one
	// after a pause.
	Settle time.Duration
	// Traces are the trace files replayed on the NAS, one row each.
	Traces []string
	// Rows are the IDs of the rows to run (ColdRowIDs); empty runs every row.
	Rows []string
	// WorkDir holds the sockets and the SSD tiers; its file system must support O_DIRECT.
	WorkDir string
	Log     io.Writer
}

// ColdRow is one workload of the cold benchmark.
type ColdRow struct {
	// ID selects the row in ColdOptions.Rows; every replay has the ID "replay".
	ID      string
	Name    string
	Backend string // ColdNAS or ColdSlow
	// Fio is the fio workload; nil for a replay.
	Fio *Row
	// Replay is the trace replayed, for a replay row.
	Replay *Replay
}

// Unit is what the row's figures count: fio's IOPS, or the seconds a replay took.
func (r ColdRow) Unit() string {
	if r.Fio != nil {
		return r.Fio.Unit
	}
	return coldUnitTime
}

// ColdRowIDs are the IDs ColdOptions.Rows accepts, in the table's order.
func ColdRowIDs() []string { return []string{"nas-read", "nas-rw", "slow-read", coldRowReplay} }

// coldRows are the rows over a region of size (fio size syntax), followed by one replay per trace,
// keeping those whose ID is in ids (all when ids is empty).
func coldRows(size string, replays []*Replay, ids []string) []ColdRow {
	randread := []string{"--rw=randread", "--bs=4k", "--iodepth=32"}
	rows := []ColdRow{
		{ID: "nas-read", Name: "cold 4K random read, QD32, over " + size, Backend: ColdNAS,
			Fio: &Row{FioArgs: randread, Unit: "IOPS"}},
		{ID: "nas-rw", Name: "cold 4K random 50/50 read/write, QD32, over " + size + ", write-through", Backend: ColdNAS,
			Fio: &Row{FioArgs: []string{"--rw=randrw", "--rwmixread=50", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"}},
		{ID: "slow-read", Name: "cold 4K random read, QD32, over " + size, Backend: ColdSlow,
			Fio: &Row{FioArgs: randread, Unit: "IOPS"}},
	}
	for _, rp := range replays {
		rows = append(rows, ColdRow{ID: coldRowReplay, Backend: ColdNAS, Replay: rp,
			Name: fmt.Sprintf("replay of %s (%d requests, %d in flight): time, lower is better", rp.Name, rp.Requests(), ReplayDepth)})
	}
	if len(ids) == 0 {
		return rows
	}
	return slices.DeleteFunc(rows, func(r ColdRow) bool { return !slices.Contains(ids, r.ID) })
}

// ColdResult is one row's figures: one sample per round on each tierblk, and on the NAS one of the
// NAS alone.
type ColdResult struct {
	Row, Backend, Unit string
	Cache, NoCache     []float64
	// Bound is the NAS measured alone, once, in the first round: what the link allows. Zero on
	// the slow disk, whose bound is known (one request at a time, 5 ms each: 200 IOPS).
	Bound float64
}

// Ratios are cache/no cache per round, paired by round.
func (r ColdResult) Ratios() []float64 { return pairedRatios(r.Cache, r.NoCache) }

// ColdReport is RunCold's outcome: the results and the command lines measured.
type ColdReport struct {
	Results []ColdResult
	// Commands are the backends' and servers' command lines and fio's, with WORK for the run's
	// directory and ROUND for a measurement's own subdirectory.
	Commands []string
}

// RunCold measures tierblk with its cache against tierblk without one, over backends far larger
// than the cache, in the same run. Row by row, each round runs the row on both, alternating which
// goes first from round to round; every measurement starts a fresh tierblk in a new directory (a new SSD tier
// and metadata), so the cache is empty at the start of each. The backends (a NAS behind a 1 Gb/s
// link and a slow disk, both nbdkit) are started once and serve every measurement; the traces are
// read into memory before the first.
func RunCold(ctx context.Context, o ColdOptions) (ColdReport, error) {
	if err := o.check(); err != nil {
		return ColdReport{}, err
	}
	var replays []*Replay
	if len(o.Rows) == 0 || slices.Contains(o.Rows, coldRowReplay) {
		for _, path := range o.Traces {
			began := time.Now()
			rp, err := LoadReplay(path)
			if err != nil {
				return ColdReport{}, err
			}
			fmt.Fprintf(o.Log, "loaded %s: %d requests to replay, %d skipped, in %.1fs\n", rp.Name, rp.Requests(), rp.Skipped, time.Since(began).Seconds())
			replays = append(replays, rp)
		}
	}
	rows := coldRows(o.Size, replays, o.Rows)
	dir, err := os.MkdirTemp(o.WorkDir, "cold")
	if err != nil {
		return ColdReport{}, err
	}
	defer os.RemoveAll(dir)
	backends := map[string]*server{}
	defer func() {
		for _, s := range backends {
			s.close()
		}
	}()
	for _, name := range []string{ColdNAS, ColdSlow} {
		s := &server{Target: Target{Name: name, Command: coldBackend(name)}, sock: filepath.Join(dir, coldSockName(name))}
		if err := s.start(ctx); err != nil {
			return ColdReport{}, err
		}
		backends[name] = s
	}
	c := &coldRun{o: o, dir: dir, backends: backends}
	rep := ColdReport{Commands: c.commands(rows)}
	for i, row := range rows {
		r := ColdResult{Row: row.Name, Backend: row.Backend, Unit: row.Unit()}
		for round := range o.Rounds {
			fmt.Fprintf(o.Log, "%s (%s), round %d of %d\n", row.Name, row.Backend, round+1, o.Rounds)
			for _, t := range roundOrder(2, round) {
				cached := t == 0
				v, err := c.measureTierblk(ctx, row, fmt.Sprintf("%d-%d", i, round), cached)
				if err != nil {
					return ColdReport{}, err
				}
				if cached {
					r.Cache = append(r.Cache, v)
				} else {
					r.NoCache = append(r.NoCache, v)
				}
			}
			// The slow disk's bound needs no measuring: one request at a time, 5 ms each.
			if round == 0 && row.Backend == ColdNAS {
				if err := c.settle(ctx, row); err != nil {
					return ColdReport{}, err
				}
				if r.Bound, err = c.measure(ctx, row, backends[row.Backend].sock, nameColdBound); err != nil {
					return ColdReport{}, err
				}
			}
		}
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

// Validate checks the options a user gives (`tierblk bench cold` reports its error as a usage
// error, naming the flags).
func (o ColdOptions) Validate() error {
	if o.Rounds < 1 || o.Runtime < time.Second || o.SlowRuntime < time.Second || o.Settle < 0 {
		return fmt.Errorf("--rounds must be at least 1, --runtime and --slow-runtime at least 1s (fio counts whole seconds), --settle not negative; got %d, %s, %s, %s",
			o.Rounds, o.Runtime, o.SlowRuntime, o.Settle)
	}
	if o.Size == "" {
		return errors.New("--size is empty; give a region far larger than the cache, e.g. 512g")
	}
	for _, id := range o.Rows {
		if !slices.Contains(ColdRowIDs(), id) {
			return fmt.Errorf("--rows: unknown row %q; rows: %s", id, strings.Join(ColdRowIDs(), ", "))
		}
	}
	return nil
}

// check is Validate, and that the tools and the work directory's file system are fit to run.
func (o ColdOptions) check() error {
	if err := o.Validate(); err != nil {
		return err
	}
	return checkFioRun(o.WorkDir)
}

// coldBackend is the nbdkit command line of a backend.
func coldBackend(name string) func(sock string) *exec.Cmd {
	args := []string{"--filter=rate", "memory", coldBackendSize, "rate=" + coldRate}
	if name == ColdSlow {
		args = []string{"--filter=noparallel", "--filter=delay", "memory", coldBackendSize, "delay-read=" + slowDelay, "delay-write=" + slowDelay}
	}
	return func(sock string) *exec.Cmd {
		return exec.Command("nbdkit", append([]string{"-f", "-U", sock}, args...)...)
	}
}

func coldSockName(backend string) string {
	if backend == ColdNAS {
		return "nas.sock"
	}
	return "slow.sock"
}

// coldTierblk is tierblk's serve command over the backend at backendSock, listening on
// dir/nbd.sock; with a cache, its SSD tier, metadata and admin socket are in dir too.
func coldTierblk(tierblk, backendSock, dir string, cached bool, cacheFlags []string) []string {
	args := []string{tierblk, "serve", "--backend", "nbd+unix:///?socket=" + backendSock, "--nbd", "unix:" + filepath.Join(dir, "nbd.sock"),
		"--log-level", "warn"}
	if cached {
		args = append(args, "--ram", ColdRAM, "--ssd", filepath.Join(dir, "ssd.img"), "--ssd-size", ColdSSD,
			"--admin", "unix:"+filepath.Join(dir, "admin.sock"))
		args = append(args, cacheFlags...)
	}
	return args
}

// coldRun is one run's state.
type coldRun struct {
	o        ColdOptions
	dir      string
	backends map[string]*server
	// nasIdle is when the last measurement on the NAS ended (zero before the first).
	nasIdle time.Time
}

// measureTierblk starts a tierblk over the row's backend in a new directory named by key, runs the
// row on it, stops it and removes the directory.
func (c *coldRun) measureTierblk(ctx context.Context, row ColdRow, key string, cached bool) (float64, error) {
	name, suffix := nameColdNone, "n"
	if cached {
		name, suffix = nameColdCache, "c"
	}
	dir := filepath.Join(c.dir, key+suffix)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	var proc *exec.Cmd
	args := coldTierblk(c.o.Tierblk, c.backends[row.Backend].sock, dir, cached, c.o.CacheFlags)
	s := &server{Target: Target{Name: name, Command: func(string) *exec.Cmd {
		proc = exec.Command(args[0], args[1:]...)
		return proc
	}}, sock: filepath.Join(dir, "nbd.sock")}
	began := time.Now()
	if err := s.start(ctx); err != nil {
		return 0, err
	}
	defer s.close()
	startup := time.Since(began)
	if err := c.settle(ctx, row); err != nil {
		return 0, err
	}
	cpu0, err := readCPU(proc.Process.Pid)
	if err != nil {
		return 0, err
	}
	v, err := c.measure(ctx, row, s.sock, name)
	if err != nil {
		return 0, err
	}
	cpu1, err := readCPU(proc.Process.Pid)
	if err != nil {
		return 0, err
	}
	note := cpu1.since(cpu0)
	if cached {
		client := adminClient(filepath.Join(dir, "admin.sock"))
		defer client.CloseIdleConnections()
		st, err := getStats(ctx, client)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		note += "; " + cacheNote(st)
	}
	// What a measurement costs beside itself, for the run's length.
	began = time.Now()
	s.close()
	stopped := time.Since(began)
	began = time.Now()
	if err := os.RemoveAll(dir); err != nil {
		return 0, err
	}
	fmt.Fprintf(c.o.Log, "    %s; started in %.1fs, stopped in %.1fs, its directory removed in %.1fs\n",
		note, startup.Seconds(), stopped.Seconds(), time.Since(began).Seconds())
	return v, nil
}

// settle waits, before a measurement of a row on the NAS, until the NAS was idle for Settle.
func (c *coldRun) settle(ctx context.Context, row ColdRow) error {
	if row.Backend != ColdNAS || c.nasIdle.IsZero() {
		return nil
	}
	select {
	case <-time.After(time.Until(c.nasIdle.Add(c.o.Settle))):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// measure runs the row once against the NBD server at sock and returns its figure.
func (c *coldRun) measure(ctx context.Context, row ColdRow, sock, name string) (float64, error) {
	if row.Backend == ColdNAS {
		defer func() { c.nasIdle = time.Now() }()
	}
	var v float64
	if row.Fio != nil {
		runtime := c.o.Runtime
		if row.Backend == ColdSlow {
			runtime = c.o.SlowRuntime
		}
		// No ramp: the cache is cold from the start, and a measurement covers the start.
		res, err := fio(ctx, Endpoint{Sock: sock}, c.o.Size, runtime, 0, row.Fio.FioArgs)
		if err != nil {
			return 0, fmt.Errorf("%s on %s: %w", row.Name, name, err)
		}
		v = res.value
		fmt.Fprintf(c.o.Log, "  %-18s %8.0f %s\n", name, v, row.Fio.Unit)
	} else {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cl, err := client.Dial(dctx, client.Config{Network: "unix", Address: sock, Logger: slog.New(slog.DiscardHandler)})
		cancel()
		if err != nil {
			return 0, fmt.Errorf("%s on %s: %w", row.Name, name, err)
		}
		st, err := row.Replay.Run(ctx, cl, ReplayDepth)
		cl.Close()
		if err != nil {
			return 0, fmt.Errorf("%s on %s: %w", row.Name, name, err)
		}
		v = st.Elapsed.Seconds()
		fmt.Fprintf(c.o.Log, "  %-18s %8.2f s (%d reads, %d writes, %.0f MiB read, %.0f MiB written)\n",
			name, v, st.Reads, st.Writes, float64(st.ReadBytes)/(1<<20), float64(st.WrittenBytes)/(1<<20))
	}
	return v, nil
}

// cacheNote sums up a cache's counters after a measurement: each tier's hits and misses, and the
// read amplification (bytes fetched from the backend per byte clients read).
func cacheNote(st cache.Stats) string {
	var b strings.Builder
	for _, t := range st.Tiers {
		fmt.Fprintf(&b, "%s %d hits %d misses, ", t.Name, t.Hits, t.Misses)
	}
	amp := 0.0
	if st.ReadBytes > 0 {
		amp = float64(st.FetchedBytes) / float64(st.ReadBytes)
	}
	fmt.Fprintf(&b, "read amplification %.2f", amp)
	return b.String()
}

// commands are the command lines of a run, with WORK for the run's directory and ROUND for a
// measurement's directory, as RunCold prints them.
func (c *coldRun) commands(rows []ColdRow) []string {
	work := func(args []string) string {
		return strings.ReplaceAll(shellJoin(args), c.dir, "WORK")
	}
	var out []string
	for _, name := range []string{ColdNAS, ColdSlow} {
		cmd := coldBackend(name)(c.backends[name].sock)
		out = append(out, name+": "+work(cmd.Args))
	}
	for _, cached := range []bool{false, true} {
		name := nameColdNone
		if cached {
			name = nameColdCache
		}
		args := coldTierblk(c.o.Tierblk, c.backends[ColdNAS].sock, filepath.Join(c.dir, "ROUND"), cached, c.o.CacheFlags)
		out = append(out, name+": "+work(args)+" (over the slow disk: --backend 'nbd+unix:///?socket=WORK/slow.sock')")
	}
	for _, row := range rows {
		if row.Fio == nil {
			continue
		}
		runtime := c.o.Runtime
		if row.Backend == ColdSlow {
			runtime = c.o.SlowRuntime
		}
		args := append([]string{"fio"}, fioArgs(Endpoint{Sock: filepath.Join(c.dir, "ROUND", "nbd.sock")}.URI(), c.o.Size, runtime, 0, row.Fio.FioArgs)...)
		out = append(out, row.Name+" ("+row.Backend+"): "+work(args))
	}
	if slices.ContainsFunc(rows, func(r ColdRow) bool { return r.Replay != nil }) {
		out = append(out, fmt.Sprintf("replays: tierblk's NBD client (internal/nbd/client), one connection, %d requests in flight, in trace order; "+
			"writes carry the byte %#x", ReplayDepth, replayPattern))
	}
	return out
}

// ColdTable renders RunCold's results as a Markdown table: each side's median, and the median,
// lowest and highest of the per-round ratios cache/no cache.
func ColdTable(rs []ColdResult) string {
	var b strings.Builder
	b.WriteString("| workload | backend | " + nameColdCache + " | " + nameColdNone + " | ratio cache/no cache, median | min | max | " + nameColdBound + " (once) |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		ratios := r.Ratios()
		format := "%.0f %s"
		if r.Unit == coldUnitTime {
			format = "%.2f %s"
		}
		fig := func(v float64) string { return fmt.Sprintf(format, v, r.Unit) }
		bound := "—"
		if r.Bound > 0 {
			bound = fig(r.Bound)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %.2f | %.2f | %s |\n", r.Row, r.Backend, fig(median(r.Cache)), fig(median(r.NoCache)),
			median(ratios), slices.Min(ratios), slices.Max(ratios), bound)
	}
	return b.String()
}
