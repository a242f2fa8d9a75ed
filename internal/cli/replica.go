//go:build linux

package cli

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/replica"
	"github.com/tierblk/tierblk/internal/units"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

func newReplicaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replica",
		Short: "Keep another host's write-back dirty data, and give it to the backend when that host dies",
		Long: `A write-back cache holds the only copy of recent writes on its host's SSD. With
write_back.replicas (--replica) it also logs every change on one or two peers, and acknowledges a
FLUSH (or a FUA write) only once the change is durable there too. The peers run 'tierblk replica
serve', which keeps the log in a file. If the primary host dies, 'tierblk replica drain' on a peer
writes the log to the backend, so the backend holds every write the primary acknowledged as
durable. docs/operations.md#write-back-replicas walks through a two-host set-up.`,
		Args: noArgs,
	}
	cmd.AddCommand(newReplicaServeCmd(), newReplicaDrainCmd(), newReplicaStatusCmd())
	return cmd
}

// replicaPort is the port a replica serves on unless --nbd says otherwise.
const replicaPort = "10810"

func newReplicaServeCmd() *cobra.Command {
	o := serveOpts{given: map[string][]string{}}
	var logFile, size string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a replica log to a primary over NBD",
		Long: `Serves one replica log, a file (created sparse at --size if missing), as an NBD export that
a primary names in write_back.replicas, e.g. nbd://THIS-HOST:10810/nas. It is 'tierblk serve' of
that file: every flag of serve applies (--export names it; --nbd defaults to :` + replicaPort + `;
--allow, --tls and --tls-certificates guard it). The log must hold the primary's dirty data and the
changes made since the cache last wrote it back: give it at least the primary's SSD tier's
write_back.max share of lines, twice that to spare it waits. The primary writes to the log at
least every few seconds; 'tierblk replica drain' refuses while it does.`,
		Example: `  tierblk replica serve --log /var/lib/tierblk/nas.replica --size 16GiB --export nas --allow 192.168.1.0/24`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stderr = cmd.ErrOrStderr()
			if logFile == "" {
				return usageErrorf("--log: give the replica log's file, e.g. --log /var/lib/tierblk/nas.replica")
			}
			if len(o.given["backend"]) > 0 || o.configFile != "" {
				return usageErrorf("--backend and --config: a replica serves its --log alone")
			}
			u := url.URL{Scheme: "file", Path: logFile}
			if _, err := os.Stat(logFile); errors.Is(err, os.ErrNotExist) {
				if size == "" {
					return usageErrorf("--log %s does not exist: give --size to create it", logFile)
				}
				u.RawQuery = "size=" + url.QueryEscape(size)
			}
			o.given["backend"] = []string{u.String()}
			if len(o.given["nbd"]) == 0 {
				o.given["nbd"] = []string{":" + replicaPort}
			}
			return runServe(cmd.Context(), o)
		},
	}
	addServeFlags(cmd.Flags(), &o)
	cmd.Flags().StringVar(&logFile, "log", "", "the replica log's file")
	cmd.Flags().StringVar(&size, "size", "", "the log's size where --log is created, e.g. 16GiB")
	return cmd
}

func newReplicaDrainCmd() *cobra.Command {
	var logFile, to string
	var force bool
	var lease time.Duration
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Write a replica log's changes to the backend (the primary is dead)",
		Long: `Applies the changes a replica log holds to the backend, in the order the primary made them,
flushing the backend at each FLUSH the primary's clients sent, then marks the log empty. Run it on
the replica's host when the primary host is gone for good: the backend then holds every write the
primary acknowledged as durable, and can be served again (by a new primary, or plain).

It refuses while 'tierblk replica serve' serves the log (stop it first: that also cuts the primary
off the log), and while the primary may be alive: if the log was written in the last --lease (the
primary writes it at least every 2 s), it says so and exits; --force drains anyway. It also refuses a log
made for a backend of another size, and a file that is not a replica log. Two writers must never
share the backend: make sure the old primary is stopped (or its host off) first.`,
		Example: `  tierblk replica drain --log /var/lib/tierblk/nas.replica --backend iscsi://nas/iqn.2000-01.com.synology:nas.lun0/1`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplicaDrain(cmd.OutOrStdout(), logFile, to, force, lease)
		},
	}
	cmd.Flags().StringVar(&logFile, "log", "", "the replica log's file")
	cmd.Flags().StringVar(&to, "backend", "", "the backend URL the primary served (as in its config)")
	cmd.Flags().BoolVar(&force, "force", false, "drain even if the log was written within --lease")
	cmd.Flags().DurationVar(&lease, "lease", 15*time.Second, "how long after the log's last write the primary counts as gone")
	return cmd
}

