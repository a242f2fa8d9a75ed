//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchCacheOpts struct {
	bench.CacheOptions
	parts    []string
	image    string // the reduction part's disk image
	baseline string // the checksums part's tierblk to compare with
	out      io.Writer
}

func newBenchCacheCmd() *cobra.Command {
	o := benchCacheOpts{}
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "Measure tierblk's cache against nbdkit's cache filter over a slow disk (needs fio and nbdkit)",
		Long: `Over a slow disk (nbdkit, one request at a time, 5 ms each: about 190 IOPS), measures with fio's
nbd engine, in the same run and alternating between them each round:
  tierblk     serve --backend (its own slow disk) --ram ` + bench.CacheRAM + ` --ssd WORK/ssd.img --ssd-size ` + bench.CacheSSD + ` --mode writethrough
  nbdkit      --filter=cache (cache-on-read=true, cache=writethrough) over the slow disk
  slow disk   the slow disk alone
Both caches are warmed by one read of the working set (--size). The rows: warm 4K random read at
QD32; the same right after tierblk and nbdkit restart (before every round: tierblk's RAM tier is
then empty, its SSD tier warm; nbdkit's cache is empty); 8K random 80/20 read/write; 1M sequential
read. Prints the medians and the ratios tierblk/nbdkit and tierblk/slow disk (above 1.0: tierblk
is faster).

Then the hit paths (--parts hits), where every read is a hit on a working set (--size) written and
read once before the first round:
  tierblk --ram 0     serve --backend (a file) --ram 0 --ssd WORK/ssd.img --ssd-size ` + bench.HitsSSD + `: every read an SSD-tier hit
  tierblk --ram ` + bench.HitsRAM + ` the same with a RAM tier smaller than the working set
  qemu-nbd            -t -f raw --cache=none --aio=native, a file on the same file system
The rows: 4K random read at QD32, 1M random read at QD8. Prints the medians and the medians of the
per-round ratios tierblk --ram 0/qemu-nbd and tierblk --ram ` + bench.HitsRAM + `/tierblk --ram 0.

What the live miss-ratio curves cost the hit paths (--parts curves): the hit part's rows on
  tierblk --ram ` + bench.CurvesRAM + `                  a RAM tier holding the working set: RAM-tier hits
  tierblk --ram ` + bench.CurvesRAM + ` --curves off     the same without the curves
  tierblk --ram 0 (--curves off)        SSD-tier hits, with and without the curves
and the medians of the per-round ratios with/without the curves.

Then what the SSD tier's data reduction saves and costs (--parts reduction, which needs --image, a
raw disk image such as a file system with files in it; docs/benchmarks.md says how to make one):
  tierblk --reduction off        serve --backend file://IMAGE --read-only --ram 0 --ssd WORK/... (all of the image) --admission always
  tierblk --reduction zero       the same, storing no zero block
  tierblk --reduction compress   the same, every other block compressed (S2) in log-structured segments
All three have the same SSD tier size. Each reads the image once; their SSD tiers' logical and
physical bytes are printed, then the rows of the hit part over the whole image, and the medians of
the per-round ratios compress/off and zero/off. Then data that does not compress: an image of
random bytes as large as IMAGE, up to ` + fmt.Sprint(bench.ReductionRandomSize>>20) + ` MiB, written to WORK, read once and then
4K random reads at QD32 through off and compress (ratio compress/off). Then 4K random writes of data
(fio's random buffers) at QD32 on three more tierblks in write-back (--reduction off, zero and
compress, each over a backend file of its own), over ` + bench.ReductionWriteSize + ` written once first.
Last dedupe, in one run (a size, not a speed): ` + fmt.Sprint(bench.DedupeClones) + ` clones of IMAGE written to WORK one after another
in one file, each with ` + fmt.Sprint(bench.DedupeRewritePercent) + ` % of its 4 KiB blocks (drawn by an RNG seeded per clone) rewritten with
4 KiB of IMAGE read at an offset that is not a multiple of 4 KiB (never zeros, never the bytes of
another block), served as one export and read once through --reduction dedupe and through
compress, and clone 0 alone through dedupe; prints each SSD tier's physical bytes, dedupe hits and
collisions, what a tier storing each distinct block's S2 unit once would hold, and the four
clones' physical bytes over clone 0's (the goal: at most ` + fmt.Sprint(bench.DedupeGoal) + ` with dedupe). The clones are
deleted when read; WORK needs room for ` + fmt.Sprint(bench.DedupeClones+1) + ` copies of IMAGE meanwhile, besides the SSD tiers.

Then what checking the SSD tier's checksums costs (--parts checksums, which needs --baseline, a
tierblk binary of the build to compare with, such as one built from before the checks): for each
of --reduction ` + strings.Join(bench.ChecksumReductions(), " and ") + `, this tierblk and the baseline, each
  serve --backend (a file) --ram 0 --ssd WORK/... --ssd-size ` + bench.ChecksumSSD + ` --reduction R
and qemu-nbd as in the hit part, all in the same rounds. The hit part's rows on a working set
(--size) written and read once; then 4K random writes at QD32 on five more such servers, the
tierblks with --mode writeback, over the working set written once, each tierblk flushed (not
timed) after that and after each of its measurements. Prints the medians, the medians of the
per-round ratios this/baseline and this/qemu-nbd (lowest-highest), the SSD-tier lookups of the
hit rows (misses: reads that were not hits) and the CPU each server used.

--work must be on a file system with O_DIRECT (not tmpfs): the SSD tier and nbdkit's cache file
live there.`,
		Example: `  tierblk bench cache --work .cache/bench-cache
  tierblk bench cache --parts hits --rounds 5
  tierblk bench cache --parts curves --rounds 9
  tierblk bench cache --parts reduction --image usr.ext4 --rounds 5
  tierblk bench cache --parts checksums --baseline /tmp/tierblk-19fdf5f --rounds 5`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchCache(cmd.Context(), o)
		},
	}
	benchCacheFlags(cmd, &o.CacheOptions)
	cmd.Flags().StringSliceVar(&o.parts, "parts", []string{"slow", "hits", "curves"}, "what to measure: slow (the caches over a slow disk), hits (the hit paths against qemu-nbd), curves (the hit paths with the live curves on and off), reduction (the SSD tier's data reduction on --image), checksums (the hit paths and write-back writes against --baseline and qemu-nbd)")
	cmd.Flags().StringVar(&o.image, "image", "", "raw disk image the reduction part reads through the cache")
	cmd.Flags().StringVar(&o.baseline, "baseline", "", "tierblk binary the checksums part compares this one with, e.g. a build from before the checks")
	return cmd
}

