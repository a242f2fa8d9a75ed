//go:build linux

package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/bench"
)

type benchReplicaOpts struct {
	bench.ReplicaOptions
	out io.Writer
}

func newBenchReplicaCmd() *cobra.Command {
	o := benchReplicaOpts{}
	cmd := &cobra.Command{
		Use:   "replica",
		Short: "Measure write-back with a replica on a peer against write-back without one, over a link with added latency (needs fio)",
		Long: `Measures a write-back cache with one replica (write_back.replicas) against the same cache without
one, in paired rounds, alternating which goes first each round, at each added round trip of
--delays. The peer is a 'tierblk replica serve' on this machine, reached through a relay of the
benchmark's own that holds every byte for half the round trip in each direction. Every measurement
starts fresh:
  primary   serve --backend file://ROUND/nas.img?size=` + "1GiB" + `&direct=true --ram ` + bench.CacheRAM + ` --ssd ROUND/ssd.img --ssd-size 2GiB --mode writeback [--replica nbd://RELAY/nas]
and fio's nbd engine runs, on the primary: one write of every 4K block of the region (--size) at
random, not measured (the daemon warm: its memory touched), 4K random writes at QD32 (with each
process's CPU a write), the same writes held to ` + strconv.Itoa(bench.ReplicaEqualRate) + ` a second (the primary's CPU a write at a rate
both reach, what the replica itself costs it), a FLUSH (the records reach the peer), then 4K random
reads of the region (cached), then a writer that sends a FLUSH after each 4K write (QD1), whose
FLUSH latency p50 and p99 it reports. Each round also measures the peer's own FLUSH p99 (the same
writer straight to its export) and the relay's actual added round trip, so that the FLUSH
latency can be held to its bound: the round trip, plus the peer's flush, plus 1 ms.

--work must be on a file system with O_DIRECT (not tmpfs).`,
		Example: `  tierblk bench replica --work .cache/bench-replica --rounds 3`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out, o.Log = cmd.OutOrStdout(), cmd.ErrOrStderr()
			return runBenchReplica(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Rounds, "rounds", 3, "paired rounds per delay")
	f.DurationSliceVar(&o.Delays, "delays", []time.Duration{100 * time.Microsecond, time.Millisecond}, "round trip times the relay adds")
	f.StringVar(&o.Size, "size", "256m", "the region fio works on (fio size syntax)")
	f.DurationVar(&o.Runtime, "runtime", 10*time.Second, "fio run time per measurement")
	f.DurationVar(&o.Ramp, "ramp", 2*time.Second, "fio ramp time, not counted, of the throughput rows")
	f.StringVar(&o.Tierblk, "tierblk", "", "the tierblk binary to measure (default: this one)")
	f.StringVar(&o.WorkDir, "work", "", "directory for the SSD tiers, logs and sockets, on a file system with O_DIRECT (default: a temporary directory)")
	return cmd
}

func runBenchReplica(ctx context.Context, o benchReplicaOpts) error {
	if err := o.Validate(); err != nil {
		return usageErrorf("%v", err)
	}
	done, err := benchBinaryAndWork(&o.Tierblk, &o.WorkDir, "tierblk-bench-replica")
	if err != nil {
		return err
	}
	defer done()
	rep, err := bench.RunReplica(ctx, o.ReplicaOptions)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "\nfio (nbd engine, one job, unix socket) against a write-back primary without and with a replica, %d paired rounds (%s a run):\n\n%s",
		o.Rounds, o.Runtime, bench.ReplicaTable(rep.Results))
	fmt.Fprint(o.out, "\n"+bench.ReplicaBounds(rep, o.Delays))
	fmt.Fprintln(o.out, "\ncommand lines (WORK is the run's directory, ROUND a measurement's own, removed after it):")
	for _, c := range rep.Commands {
		fmt.Fprintf(o.out, "  %s\n", c)
	}
	return nil
}
