package replica

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

const (
	testBlock   = 4 << 10
	testLine    = 16 << 10
	testVolume  = 1 << 20
	testLogSize = 8<<10 + 2<<20
)

// primary is a write-back cache over a backend that can be made to die (fault), replicated to
// one log device.
type primary struct {
	b     *fault.Backend
	inner *mem.Mem
	ssd   *mem.Mem // the SSD tier's device
	c     *cache.Cache
	r     *Replicated
	logs  []*fault.Backend
	model []byte // what every acknowledged change made the volume
	mu    sync.Mutex
}

func newPrimary(t *testing.T, onLoss string, logSize int64, replicas int, tweaks ...func(*cache.Config, *Options)) *primary {
	t.Helper()
	p := &primary{inner: mem.New(testVolume), ssd: mem.New(2 * testVolume), model: make([]byte, testVolume)}
	p.b = fault.New(p.inner, fault.Options{})
	cfg := cache.Config{LineSize: testLine, Mode: cache.WriteBack, BackendID: "test",
		SSD: cache.TierConfig{Size: 2 * testVolume, Admission: "always"}, SSDDevice: p.ssd, Meta: meta.NewMem(),
		// The tier holds the whole volume and never has more than half of its lines dirty: the
		// destager leaves the dirty data alone, and only the replicas' releases write it back.
		WriteBack: cache.WriteBackConfig{Throttle: "none", High: 0.9, Low: 0.8, Max: 0.95}}
	o := Options{OnLoss: onLoss, Retry: 10 * time.Millisecond, Check: time.Millisecond}
	for _, tweak := range tweaks {
		tweak(&cfg, &o)
	}
	c, err := cache.New(p.b, cfg)
	require.NoError(t, err)
	p.c = c
	var peers []Peer
	for i := range replicas {
		d := fault.New(mem.New(logSize), fault.Options{})
		p.logs = append(p.logs, d)
		peers = append(peers, Peer{Name: fmt.Sprintf("peer%d", i), Dev: &holdingDev{Backend: d}})
	}
	p.r, err = Replicate(volume.New(c, volume.Options{}), c, peers, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		p.r.Close()
		c.Close()
	})
	return p
}

// write writes n random blocks at block b through the replicated volume, and into the model once
// acknowledged.
func (p *primary) write(t *testing.T, rng *rand.Rand, b, n int, fua bool) {
	t.Helper()
	buf := make([]byte, n*testBlock)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	require.NoError(t, p.r.WriteAt(buf, int64(b)*testBlock, fua))
	p.mu.Lock()
	copy(p.model[b*testBlock:], buf)
	p.mu.Unlock()
}

// workload writes, trims, zeroes and flushes at random, count requests from workers goroutines on
// disjoint blocks.
func (p *primary) workload(t *testing.T, seed uint64, workers, count int) {
	t.Helper()
	var wg sync.WaitGroup
	blocks := testVolume / testBlock / workers
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for range count {
				b := w*blocks + rng.IntN(blocks-4)
				n := 1 + rng.IntN(4)
				switch k := rng.IntN(20); {
				case k == 0:
					require.NoError(t, p.r.Flush())
				case k == 1:
					require.NoError(t, p.r.WriteZeroes(int64(b)*testBlock, int64(n)*testBlock, volume.ZeroFlags{}))
					p.mu.Lock()
					clear(p.model[b*testBlock : (b+n)*testBlock])
					p.mu.Unlock()
				default:
					p.write(t, rng, b, n, k == 2)
				}
			}
		})
	}
	wg.Wait()
}

