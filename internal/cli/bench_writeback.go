//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchWriteBackOpts struct {
	bench.WriteBackOptions
	out io.Writer
}

func newBenchWriteBackCmd() *cobra.Command {
	o := benchWriteBackOpts{}
	cmd := &cobra.Command{
		Use:   "writeback",
		Short: "Measure tierblk's write-back cache against nbdkit's cache filter over a slow disk (needs fio and nbdkit)",
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

--work must be on a file system with O_DIRECT (not tmpfs): the SSD tiers and nbdkit's cache file
live there.`,
		Example: `  tierblk bench writeback --work .cache/bench-writeback`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchWriteBack(cmd.Context(), o)
		},
	}
	benchCacheFlags(cmd, &o.CacheOptions)
	cmd.Flags().StringVar(&o.Burst, "burst", "256m", "how much the burst writes, more than the burst tierblk's SSD tier (fio size syntax)")
	return cmd
}

func runBenchWriteBack(ctx context.Context, o benchWriteBackOpts) error {
	if o.Burst == "" {
		return usageErrorf("--burst is empty; give a size larger than %s, e.g. 256m", bench.BurstSSD)
	}
	done, err := prepareCache(&o.CacheOptions)
	if err != nil {
		return err
	}
	defer done()
	rep, err := bench.RunWriteBack(ctx, o.WriteBackOptions)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nfio, nbd engine, one job, unix socket, a %s working set over a slow disk (nbdkit, one request at a time, "+
		"5 ms each), both caches in write-back, median of %d runs of %s (%s on the slow disk alone; the burst once over %s):\n\n%s",
		o.Size, o.Rounds, o.Runtime, o.SlowRuntime, o.Burst, bench.WriteBackTable(rep))
	return nil
}
