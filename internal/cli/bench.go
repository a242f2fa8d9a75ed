//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/units"
)

type benchOpts struct {
	rounds  int
	runtime time.Duration
	size    string
	parts   []string
	work    string
	out     io.Writer
	log     io.Writer
}

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: 'bench nbd' (fio against nbdkit, and qemu-nbd over iSCSI), 'bench cache' and 'bench writeback' (the cache against nbdkit's), 'bench sim' (the simulator's speed), 'bench startup' (restart and memory of a large SSD tier), 'bench cold' (the cache against no cache on cold workloads), 'bench memory' (the daemon's memory against its bound under load), 'bench kernel' (tierblk's ublk cache beside dm-cache, bcache and dm-writecache in the kernel VM)",
		Args:  noSuchCommand("unknown benchmark %q%s (use 'tierblk bench nbd', 'tierblk bench cache', 'tierblk bench writeback', 'tierblk bench sim', 'tierblk bench startup', 'tierblk bench cold', 'tierblk bench memory' or 'tierblk bench kernel')"),
		RunE:  showHelp,
		// As the root's: noSuchCommand suggests the benchmarks this near to what was typed.
		SuggestionsMinimumDistance: 2,
	}
	cmd.AddCommand(newBenchNBDCmd(), newBenchCacheCmd(), newBenchWriteBackCmd(), newBenchSimCmd(), newBenchStartupCmd(), newBenchColdCmd(), newBenchMemoryCmd(), newBenchKernelCmd())
	return cmd
}