// die is the primary's host dying: from now on nothing reaches the backend, and the SSD tier is
// gone with it. It returns a copy of the backend as the host left it.
//
// Writes stream to the replicas behind their acknowledgement, so a death loses the records still
// on their way; the contract covers only what a FLUSH or FUA write waited for. The tests model
// every acknowledged write (p.model), so the host dies once the records sent have reached the
// logs, as a network that delivered what it was given would have it.
func (p *primary) die(t *testing.T) *mem.Mem {
	t.Helper()
	for _, pe := range p.r.peers {
		if l := pe.log.Load(); l != nil {
			require.Eventually(t, func() bool {
				l.wmu.Lock()
				defer l.wmu.Unlock()
				return l.pending == 0
			}, 10*time.Second, time.Millisecond, "the records sent reach the log")
		}
	}
	p.b.SetFailing(true)
	got := make([]byte, testVolume)
	_, err := p.inner.ReadAt(got, 0)
	require.NoError(t, err)
	after := mem.New(testVolume)
	_, err = after.WriteAt(got, 0)
	require.NoError(t, err)
	return after
}

// diesAndDrains is the primary's death and the drain of its first replica into what the backend
// held then, which must then hold every acknowledged change.
func (p *primary) diesAndDrains(t *testing.T, what string) {
	t.Helper()
	after := p.die(t)
	_, err := Drain(p.logs[0], after, nil)
	require.NoError(t, err)
	requireVolume(t, p.model, after, what)
}

func requireVolume(t *testing.T, want []byte, b *mem.Mem, what string) {
	t.Helper()
	got := make([]byte, testVolume)
	_, err := b.ReadAt(got, 0)
	require.NoError(t, err)
	for off := 0; off < testVolume; off += testBlock {
		if !bytes.Equal(got[off:off+testBlock], want[off:off+testBlock]) {
			t.Fatalf("%s: block %d differs from the last acknowledged change", what, off/testBlock)
		}
	}
}

// TestReplicatedDrainHasEveryWrite: a primary that dies with dirty data the backend lacks loses
// nothing once its replica's log is drained (the memory devices keep every write, so every
// acknowledged write must be there, not only the flushed ones).
func TestReplicatedDrainHasEveryWrite(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d-replicas", replicas), func(t *testing.T) {
			p := newPrimary(t, OnLossWriteThrough, testLogSize, replicas)
			p.workload(t, 1, 4, 300)
			require.Positive(t, p.c.Stats().Dirty.Bytes, "the test proves nothing without dirty data")
			after := p.die(t)
			left := make([]byte, testVolume)
			_, err := after.ReadAt(left, 0)
			require.NoError(t, err)
			require.NotEqual(t, p.model, left, "the backend alone already holds everything: the test proves nothing")
			for i, l := range p.logs {
				b := mem.New(testVolume)
				_, err := b.WriteAt(left, 0)
				require.NoError(t, err)
				st, err := Drain(l, b, nil)
				require.NoError(t, err)
				require.Positive(t, st.Writes)
				requireVolume(t, p.model, b, fmt.Sprintf("replica %d drained", i))
			}
		})
	}
}

// TestReplicatedReleases: once the cache has written the dirty data back, the log is released.
func TestReplicatedReleases(t *testing.T) {
	p := newPrimary(t, OnLossWriteThrough, testLogSize, 1)
	p.workload(t, 2, 2, 100)
	require.Positive(t, p.r.Stats()[0].LagBytes+int64(p.c.Stats().Dirty.Bytes))
	require.NoError(t, p.c.FlushAll(t.Context(), nil))
	require.Eventually(t, func() bool { return p.r.Stats()[0].LagBytes == 0 }, 10*time.Second, time.Millisecond)
	st, err := Drain(p.logs[0], mem.New(testVolume), nil)
	require.NoError(t, err)
	require.Zero(t, st.Writes+st.Zeroes+st.Trims, "a released log still had changes to drain (a heartbeat's flush record may follow the release)")
}

