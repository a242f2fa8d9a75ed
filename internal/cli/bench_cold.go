//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchColdOpts struct {
	bench.ColdOptions
	out io.Writer
}

// defaultColdTraces are the real traces the repository carries, relative to its root, where
// `make bench` runs.
var defaultColdTraces = []string{"testdata/traces/cloudPhysicsIO.vscsi.xz", "testdata/traces/oltp.arc.xz"}

func newBenchColdCmd() *cobra.Command {
	o := benchColdOpts{}
	cmd := &cobra.Command{
		Use:   "cold",
		Short: "Measure tierblk with its cache against tierblk without one, on workloads where the cache starts cold (needs fio and nbdkit)",
		Long: `Over two backends of 1 TiB (nbdkit's sparse memory plugin), started once:
  NAS         --filter=rate rate=1G: an SSD NAS behind a 1 Gb/s link (32,768 4K transfers a second each way)
  slow disk   --filter=noparallel --filter=delay, 5 ms a request: at most 200 IOPS
measures, in the same run and alternating which goes first each round:
  tierblk, cache      serve --backend (the backend) --ram ` + bench.ColdRAM + ` --ssd ROUND/ssd.img --ssd-size ` + bench.ColdSSD + ` (tierblk's defaults otherwise)
  tierblk, no cache   serve --backend (the backend)
Every measurement starts a fresh tierblk in a new directory, so the cache is empty at its start.
The rows (--rows picks some by ID): nas-read, cold 4K random read at QD32 over --size of the NAS;
nas-rw, cold 4K random 50/50 read/write, write-through (the default mode); slow-read, cold 4K
random read over the slow disk; replay, each --trace replayed on the NAS in trace order with 32
requests in flight through tierblk's NBD client, timed whole. The NAS alone is measured once per
NAS row, in the first round, as the bound. nbdkit's rate filter lets an idle link burst for 2 s,
so every measurement on the NAS starts after it was idle --settle. Prints each side's median, the
median, lowest and highest of the per-round ratios cache/no cache (IOPS: above 1.0, the cache is
faster; replay times: below 1.0, the cache is faster) and the command lines.

--work must be on a file system with O_DIRECT (not tmpfs): the SSD tiers live there.`,
		Example: `  tierblk bench cold --work .cache/bench-cold
  tierblk bench cold --rows nas-read,replay --rounds 5`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchCold(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Rounds, "rounds", 3, "measurements per row and server (the median is reported)")
	f.DurationVar(&o.Runtime, "runtime", 15*time.Second, "fio run time per measurement on the NAS")
	f.DurationVar(&o.SlowRuntime, "slow-runtime", 5*time.Second, "fio run time per measurement on the slow disk (whose 5 ms per request hardly vary)")
	f.StringVar(&o.Size, "size", "512g", "the region the fio rows work on, far larger than the cache (fio size syntax)")
	f.DurationVar(&o.Settle, "settle", bench.ColdBurst, "how long the NAS idles before each measurement, so that each starts with the rate filter's full 2 s burst")
	f.StringSliceVar(&o.Traces, "trace", defaultColdTraces, "traces to replay on the NAS, one row each (any format 'tierblk sim' reads)")
	f.StringSliceVar(&o.Rows, "rows", nil, "rows to run, by ID: "+strings.Join(bench.ColdRowIDs(), ", ")+" (default: all)")
	f.StringArrayVar(&o.CacheFlags, "cache-flag", nil, "a 'tierblk serve' flag for the cached tierblk, e.g. --cache-flag=--admission=nhit:2 (repeatable)")
	f.StringVar(&o.Tierblk, "tierblk", "", "the tierblk binary to measure (default: this one), e.g. an older build to compare with")
	f.StringVar(&o.WorkDir, "work", "", "directory for the SSD tiers and the sockets, on a file system with O_DIRECT (default: a temporary directory)")
	return cmd
}

func runBenchCold(ctx context.Context, o benchColdOpts) error {
	if err := o.Validate(); err != nil {
		return usageErrorf("%v", err)
	}
	done, err := benchBinaryAndWork(&o.Tierblk, &o.WorkDir, "tierblk-bench-cold")
	if err != nil {
		return err
	}
	defer done()
	rep, err := bench.RunCold(ctx, o.ColdOptions)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nfio (nbd engine, one job, unix socket) and trace replays against tierblk with and without a cache, "+
		"a fresh server in a new directory for every measurement, %d rounds (%s a fio run on the NAS, %s on the slow disk):\n\n%s"+
		"\ncommand lines (WORK is the run's directory, ROUND a measurement's own, removed after it):\n",
		o.Rounds, o.Runtime, o.SlowRuntime, bench.ColdTable(rep.Results))
	for _, c := range rep.Commands {
		fmt.Fprintf(o.out, "  %s\n", c)
	}
	return nil
}
