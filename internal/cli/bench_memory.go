//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchMemoryOpts struct {
	bench.MemoryOptions
	out io.Writer
}

func newBenchMemoryCmd() *cobra.Command {
	o := benchMemoryOpts{}
	cmd := &cobra.Command{
		Use:   "memory",
		Short: "Measure the daemon's memory against its bound (RAM tier + index + 64 MiB) under a heavy NBD load (needs fio)",
		Long: `For RAM tiers of 32 MiB, 256 MiB and 1 GiB, starts 'tierblk serve' (this binary, and --baseline
in the same rounds, alternating which goes first) in a new directory for every run:
  serve --backend file://RUN/backend.img?size=` + bench.MemoryBackend + ` --ram RAM --ssd RUN/ssd.img --ssd-size ` + bench.MemorySSD + `
        --mode writeback --admin unix:RUN/admin.sock
and drives it with fio's nbd engine over the same GiB:
  512K sequential write, 4 jobs x QD64 (each job a quarter of the GiB)
  1M random read, 4 jobs x QD64 (256 MiB each, over the whole GiB)
  4K random write, 1 job x QD32 (256 MiB, or 20 s)
After each phase it reads the daemon's /stats memory object (what 'tierblk stats --json' prints:
bound_bytes, held_peak_bytes, go_heap_bytes) and /proc/PID/status (VmHWM, RssAnon + RssShmem; also
sampled every 100 ms): the older build has no memory object, so both builds' VmHWM and held peak
are also read from /proc. Prints, per RAM tier and build, the medians over rounds (lowest-highest)
of the bound, the held peak, held peak / bound (at most 1), VmHWM, VmHWM / (RAM tier + 64 MiB) and
the Go heap. A run whose held peak passes its bound leaves its heap profile (/debug/pprof/heap) in
--work. The run directories are removed.

--work must be on a file system with O_DIRECT (not tmpfs): the SSD tiers live there.`,
		Example: `  tierblk bench memory --work .cache/bench-memory
  tierblk bench memory --rounds 3 --baseline /tmp/tierblk-e113d40 --work /tmp/bench-memory`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchMemory(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Rounds, "rounds", 3, "runs per RAM tier and build (the median is reported)")
	f.StringVar(&o.Baseline, "baseline", "", "an older tierblk binary measured in the same rounds, e.g. a build from before the memory bound")
	f.StringVar(&o.WorkDir, "work", "", "directory for the runs (SSD tier, backend file, sockets), on a file system with O_DIRECT (default: a temporary directory)")
	return cmd
}

func runBenchMemory(ctx context.Context, o benchMemoryOpts) error {
	if o.Rounds < 1 {
		return usageErrorf("--rounds must be at least 1")
	}
	var err error
	if o.Tierblk, err = os.Executable(); err != nil {
		return err
	}
	o.RAMTiers = bench.MemoryRAMTiers()
	var done func()
	if o.WorkDir, done, err = workDir(o.WorkDir, "tierblk-bench-memory"); err != nil {
		return err
	}
	defer done()
	res, err := bench.RunMemory(ctx, o.MemoryOptions)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\n'tierblk serve' in write-back (SSD tier %s, file backend %s) under fio's nbd engine (512K sequential write 4x64, "+
		"1M random read 4x64, 4K random write 1x32, over 1 GiB); median of %d runs (lowest-highest):\n\n%s\ncommand lines (RUN is the run's directory, removed after it):\n",
		bench.MemorySSD, bench.MemoryBackend, o.Rounds, bench.MemoryTable(res))
	seen := map[string]bool{}
	for _, r := range res {
		c := strings.ReplaceAll(r.Command, "WORK", "RUN")
		if !seen[c] {
			seen[c] = true
			fmt.Fprintf(o.out, "  %s\n", c)
		}
	}
	return nil
}
