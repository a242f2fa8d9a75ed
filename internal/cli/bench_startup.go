//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
	"github.com/tierblk/tierblk/internal/units"
)

type benchStartupOpts struct {
	lines  string
	rounds int
	work   string
	out    io.Writer
	log    io.Writer
}

func newBenchStartupCmd() *cobra.Command {
	o := benchStartupOpts{}
	cmd := &cobra.Command{
		Use:   "startup",
		Short: "Measure how long 'tierblk serve' takes to serve again, and its memory, on an SSD tier of millions of lines",
		Long: `For each tier size in --lines, builds an SSD tier of 4 KiB lines holding that many lines (a sparse
file, and the metadata written directly as the cache writes it: nothing goes through NBD) and an
empty tier of the same size, over a sparse file backend. Then, each round and alternating between
them, starts 'tierblk serve --ram 0' (this binary) on each, and measures the time until its unix
NBD socket accepts a connection and until it logs "SSD tier warm", and its VmRSS once it serves; it
is stopped with SIGTERM. The memory the cached lines cost is the VmRSS on the full tier less that
on the empty one, in the same round. Prints the medians and the command lines measured. The work
files are removed at the end.`,
		Example: `  tierblk bench startup --work .cache/bench-startup
  tierblk bench startup --lines 100K,1M --rounds 5`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchStartup(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.lines, "lines", "1M,10M", "comma-separated tier sizes in cached lines; K, M and G are binary (1M is 1,048,576)")
	f.IntVar(&o.rounds, "rounds", 3, "starts per tier (the median is reported)")
	f.StringVar(&o.work, "work", "", "directory for the tiers and the socket (default: a temporary directory)")
	return cmd
}

func runBenchStartup(ctx context.Context, o benchStartupOpts) error {
	if o.rounds < 1 {
		return usageErrorf("--rounds must be at least 1")
	}
	lines, err := parseLineCounts(o.lines)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, done, err := workDir(o.work, "tierblk-bench-startup")
	if err != nil {
		return err
	}
	defer done()
	res, err := bench.RunStartup(ctx, bench.StartupOptions{Tierblk: self, Lines: lines, Rounds: o.rounds, WorkDir: dir, Log: o.log})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nrestart of 'tierblk serve --ram 0' on an SSD tier of %s lines, until its unix socket accepts a connection, "+
		"and its VmRSS then; median of %d rounds:\n\n%s\ncommand lines (full tier, then the empty one; their directory is removed):\n",
		units.FormatSize(bench.StartupLineSize), o.rounds, bench.StartupTable(res))
	for _, r := range res {
		fmt.Fprintf(o.out, "  %s\n  %s\n", r.Command, r.BaseCommand)
	}
	return nil
}

// parseLineCounts parses a comma-separated list of line counts written as sizes are ("1M" is
// 1,048,576, as 1M is 1 MiB).
func parseLineCounts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := units.ParseSize(f)
		if err != nil || n < 1 || n > 1<<30 {
			return nil, usageErrorf("--lines: %q is not a count of lines from 1 to 1G (e.g. 1M,10M)", f)
		}
		out = append(out, int(n))
	}
	if len(out) == 0 {
		return nil, usageErrorf("--lines is empty; give counts of lines, e.g. 1M,10M")
	}
	return out, nil
}
