package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/sim"
	"github.com/tierblk/tierblk/internal/trace"
	"github.com/tierblk/tierblk/internal/units"
)

type simOpts struct {
	tracePath  string
	format     string
	policies   string
	admission  string
	sizes      string
	blockSize  string
	ops        string
	model      string
	warmup     int
	output     string
	plot       string
	workers    int
	stdout     io.Writer
	stderr     io.Writer
	noProgress bool
	reduction  string
	reducedBy  string
	reduceMode string
}

func newSimCmd() *cobra.Command {
	o := simOpts{}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Replay a block trace through cache policies and report miss ratios",
		Long: `Replays a block I/O trace through one simulated cache per policy and size, in parallel, and
reports each cache's miss ratio. The policies are the code the daemon's cache will run.

The trace is streamed, never held in memory: one read of it feeds every cache (sizes given as
fractions need one more read first, to count the distinct keys). Memory is the caches' own plus a
few MiB of buffers, whatever the trace's length. On a terminal, stderr shows the progress.

Sizes: a fraction below 1 is that share of the trace's distinct keys (floor, as libCacheSim counts);
a whole number is a number of objects; a size with a unit (64MiB, 1GiB) is bytes divided by
--block-size.

With --model lines and --block-size set to the daemon's line size, each simulated line holds the
4 KiB blocks fetched into it, and a read misses wherever its blocks are not held, as in the daemon;
a miss fetches the blocks it touches, or on to the line's end for a sequential reader. The "fetched"
column is the bytes read misses fetched from the backend over the bytes read: what a cache costs the
link to the backend.

--reduction RATIO shows what an SSD tier with data reduction holds: each cache keeps RATIO times
its size in keys. --reduction-of FILE measures the ratio on a sample of the data (a disk image):
its 4 KiB zero blocks take no space (reduction: zero); with --reduction-mode compress the
others count compressed with S2, a block at a time; with --reduction-mode dedupe each block whose
bytes an earlier block had counts nothing, the unique ones compressed (blocks are told apart by
SHA-256, 128 bits of it, at about 30 bytes of RAM per unique block).`,
		Example: `  tierblk sim --trace cloudPhysicsIO.vscsi --policy lru,arc,s3fifo --size 0.01,0.05,0.1 --plot mrc.png
  tierblk sim --trace oltp.arc.gz --block-size 512 --policy all --size 0.01,0.1 --output csv
  tierblk sim --trace my.iolog --format fio --block-size 64KiB --policy lru --size 1GiB,8GiB,64GiB
  tierblk sim --trace cloudPhysicsIO.vscsi --block-size 64KiB --model lines --policy lru,s3fifo --size 0.01,0.1
  tierblk sim --trace my.iolog --format fio --block-size 64KiB --size 8GiB --reduction-of /srv/vm.img`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stdout, o.stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runSim(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.tracePath, "trace", "", "trace file (.gz, .zst and .xz are read transparently)")
	f.StringVar(&o.format, "format", "auto", "trace format: "+strings.Join(trace.Formats(), ", "))
	f.StringVar(&o.policies, "policy", "lru", "comma-separated eviction policies, or 'all': "+strings.Join(policy.EvictionNames(), ", "))
	f.StringVar(&o.admission, "admission", "always", "admission policy: "+strings.Join(policy.AdmissionNames(), ", ")+" (e.g. nhit:2, seqcutoff:4MiB)")
	f.StringVar(&o.sizes, "size", "0.01,0.05,0.1", "comma-separated cache sizes")
	f.StringVar(&o.blockSize, "block-size", "0", "split requests into blocks of this size (512, 4KiB, 64KiB), one key each; 0: one key per request")
	f.StringVar(&o.ops, "ops", "all", "which requests to simulate: all or read")
	f.StringVar(&o.model, "model", "object", "object: a key is cached or not, and a miss fetches it whole (libCacheSim's model); "+
		"lines: the daemon's cache lines (--block-size is the line size): 4 KiB valid blocks, misses fetch what the daemon fetches")
	f.IntVar(&o.warmup, "warmup", 0, "requests replayed before counting starts")
	f.StringVar(&o.output, "output", "table", "table, csv or json")
	f.StringVar(&o.plot, "plot", "", "also draw the miss-ratio curves into this .png or .svg file")
	f.IntVar(&o.workers, "workers", runtime.NumCPU(), "goroutines feeding the caches, each owning a share of them (the trace is read once for all)")
	f.StringVar(&o.reduction, "reduction", "", "the data's reduction ratio on the SSD tier (2, 2.5:1): each cache holds that many times its size")
	f.StringVar(&o.reducedBy, "reduction-of", "", "measure the reduction ratio on this data file (a disk image) instead of giving --reduction")
	f.StringVar(&o.reduceMode, "reduction-mode", "zero", "what --reduction-of counts: zero (zero blocks take no space), compress (and the rest compressed) or dedupe (and duplicate blocks stored once)")
	f.BoolVar(&o.noProgress, "quiet", false, "no progress on stderr (shown only when stderr is a terminal)")
	return cmd
}

