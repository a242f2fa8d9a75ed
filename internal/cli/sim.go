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
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/cache"
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
	sample     string
}

// The daemon's cache as `tierblk serve` runs it with nothing configured, which `tierblk sim`
// simulates unless told otherwise: taken from the constants the daemon uses, so that they cannot
// drift apart (TestSimDefaultsAreTheDaemons).
var (
	simLineSize      = units.FormatSize(cache.DefaultLineSize)
	simReductionMode = cache.DefaultReduction.String()
)

// The object model's defaults are libCacheSim's: one key per request and no admission policy.
const (
	simObjectBlockSize = "0"
	simObjectAdmission = "always"
)

func newSimCmd() *cobra.Command {
	o := simOpts{}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Replay a block trace through cache policies and report miss ratios",
		Long: fmt.Sprintf(`Replays a block I/O trace through one simulated cache per policy and size, in parallel, and
reports each cache's miss ratio. The policies are the code the daemon's cache runs.

By default it simulates the cache the daemon runs when its config sets nothing: lines of %[1]s
(--model lines, --block-size %[1]s), eviction %[2]s, admission %[3]s, and, for --reduction-of,
the SSD tier's reduction %[4]s. --model object simulates libCacheSim's model instead (a key is cached
or not, and a miss fetches it whole), with one key per request unless --block-size is given and
admission always unless --admission is.

The trace is streamed, never held in memory: one read of it feeds every cache (sizes given as
fractions need one more read first, to count the distinct keys). Memory is the caches' own plus a
few MiB of buffers, whatever the trace's length. On a terminal, stderr shows the progress.

Sizes: a fraction below 1 is that share of the trace's distinct keys (floor, as libCacheSim counts);
a whole number is a number of keys (lines, blocks or objects); a size with a unit (64MiB, 1GiB) is
bytes divided by --block-size. Sizes at which no cache evicted a key hold the trace's working set,
and the output says so: a larger size gives the same rows.

In the lines model each simulated line holds the 4 KiB blocks fetched into it, and a read misses
wherever its blocks are not held, as in the daemon; a miss fetches the blocks it touches, or on to
the line's end for a sequential reader. The "fetched" column is the bytes read misses fetched from
the backend over the bytes read: what a cache costs the link to the backend.

--reduction RATIO shows what an SSD tier with data reduction holds: each cache keeps RATIO times
its size in keys. --reduction-of FILE measures the ratio on a sample of the data (a disk image):
its 4 KiB zero blocks take no space (reduction-mode zero); with --reduction-mode compress (the
daemon's) the others count compressed with S2, a block at a time; with --reduction-mode dedupe each
block whose bytes an earlier block had counts nothing, the unique ones compressed (blocks are told
apart by SHA-256, 128 bits of it, at about 30 bytes of RAM per unique block).

--sample estimates the curves from a sample of the keys instead of replaying them all, for far
less time and memory; the output says the figures are estimates. --sample RATE (a fraction such as
0.01) runs each cache in miniature: RATE times its size, fed only the keys a seeded hash picks at
that rate (a line with all its blocks in the lines model); any policy, admission and model.
--sample N (a whole number such as 8192) estimates LRU's curve with SHARDS, one estimator for every
size that holds at most N keys however large the trace: --model object, --policy lru and admission
always only, and it estimates the miss ratios only (not the fetched bytes).`,
			simLineSize, cache.DefaultPolicy, cache.DefaultAdmission, simReductionMode),
		Example: `  tierblk sim --trace my.iolog --format fio --size 1GiB,8GiB,64GiB --plot mrc.svg
  tierblk sim --trace my.iolog --format fio --policy all --size 0.01,0.1 --output csv
  tierblk sim --trace my.iolog --format fio --size 8GiB --reduction-of /srv/vm.img
  tierblk sim --trace cloudPhysicsIO.vscsi --model object --policy lru,arc,s3fifo --size 0.01,0.05,0.1 --plot mrc.png
  tierblk sim --trace oltp.arc.gz --model object --block-size 512 --policy all --size 0.01,0.1 --output csv
  tierblk sim --trace big.oracleGeneral --model object --policy all --size 0.01,0.02,0.05,0.1 --sample 0.01
  tierblk sim --trace big.oracleGeneral --model object --policy lru --size 0.01,0.02,0.05,0.1 --sample 8192`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stdout, o.stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			o.modelDefaults(cmd.Flags().Changed)
			return runSim(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.tracePath, "trace", "", "trace file (.gz, .zst and .xz are read transparently)")
	f.StringVar(&o.format, "format", "auto", "trace format: "+strings.Join(trace.Formats(), ", "))
	f.StringVar(&o.policies, "policy", cache.DefaultPolicy, "comma-separated eviction policies, or 'all': "+strings.Join(policy.EvictionNames(), ", ")+"; the daemon's by default")
	f.StringVar(&o.admission, "admission", cache.DefaultAdmission, "admission policy: "+strings.Join(policy.AdmissionNames(), ", ")+
		" (e.g. nhit:2, seqcutoff:4MiB); the daemon's by default, "+simObjectAdmission+" with --model object")
	f.StringVar(&o.sizes, "size", "0.01,0.05,0.1", "comma-separated cache sizes")
	f.StringVar(&o.blockSize, "block-size", simLineSize, "with --model lines the line size, the daemon's by default; "+
		"with --model object split requests into blocks of this size (512, 4KiB), one key each, or "+simObjectBlockSize+" (its default there): one key per request")
	f.StringVar(&o.ops, "ops", "all", "which requests to simulate: all or read")
	f.StringVar(&o.model, "model", "lines", "lines: the daemon's cache lines (--block-size is the line size): 4 KiB valid blocks, misses fetch what the daemon fetches; "+
		"object: libCacheSim's model, a key is cached or not and a miss fetches it whole (with --block-size "+simObjectBlockSize+" and --admission "+simObjectAdmission+" unless given)")
	f.IntVar(&o.warmup, "warmup", 0, "requests replayed before counting starts")
	f.StringVar(&o.output, "output", "table", "table, csv or json")
	f.StringVar(&o.plot, "plot", "", "also draw the miss-ratio curves into this .png or .svg file")
	f.IntVar(&o.workers, "workers", runtime.NumCPU(), "goroutines feeding the caches, each owning a share of them (the trace is read once for all)")
	f.StringVar(&o.reduction, "reduction", "", "the data's reduction ratio on the SSD tier (2, 2.5:1): each cache holds that many times its size")
	f.StringVar(&o.reducedBy, "reduction-of", "", "measure the reduction ratio on this data file (a disk image) instead of giving --reduction")
	f.StringVar(&o.reduceMode, "reduction-mode", simReductionMode, "what --reduction-of counts: zero (zero blocks take no space), compress (and the rest compressed) or dedupe (and duplicate blocks stored once); the daemon's by default")
	f.StringVar(&o.sample, "sample", "", "estimate from a sample of the keys: a rate (0.01: every policy in miniature caches) or a number of keys (8192: SHARDS, lru only); none by default: an exact replay")
	f.BoolVar(&o.noProgress, "quiet", false, "no progress on stderr (shown only when stderr is a terminal)")
	return cmd
}

