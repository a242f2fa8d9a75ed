//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
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