func runSim(ctx context.Context, o simOpts) error {
	if o.tracePath == "" {
		return usageErrorf("--trace is required")
	}
	if o.ops != "all" && o.ops != "read" {
		return usageErrorf("--ops %q: use all or read", o.ops)
	}
	if o.model != "object" && o.model != "lines" {
		return usageErrorf("--model %q: use object or lines", o.model)
	}
	if o.output != "table" && o.output != "csv" && o.output != "json" {
		return usageErrorf("--output %q: use table, csv or json", o.output)
	}
	blockSize, err := units.ParseSize(o.blockSize)
	if err != nil {
		return usageErrorf("--block-size: %v; 0 means one key per request", err)
	}
	if o.plot != "" {
		if err := sim.CheckPlotPath(o.plot); err != nil {
			return usageErrorf("--plot %v", err)
		}
	}
	if o.workers < 1 {
		return usageErrorf("--workers %d: must be at least 1", o.workers)
	}
	sizes, err := sim.ParseSizes(o.sizes)
	if err != nil {
		return usageErrorf("--size: %v", err)
	}
	names := splitList(o.policies)
	if len(names) == 1 && names[0] == "all" {
		names = policy.EvictionNames()
	}
	for _, n := range names {
		if _, err := policy.NewEviction(n, policy.Config{Capacity: 1}); err != nil {
			return usageErrorf("--policy: %v", err)
		}
	}
	if _, err := policy.NewAdmission(o.admission); err != nil {
		return usageErrorf("--admission: %v", err)
	}
	ratio, measured, err := simReduction(o)
	if err != nil {
		return err
	}
	var progress io.Writer
	if !o.noProgress && isTerminal(o.stderr) {
		progress = o.stderr
	}

	opts := sim.Options{BlockSize: blockSize, ReadsOnly: o.ops == "read", Warmup: int64(o.warmup), Workers: o.workers,
		Blocks: o.model == "lines", Progress: progress}
	if err := opts.Check(); err != nil {
		if o.model == "lines" {
			return usageErrorf("--model lines: %v", err)
		}
		return usageErrorf("%v", err)
	}
	countDistinct := false
	for _, s := range sizes {
		countDistinct = countDistinct || s.Fractional()
	}
	// Sizes given as fractions need the distinct keys first: a pass of its own, as the trace is
	// never held. Its memory (a slot per distinct key) is given back before the caches are built.
	var distinct int64
	if countDistinct {
		sum, err := simPass(o, func(r trace.Reader) (sim.Summary, error) { return sim.CountKeys(ctx, r, opts) })
		if err != nil {
			return err
		}
		distinct = sum.Distinct
		if int64(o.warmup) >= sum.Requests {
			return usageErrorf("--warmup %d must be below the %d requests of the trace", o.warmup, sum.Requests)
		}
		debug.FreeOSMemory()
	}
	var jobs []sim.Job
	for _, n := range names {
		for _, s := range sizes {
			k, err := s.Keys(int(distinct), blockSize)
			if err != nil {
				return usageErrorf("--size: %v", err)
			}
			if ratio > 1 {
				k = sim.Reduce(k, ratio)
			}
			jobs = append(jobs, sim.Job{Policy: n, Admission: o.admission, Size: k, Label: s.Label})
		}
	}
	sum, err := simPass(o, func(r trace.Reader) (sim.Summary, error) { return sim.Run(ctx, r, jobs, opts) })
	if errors.Is(err, sim.ErrWarmup) {
		return &UsageError{Err: err}
	}
	if err != nil {
		return err
	}
	res := sum.Results
	switch o.output {
	case "csv":
		err = sim.WriteCSV(o.stdout, res)
	case "json":
		err = sim.WriteJSON(o.stdout, res)
	default:
		fmt.Fprintf(o.stdout, "%s: %d requests", filepath.Base(o.tracePath), sum.Requests)
		if countDistinct {
			fmt.Fprintf(o.stdout, ", %d distinct keys", distinct)
		}
		fmt.Fprintln(o.stdout)
		if ratio > 1 {
			fmt.Fprintf(o.stdout, "reduction %.2f:1%s: each cache holds %.2f times its size\n", ratio, measured, ratio)
		}
		err = sim.WriteTable(o.stdout, res)
	}
	if err != nil {
		return err
	}
	if o.plot != "" {
		if err := sim.Plot(o.plot, "miss ratio: "+filepath.Base(o.tracePath), res); err != nil {
			return err
		}
		fmt.Fprintf(o.stderr, "plot: %s\n", o.plot)
	}
	return nil
}