// TestReplicatedLogFull: a log much smaller than what is written without a flush makes the cache
// write back and release; nothing waits for ever and nothing is lost.
func TestReplicatedLogFull(t *testing.T) {
	p := newPrimary(t, OnLossWriteThrough, 8<<10+1<<20, 1)
	// Writes alone, 8 MiB of them: a FLUSH would let the cache write epochs back on its own.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(3, uint64(w)))
			for range 512 {
				p.write(t, rng, w*64+rng.IntN(60), 1+rng.IntN(4), false)
			}
		})
	}
	wg.Wait()
	require.Positive(t, p.r.Stats()[0].FullWaits, "the log never filled: the test proves nothing")
	p.diesAndDrains(t, "drained after the log filled")
}

// TestReplicatedLossWriteThrough: a replica lost makes the cache write its dirty data back and
// write through, so a FLUSH still means the backend has everything; when the replica is back it is
// resynchronised and write-back resumes, and a drain then has everything again.
func TestReplicatedLossWriteThrough(t *testing.T) {
	// In address order under the watermarks the destager leaves dirty data alone: only what the
	// loss makes write back reaches the backend.
	p := newPrimary(t, OnLossWriteThrough, testLogSize, 1, func(c *cache.Config, _ *Options) { c.WriteBack.Order = cache.OrderAddress })
	rng := rand.New(rand.NewPCG(4, 0))
	p.workload(t, 4, 2, 100)
	p.logs[0].SetFailing(true)
	p.write(t, rng, 3, 2, false) // the write is acknowledged: the cache has it
	require.NoError(t, p.r.Flush())
	require.NotEqual(t, "ok", p.r.Stats()[0].State)
	require.Equal(t, cache.WriteThrough, p.c.Mode())
	requireVolume(t, p.model, p.inner, "the backend after a FLUSH with the replica lost")
	// Switched back to write-back by hand (tierblk mode) with the replica still lost: a FLUSH
	// still means the backend has every write.
	require.NoError(t, p.c.SetMode(t.Context(), cache.WriteBack, nil))
	p.write(t, rng, 20, 2, false)
	require.NoError(t, p.r.Flush())
	requireVolume(t, p.model, p.inner, "the backend after a FLUSH in write-back by hand, the replica lost")

	p.logs[0].SetFailing(false)
	require.Eventually(t, func() bool { return p.r.Stats()[0].State == "ok" }, 10*time.Second, time.Millisecond)
	require.Equal(t, cache.WriteBack, p.c.Mode())
	require.EqualValues(t, 1, p.r.Stats()[0].Resyncs)
	p.workload(t, 5, 2, 100)
	p.diesAndDrains(t, "drained after a resync")
}

// TestReplicatedLossWait: with on_replica_loss wait, a FLUSH waits for the replica to come back.
func TestReplicatedLossWait(t *testing.T) {
	p := newPrimary(t, OnLossWait, testLogSize, 1)
	rng := rand.New(rand.NewPCG(6, 0))
	p.workload(t, 6, 2, 50)
	p.logs[0].SetFailing(true)
	p.write(t, rng, 7, 1, false) // acknowledged once the cache has it; its record then fails
	require.Eventually(t, func() bool { return p.r.Stats()[0].State != "ok" }, 10*time.Second, time.Millisecond, "the replica lost")
	require.Equal(t, cache.WriteBack, p.c.Mode(), "wait keeps write-back")
	flushed := make(chan error, 1)
	go func() { flushed <- p.r.Flush() }()
	// Resyncs fail while the device does; the FLUSH is still waiting after one of them.
	require.Eventually(t, func() bool { return p.r.Stats()[0].LastError != "" && p.r.Stats()[0].State == "lost" }, 10*time.Second, time.Millisecond)
	select {
	case err := <-flushed:
		t.Fatalf("FLUSH returned (%v) with its replica lost", err)
	default:
	}
	p.logs[0].SetFailing(false)
	require.NoError(t, <-flushed)
	require.Equal(t, "ok", p.r.Stats()[0].State)
	p.write(t, rng, 9, 1, true)
	p.diesAndDrains(t, "drained after a wait")
}

