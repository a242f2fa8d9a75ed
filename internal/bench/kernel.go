package bench

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The kernel benchmark's contenders and rows, as integration/vm/guest/bench-kernel.sh names them.
var (
	// KernelContenders are every contender, the bounds first: the NAS and the SSD alone, and
	// tierblk's ublk device without a cache; tierblk writes back in FLUSH order (the default),
	// tierblkaddr in address order.
	KernelContenders = []string{"none", "ssd", "ublk", "dmcache", "bcache", "dmwritecache", "tierblk", "tierblkaddr"}
	KernelRows       = []string{"zipf", "hits", "randw", "seq", "fsync"}
)

// kernelRowNames are the rows as the table names them.
var kernelRowNames = map[string]string{
	"zipf":  "4K random reads, zipf:1.1 over the NAS, QD16 (IOPS)",
	"hits":  "4K random reads, zipf:1.1 over half the SSD's size, QD16: hits after warm-up (IOPS)",
	"randw": "4K random writes over the SSD's size, QD16 (IOPS)",
	"seq":   "1M sequential read of the whole NAS, QD4 (MB/s)",
	"fsync": "ext4: 4 writers of 4K random writes to their files, fsync every 64 (IOPS)",
}

// kernelVCPUs is the guest's CPUs (run.sh's -smp): a busy fraction of 1 is this many CPU-seconds
// a second.
const kernelVCPUs = 2

// KernelOptions control `tierblk bench kernel`.
type KernelOptions struct {
	// Tierblk is the tierblk binary the guest runs: static (make build), as the guest has no libc.
	Tierblk string
	// VMDir is the repository's integration/vm: run.sh, prepare.sh and guest/bench-kernel.sh.
	VMDir  string
	Rounds int
	// NASms are the NAS's latencies, in ms: one boot for each in every round.
	NASms []int
	// Contenders and Rows are those to run (empty: all).
	Contenders, Rows []string
	// Warm and Measure are each row's warm-up and measured window (the sequential row runs one
	// pass instead).
	Warm, Measure time.Duration
	// MemMiB is the guest's RAM.
	MemMiB int
	// Profile, if set, is a directory for CPU profiles of tierblk over each measured window of
	// the ublk, tierblk and tierblkaddr contenders (not the sequential row), taken in the guest
	// from its admin endpoint: nas<ms>-round<r>-<contender>-<row>.pprof, for go tool pprof with
	// the same binary.
	Profile string
	Log     io.Writer
}

// KernelSample is one contender's figures on one row in one boot.
type KernelSample struct {
	Contender, Row string
	IOPS, MBps     float64
	// Busy is the guest's CPUs' busy fraction over the measured window, kernel and tierblk
	// together.
	Busy     float64
	P50, P99 int // completion latency, µs
	// Stats is the contender's own statistics at the row's end, as the guest printed them
	// (tierblk stats, dm-cache's status, bcache's counters), a line each.
	Stats []string
}

// value is the sample's figure for its row: MB/s for the sequential row, IOPS for the others.
func (s KernelSample) value() float64 {
	if s.Row == "seq" {
		return s.MBps
	}
	return s.IOPS
}

// cpuPerRequest is the guest's CPU time a request took, in µs.
func (s KernelSample) cpuPerRequest() float64 {
	if s.IOPS == 0 {
		return 0
	}
	return s.Busy * kernelVCPUs * 1e6 / s.IOPS
}

// KernelResult is one NAS latency's samples, by contender and row, one per round.
type KernelResult struct {
	NASms   int
	Samples map[string]map[string][]KernelSample
}

