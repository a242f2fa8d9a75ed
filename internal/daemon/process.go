package daemon

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/process"
	"github.com/tierblk/tierblk/internal/runlog"
	"github.com/tierblk/tierblk/internal/ublk"
	"github.com/tierblk/tierblk/internal/volume"
)

// servingOOMScore is the oom_score_adj the daemon takes while it serves a kernel device, as
// configs/tierblk@.service sets it: the OOM killer then takes almost anything else first, since
// killing the daemon fails every I/O of the device and may leave its file system unmountable.
const servingOOMScore = -900

// runtimeMemory is the Go runtime's share of the daemon's memory bound: its own structures, the
// goroutines' stacks, and the small objects of the requests in flight and of the tiers' upkeep
// (a reclaim's list of units to move). The other parts of the bound are each bounded by what
// makes them (planMemory). The bound is on the memory the daemon holds (anonymous and shared:
// what the kernel cannot take back), not on the pages of its binary and of the metadata store's
// tables, which the kernel reclaims under pressure. integration's TestMemoryPressure holds the
// daemon to it under a writer in a small VM, TestMemoryBoundNBD under many large requests.
const runtimeMemory = 16 << 20

// kernelDevices reports whether cfg serves a device of this machine's kernel (ublk or the kernel
// NBD client), whose writers the daemon must never wait on.
func kernelDevices(cfg config.Config) bool {
	for _, e := range cfg.Exports {
		if e.UBLK != nil || e.NBDDevice != "" {
			return true
		}
	}
	return false
}

// setUpProcess asks the kernel for what a daemon serving block devices needs (package process),
// before any export is opened, and says what it got. Only lock_memory, which the user asked for,
// fails the start; the rest are warned about where a kernel device is served and they failed.
func setUpProcess(cfg config.Config, log *slog.Logger) (metrics.ProcessStats, error) {
	var st metrics.ProcessStats
	kernel := kernelDevices(cfg)
	if err := process.SetIOFlusher(); err != nil {
		level := slog.LevelDebug
		if kernel {
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, "not an I/O flusher: a writer filling the page cache of a device this daemon serves can stall it", "err", err)
		st.IOFlusherError = err.Error()
	} else {
		st.IOFlusher = true
		log.Debug("every thread is an I/O flusher (PR_SET_IO_FLUSHER)")
	}
	if kernel {
		from, err := process.LowerOOMScore(servingOOMScore)
		switch {
		case err != nil:
			log.Warn("could not lower the OOM score while serving kernel devices: the OOM killer may choose this daemon and fail their I/O", "err", err)
		case from > servingOOMScore:
			log.Info("oom_score_adj lowered while serving kernel devices", "from", from, "to", servingOOMScore)
		}
	}
	if cfg.LockMemory {
		if err := process.LockMemory(); err != nil {
			return st, err
		}
		st.MemoryLocked = true
		log.Info("memory locked in RAM (lock_memory)")
	}
	return st, nil
}

// memoryPlan is the daemon's memory bound and its parts.
type memoryPlan struct {
	ramTier, index, metadata, bound uint64
	// ioMax is the request buffers, at most: the NBD server's payloads and the ublk devices'.
	ioMax uint64
	// work is the caches' buffers, at most: a copy of each request in flight (a compressed unit,
	// a read miss's fetch, a partial block's read-modify-write: no larger than the request, whose
	// buffer ioMax bounds), and the destagers' buffers and packed tiers' reclaim lists.
	work uint64
	// pooled is the part of ioMax and work in the process's pool of buffers (bufpool), which
	// keeps that much through garbage collections.
	pooled uint64
	// outsideGo is the part of the bound outside the Go runtime's count: mapped files (the run
	// logs, the metadata stores' logs) and the ublk buffers.
	outsideGo uint64
	ublk      uint64 // the ublk devices' buffers
	// memBackends are the bytes of mem:// backends, on the heap, in the bound.
	memBackends uint64
}