// modelDefaults gives the object model libCacheSim's defaults where the user set no value:
// the flags' defaults are the daemon's, which belong to the lines model. changed reports whether
// the user set a flag.
func (o *simOpts) modelDefaults(changed func(flag string) bool) {
	if o.model != "object" {
		return
	}
	if !changed("block-size") {
		o.blockSize = simObjectBlockSize
	}
	if !changed("admission") {
		o.admission = simObjectAdmission
	}
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
	names, err := policyNames(o.policies)
	if err != nil {
		return err
	}
	if _, err := policy.NewAdmission(o.admission); err != nil {
		return usageErrorf("--admission: %v", err)
	}
	ratio, measured, err := simReduction(o)
	if err != nil {
		return err
	}
	if o.model == "lines" {
		ratio, measured = daemonReduction(ratio, measured, o.reduceMode)
	}
	var progress io.Writer
	if !o.noProgress && isTerminal(o.stderr) {
		progress = o.stderr
	}

	sample, err := simSampling(o, names)
	if err != nil {
		return err
	}
	opts := sim.Options{BlockSize: blockSize, ReadsOnly: o.ops == "read", Warmup: int64(o.warmup), Workers: o.workers,
		Blocks: o.model == "lines", Progress: progress, Sample: sample}
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
			jobs = append(jobs, sim.Job{Policy: n, Admission: o.admission, Size: k, Label: s.Label, Bytes: s.Bytes()})
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
	keys := simKeys(o.model, blockSize)
	note := simWorkingSetNote(res, keys, blockSize)
	switch o.output {
	case "csv":
		err = sim.WriteCSV(o.stdout, res)
	case "json":
		err = sim.WriteJSON(o.stdout, res)
	default:
		fmt.Fprintf(o.stdout, "%s: %d requests", filepath.Base(o.tracePath), sum.Requests)
		if countDistinct {
			fmt.Fprintf(o.stdout, ", %d distinct %s", distinct, keys.plural)
		}
		fmt.Fprintln(o.stdout)
		fmt.Fprintln(o.stdout, simModel(o, keys))
		if e := simEstimate(sample); e != "" {
			fmt.Fprintln(o.stdout, e)
		}
		if ratio > 1 || measured != "" {
			fmt.Fprintf(o.stdout, "reduction %.2f:1%s: each cache holds %.2f times its size\n", ratio, measured, ratio)
		}
		column := keys.plural
		if column == "keys" {
			column = "objects" // libCacheSim's word
		}
		err = sim.WriteTable(o.stdout, res, column)
		if err == nil && note != "" {
			fmt.Fprintln(o.stdout, note)
			note = ""
		}
	}
	if err != nil {
		return err
	}
	if note != "" {
		// Beside CSV or JSON, which scripts read, it goes where people look.
		fmt.Fprintln(o.stderr, note)
	}
	if o.plot != "" {
		title := "miss ratio: " + filepath.Base(o.tracePath)
		if e := sample.String(); e != "" {
			title += " (estimated: " + e + ")"
		}
		if err := sim.Plot(o.plot, title, keys.axis, res, nil); err != nil {
			return err
		}
		fmt.Fprintf(o.stderr, "plot: %s\n", o.plot)
	}
	return nil
}

