//go:build linux

package cli

import (
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: 'bench nbd' (fio against nbdkit, and qemu-nbd over iSCSI), 'bench cache' and 'bench writeback' (the cache against nbdkit's), 'bench sim' (the simulator's speed), 'bench startup' (restart and memory of a large SSD tier), 'bench cold' (the cache against no cache on cold workloads), 'bench memory' (the daemon's memory against its bound under load), 'bench kernel' (tierblk's ublk cache beside dm-cache, bcache and dm-writecache in the kernel VM)",
		Args:  noSuchCommand("unknown benchmark %q%s (use 'tierblk bench nbd', 'tierblk bench cache', 'tierblk bench writeback', 'tierblk bench sim', 'tierblk bench startup', 'tierblk bench cold', 'tierblk bench memory', 'tierblk bench kernel' or 'tierblk bench replica')"),
		RunE:  showHelp,
		// As the root's: noSuchCommand suggests the benchmarks this near to what was typed.
		SuggestionsMinimumDistance: 2,
	}
	cmd.AddCommand(newBenchNBDCmd(), newBenchCacheCmd(), newBenchWriteBackCmd(), newBenchSimCmd(), newBenchStartupCmd(), newBenchColdCmd(), newBenchMemoryCmd(), newBenchKernelCmd(), newBenchReplicaCmd())
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

// benchBinaryAndWork fills in the tierblk binary measured (this one unless given) and the work
// directory (a temporary one, named from prefix, unless given); done removes a temporary one.
func benchBinaryAndWork(tierblk, work *string, prefix string) (done func(), err error) {
	if *tierblk == "" {
		if *tierblk, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	*work, done, err = workDir(*work, prefix)
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
