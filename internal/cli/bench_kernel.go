//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchKernelOpts struct {
	bench.KernelOptions
	out io.Writer
}

func newBenchKernelCmd() *cobra.Command {
	o := benchKernelOpts{}
	cmd := &cobra.Command{
		Use:   "kernel",
		Short: "Measure tierblk's cache behind its ublk device beside the kernel's caches (dm-cache, bcache, dm-writecache) in the kernel VM (needs qemu)",
		Long: `Boots the test VM (integration/vm, under qemu; VM_WITH_CACHES=1 adds fio, dmsetup, make-bcache
and the kernel's cache modules to its image) once for each NAS latency (--nas-ms) in every round.
In the guest (integration/vm/guest/bench-kernel.sh) two null_blk devices, memory-backed and made
again for each contender and row: a NAS of 1 GiB whose requests complete after --nas-ms and an SSD
of 256 MiB. The contenders, each set up fresh over them with 64 KiB blocks or lines: none (the NAS
alone), ssd (the SSD alone), ublk (tierblk's ublk device over the NAS, no cache), dmcache (smq,
write-back), bcache (write-back, sequential cutoff and congestion bypass off), dmwritecache, tierblk
(serve --ublk --ram 0 --line 64KiB --mode writeback, the backend opened direct, writing back in
FLUSH order, the default), tierblkaddr (the same with --write-back-order address). The rows, fio in
the guest: zipf, 4K random reads, zipf:1.1 over the NAS, QD16; hits, the same over the NAS's first
128 MiB, which every cache holds after the warm-up; randw, 4K random writes over 256 MiB, QD16;
seq, 1M sequential read of the whole NAS; fsync, ext4 on the device and 4 writers of 4K random
writes with an fsync every 64. Each is measured over --measure after --warm (seq: one pass), with
the guest's CPU over the window: the CPU a request took, kernel and tierblk together. The
contenders' order rotates from round to round. Prints each row's result as it comes, with the
contender's own statistics at the row's end (tierblk stats; dm-cache's, dm-writecache's status;
bcache's counters), then each contender's median, and tierblk's ratio to the better of dm-cache
and bcache and to no cache (medians of the per-round ratios, lowest and highest).

Run from the repository's root (or give --vm), with a static tierblk (make build).`,
		Example: `  tierblk bench kernel --rounds 3
  tierblk bench kernel --contenders none,ublk,tierblk --rows zipf --nas-ms 2 --rounds 1
  tierblk bench kernel --contenders ublk,tierblk --rows zipf,randw --nas-ms 2 --rounds 1 --profile /tmp/prof`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchKernel(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Rounds, "rounds", 3, "boots per NAS latency (the median is reported)")
	f.IntSliceVar(&o.NASms, "nas-ms", []int{2, 10}, "the NAS's latencies in ms, one boot each per round")
	f.StringSliceVar(&o.Contenders, "contenders", nil, "contenders to run: "+strings.Join(bench.KernelContenders, ", ")+" (default: all)")
	f.StringSliceVar(&o.Rows, "rows", nil, "rows to run: "+strings.Join(bench.KernelRows, ", ")+" (default: all)")
	f.DurationVar(&o.Warm, "warm", 40*time.Second, "each row's warm-up before its measured window")
	f.DurationVar(&o.Measure, "measure", 20*time.Second, "each row's measured window")
	f.IntVar(&o.MemMiB, "mem", 3072, "the guest's RAM in MiB (the null_blk devices are in it)")
	f.StringVar(&o.VMDir, "vm", "integration/vm", "the repository's integration/vm directory")
	f.StringVar(&o.Tierblk, "tierblk", "", "the static tierblk binary the guest runs (default: this one)")
	f.StringVar(&o.Profile, "profile", "", "a directory for CPU profiles of tierblk over each measured window of the ublk, tierblk and tierblkaddr contenders (go tool pprof BINARY FILE)")
	return cmd
}

func runBenchKernel(ctx context.Context, o benchKernelOpts) error {
	if err := o.Validate(); err != nil {
		return usageErrorf("%v", err)
	}
	if _, err := os.Stat(filepath.Join(o.VMDir, "run.sh")); err != nil {
		return usageErrorf("--vm %s: no run.sh there: run from the repository's root, or give its integration/vm", o.VMDir)
	}
	var err error
	if o.Tierblk == "" {
		if o.Tierblk, err = os.Executable(); err != nil {
			return err
		}
	}
	res, err := bench.RunKernel(ctx, o.KernelOptions)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nfio in the kernel VM (TCG, %d vCPUs), %d rounds, each row %s after %s of warm-up; "+
		"figures are medians, \"µs CPU\" the guest's CPU time per request:\n\n%s", 2, o.Rounds, o.Measure, o.Warm, bench.KernelTable(res))
	return nil
}