// simKeyNames say what a simulated cache counts, in the output's words.
type simKeyNames struct {
	plural string // "lines", "blocks", "keys"
	axis   string // a plot's unit: "64KiB lines"
}

func simKeys(model string, blockSize int64) simKeyNames {
	size := units.FormatSize(blockSize)
	if strings.TrimLeft(size, "0123456789") == "" {
		size += "-byte" // not "512 blocks", which reads as a count
	}
	switch {
	case model == "lines":
		return simKeyNames{"lines", size + " lines"}
	case blockSize > 0:
		return simKeyNames{"blocks", size + " blocks"}
	}
	return simKeyNames{"keys", "objects"}
}

// simModel is the heading's line that says which cache was simulated: the daemon's by default, so
// that its figures are read as what `tierblk serve` would do, and so that they are not where they
// are libCacheSim's model's.
func simModel(o simOpts, keys simKeyNames) string {
	if o.model == "object" {
		what := "one key per request"
		if keys.plural != "keys" {
			what = keys.axis + ", one key each"
		}
		return fmt.Sprintf("model object (libCacheSim's): %s, admission %s", what, o.admission)
	}
	s := fmt.Sprintf("model lines (the daemon's cache): %s, admission %s", keys.axis, o.admission)
	if o.reduction == "" && o.reducedBy == "" {
		// No ratio can be measured without the data, but an SSD tier stores it reduced all the same.
		s += fmt.Sprintf("\nreduction: none counted; an SSD tier with reduction %s holds more (--reduction-of IMAGE measures how much)", o.reduceMode)
	}
	return s
}

// simWorkingSetNote names the sizes at which no cache evicted a key, which otherwise give rows
// that repeat without a word: each of those caches held every key it admitted, so its misses were
// cold misses (or keys its admission turned away), and any larger size gives the same rows. Empty
// when every size evicted.
func simWorkingSetNote(res []sim.Result, keys simKeyNames, blockSize int64) string {
	if len(res) > 0 && res[0].Estimate != "" {
		return "" // a miniature cache's evictions, or SHARDS' none, say nothing of the full cache's
	}
	var labels []string
	evicted := map[string]bool{}
	held := 0
	for _, r := range res {
		if _, seen := evicted[r.SizeLabel]; !seen {
			labels = append(labels, r.SizeLabel)
		}
		evicted[r.SizeLabel] = evicted[r.SizeLabel] || r.Evicted > 0
		if r.Evicted == 0 {
			held = max(held, r.Held)
		}
	}
	var full []string
	for _, l := range labels {
		if !evicted[l] {
			full = append(full, l)
		}
	}
	if len(full) == 0 {
		return ""
	}
	set := fmt.Sprintf("%d %s", held, keys.plural)
	if blockSize > 0 {
		set += fmt.Sprintf(" (%s)", humanBytes(uint64(held)*uint64(blockSize)))
	}
	sizes := "size " + full[0]
	if len(full) > 1 {
		sizes = "sizes " + strings.Join(full, ", ")
	}
	adm := res[0].Admission
	if adm == "" || adm == "always" {
		return fmt.Sprintf("note: %s >= the trace's working set of %s: nothing was evicted, so every miss is a cold miss, and a larger size gives the same rows", sizes, set)
	}
	return fmt.Sprintf("note: at %s nothing was evicted: the cache held all %s that admission %s let in, so every miss is a cold miss or one the admission turned away, and a larger size gives the same rows",
		sizes, set, adm)
}

