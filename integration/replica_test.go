package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
)

// startReplica runs `tierblk replica serve` of a log file in dir on a fresh loopback port and
// returns the daemon, the log's path and the URL a primary names it by.
func startReplica(t *testing.T, log, size string) (*daemon, string) {
	t.Helper()
	tcp := freeTCPAddr(t)
	d := startDaemon(t, tierblkPath, []string{"replica", "serve", "--log", log, "--size", size, "--export", "nas", "--nbd", tcp}, tcp)
	return d, "nbd://" + tcp + "/nas"
}

// TestReplicaDrainAfterHostDeath is a primary host's death under the kill -9 checker's workload
// (writes, FUA writes, zeroings, flushes from four clients), in write-back with a replica on a
// "peer" (another tierblk process): the primary is killed (-9) and its SSD tier and metadata
// deleted, as a dead host's would be gone; `tierblk replica drain` then writes the replica's log
// to the backend, which must hold, for every block, the last write a completed FLUSH or FUA made
// durable, or a later one; in every other cycle, instead, a new primary with a fresh SSD tier
// started over the same replica takes the export over from the log, and must serve the same. A
// new primary with a fresh SSD tier starts over the backend and the same replica, and the cycle
// repeats. Without the replica the deleted SSD tier would take
// the dirty data with it (the first two cycles check that the backend alone lacked some).
func TestReplicaDrainAfterHostDeath(t *testing.T) {
	const (
		seed    = 11
		region  = 8 << 20
		workers = 4
	)
	cycles := envCount(t, "TIERBLK_KILL_CYCLES", 3)
	image := filepath.Join(shortTempDir(t), "nas.img")
	backend := fmt.Sprintf("file://%s?size=%d", image, region)
	logFile := filepath.Join(shortTempDir(t), "nas.replica")
	m := newDurableModel(region / blockBytes)
	rng := rand.New(rand.NewPCG(seed, 0))
	var acked, flushed atomic.Int64
	var drained, tookOver int
	for cycle := range cycles {
		// A fresh host each cycle: its own SSD tier, big enough that little is written back.
		peer, replicaURL := startReplica(t, logFile, "64MiB")
		o := cacheOpts{backend: backend, dir: shortTempDir(t), ram: "0", ssdSize: "16MiB", line: "64KiB", mode: "writeback"}
		d := startServe(t, append(o.args(), "--replica", replicaURL, "--dirty-high", "0.9", "--dirty-max", "0.95")...)
		c := dialNBD(t, d.Unix)
		m.verify(t, c, fmt.Sprintf("cycle %d, through a new primary", cycle))

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wrng := rand.New(rand.NewPCG(seed, uint64(cycle*workers+w+1)))
			wg.Go(func() { errs[w] = m.work(ctx, c, wrng, w, workers, &acked, &flushed) })
		}
		// Until the replica holds a few flushes' worth: its log is written as the clients write.
		before := flushed.Load()
		require.Eventually(t, func() bool { return flushed.Load() >= before+20 }, 2*time.Minute, 10*time.Millisecond)
		time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond) // somewhere between two flushes
		d.stop(syscall.SIGKILL)
		cancel()
		wg.Wait()
		c.Close()
		requireNoWrongRead(t, errs, fmt.Sprintf("cycle %d", cycle))
		require.NoError(t, os.RemoveAll(o.dir), "the dead host's SSD tier and metadata")
		if cycle <= 1 { // for a drain and for a take-over
			direct := dialNBD(t, startNbdkit(t, "file", image))
			require.Positive(t, m.behind(t, direct), "the backend alone already held every durable write: the test proves nothing")
			require.NoError(t, direct.Close())
		}

		code, out := runTierblk(t, "replica", "status", "--log", logFile)
		require.Zero(t, code, out)
		t.Logf("cycle %d: %s", cycle, out)
		if cycle%2 == 1 {
			// A new primary on another host takes the export over: it applies the dead one's
			// log to the backend before it serves.
			o := cacheOpts{backend: backend, dir: shortTempDir(t), ram: "0", ssdSize: "16MiB", line: "64KiB", mode: "writeback"}
			d := startServe(t, append(o.args(), "--replica", replicaURL, "--take-over")...)
			c := dialNBD(t, d.Unix)
			m.verify(t, c, fmt.Sprintf("cycle %d, through the primary that took over", cycle))
			require.NoError(t, c.Close())
			d.requireStop(syscall.SIGTERM)
			peer.requireStop(syscall.SIGTERM)
			tookOver++
			continue
		}
		code, out = runTierblk(t, "replica", "drain", "--log", logFile, "--backend", backend)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, "stop that first")
		peer.requireStop(syscall.SIGTERM)
		// The log was written just now: the primary may be alive, as far as the peer can tell.
		code, out = runTierblk(t, "replica", "drain", "--log", logFile, "--backend", backend)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, "its primary may be alive")
		code, out = runTierblk(t, "replica", "drain", "--log", logFile, "--backend", backend, "--force")
		require.Zero(t, code, out)
		require.Contains(t, out, "drained:")
		t.Logf("cycle %d: %s", cycle, out)
		drained++

		direct := dialNBD(t, startNbdkit(t, "file", image))
		m.verify(t, direct, fmt.Sprintf("cycle %d, on the backend after the drain", cycle))
		require.NoError(t, direct.Close())
	}
	require.Positive(t, flushed.Load())
	t.Logf("%d writes acknowledged, %d flushes completed, %d drains, %d take-overs, %d blocks found older than their last acknowledged write (allowed: not flushed)",
		acked.Load(), flushed.Load(), drained, tookOver, m.lost)
	logCampaign(t, cycles, "kill -9 cycles", m.sectors)
}