// planMemory adds up the bound: the caches' RAM tiers and indexes (with the SSD tiers' run logs,
// the index's journal on /run), their metadata stores, the request buffers and the caches' work
// buffers, runtimeMemory, and the mem:// backends.
func planMemory(cfg config.Config, caches []*cache.Cache, vols []*volume.Volume) memoryPlan {
	var p memoryPlan
	stores, devices := 0, 0
	var tierWork uint64 // the destagers' buffers, the reclaims' lists
	// NBD payloads are held only where NBD clients can come: a listener or a kernel NBD device
	// (served through the same server). A daemon serving ublk devices alone holds none.
	nbd := len(cfg.Listen) > 0
	for i, c := range caches {
		if cfg.Exports[i].NBDDevice != "" {
			nbd = true
		}
		if strings.HasPrefix(cfg.Exports[i].Backend, "mem://") {
			// A backend in RAM, as asked: its bytes are on the heap, past any bound of ours.
			p.memBackends += uint64(vols[i].Info().Size)
		}
		if c != nil {
			r, x, d := c.MemoryPlan()
			p.ramTier += r
			p.index += x
			tierWork += d
			if cfg.Exports[i].Cache != nil && cfg.Exports[i].Cache.SSD != "" {
				stores++
			}
		}
		if cfg.Exports[i].UBLK != nil {
			devices++
		}
	}
	runLogs := uint64(stores) * runlog.DefaultSize
	p.index += runLogs
	p.metadata = uint64(stores) * meta.BadgerMemoryBytes
	p.ublk = uint64(devices) * ublk.DefaultBufferBytes
	var payloads uint64
	if nbd {
		payloads = server.DefaultPayloadBytes * 5 / 4 // and the read-ahead's quarter
	}
	p.ioMax = payloads + p.ublk
	p.work = p.ioMax + tierWork
	p.pooled = payloads + p.work
	p.bound = p.ramTier + p.index + p.metadata + p.ioMax + p.work + runtimeMemory + p.memBackends
	p.outsideGo = runLogs + uint64(stores)*meta.BadgerMappedBytes + p.ublk
	return p
}

// processPlans sums the memory plans of the daemons that run in this process: one, or one a volume in
// the CSI node plugin (internal/csi), whose memory is one process's.
var processPlans struct {
	sync.Mutex
	bound, outsideGo uint64
}

// processBound is the bound of all the daemons running in this process.
func processBound() uint64 {
	processPlans.Lock()
	defer processPlans.Unlock()
	return processPlans.bound
}

// limitGo adds p to the process's plans and sets the Go runtime's memory limit so that its heap,
// the part that grows with load, keeps the process within its bound: the garbage collector works
// harder near it rather than let the heap double. The returned release takes p out again when
// its daemon stops. A GOMEMLIMIT in the environment is the user's, and stays.
func limitGo(p memoryPlan, log *slog.Logger) (release func()) {
	set := func(sign int) {
		processPlans.Lock()
		defer processPlans.Unlock()
		if sign > 0 {
			processPlans.bound += p.bound
			processPlans.outsideGo += p.outsideGo
		} else {
			processPlans.bound -= p.bound
			processPlans.outsideGo -= p.outsideGo
		}
		bufpool.AddBudget(int64(sign) * int64(p.pooled))
		limit := int64(math.MaxInt64)
		if processPlans.bound > 0 {
			limit = plannedGoLimitLocked()
		}
		setGoLimit(limit)
	}
	set(1)
	log.Info("memory", "bound", p.bound, "ram_tier", p.ramTier, "index", p.index, "process_bound", processBound())
	return func() { set(-1) }
}

// plannedGoLimitLocked is the Go runtime's share of the bound when every part outside it holds
// the most its plan lets it (mapped files, the ublk buffers). The caller holds processPlans.
func plannedGoLimitLocked() int64 {
	return int64(processPlans.bound - processPlans.outsideGo)
}