func newBenchNBDCmd() *cobra.Command {
	o := benchOpts{}
	cmd := &cobra.Command{
		Use:   "nbd",
		Short: "Measure tierblk against nbdkit (and qemu-nbd over iSCSI) with fio (needs fio and nbdkit)",
		Long: `Runs fio's nbd engine against 'tierblk serve --backend mem://1GiB' and 'nbdkit memory 1G'
in the same run, alternating between them each round, and prints the median of each row and the
median of the per-round ratios tierblk/nbdkit with their lowest and highest (above 1.0: tierblk is
faster), then the CPU each server used. The parts (--parts):
  plain   both on a unix socket
  tls     both on a TCP port of 127.0.0.1 each, requiring TLS (--tls require, --tls=require),
          with a certificate made for the run (ECDSA P-256, for 127.0.0.1); fio's GnuTLS may
          offer only ` + bench.TLSCipher + `, so that both serve the same
          cipher (left to choose, nbdkit takes AES-256-GCM and tierblk AES-128-GCM)
  iscsi   not by default: needs root, tgtd (Debian package tgt) and qemu-nbd with qemu's iSCSI
          driver (qemu-utils, qemu-block-extra). A tgtd on a free port of 127.0.0.1 serves a
          1 GiB sparse file in the work directory as LUN 1 of ` + bench.ISCSIIQN + `;
          'tierblk serve --backend iscsi://127.0.0.1:PORT/IQN/1' (no cache) and
          'qemu-nbd -t -f raw --cache=none iscsi://127.0.0.1:PORT/IQN/1' serve it on unix
          sockets; the rows add 1M sequential write, QD8, and the CPU table tgtd's CPU`,
		Example: `  tierblk bench nbd
  tierblk bench nbd --parts tls --rounds 5
  sudo tierblk bench nbd --parts iscsi --rounds 5 --runtime 5s`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBench(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.rounds, "rounds", 3, "measurements per row and server (the median is reported)")
	f.DurationVar(&o.runtime, "runtime", 10*time.Second, "fio run time per measurement")
	f.StringVar(&o.size, "size", "512m", "region of the 1 GiB disk that fio works on (fio size syntax)")
	f.StringSliceVar(&o.parts, "parts", bench.NBDDefaultParts(), "what to measure: plain (over a unix socket), tls (over TCP with TLS), iscsi (against qemu-nbd, both over a tgtd LUN; needs root)")
	f.StringVar(&o.work, "work", "", "directory for the sockets, the TLS certificates and the iSCSI LUN's file (default: a temporary directory)")
	return cmd
}

// checkParts checks the parts a --parts flag names against the known ones.
func checkParts(parts []string, known ...string) error {
	for _, p := range parts {
		if !slices.Contains(known, p) {
			return usageErrorf("--parts: unknown part %q; parts: %s", p, strings.Join(known, ", "))
		}
	}
	if len(parts) == 0 {
		return usageErrorf("--parts is empty; parts: %s", strings.Join(known, ", "))
	}
	return nil
}

func runBench(ctx context.Context, o benchOpts) error {
	if o.rounds < 1 || o.runtime < time.Second {
		return usageErrorf("--rounds must be at least 1 and --runtime at least 1s")
	}
	if err := checkParts(o.parts, bench.NBDParts()...); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// What a part lacks fails the run before the first part, not after minutes of others.
	if slices.Contains(o.parts, bench.NBDPlain) || slices.Contains(o.parts, bench.NBDTLS) {
		if _, err := exec.LookPath("nbdkit"); err != nil {
			return fmt.Errorf("nbdkit is not installed; run `make deps` (Debian package nbdkit)")
		}
	}
	if slices.Contains(o.parts, bench.NBDISCSI) {
		if err := bench.CheckISCSI(); err != nil {
			return err
		}
	}
	work, done, err := workDir(o.work, "tierblk-bench")
	if err != nil {
		return err
	}
	defer done()
	for _, part := range bench.NBDParts() {
		if !slices.Contains(o.parts, part) {
			continue
		}
		if err := runBenchPart(ctx, o, part, self, work); err != nil {
			return err
		}
	}
	return nil
}

// runBenchPart measures one part of `bench nbd` in a directory of its own under work, removed at
// the end.
func runBenchPart(ctx context.Context, o benchOpts, part, self, work string) error {
	dir, err := os.MkdirTemp(work, part)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	setup, err := bench.NBDTargets(part, self, dir)
	if err != nil {
		return err
	}
	// After Run has stopped the servers.
	defer setup.Close()
	res, err := bench.Run(ctx, setup.Targets, bench.Options{
		Rows: setup.Rows, Rounds: o.rounds, Runtime: o.runtime, Size: o.size, WorkDir: dir, Log: o.log, Watch: setup.Watch,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nfio, nbd engine, one job, %s, %s of %s, median of %d runs of %s; ratio: median of the per-round ratios (lowest-highest):\n\n",
		setup.Transport, o.size, setup.Disk, o.rounds, o.runtime)
	setup.Table(o.out, res)
	fmt.Fprintf(o.out, "\nCPU during each server's runs (fio's ramp included), medians; µs per I/O (IOPS rows) or per MiB (MiB/s rows):\n\n")
	setup.CPUTable(o.out, res)
	return nil
}

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
  tierblk bench cache --parts reduction --image usr.ext4 --rounds 5
  tierblk bench cache --parts checksums --baseline /tmp/tierblk-19fdf5f --rounds 5`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchCache(cmd.Context(), o)
		},
	}
	benchCacheFlags(cmd, &o.CacheOptions)
	cmd.Flags().StringSliceVar(&o.parts, "parts", []string{"slow", "hits"}, "what to measure: slow (the caches over a slow disk), hits (the hit paths against qemu-nbd), reduction (the SSD tier's data reduction on --image), checksums (the hit paths and write-back writes against --baseline and qemu-nbd)")
	cmd.Flags().StringVar(&o.image, "image", "", "raw disk image the reduction part reads through the cache")
	cmd.Flags().StringVar(&o.baseline, "baseline", "", "tierblk binary the checksums part compares this one with, e.g. a build from before the checks")
	return cmd
}

// benchCacheFlags are the flags `bench cache` and `bench writeback` share.
func benchCacheFlags(cmd *cobra.Command, o *bench.CacheOptions) {
	f := cmd.Flags()
	f.IntVar(&o.Rounds, "rounds", 3, "measurements per row and server (the median is reported)")
	f.DurationVar(&o.Runtime, "runtime", 10*time.Second, "fio run time per measurement on the caches")
	f.DurationVar(&o.SlowRuntime, "slow-runtime", 3*time.Second, "fio run time per measurement on the slow disk alone")
	f.StringVar(&o.Size, "size", "128m", "the working set (fio size syntax)")
	f.StringVar(&o.WorkDir, "work", "", "directory for the SSD tier and the sockets, on a file system with O_DIRECT (default: a temporary directory)")
}

// prepareCache checks the shared flags and fills in the binary and the work directory; done
// removes a temporary work directory.
func prepareCache(o *bench.CacheOptions) (done func(), err error) {
	if o.Rounds < 1 || o.Runtime < time.Second || o.SlowRuntime < time.Second {
		return nil, usageErrorf("--rounds must be at least 1, --runtime and --slow-runtime at least 1s")
	}
	if o.Tierblk, err = os.Executable(); err != nil {
		return nil, err
	}
	o.WorkDir, done, err = workDir(o.WorkDir, "tierblk-bench-cache")
	return done, err
}

// workDir returns dir, created if need be, or a new temporary directory (named from prefix) when
// dir is empty; done removes the temporary one.
func workDir(dir, prefix string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, os.MkdirAll(dir, 0o755)
	}
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	return tmp, func() { os.RemoveAll(tmp) }, nil
}

func runBenchCache(ctx context.Context, o benchCacheOpts) error {
	if err := checkParts(o.parts, "slow", "hits", "reduction", "checksums"); err != nil {
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
	if slices.Contains(o.parts, "hits") {
		res, err := bench.RunHits(ctx, o.CacheOptions)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.out, "\nHits: fio, nbd engine, one job, unix socket, a %s working set, median of %d runs of %s; ratios: median of the per-round ratios:\n\n",
			o.Size, o.Rounds, o.Runtime)
		bench.HitTable(o.out, res)
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
	names := splitList(o.policies)
	if len(names) == 1 && names[0] == "all" {
		names = policy.EvictionNames()
	}
	for _, n := range names {
		if _, err := policy.NewEviction(n, policy.Config{Capacity: 1}); err != nil {
			return usageErrorf("--policy: %v", err)
		}
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
	var err error
	if o.Tierblk == "" {
		if o.Tierblk, err = os.Executable(); err != nil {
			return err
		}
	}
	var done func()
	if o.WorkDir, done, err = workDir(o.WorkDir, "tierblk-bench-cold"); err != nil {
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
(serve --ublk --ram 0 --line 64KiB --mode writeback, the backend opened direct). The rows, fio in
the guest: zipf, 4K random reads, zipf:1.1 over the NAS, QD16; randw, 4K random writes over 256 MiB,
QD16; seq, 1M sequential read of the whole NAS. Each is measured over --measure after --warm (seq:
one pass), with the guest's CPU over the window: the CPU a request took, kernel and tierblk
together. The contenders' order rotates from round to round. Prints each contender's median, and
tierblk's ratio to the better of dm-cache and bcache and to no cache (medians of the per-round
ratios, lowest and highest).

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
	f.StringVar(&o.Profile, "profile", "", "a directory for CPU profiles of tierblk over each measured window of the ublk and tierblk contenders (go tool pprof BINARY FILE)")
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