// requireNoWrongRead: the workers stop at their first failed request, which the kill causes; a
// wrong read is a test failure.
func requireNoWrongRead(t *testing.T, errs []error, when string) {
	t.Helper()
	for w, err := range errs {
		var bad *durableBlockError
		require.NotErrorAs(t, err, &bad, "%s, worker %d", when, w)
	}
}

// behind counts the blocks c holds older than their last durable write, changing nothing.
func (m *durableModel) behind(t *testing.T, c *client.Client) int {
	t.Helper()
	n := 0
	buf := make([]byte, blockBytes)
	for b := range m.blocks {
		_, err := c.ReadAt(buf, int64(b)*blockBytes)
		require.NoError(t, err)
		s := &m.blocks[b]
		if matchWrite(b, buf, append([]uint64{s.durable}, s.since...)) < 0 {
			n++
		}
	}
	return n
}

// replicaState is one replica's entry in `tierblk stats --json`.
type replicaState struct {
	Name    string `json:"name"`
	State   string `json:"state"`
	Losses  uint64 `json:"losses"`
	Resyncs uint64 `json:"resyncs"`
}

// replicaStats returns the mode of the one export's cache and its replicas' states.
func replicaStats(t *testing.T, admin string) (string, []replicaState) {
	t.Helper()
	var resp struct {
		Exports []struct {
			Stats    cacheStats     `json:"stats"`
			Replicas []replicaState `json:"replicas"`
		} `json:"exports"`
	}
	out := statsJSON(t, admin, &resp)
	require.Len(t, resp.Exports, 1, out)
	return resp.Exports[0].Stats.Mode, resp.Exports[0].Replicas
}