// parseKernelBench reads the guest's result lines from its console, each with the statistics
// lines of its contender and row printed before it.
func parseKernelBench(console io.Reader) ([]KernelSample, error) {
	var out []KernelSample
	stats := map[string][]string{}
	s := bufio.NewScanner(console)
	for s.Scan() {
		if _, rest, ok := strings.Cut(strings.TrimRight(s.Text(), "\r"), "TIERBLK-STATS: "); ok {
			f := strings.SplitN(rest, " ", 3)
			c, okc := strings.CutPrefix(field(f, 0), "contender=")
			r, okr := strings.CutPrefix(field(f, 1), "row=")
			if !okc || !okr {
				return nil, fmt.Errorf("bench-kernel.sh: %q: want contender=C row=R TEXT", s.Text())
			}
			stats[c+" "+r] = append(stats[c+" "+r], field(f, 2))
			continue
		}
		_, rest, ok := strings.Cut(s.Text(), "TIERBLK-BENCH: ")
		if !ok {
			continue
		}
		var k KernelSample
		for _, f := range strings.Fields(rest) {
			key, v, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("bench-kernel.sh: %q: a field without a value", s.Text())
			}
			var err error
			switch key {
			case "contender":
				k.Contender = v
			case "row":
				k.Row = v
			case "iops":
				k.IOPS, err = strconv.ParseFloat(v, 64)
			case "mbps":
				k.MBps, err = strconv.ParseFloat(v, 64)
			case "busy":
				k.Busy, err = strconv.ParseFloat(v, 64)
			case "lat_p50_us":
				k.P50, err = strconv.Atoi(v)
			case "lat_p99_us":
				k.P99, err = strconv.Atoi(v)
			}
			if err != nil {
				return nil, fmt.Errorf("bench-kernel.sh: %q: %s: %w", s.Text(), key, err)
			}
		}
		if k.Contender == "" || k.Row == "" {
			return nil, fmt.Errorf("bench-kernel.sh: %q: no contender or row", s.Text())
		}
		k.Stats = stats[k.Contender+" "+k.Row]
		delete(stats, k.Contender+" "+k.Row)
		out = append(out, k)
	}
	return out, s.Err()
}