// TestReplicatedRefusesADrainedLog: a primary whose replica's log was drained without it (the
// export taken over) must not start with the cache it had, whose lines may be older than the
// backend's now; with an empty cache it starts and the log is its again.
func TestReplicatedRefusesADrainedLog(t *testing.T) {
	p := newPrimary(t, OnLossWriteThrough, testLogSize, 1)
	p.workload(t, 7, 2, 50)
	after := p.die(t)
	_, err := Drain(p.logs[0], after, nil)
	require.NoError(t, err)

	// The same cache comes back (its host rebooted).
	p.b.SetFailing(false)
	_, err = Replicate(volume.New(p.c, volume.Options{}), p.c, []Peer{{Name: "peer0", Dev: p.logs[0]}}, Options{})
	require.ErrorContains(t, err, "its log was drained into the backend")

	// An empty cache over the drained backend starts.
	c := emptyCache(t, after)
	r, err := Replicate(volume.New(c, volume.Options{}), c, []Peer{{Name: "peer0", Dev: p.logs[0]}}, Options{})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	lr, err := Open(p.logs[0])
	require.NoError(t, err)
	require.False(t, lr.Drained(), "a new log")
}

// emptyCache is a write-back cache with nothing in it over b, closed at the test's end.
func emptyCache(t *testing.T, b backend.Backend) *cache.Cache {
	t.Helper()
	c, err := cache.New(b, cache.Config{LineSize: testLine, Mode: cache.WriteBack, BackendID: "test",
		SSD: cache.TierConfig{Size: 2 * testVolume}, SSDDevice: mem.New(2 * testVolume), Meta: meta.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// discarding is a device that acknowledges writes and keeps none, as a replica that lies would.
type discarding struct{ *mem.Mem }

func (discarding) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// TestReplicatedRefusesALyingReplica: a replica too small for a log, or one that does not keep
// what is written to it, is refused with a clear error before the export is served.
func TestReplicatedRefusesALyingReplica(t *testing.T) {
	for _, tc := range []struct {
		name string
		dev  backend.Backend
		want string
	}{
		{"too small", mem.New(64 << 10), "is too small for a log"},
		{"keeps nothing", discarding{mem.New(testLogSize)}, "the device did not keep the new log's superblock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := emptyCache(t, mem.New(testVolume))
			_, err := Replicate(volume.New(c, volume.Options{}), c, []Peer{{Name: "peer0", Dev: tc.dev}}, Options{})
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "replica peer0")
		})
	}
}

// holdingDev holds its writes while hold is on, until it is let go.
type holdingDev struct {
	backend.Backend
	mu      sync.Mutex
	held    chan struct{} // nil: writes go through
	waiting atomic.Int64
}

func (h *holdingDev) WriteAt(p []byte, off int64) (int, error) {
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	if held != nil {
		h.waiting.Add(1)
		<-held
		h.waiting.Add(-1)
	}
	return h.Backend.WriteAt(p, off)
}

func (h *holdingDev) hold() {
	h.mu.Lock()
	h.held = make(chan struct{})
	h.mu.Unlock()
}

func (h *holdingDev) letGo() {
	h.mu.Lock()
	close(h.held)
	h.held = nil
	h.mu.Unlock()
}

// TestReplicatedWritesStream: a write is acknowledged once the cache holds it, its record
// streaming to the replica behind it; a FLUSH, and a FUA write, wait until the replica has it.
func TestReplicatedWritesStream(t *testing.T) {
	p := newPrimary(t, OnLossWriteThrough, testLogSize, 1)
	dev := p.r.peers[0].Dev.(*holdingDev)
	rng := rand.New(rand.NewPCG(7, 7))
	dev.hold()
	for i := range 8 {
		p.write(t, rng, i*4, 4, false) // returns with the replica's device held
	}
	require.Eventually(t, func() bool { return dev.waiting.Load() > 0 }, 10*time.Second, time.Millisecond, "the records at the replica's device")
	flushed := make(chan error, 1)
	go func() { flushed <- p.r.Flush() }()
	fua := make(chan error, 1)
	go func() { fua <- p.r.WriteAt(make([]byte, testBlock), 40*testBlock, true) }()
	// Nothing the test can wait for says that they are waiting rather than not yet started; what
	// can fail is that either ends while the device holds the records.
	select {
	case err := <-flushed:
		t.Fatalf("a FLUSH ended (%v) with the replica's records held", err)
	case err := <-fua:
		t.Fatalf("a FUA write ended (%v) with the replica's records held", err)
	case <-time.After(50 * time.Millisecond):
	}
	dev.letGo()
	require.NoError(t, <-flushed)
	require.NoError(t, <-fua)
	p.mu.Lock()
	clear(p.model[40*testBlock : 41*testBlock])
	p.mu.Unlock()
	p.diesAndDrains(t, "after the held records went through")
}

// TestReplicatedCloseWhenHung: the export closes while its replica's device answers nothing and
// its loop waits on a heartbeat record: Close returns, without waiting for the replica.
func TestReplicatedCloseWhenHung(t *testing.T) {
	defer func(d time.Duration) { closeWait = d }(closeWait)
	closeWait = 10 * time.Millisecond
	p := newPrimary(t, OnLossWriteThrough, testLogSize, 1)
	dev := p.r.peers[0].Dev.(*holdingDev)
	defer dev.letGo()
	rng := rand.New(rand.NewPCG(9, 9))
	dev.hold()
	for i := range 8 {
		p.write(t, rng, i*4, 4, false)
	}
	l := p.r.peers[0].log.Load()
	written := l.Head().Seq
	require.Eventually(t, func() bool { return l.Head().Seq > written }, 10*time.Second, time.Millisecond,
		"the loop's heartbeat, after the writes, held with them")
	closed := make(chan error, 1)
	go func() { closed <- p.r.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Close waits for a replica that answers nothing")
	}
}

// TestReplicatedRepairsDamage: every byte of the SSD tier damaged, its dirty data is read back
// from the replica's log, not lost: every block reads as last written (zeroed ones too), and the
// cache counts them repaired.
func TestReplicatedRepairsDamage(t *testing.T) {
	// A log never full, and write-back in address order under the watermarks: nothing is
	// written back, so every block written is dirty when the tier is damaged.
	p := newPrimary(t, OnLossWriteThrough, 8*testLogSize, 1, func(c *cache.Config, _ *Options) { c.WriteBack.Order = cache.OrderAddress })
	p.workload(t, 11, 4, 200)
	require.NoError(t, p.r.Flush())
	require.NotZero(t, p.c.Stats().Dirty, "dirty data for the replica to hold")
	junk := make([]byte, p.ssd.Size())
	rand.NewChaCha8([32]byte{3}).Read(junk)
	_, err := p.ssd.WriteAt(junk, 0)
	require.NoError(t, err)
	got := make([]byte, testVolume)
	require.NoError(t, p.r.ReadAt(got, 0))
	require.True(t, bytes.Equal(p.model, got), "the volume as written, read over a damaged SSD tier")
	st := p.c.Stats()
	require.NotZero(t, st.Lost.Repaired, "blocks repaired from the replica")
	require.Zero(t, st.Lost.Blocks, "blocks lost")
}

// TestReplicatedTakeOver: a primary dies with changes the backend lacks; a new one, with an empty
// cache, on another host, started over the same replica, is refused unless the user allows a
// take-over, and then applies the dead one's log to the backend first and serves every
// acknowledged write. It refuses while the log's primary still writes it, and where two replicas
// both hold changes.
func TestReplicatedTakeOver(t *testing.T) {
	defer func(w func()) { takeOverWait = w }(takeOverWait)
	takeOverWait = func() {}

	t.Run("after-death", func(t *testing.T) {
		p := newPrimary(t, OnLossWriteThrough, testLogSize, 1)
		p.workload(t, 21, 4, 100)
		after := p.die(t)
		c := emptyCache(t, after)
		_, err := Replicate(volume.New(c, volume.Options{}), c, []Peer{{Name: "peer0", Dev: p.logs[0]}}, Options{})
		require.ErrorContains(t, err, "give --take-over", "a take-over the user did not ask for")
		r, err := Replicate(volume.New(c, volume.Options{}), c, []Peer{{Name: "peer0", Dev: p.logs[0]}}, Options{TakeOver: true})
		require.NoError(t, err)
		defer r.Close()
		requireVolume(t, p.model, after, "the backend after the take-over")
		got := make([]byte, testVolume)
		require.NoError(t, r.ReadAt(got, 0))
		require.True(t, bytes.Equal(p.model, got), "the volume served after the take-over")
		lr, err := Open(p.logs[0])
		require.NoError(t, err)
		_, err = lr.Next()
		require.ErrorIs(t, err, io.EOF, "a fresh log")
	})

	t.Run("primary-alive", func(t *testing.T) {
		p := newPrimary(t, OnLossWriteThrough, testLogSize, 1)
		p.workload(t, 22, 2, 20)
		takeOverWait = func() { // the old primary writes on meanwhile
			p.write(t, rand.New(rand.NewPCG(22, 22)), 1, 1, false)
			require.NoError(t, p.r.Flush())
		}
		c := emptyCache(t, mem.New(testVolume))
		_, err := Replicate(volume.New(c, volume.Options{}), c, []Peer{{Name: "peer0", Dev: p.logs[0]}}, Options{TakeOver: true})
		takeOverWait = func() {}
		require.ErrorContains(t, err, "being written by another primary")
	})

	t.Run("two-replicas", func(t *testing.T) {
		p := newPrimary(t, OnLossWriteThrough, testLogSize, 2)
		p.workload(t, 23, 2, 20)
		after := p.die(t)
		c := emptyCache(t, after)
		_, err := Replicate(volume.New(c, volume.Options{}), c, []Peer{{Name: "peer0", Dev: p.logs[0]}, {Name: "peer1", Dev: p.logs[1]}}, Options{TakeOver: true})
		require.ErrorContains(t, err, "both hold changes")
	})
}

// TestReplicatedLossWhenHung: a replica that stops answering (its link down, the peer hung) is lost
// once a call has waited Options.Timeout: a FLUSH waiting for it goes on as on_replica_loss says
// (write-through: once the dirty data is written back), and when the peer answers again it is
// resynchronised and trusted again, and a drain has everything.
func TestReplicatedLossWhenHung(t *testing.T) {
	p := newPrimary(t, OnLossWriteThrough, testLogSize, 1, func(_ *cache.Config, o *Options) { o.Timeout = 100 * time.Millisecond })
	dev := p.r.peers[0].Dev.(*holdingDev)
	rng := rand.New(rand.NewPCG(8, 8))
	p.workload(t, 8, 2, 50)
	dev.hold()
	for i := range 8 {
		p.write(t, rng, i*4, 4, false)
	}
	require.NoError(t, p.r.Flush(), "a FLUSH over a hung replica")
	st := p.r.Stats()[0]
	require.Equal(t, "lost", st.State)
	require.Contains(t, st.LastError, "has waited")
	require.Equal(t, cache.WriteThrough, p.c.Mode())
	direct := make([]byte, testVolume)
	_, err := p.inner.ReadAt(direct, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(p.model, direct), "the backend holds every write once the FLUSH is done")
	dev.letGo()
	require.Eventually(t, func() bool { return p.r.Stats()[0].State == "ok" }, time.Minute, time.Millisecond, "the replica back")
	require.Equal(t, cache.WriteBack, p.c.Mode())
	p.workload(t, 9, 2, 50)
	p.diesAndDrains(t, "drained after a hang")
}