// simSampling parses --sample: a rate (a fraction, with a point or an exponent) for miniature
// caches, or a whole number of keys for SHARDS, which estimates only LRU in the object model with
// admission always; names are the policies.
func simSampling(o simOpts, names []string) (sim.Sampling, error) {
	if o.sample == "" {
		return sim.Sampling{}, nil
	}
	if n, err := strconv.Atoi(o.sample); err == nil {
		if n < 1 {
			return sim.Sampling{}, usageErrorf("--sample %s: a number of keys must be at least 1 (or give a rate, such as 0.01)", o.sample)
		}
		if o.model != "object" {
			return sim.Sampling{}, usageErrorf("--sample %s: a number of keys (SHARDS) estimates LRU in the object model only: add --model object, or give a rate (0.01) for the lines model", o.sample)
		}
		for _, p := range names {
			if p != "lru" {
				return sim.Sampling{}, usageErrorf("--sample %s: a number of keys (SHARDS) estimates lru only, not %s: give a rate (0.01) for every policy", o.sample, p)
			}
		}
		if o.admission != "always" {
			return sim.Sampling{}, usageErrorf("--sample %s: a number of keys (SHARDS) knows no admission policy: use --admission always, or give a rate (0.01)", o.sample)
		}
		return sim.Sampling{Keys: n}, nil
	}
	r, err := strconv.ParseFloat(o.sample, 64)
	if err != nil || !(r > 0 && r <= 1) {
		return sim.Sampling{}, usageErrorf("--sample %q: give a rate above 0 and at most 1 (0.01) or a whole number of keys (8192)", o.sample)
	}
	s := sim.Sampling{Rate: r}
	if err := (sim.Options{Sample: s}).Check(); err != nil {
		return sim.Sampling{}, usageErrorf("--sample %s: %v", o.sample, err)
	}
	return s, nil
}

// simEstimate is the table heading's line that says the figures are estimates, and how they were
// made; empty for an exact replay.
func simEstimate(s sim.Sampling) string {
	switch {
	case s.Keys > 0:
		return fmt.Sprintf("estimated (%s): LRU's reuse distances of a sample of the keys, scaled; miss ratios only", s)
	case s.Rate > 0:
		return fmt.Sprintf("estimated (%s): each cache simulated at %.4g%% of its size, fed only the keys sampled", s, 100*s.Rate)
	}
	return ""
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

// daemonReduction is what a data reduction ratio makes of the daemon's SSD tier: at most
// cache.PackedLinesPerLine times the lines with reduction compress or dedupe, and no more lines
// with zero (a line takes its slot whatever its zero blocks), said in the heading's note.
func daemonReduction(ratio float64, measured, mode string) (float64, string) {
	switch {
	case ratio > 1 && mode == sim.ReduceZero.String():
		return 1, measured + fmt.Sprintf("; the daemon's SSD tier with reduction zero holds no more lines for it (%.2f:1 is its data's, not its lines')", ratio)
	case ratio > cache.PackedLinesPerLine:
		return cache.PackedLinesPerLine, measured + fmt.Sprintf("; the daemon's SSD tier holds at most %d lines a line of room (%.2f:1 is its data's)", cache.PackedLinesPerLine, ratio)
	}
	return ratio, measured
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

// policyNames parses --policy: eviction policies' names, comma-separated, or all of them.
func policyNames(list string) ([]string, error) {
	names := splitList(list)
	if len(names) == 1 && names[0] == "all" {
		names = policy.EvictionNames()
	}
	for _, n := range names {
		if _, err := policy.NewEviction(n, policy.Config{Capacity: 1}); err != nil {
			return nil, usageErrorf("--policy: %v", err)
		}
	}
	return names, nil
}
