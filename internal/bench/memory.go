package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/units"
)

// The memory benchmark's setup: the daemon must hold at most its bound whatever the
// load (docs/operations.md, "How much RAM"). Each RAM tier of MemoryRAMTiers is measured in write-back over an SSD
// tier of MemorySSD and a file backend of MemoryBackend, under MemoryPhases.
const (
	MemorySSD     = "512MiB"
	MemoryBackend = "2GiB"
	// MemorySlack is a fixed allowance besides the RAM tier: the RSS ratio is taken against RAM
	// tier + MemorySlack, a figure both builds share (the older one reports no bound).
	MemorySlack = 64 << 20
	// memoryRegion is the region of the disk the phases work on.
	memoryRegion = "1g"
	// memorySample is how often /proc/PID/status is read during the phases, for the held peak of
	// both builds.
	memorySample = 100 * time.Millisecond
	// memoryThis and memoryBaseline name the builds.
	memoryThis, memoryBaseline = "this build", "baseline"
)

// MemoryRAMTiers are the RAM tiers measured by default: 32 MiB, 256 MiB and 1 GiB.
func MemoryRAMTiers() []int64 { return []int64{32 << 20, 256 << 20, 1 << 30} }

// MemoryPhase is one fio load; its args follow the common ones (memoryFioArgs).
type MemoryPhase struct {
	Name    string
	FioArgs []string
}

// MemoryPhases are the loads, in order, over the same GiB: 4 jobs of 512 KiB sequential writes at
// QD64 (each job its quarter), 4 jobs of 1 MiB random reads at QD64 (each job 256 MiB over the
// whole GiB), then one job of 4 KiB random writes at QD32 (256 MiB, or 20 s, whichever ends first).
func MemoryPhases() []MemoryPhase {
	return []MemoryPhase{
		{Name: "512K sequential write, 4 jobs x QD64", FioArgs: []string{"--rw=write", "--bs=512k", "--iodepth=64", "--numjobs=4",
			"--size=256m", "--offset_increment=256m"}},
		{Name: "1M random read, 4 jobs x QD64", FioArgs: []string{"--rw=randread", "--bs=1m", "--iodepth=64", "--numjobs=4",
			"--size=" + memoryRegion, "--io_size=256m"}},
		{Name: "4K random write, 1 job x QD32", FioArgs: []string{"--rw=randwrite", "--bs=4k", "--iodepth=32", "--numjobs=1",
			"--size=" + memoryRegion, "--io_size=256m", "--runtime=20s"}},
	}
}

// memoryFioArgs are fio's arguments for phase p against the NBD URI: the jobs reported as one.
func memoryFioArgs(uri string, p MemoryPhase) []string {
	return append([]string{"--name=memory", "--ioengine=nbd", "--uri=" + uri, "--group_reporting",
		"--output-format=json", "--random_generator=tausworthe64"}, p.FioArgs...)
}

// MemoryOptions control `tierblk bench memory`.
type MemoryOptions struct {
	// Tierblk is this build; Baseline, if set, an older tierblk measured in the same rounds.
	Tierblk, Baseline string
	// RAMTiers are the --ram sizes measured, in bytes.
	RAMTiers []int64
	Rounds   int
	// WorkDir holds each run's directory (removed after it) and the heap profiles of runs whose
	// held peak passed the bound (kept).
	WorkDir string
	Log     io.Writer
}

// MemorySample is one run of one build on one RAM tier.
type MemorySample struct {
	// From this build's /stats memory object, after the last phase; zero for a build without one.
	Bound, HeldPeak, Index uint64
	// GoHeap is the most Go heap seen after a phase (this build only).
	GoHeap uint64
	// RSSPeak is VmHWM from /proc/PID/status after the last phase, for every build.
	RSSPeak uint64
	// ProcHeld is the most RssAnon + RssShmem seen in /proc/PID/status (every memorySample and
	// after each phase), for every build.
	ProcHeld uint64
	// HasStats is whether the build's /stats has a memory object.
	HasStats bool
}

// MemoryResult is one build on one RAM tier, a sample per round.
type MemoryResult struct {
	RAM     int64
	Build   string
	Samples []MemorySample
	// Command is the measured command line (WORK: the run's directory).
	Command string
}

// memRun is how one run is started.
type memRun struct {
	build, bin string
	ram        int64
}

