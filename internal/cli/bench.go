package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchOpts struct {
	rounds  int
	runtime time.Duration
	size    string
	out     io.Writer
	log     io.Writer
}

func newBenchCmd() *cobra.Command {
	o := benchOpts{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure tierblk against nbdkit with fio (needs fio and nbdkit)",
		Long: `Runs fio's nbd engine against 'tierblk serve --backend mem://1GiB' and 'nbdkit memory 1G'
in the same run, alternating between them each round, and prints the median of each row and the
ratio tierblk/nbdkit (above 1.0: tierblk is faster).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBench(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.rounds, "rounds", 3, "measurements per row and server (the median is reported)")
	f.DurationVar(&o.runtime, "runtime", 10*time.Second, "fio run time per measurement")
	f.StringVar(&o.size, "size", "512m", "region of the 1 GiB disk that fio works on (fio size syntax)")
	return cmd
}

func runBench(ctx context.Context, o benchOpts) error {
	if o.rounds < 1 || o.runtime < time.Second {
		return usageErrorf("--rounds must be at least 1 and --runtime at least 1s")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("nbdkit"); err != nil {
		return fmt.Errorf("nbdkit is not installed; run `make deps` (Debian package nbdkit)")
	}
	dir, err := os.MkdirTemp("", "tierblk-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	targets := []bench.Target{
		{Name: "tierblk", Command: func(sock string) *exec.Cmd {
			return exec.Command(self, "serve", "--backend", "mem://1GiB", "--nbd", "unix:"+sock, "--log-level", "warn")
		}},
		{Name: "nbdkit", Command: func(sock string) *exec.Cmd {
			return exec.Command("nbdkit", "-f", "-U", sock, "memory", "1G")
		}},
	}
	res, err := bench.Run(ctx, targets, bench.Options{
		Rows: bench.DefaultRows(), Rounds: o.rounds, Runtime: o.runtime, Size: o.size, WorkDir: dir, Log: o.log,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nfio, nbd engine, one job, unix socket, %s of a 1 GiB RAM disk, median of %d runs of %s:\n\n%s",
		o.size, o.rounds, o.runtime, bench.Table(res, targets))
	return nil
}
