//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchWriteBackOpts struct {
	bench.WriteBackOptions
	parts []string
	// orderWrites is the order part's writes per measurement (bench.OrderOptions.Writes).
	orderWrites int
	out         io.Writer
}

// The parts of `tierblk bench writeback`.
const (
	writeBackSlow  = "slow"
	writeBackOrder = "order"
)

func newBenchWriteBackCmd() *cobra.Command {
	o := benchWriteBackOpts{}
	cmd := &cobra.Command{
		Use:   "writeback",
		Short: "Measure tierblk's write-back cache against nbdkit's cache filter over a slow disk, and its two write-back orders (needs fio and nbdkit)",
		Long: `Over a slow disk (nbdkit, one request at a time, 5 ms each: about 190 IOPS), measures with fio's
nbd engine, in the same run and alternating between them each round:
  tierblk     serve --backend (its own slow disk) --ram ` + bench.CacheRAM + ` --ssd WORK/ssd.img --ssd-size ` + bench.CacheSSD + ` --mode writeback
  nbdkit      --filter=cache (cache-on-read=true, cache=writeback: its default, lost on a crash) over the slow disk
  slow disk   the slow disk alone
Both caches are warmed by one read of the working set (--size). The rows: 4K random write, 8K
random 80/20 read/write and 64K sequential write, all at QD32; then a burst: --burst written
sequentially in 64K requests at QD32, on a second tierblk whose SSD tier (` + bench.BurstSSD + `) is smaller than
the burst, while its dirty ratio is sampled every 100 ms. tierblk is flushed ('tierblk flush',
not timed) before each of its measurements; nbdkit never writes back during the run. Prints the
medians, the ratios tierblk/nbdkit and tierblk/slow disk (above 1.0: tierblk is faster), and the
burst's peak dirty ratio against its maximum.

The order part (--parts order) measures tierblk in write-back with --write-back-order address
against --write-back-order flush, everything else equal, in the same rounds, alternating which
goes first each round, over the slow disk and over a file (file://WORK/...?direct=true). Every
measurement starts a fresh backend and a fresh
  tierblk   serve --backend (the backend) --ram ` + bench.CacheRAM + ` --ssd ROUND/ssd.img --ssd-size ` + bench.OrderSSD + ` --mode writeback --write-back-order ORDER
then fio writes --order-writes 4K blocks at random in --size (QD32, an fsync, an NBD FLUSH, every
` + fmt.Sprint(bench.OrderFsync) + ` writes: a database-like writer), 'tierblk flush' writes everything back, timed, and fio
writes --order-writes blocks again, without its random map, in the first ` + bench.OrderOverwriteRegion + `: blocks written
again while dirty, which in flush order an older epoch may still need.
--size may be at most ` + fmt.Sprint(bench.OrderRegionShare) + ` of the SSD tier, so that dirty data stays at the low watermark or
under, far from the maximum: no write is throttled (a measurement where one is fails). Prints,
per backend, the write IOPS, the destage rate (dirty MiB when the flush starts over its time),
the blocks a backend write carried and the overwrite IOPS in each order, and the median, lowest
and highest of the per-round ratios flush/address (above 1.0: flush order is faster), then the
command lines. The file-system writer (ext4 under fio with
fsync) needs a kernel block device, and is not part of it.

--work must be on a file system with O_DIRECT (not tmpfs): the SSD tiers, nbdkit's cache file and
the order part's backend files live there.`,
		Example: `  tierblk bench writeback --work .cache/bench-writeback
  tierblk bench writeback --parts order --rounds 5`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchWriteBack(cmd.Context(), o)
		},
	}
	benchCacheFlags(cmd, &o.CacheOptions)
	cmd.Flags().StringVar(&o.Burst, "burst", "256m", "how much the burst writes, more than the burst tierblk's SSD tier (fio size syntax)")
	cmd.Flags().StringSliceVar(&o.parts, "parts", []string{writeBackSlow}, "what to measure: slow (the caches over a slow disk, and the burst), order (--write-back-order address against flush, over the slow disk and a file)")
	cmd.Flags().IntVar(&o.orderWrites, "order-writes", 16384, "the order part's 4K random writes per measurement (at most --size's 4K blocks)")
	return cmd
}

func runBenchWriteBack(ctx context.Context, o benchWriteBackOpts) error {
	if err := checkParts(o.parts, writeBackSlow, writeBackOrder); err != nil {
		return err
	}
	if slices.Contains(o.parts, writeBackSlow) && o.Burst == "" {
		return usageErrorf("--burst is empty; give a size larger than %s, e.g. 256m", bench.BurstSSD)
	}
	// The order part's options fail the run before the slow part's minutes, not after.
	order := orderOptions(o)
	if slices.Contains(o.parts, writeBackOrder) {
		if err := order.Validate(); err != nil {
			return usageErrorf("%v", err)
		}
	}
	done, err := prepareCache(&o.CacheOptions)
	if err != nil {
		return err
	}
	defer done()
	if slices.Contains(o.parts, writeBackSlow) {
		if err := runWriteBackSlow(ctx, o); err != nil {
			return err
		}
	}
	if slices.Contains(o.parts, writeBackOrder) {
		order.Tierblk, order.WorkDir = o.Tierblk, o.WorkDir
		return runWriteBackOrder(ctx, o, order)
	}
	return nil
}

// orderOptions are the order part's options from the command's.
func orderOptions(o benchWriteBackOpts) bench.OrderOptions {
	return bench.OrderOptions{Tierblk: o.Tierblk, Rounds: o.Rounds, Size: o.Size, Writes: o.orderWrites, WorkDir: o.WorkDir, Log: o.Log}
}

func runWriteBackSlow(ctx context.Context, o benchWriteBackOpts) error {
	rep, err := bench.RunWriteBack(ctx, o.WriteBackOptions)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nfio, nbd engine, one job, unix socket, a %s working set over a slow disk (nbdkit, one request at a time, "+
		"5 ms each), both caches in write-back, median of %d runs of %s (%s on the slow disk alone; the burst once over %s):\n\n%s",
		o.Size, o.Rounds, o.Runtime, o.SlowRuntime, o.Burst, bench.WriteBackTable(rep))
	return nil
}

func runWriteBackOrder(ctx context.Context, o benchWriteBackOpts, order bench.OrderOptions) error {
	rep, err := bench.RunOrder(ctx, order)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nWrite-back order: tierblk in write-back, --write-back-order address against flush, a fresh backend and tierblk "+
		"for every measurement, %d rounds; fio, nbd engine, one job, unix socket, then 'tierblk flush' timed; "+
		"ratios: median of the per-round ratios flush/address:\n\n%s"+
		"\ncommand lines (WORK is the run's directory, ROUND a measurement's own, removed after it; ORDER address or flush):\n",
		o.Rounds, bench.OrderTable(rep.Results))
	for _, c := range rep.Commands {
		fmt.Fprintf(o.out, "  %s\n", c)
	}
	return nil
}