func runBenchCache(ctx context.Context, o benchCacheOpts) error {
	if err := checkParts(o.parts, "slow", "hits", "curves", "reduction", "checksums"); err != nil {
		return err
	}
	if slices.Contains(o.parts, "reduction") != (o.image != "") {
		return usageErrorf("--image goes with --parts reduction, and the reduction part needs it: a raw disk image to read through the cache")
	}
	if slices.Contains(o.parts, "checksums") != (o.baseline != "") {
		return usageErrorf("--baseline goes with --parts checksums, and the checksums part needs it: a tierblk binary to compare this one with")
	}
	done, err := prepareCache(&o.CacheOptions)
	if err != nil {
		return err
	}
	defer done()
	if slices.Contains(o.parts, "slow") {
		res, err := bench.RunCache(ctx, o.CacheOptions)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.out, "\nfio, nbd engine, one job, unix socket, a %s working set over a slow disk (nbdkit, one request at a time, "+
			"5 ms each), median of %d runs of %s (%s on the slow disk alone):\n\n%s",
			o.Size, o.Rounds, o.Runtime, o.SlowRuntime, bench.CacheTable(res))
	}
	for _, h := range []struct {
		part, title string
		run         func(context.Context, bench.CacheOptions) ([]bench.HitResult, error)
		table       func(io.Writer, []bench.HitResult)
	}{
		{"hits", "Hits", bench.RunHits, bench.HitTable},
		{"curves", "Curves: the hit paths with the live miss-ratio curves on and off", bench.RunCurves, bench.CurvesTable},
	} {
		if !slices.Contains(o.parts, h.part) {
			continue
		}
		res, err := h.run(ctx, o.CacheOptions)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.out, "\n%s: fio, nbd engine, one job, unix socket, a %s working set, median of %d runs of %s; ratios: median of the per-round ratios (lowest-highest):\n\n",
			h.title, o.Size, o.Rounds, o.Runtime)
		h.table(o.out, res)
	}
	if slices.Contains(o.parts, "reduction") {
		rep, err := bench.RunReduction(ctx, o.CacheOptions, o.image)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.out, "\nReduction: %s (%.1f MiB), and %.1f MiB of random bytes, read once through each tierblk, then hits on all of it: fio, nbd engine, one job, unix socket, median of %d runs of %s; ratios: median of the per-round ratios (lowest-highest):\n\n",
			rep.Image, float64(rep.ImageBytes)/(1<<20), float64(rep.RandomBytes)/(1<<20), o.Rounds, o.Runtime)
		bench.ReductionTable(o.out, rep)
	}
	if slices.Contains(o.parts, "checksums") {
		rep, err := bench.RunChecksums(ctx, o.CacheOptions, o.baseline)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.out, "\nChecksums: fio, nbd engine, one job, unix socket, a %s working set, median of %d runs of %s; ratios: median of the per-round ratios (lowest-highest):\n\n",
			o.Size, o.Rounds, o.Runtime)
		bench.ChecksumTable(o.out, rep)
	}
	return nil
}