// TestReplicaLostAndBack: the replica's daemon killed under the kill -9 checker's workload makes
// the primary (on_replica_loss: writethrough, the default) write its dirty data back and write
// through, FLUSHes going on; the replica restarted on the same address is resynchronised and
// write-back resumes. Then the primary dies (-9, its SSD tier deleted) and a drain of the replica
// gives the backend every durable write: nothing acknowledged was lost across the loss.
func TestReplicaLostAndBack(t *testing.T) {
	const (
		seed    = 12
		region  = 8 << 20
		workers = 4
	)
	image := filepath.Join(shortTempDir(t), "nas.img")
	backend := fmt.Sprintf("file://%s?size=%d", image, region)
	logFile := filepath.Join(shortTempDir(t), "nas.replica")
	tcp := freeTCPAddr(t)
	replicaArgs := []string{"replica", "serve", "--log", logFile, "--size", "64MiB", "--export", "nas", "--nbd", tcp}
	peer := startDaemon(t, tierblkPath, replicaArgs, tcp)
	o := cacheOpts{backend: backend, dir: shortTempDir(t), ram: "0", ssdSize: "16MiB", line: "64KiB", mode: "writeback"}
	d := startServe(t, append(o.args(), "--replica", "nbd://"+tcp+"/nas?reconnect-wait=2s", "--dirty-high", "0.9", "--dirty-max", "0.95")...)
	c := dialNBD(t, d.Unix)
	m := newDurableModel(region / blockBytes)
	var acked, flushed atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wrng := rand.New(rand.NewPCG(seed, uint64(w+1)))
		wg.Go(func() { errs[w] = m.work(ctx, c, wrng, w, workers, &acked, &flushed) })
	}
	flushes := func(n int64) {
		t.Helper()
		before := flushed.Load()
		require.Eventually(t, func() bool { return flushed.Load() >= before+n }, 2*time.Minute, 10*time.Millisecond)
	}
	flushes(10)
	mode, reps := replicaStats(t, o.admin())
	require.Equal(t, "writeback", mode)
	require.Len(t, reps, 1)
	require.Equal(t, "ok", reps[0].State)

	peer.stop(syscall.SIGKILL)
	require.Eventually(t, func() bool {
		mode, reps := replicaStats(t, o.admin())
		return mode == "writethrough" && reps[0].State != "ok" && reps[0].Losses == 1
	}, 2*time.Minute, 50*time.Millisecond, "the primary never took the replica for lost")
	flushes(10) // FLUSHes go on without the replica

	peer = startDaemon(t, tierblkPath, replicaArgs, tcp)
	require.Eventually(t, func() bool {
		mode, reps := replicaStats(t, o.admin())
		return mode == "writeback" && reps[0].State == "ok" && reps[0].Resyncs == 1
	}, 2*time.Minute, 50*time.Millisecond, "the replica was never brought back")
	flushes(10)

	d.stop(syscall.SIGKILL)
	cancel()
	wg.Wait()
	c.Close()
	requireNoWrongRead(t, errs, "the run")
	require.NoError(t, os.RemoveAll(o.dir), "the dead host's SSD tier and metadata")
	peer.requireStop(syscall.SIGTERM)
	code, out := runTierblk(t, "replica", "drain", "--log", logFile, "--backend", backend, "--force")
	require.Zero(t, code, out)
	t.Log(out)
	direct := dialNBD(t, startNbdkit(t, "file", image))
	m.verify(t, direct, "on the backend after the drain")
	require.NoError(t, direct.Close())
	t.Logf("%d writes acknowledged, %d flushes completed", acked.Load(), flushed.Load())
}

// TestReplicaRefusesALiar: a primary refuses to start over a replica it cannot trust, with a clear
// error: an export that keeps nothing written to it (nbdkit's null plugin), or one too small for a
// log.
func TestReplicaRefusesALiar(t *testing.T) {
	requireTools(t, "nbdkit")
	for _, tc := range []struct {
		name   string
		nbdkit []string
		want   string
	}{
		{"keeps nothing", []string{"null", "64M"}, "did not keep the new log's superblock"},
		{"too small", []string{"memory", "64K"}, "is too small for a log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := startNbdkit(t, tc.nbdkit...)
			o := cacheOpts{backend: "file://" + filepath.Join(shortTempDir(t), "nas.img") + "?size=8MiB", dir: shortTempDir(t), ram: "0", ssdSize: "16MiB", line: "64KiB", mode: "writeback"}
			args := append(append([]string{"serve"}, o.args()...), "--replica", unixURI(sock, ""), "--nbd", "unix:"+filepath.Join(o.dir, "nbd.sock"))
			code, out := runTierblk(t, args...)
			require.Equal(t, 1, code, out)
			require.Contains(t, out, tc.want)
		})
	}
}

// TestKernelReplicaHostDeath: the primary's host dies under ext4 and a writer that fsyncs every
// file, in a real kernel; the replica's log, drained to the NAS or taken over by a new primary,
// gives back every fsynced file (vm/guest/replica-death.sh).
func TestKernelReplicaHostDeath(t *testing.T) {
	runVM(t, "vm/guest/replica-death.sh", "64M")
}