func runReplicaDrain(out io.Writer, logFile, to string, force bool, lease time.Duration) error {
	if logFile == "" || to == "" {
		return usageErrorf("give --log (the replica log) and --backend (the backend URL the primary served)")
	}
	fi, err := os.Stat(logFile)
	if err != nil {
		return usageErrorf("--log: %v", err)
	}
	if err := notServed(logFile); err != nil {
		return err
	}
	if age := time.Since(fi.ModTime()); age < lease && !force {
		return fmt.Errorf("the replica log was written %s ago: its primary may be alive, and two writers must never share the backend; stop the primary, wait for --lease (%s) to pass, or give --force", age.Round(time.Millisecond), lease)
	}
	reg := registry.Default()
	dev, err := reg.Open((&url.URL{Scheme: "file", Path: logFile}).String(), backend.Options{})
	if err != nil {
		return err
	}
	defer dev.Close()
	b, err := reg.Open(to, backend.Options{})
	if err != nil {
		return usageErrorf("--backend: %v", err)
	}
	defer b.Close()
	last := time.Now()
	st, err := replica.Drain(dev, b, func(s replica.DrainStats) {
		if time.Since(last) >= time.Second {
			last = time.Now()
			fmt.Fprintf(out, "draining: %d records, %s written\n", s.Records, humanBytes(uint64(s.Bytes)))
		}
	})
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	fmt.Fprintf(out, "drained: %d records (%d writes, %d trims, %d zeroes, %d flushes), %s written to the backend; the log is empty\n",
		st.Records, st.Writes, st.Trims, st.Zeroes, st.Flushes, humanBytes(uint64(st.Bytes)))
	return nil
}

// notServed refuses a log that a process holds open as a backend (tierblk replica serve locks its
// file): while it is served, the primary may still be writing to it.
func notServed(logFile string) error {
	f, err := os.Open(logFile)
	if err != nil {
		return usageErrorf("--log: %v", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%s is served (tierblk replica serve holds it): stop that first, which also cuts the primary off the log", logFile)
		}
		return fmt.Errorf("--log: lock: %w", err)
	}
	return unix.Flock(int(f.Fd()), unix.LOCK_UN)
}

func newReplicaStatusCmd() *cobra.Command {
	var logFile string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Say what a replica log holds",
		Long:  `Reads a replica log (read-only) and prints its volume's size, when it was last written, and the changes it holds that a drain would apply.`,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if logFile == "" {
				return usageErrorf("--log: give the replica log's file")
			}
			return runReplicaStatus(cmd.OutOrStdout(), logFile)
		},
	}
	cmd.Flags().StringVar(&logFile, "log", "", "the replica log's file")
	return cmd
}

func runReplicaStatus(out io.Writer, logFile string) error {
	fi, err := os.Stat(logFile)
	if err != nil {
		return usageErrorf("--log: %v", err)
	}
	// Read without the backend's lock, which a serving replica holds.
	f, err := os.Open(logFile)
	if err != nil {
		return usageErrorf("--log: %v", err)
	}
	defer f.Close()
	r, err := replica.Open(readOnlyFile{f, fi.Size()})
	if err != nil {
		return err
	}
	var n, bytes int64
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		n++
		if rec.Kind == replica.KindWrite {
			bytes += rec.Len
		}
	}
	fmt.Fprintf(out, "log %016x: volume %s, last written %s ago, %d changes to drain (%s of writes)\n",
		r.ID(), units.FormatSize(r.VolumeSize()), time.Since(fi.ModTime()).Round(time.Second), n, humanBytes(uint64(bytes)))
	return nil
}

// readOnlyFile is a file read as a backend, for a look at a log that may be served meanwhile.
type readOnlyFile struct {
	f    *os.File
	size int64
}

func (r readOnlyFile) ReadAt(p []byte, off int64) (int, error) { return r.f.ReadAt(p, off) }
func (r readOnlyFile) WriteAt([]byte, int64) (int, error)      { return 0, backend.ErrReadOnly }
func (r readOnlyFile) Size() int64                             { return r.size }
func (r readOnlyFile) Flush() error                            { return nil }
func (r readOnlyFile) Close() error                            { return nil }