// RunMemory measures, for each RAM tier, each build (alternating which goes first each round) with
// a fresh `tierblk serve` in a new directory per run, under every phase of MemoryPhases.
func RunMemory(ctx context.Context, o MemoryOptions) ([]MemoryResult, error) {
	if o.Rounds < 1 || len(o.RAMTiers) == 0 || o.Tierblk == "" {
		return nil, fmt.Errorf("rounds must be at least 1, and there must be a RAM tier and a tierblk to measure, got %d rounds, %v", o.Rounds, o.RAMTiers)
	}
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, errors.New("fio is not installed; run `make deps` (Debian package fio)")
	}
	builds := []memRun{{build: memoryThis, bin: o.Tierblk}}
	if o.Baseline != "" {
		builds = append(builds, memRun{build: memoryBaseline, bin: o.Baseline})
	}
	var out []MemoryResult
	for _, ram := range o.RAMTiers {
		res := make([]MemoryResult, len(builds))
		for i, b := range builds {
			res[i] = MemoryResult{RAM: ram, Build: b.build, Command: shellJoin(memoryServeArgs(b.bin, "WORK", ram))}
		}
		for round := 0; round < o.Rounds; round++ {
			for _, i := range roundOrder(len(builds), round) {
				r := builds[i]
				r.ram = ram
				s, err := runMemoryOnce(ctx, r, round, o)
				if err != nil {
					return nil, fmt.Errorf("RAM tier %s, %s, round %d: %w", units.FormatSize(ram), r.build, round+1, err)
				}
				res[i].Samples = append(res[i].Samples, s)
			}
		}
		out = append(out, res...)
	}
	return out, nil
}

// memoryServeArgs is the serve command of one run in dir.
func memoryServeArgs(bin, dir string, ram int64) []string {
	return []string{bin, "serve", "--backend", "file://" + filepath.Join(dir, "backend.img") + "?size=" + MemoryBackend,
		"--nbd", "unix:" + filepath.Join(dir, "nbd.sock"), "--ram", units.FormatSize(ram),
		"--ssd", filepath.Join(dir, "ssd.img"), "--ssd-size", MemorySSD, "--mode", "writeback",
		"--admin", "unix:" + filepath.Join(dir, "admin.sock"), "--log-level", "warn"}
}

// runMemoryOnce starts r in a new directory, runs the phases and reads its memory after each.
func runMemoryOnce(ctx context.Context, r memRun, round int, o MemoryOptions) (MemorySample, error) {
	dir, err := os.MkdirTemp(o.WorkDir, "memory")
	if err != nil {
		return MemorySample{}, err
	}
	defer os.RemoveAll(dir)
	args := memoryServeArgs(r.bin, dir, r.ram)
	var proc *exec.Cmd
	t := Target{Name: r.build, Command: func(string) *exec.Cmd {
		proc = exec.Command(args[0], args[1:]...)
		return proc
	}}
	sock := filepath.Join(dir, "nbd.sock")
	stop, err := start(ctx, t, sock)
	if err != nil {
		return MemorySample{}, err
	}
	defer stop()
	pid := proc.Process.Pid
	client := adminClient(filepath.Join(dir, "admin.sock"))
	defer client.CloseIdleConnections()
	sampler := startProcSampler(ctx, pid, memorySample)
	var s MemorySample
	for _, p := range MemoryPhases() {
		began := time.Now()
		res, err := memoryFio(ctx, Endpoint{Sock: sock}.URI(), p)
		if err != nil {
			sampler.stop()
			return s, fmt.Errorf("%s: %w", p.Name, err)
		}
		st, err := procStatus(pid)
		if err != nil {
			sampler.stop()
			return s, err
		}
		s.ProcHeld = max(s.ProcHeld, st.held())
		s.RSSPeak = st.hwm
		body, err := fetchStats(ctx, client)
		if err != nil {
			sampler.stop()
			return s, err
		}
		m, err := parseMemory(body)
		if err != nil {
			sampler.stop()
			return s, err
		}
		line := fmt.Sprintf("RAM tier %-7s round %d %-10s %-38s %6.0f MiB/s in %5.1fs; VmHWM %.1f MiB, held %.1f MiB",
			units.FormatSize(r.ram), round+1, r.build, p.Name, res.bytesPerSec/(1<<20), time.Since(began).Seconds(),
			mib(st.hwm), mib(st.held()))
		if m != nil {
			s.HasStats, s.Bound, s.HeldPeak, s.Index = true, m.Bound, m.HeldPeak, m.Index
			s.GoHeap = max(s.GoHeap, m.GoHeap)
			line += fmt.Sprintf("; /stats: held peak %.1f MiB of bound %.1f MiB, Go heap %.1f MiB",
				mib(m.HeldPeak), mib(m.Bound), mib(m.GoHeap))
		}
		fmt.Fprintln(o.Log, line)
	}
	s.ProcHeld = max(s.ProcHeld, sampler.stop())
	if s.HasStats && s.HeldPeak > s.Bound {
		path := filepath.Join(o.WorkDir, fmt.Sprintf("memory-heap-%s-round%d.pb.gz", units.FormatSize(r.ram), round+1))
		if err := saveHeapProfile(ctx, client, path); err != nil {
			fmt.Fprintf(o.Log, "held peak %.1f MiB is above the bound %.1f MiB; no heap profile: %v\n", mib(s.HeldPeak), mib(s.Bound), err)
		} else {
			fmt.Fprintf(o.Log, "held peak %.1f MiB is above the bound %.1f MiB; heap profile in %s\n", mib(s.HeldPeak), mib(s.Bound), path)
		}
	}
	return s, nil
}