// simReduction is the reduction ratio the caches' sizes are multiplied by (1: none), given or
// measured; measured says where it came from, for the table's heading.
func simReduction(o simOpts) (ratio float64, measured string, err error) {
	mode, err := sim.ParseReductionMode(o.reduceMode)
	if err != nil {
		return 0, "", usageErrorf("--reduction-mode %v", err)
	}
	switch {
	case o.reduction != "" && o.reducedBy != "":
		return 0, "", usageErrorf("--reduction and --reduction-of: give one (a ratio, or a file to measure it on)")
	case o.reduction != "":
		if ratio, err = sim.ParseRatio(o.reduction); err != nil {
			return 0, "", usageErrorf("--reduction %v", err)
		}
		return ratio, "", nil
	case o.reducedBy != "":
		f, err := os.Open(o.reducedBy)
		if err != nil {
			return 0, "", usageErrorf("--reduction-of: %v", err)
		}
		defer f.Close()
		m, err := sim.MeasureReduction(f, mode)
		if err != nil {
			return 0, "", fmt.Errorf("--reduction-of %s: %w", o.reducedBy, err)
		}
		if ratio, err = m.Ratio(mode); err != nil {
			return 0, "", usageErrorf("--reduction-of %s %v", o.reducedBy, err)
		}
		return ratio, fmt.Sprintf(" (%s, reduction-mode %s: %s)", filepath.Base(o.reducedBy), o.reduceMode, m), nil
	}
	return 1, "", nil
}

// simPass opens the trace, makes one pass over it, and closes it. Errors that are not the reader's
// own (which name the file, the record and the format) get the file's name.
func simPass(o simOpts, pass func(trace.Reader) (sim.Summary, error)) (sim.Summary, error) {
	r, err := trace.Open(o.tracePath, o.format)
	if err != nil {
		return sim.Summary{}, err
	}
	sum, err := pass(r)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	var te *trace.Error
	if err != nil && !errors.As(err, &te) && !errors.Is(err, context.Canceled) {
		err = fmt.Errorf("trace %s: %w", o.tracePath, err)
	}
	return sum, err
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, strings.ToLower(f))
		}
	}
	return out
}

// isTerminal reports whether w is a terminal, where a progress bar that redraws itself belongs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