// kernelProfiles reads the guest's CPU profiles from its console, by contender and row: the
// lines "TIERBLK-PPROF: contender=C row=R BASE64" of each, in order.
func kernelProfiles(console string) (map[string][]byte, error) {
	enc := map[string]*strings.Builder{}
	var keys []string
	for line := range strings.Lines(console) {
		_, rest, ok := strings.Cut(strings.TrimRight(line, "\r\n"), "TIERBLK-PPROF: ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		c, okc := strings.CutPrefix(field(f, 0), "contender=")
		r, okr := strings.CutPrefix(field(f, 1), "row=")
		if len(f) != 3 || !okc || !okr {
			return nil, fmt.Errorf("bench-kernel.sh: %q: want contender=C row=R BASE64", line)
		}
		k := c + "-" + r
		if enc[k] == nil {
			enc[k] = &strings.Builder{}
			keys = append(keys, k)
		}
		enc[k].WriteString(f[2])
	}
	out := map[string][]byte{}
	for _, k := range keys {
		b, err := base64.StdEncoding.DecodeString(enc[k].String())
		if err != nil {
			return nil, fmt.Errorf("bench-kernel.sh: the profile of %s: %w", k, err)
		}
		out[k] = b
	}
	return out, nil
}

// field is f[i], or "" past f's end.
func field(f []string, i int) string {
	if i < len(f) {
		return f[i]
	}
	return ""
}

// Validate checks the options a user gives.
func (o KernelOptions) Validate() error {
	if o.Rounds < 1 || o.Warm < 0 || o.Measure < time.Second || o.MemMiB < 512 {
		return fmt.Errorf("--rounds must be at least 1, --warm not negative, --measure at least 1s, --mem at least 512; got %d, %s, %s, %d",
			o.Rounds, o.Warm, o.Measure, o.MemMiB)
	}
	if len(o.NASms) == 0 {
		return errors.New("--nas-ms is empty; give the NAS's latencies in ms, e.g. 2,10")
	}
	for _, ms := range o.NASms {
		if ms < 0 {
			return fmt.Errorf("--nas-ms: %d: a latency is not negative", ms)
		}
	}
	for _, c := range o.Contenders {
		if !slices.Contains(KernelContenders, c) {
			return fmt.Errorf("--contenders: unknown contender %q; contenders: %s", c, strings.Join(KernelContenders, ", "))
		}
	}
	for _, r := range o.Rows {
		if !slices.Contains(KernelRows, r) {
			return fmt.Errorf("--rows: unknown row %q; rows: %s", r, strings.Join(KernelRows, ", "))
		}
	}
	return nil
}

// RunKernel boots the kernel VM once for each NAS latency in every round and runs the guest's
// benchmark there: every contender over devices made afresh, the contenders' order rotated from
// round to round.
func RunKernel(ctx context.Context, o KernelOptions) ([]KernelResult, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	contenders := cmpOr(o.Contenders, KernelContenders)
	rows := cmpOr(o.Rows, KernelRows)
	guest, err := os.ReadFile(filepath.Join(o.VMDir, "guest", "bench-kernel.sh"))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tierblk-bench-kernel")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	profile := 0 // the guest script's switch
	if o.Profile != "" {
		if err := os.MkdirAll(o.Profile, 0o755); err != nil {
			return nil, err
		}
		profile = 1
	}
	var results []KernelResult
	for _, ms := range o.NASms {
		res := KernelResult{NASms: ms, Samples: map[string]map[string][]KernelSample{}}
		for round := range o.Rounds {
			order := make([]string, len(contenders))
			for i, k := range roundOrder(len(contenders), round) {
				order[i] = contenders[k]
			}
			fmt.Fprintf(o.Log, "NAS at %d ms, round %d of %d: %s\n", ms, round+1, o.Rounds, strings.Join(order, ", "))
			script := filepath.Join(dir, "bench-kernel.sh")
			vars := fmt.Sprintf("contenders=%q\nrows=%q\nnas_ms=%d\nwarm=%d\nmeasure=%d\nprofile=%d\n",
				strings.Join(order, " "), strings.Join(rows, " "), ms, int(o.Warm.Seconds()), int(o.Measure.Seconds()), profile)
			if err := os.WriteFile(script, append([]byte(vars), guest...), 0o644); err != nil {
				return nil, err
			}
			samples, profiles, err := o.boot(ctx, script, len(order)*len(rows))
			if err != nil {
				return nil, fmt.Errorf("NAS at %d ms, round %d: %w", ms, round+1, err)
			}
			for k, prof := range profiles {
				path := filepath.Join(o.Profile, fmt.Sprintf("nas%d-round%d-%s.pprof", ms, round+1, k))
				if err := os.WriteFile(path, prof, 0o644); err != nil {
					return nil, err
				}
				fmt.Fprintf(o.Log, "  CPU profile: %s\n", path)
			}
			for _, s := range samples {
				if res.Samples[s.Contender] == nil {
					res.Samples[s.Contender] = map[string][]KernelSample{}
				}
				res.Samples[s.Contender][s.Row] = append(res.Samples[s.Contender][s.Row], s)
				fmt.Fprintf(o.Log, "  %s, %s: %.0f IOPS, %.1f MB/s, CPU %.0f%%, p50 %d µs, p99 %d µs\n",
					s.Contender, s.Row, s.IOPS, s.MBps, 100*s.Busy, s.P50, s.P99)
				for _, l := range s.Stats {
					fmt.Fprintf(o.Log, "    %s\n", l)
				}
			}
		}
		results = append(results, res)
	}
	return results, nil
}

// boot runs the guest script in the VM and returns its want samples, and its CPU profiles.
func (o KernelOptions) boot(ctx context.Context, script string, want int) ([]KernelSample, map[string][]byte, error) {
	// Each row takes its warm-up and window, or a pass of the NAS, plus making the devices and
	// the contender: ten minutes more than that is ample under emulation.
	perRow := o.Warm + o.Measure + 2*time.Minute
	timeout := time.Duration(want)*perRow + 10*time.Minute
	cmd := exec.CommandContext(ctx, filepath.Join(o.VMDir, "run.sh"), "--script", script, "--tierblk", o.Tierblk,
		"--mem", strconv.Itoa(o.MemMiB), "--timeout", strconv.Itoa(int(timeout.Seconds())))
	cmd.Env = append(os.Environ(), "VM_WITH_CACHES=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, nil, fmt.Errorf("the VM failed: %w; its console's end:\n%s", err, tail(string(out), 40))
	}
	samples, err := parseKernelBench(strings.NewReader(string(out)))
	if err != nil {
		return nil, nil, err
	}
	if len(samples) != want {
		return nil, nil, fmt.Errorf("the guest reported %d results, want %d; its console's end:\n%s", len(samples), want, tail(string(out), 40))
	}
	profiles, err := kernelProfiles(string(out))
	return samples, profiles, err
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func cmpOr(a, b []string) []string {
	if len(a) > 0 {
		return a
	}
	return b
}

// KernelTable renders the results as Markdown: for each NAS latency and row, each contender's
// median (and the CPU a request took, in µs), and tierblk's ratio to the better of dm-cache and
// bcache and to no cache, and tierblk's in FLUSH order to its own in address order, medians of
// the paired per-round ratios (min-max).
func KernelTable(results []KernelResult) string {
	var b strings.Builder
	for _, res := range results {
		var contenders []string
		for _, c := range KernelContenders {
			if res.Samples[c] != nil {
				contenders = append(contenders, c)
			}
		}
		fmt.Fprintf(&b, "NAS at %d ms:\n\n| row |", res.NASms)
		for _, c := range contenders {
			fmt.Fprintf(&b, " %s |", c)
		}
		b.WriteString(" tierblk / best of dmcache, bcache | tierblk / none | flush order / address order |\n|---|")
		b.WriteString(strings.Repeat("---:|", len(contenders)+3) + "\n")
		for _, row := range KernelRows {
			if !slices.ContainsFunc(contenders, func(c string) bool { return len(res.Samples[c][row]) > 0 }) {
				continue
			}
			fmt.Fprintf(&b, "| %s |", kernelRowNames[row])
			for _, c := range contenders {
				s := res.Samples[c][row]
				if len(s) == 0 {
					b.WriteString(" - |")
					continue
				}
				fmt.Fprintf(&b, " %s |", kernelCell(s))
			}
			fmt.Fprintf(&b, " %s | %s | %s |\n", kernelRatio(res, row, "tierblk", "dmcache", "bcache"),
				kernelRatio(res, row, "tierblk", "none"), kernelRatio(res, row, "tierblk", "tierblkaddr"))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// kernelCell is a contender's median figure on a row and, where it counts requests, the median
// CPU a request took.
func kernelCell(s []KernelSample) string {
	v := make([]float64, len(s))
	cpu := make([]float64, len(s))
	for i, k := range s {
		v[i], cpu[i] = k.value(), k.cpuPerRequest()
	}
	if s[0].Row == "seq" {
		return fmt.Sprintf("%.1f", median(v))
	}
	return fmt.Sprintf("%.0f (%.0f µs CPU)", median(v), median(cpu))
}

// kernelRatio is contender c's figure over the best of peers' in each round, paired by round: the
// median and the range, or "-" where a side was not run.
func kernelRatio(res KernelResult, row, c string, peers ...string) string {
	t := res.Samples[c][row]
	var ratios []float64
	for i, s := range t {
		best := 0.0
		for _, p := range peers {
			if ps := res.Samples[p][row]; i < len(ps) {
				best = max(best, ps[i].value())
			}
		}
		if best > 0 {
			ratios = append(ratios, s.value()/best)
		}
	}
	if len(ratios) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f (%.2f-%.2f)", median(ratios), slices.Min(ratios), slices.Max(ratios))
}