// memoryFio runs phase p against uri.
func memoryFio(ctx context.Context, uri string, p MemoryPhase) (fioResult, error) {
	return runFio(exec.CommandContext(ctx, "fio", memoryFioArgs(uri, p)...))
}

// parseMemory returns the memory object of a /stats answer, nil when it has none (a build from
// before it).
func parseMemory(body []byte) (*metrics.MemoryStats, error) {
	var resp metrics.StatsResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("GET /stats: the answer is not tierblk stats: %w", err)
	}
	return resp.Memory, nil
}

// saveHeapProfile writes the daemon's heap profile (/debug/pprof/heap) to path.
func saveHeapProfile(ctx context.Context, client *http.Client, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://tierblk-admin/debug/pprof/heap", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/heap: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// procMem is what the memory benchmark reads from /proc/PID/status, in bytes.
type procMem struct{ hwm, rss, anon, shmem uint64 }

// held is what the daemon's bound applies to: anonymous and shared memory.
func (m procMem) held() uint64 { return m.anon + m.shmem }

func procStatus(pid int) (procMem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}, err
	}
	return parseProcMem(b)
}

// parseProcMem reads VmHWM, VmRSS, RssAnon and RssShmem (in kB) from a /proc/PID/status; all must
// be there.
func parseProcMem(status []byte) (procMem, error) {
	var m procMem
	fields := map[string]*uint64{"VmHWM:": &m.hwm, "VmRSS:": &m.rss, "RssAnon:": &m.anon, "RssShmem:": &m.shmem}
	seen := 0
	for line := range strings.SplitSeq(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		p, ok := fields[f[0]]
		if !ok {
			continue
		}
		if len(f) != 3 || f[2] != "kB" {
			return procMem{}, fmt.Errorf("/proc/PID/status: %q is not a figure in kB", line)
		}
		kb, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return procMem{}, fmt.Errorf("/proc/PID/status: %q: %w", line, err)
		}
		*p = kb << 10
		seen++
	}
	if seen != len(fields) {
		return procMem{}, errors.New("/proc/PID/status lacks one of VmHWM, VmRSS, RssAnon and RssShmem")
	}
	return m, nil
}

// procSampler keeps the most held memory /proc/PID/status showed, read every interval.
type procSampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	peak   uint64
}

func startProcSampler(ctx context.Context, pid int, every time.Duration) *procSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &procSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			// A read that fails (the process gone) leaves the peak as it was.
			if m, err := procStatus(pid); err == nil {
				s.mu.Lock()
				s.peak = max(s.peak, m.held())
				s.mu.Unlock()
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

// stop ends the sampling and returns the peak.
func (s *procSampler) stop() uint64 {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// spread is the median of v and its lowest and highest.
func spread(v []float64) (mid, lo, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	return median(v), slices.Min(v), slices.Max(v)
}

// MemoryTable renders RunMemory's results as a Markdown table: per RAM tier and build, the medians
// over rounds with the lowest and highest. The bound, the daemon's held peak, its ratio to the
// bound and the Go heap come from /stats, so a build without the memory object shows "-".
func MemoryTable(rs []MemoryResult) string {
	var b strings.Builder
	b.WriteString("| RAM tier | build | bound, MiB | held peak (/stats), MiB | held peak / bound | held peak (/proc, 100 ms), MiB | VmHWM, MiB | VmHWM / (RAM tier + 64 MiB) | Go heap (most after a phase), MiB |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	col := func(r MemoryResult, f func(MemorySample) float64, format string) string {
		v := make([]float64, len(r.Samples))
		for i, s := range r.Samples {
			v[i] = f(s)
		}
		m, lo, hi := spread(v)
		return fmt.Sprintf(format+" ("+format+"-"+format+")", m, lo, hi)
	}
	for _, r := range rs {
		stats := len(r.Samples) > 0
		for _, s := range r.Samples {
			stats = stats && s.HasStats
		}
		bound, held, ratio, heap := "-", "-", "-", "-"
		if stats {
			bound = col(r, func(s MemorySample) float64 { return mib(s.Bound) }, "%.1f")
			held = col(r, func(s MemorySample) float64 { return mib(s.HeldPeak) }, "%.1f")
			ratio = col(r, func(s MemorySample) float64 { return float64(s.HeldPeak) / float64(s.Bound) }, "%.2f")
			heap = col(r, func(s MemorySample) float64 { return mib(s.GoHeap) }, "%.1f")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", units.FormatSize(r.RAM), r.Build, bound, held, ratio,
			col(r, func(s MemorySample) float64 { return mib(s.ProcHeld) }, "%.1f"),
			col(r, func(s MemorySample) float64 { return mib(s.RSSPeak) }, "%.1f"),
			col(r, func(s MemorySample) float64 { return float64(s.RSSPeak) / float64(uint64(r.RAM)+MemorySlack) }, "%.2f"),
			heap)
	}
	return b.String()
}