// setGoLimit sets the Go runtime's memory limit, unless the environment has one (GOMEMLIMIT).
//
// The limit is soft: on a machine whose CPU is busy elsewhere (the runtime caps the collector's
// share of it) the heap may pass it for moments (bench memory measures the peaks). A limit set
// lower, to leave room for those, had the collector run ten times as often on the 1 MiB hit path
// and cost it a third of its CPU.
func setGoLimit(limit int64) {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(limit)
	}
}

// followGoLimit gives the Go runtime, besides what it counts now (m), the part of the bound the
// process does not hold now, less goLimitMargin for what may grow until the next sample: never
// less than its planned share, never more than the bound. The planned share alone assumes the
// parts outside the runtime full (the run logs, the ublk buffers) and counts the runtime's own
// pages whether resident or not; with it the collector, the pooled buffers, the RAM tiers and the
// indexes all live, had almost no room under the limit while the process held well under its
// bound, and ran after every few hundred KiB allocated (a CPU profile of TestMemoryPressure's
// write-back runs in the guest shows it). A sample that finds the process over its bound takes
// the excess from the runtime's share, down to the planned one.
func followGoLimit(m process.Memory) {
	processPlans.Lock()
	defer processPlans.Unlock()
	if processPlans.bound == 0 {
		return
	}
	inGo := int64(m.GoHeap + m.GoFree + m.GoOther)
	free := int64(processPlans.bound) - int64(m.Held) - goLimitMargin
	setGoLimit(min(max(inGo+free, plannedGoLimitLocked()), int64(processPlans.bound)))
}

// goLimitMargin is what followGoLimit keeps of the bound for the process's growth between two
// samples (allocations and run-log appends in memorySampleEvery). Whether it is enough is what
// bench memory's held peak against the bound shows.
const goLimitMargin = 8 << 20

// memorySampleEvery is how often memoryWatch reads /proc/self/status: often enough to see the
// short peaks of a garbage-collected heap, for a few microseconds each time.
const memorySampleEvery = 200 * time.Millisecond

// memoryWatch samples the daemon's memory every memorySampleEvery for the peak of what it holds, which the
// kernel does not track (VmHWM counts the binary's pages too), and warns, at most once a minute,
// while it is above its bound.
type memoryWatch struct {
	plan memoryPlan
	log  *slog.Logger
	peak atomic.Uint64
	warn time.Time
}

func (w *memoryWatch) sample() process.Memory {
	m, err := process.ReadMemory()
	if err != nil {
		w.log.Debug("reading the daemon's memory", "err", err)
		return m
	}
	for p := w.peak.Load(); m.Held > p && !w.peak.CompareAndSwap(p, m.Held); p = w.peak.Load() {
	}
	return m
}

// run samples until ctx ends.
func (w *memoryWatch) run(ctx context.Context) {
	t := time.NewTicker(memorySampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m, bound := w.sample(), processBound()
			if m.RSS > 0 {
				followGoLimit(m)
			}
			// No bound yet (0) while the daemon starts: nothing to hold it to.
			if bound > 0 && m.Held > bound && now.Sub(w.warn) >= time.Minute {
				w.warn = now
				w.log.Warn("the daemon holds more memory than its bound", "held", m.Held, "bound", bound,
					"go_heap", m.GoHeap, "rss", m.RSS)
			}
		}
	}
}

// stats reads the daemon's figures for /stats and /metrics.
func (w *memoryWatch) stats(st metrics.ProcessStats, srv *server.Server) func() metrics.Daemon {
	return func() metrics.Daemon {
		m := w.sample()
		if b, err := os.ReadFile(process.OOMScoreFile); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				st.OOMScoreAdj = n
			}
		}
		held, _ := srv.PayloadBytes()
		p := w.plan
		return metrics.Daemon{Process: st, Memory: metrics.MemoryStats{
			Memory: m, Bound: processBound(), RAMTier: p.ramTier, Index: p.index, Metadata: p.metadata,
			IO: uint64(held) + p.ublk, IOMax: p.ioMax, Work: p.work, Runtime: runtimeMemory, HeldPeak: w.peak.Load(),
		}}
	}
}
