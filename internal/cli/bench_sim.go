//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"math"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchSimOpts struct {
	policies string
	requests int
	fraction float64
	rounds   int
	cachesim string
	work     string
	seed     uint64
	out      io.Writer
	log      io.Writer
}

func newBenchSimCmd() *cobra.Command {
	o := benchSimOpts{}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Measure the simulator's requests per second per policy, optionally against libCacheSim's cachesim",
		Long: `Generates (once, cached in --work) an oracleGeneral trace of --requests requests (5 million by
default): Zipf (alpha 0.9) over a million objects, with 10 % of the requests in sequential scans,
named in --work by its parameters (sim-n5000000-o1000000-...oracleGeneral), so that 'tierblk sim'
and cachesim can replay it too. Then, for every policy, replays
it single-threaded with one cache of --fraction of the distinct objects, through the code path of
'tierblk sim', and prints the median requests per second of the replay and end to end (including
reading the trace). With --cachesim, runs libCacheSim's cachesim on the same trace, policy and size
in the same rounds and prints the ratios tierblk/cachesim (above 1: tierblk is faster) and both
miss ratios.`,
		Example: `  tierblk bench sim
  tierblk bench sim --policy lru,s3fifo --cachesim /tmp/libcachesim/_build/bin/cachesim --work /tmp/simbench
  tierblk bench sim --requests 100000000 --policy lru --rounds 1 --work /tmp/simbench`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchSim(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.policies, "policy", "lru,fifo,clock,arc,2q,s3fifo,sieve,lirs,wtinylfu", "comma-separated eviction policies, or 'all'")
	f.IntVar(&o.requests, "requests", bench.DefaultSimTrace().Requests, "requests in the generated trace (24 bytes each on disk)")
	f.Float64Var(&o.fraction, "fraction", 0.1, "cache size as a fraction of the trace's distinct objects")
	f.IntVar(&o.rounds, "rounds", 3, "measurements per policy (the median is reported)")
	f.StringVar(&o.cachesim, "cachesim", "", "libCacheSim's cachesim binary to compare with (not built by this project)")
	f.StringVar(&o.work, "work", "", "directory that keeps the generated trace between runs (default: a temporary directory)")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the generated trace")
	return cmd
}

func runBenchSim(ctx context.Context, o benchSimOpts) error {
	if o.rounds < 1 || o.fraction <= 0 || o.fraction >= 1 || o.requests < 1 || o.requests > math.MaxUint32 {
		return usageErrorf("--rounds must be at least 1, --fraction between 0 and 1, and --requests between 1 and %d", uint32(math.MaxUint32))
	}
	names, err := policyNames(o.policies)
	if err != nil {
		return err
	}
	dir, done, err := workDir(o.work, "tierblk-bench-sim")
	if err != nil {
		return err
	}
	defer done()
	t := bench.DefaultSimTrace()
	t.Seed, t.Requests = o.seed, o.requests
	path, err := bench.EnsureSimTrace(dir, t, o.log)
	if err != nil {
		return err
	}
	res, err := bench.RunSim(ctx, bench.SimOptions{
		TracePath: path, Policies: names, Fraction: o.fraction, Rounds: o.rounds, Cachesim: o.cachesim, WorkDir: dir, Log: o.log,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nsimulator, one policy and one size (%g of the distinct objects), single-threaded, %d requests "+
		"(Zipf %g over %d objects, %g of requests in scans), median of %d runs, millions of requests per second:\n\n%s",
		o.fraction, t.Requests, t.Alpha, t.Objects, t.ScanShare, o.rounds, bench.SimTable(res))
	return nil
}
