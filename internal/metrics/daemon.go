package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierblk/tierblk/internal/process"
)

// Daemon is the daemon's own state: what it asked of the kernel for itself, and its memory by
// part. /stats shows it as "process" and "memory"; /metrics as tierblk_memory_bytes and friends.
type Daemon struct {
	Process ProcessStats
	Memory  MemoryStats
}

// ProcessStats says what the daemon asked of the kernel for itself (internal/process).
type ProcessStats struct {
	IOFlusher bool `json:"io_flusher"` // every thread is PR_SET_IO_FLUSHER
	// IOFlusherError says why not, where the kernel refused it.
	IOFlusherError string `json:"io_flusher_error,omitempty"`
	OOMScoreAdj    int    `json:"oom_score_adj"` // the process's, as the daemon left it
	MemoryLocked   bool   `json:"memory_locked"` // mlockall (lock_memory)
}

// MemoryStats is the daemon's memory: the kernel's and Go's figures, the parts the daemon plans
// for, and the bound they make (docs/operations.md, "How much RAM").
type MemoryStats struct {
	process.Memory
	Bound    uint64 `json:"bound_bytes"`    // RAM tiers + indexes + the daemon's own share: RSS stays below it
	RAMTier  uint64 `json:"ram_tier_bytes"` // the RAM tiers' bytes
	Index    uint64 `json:"index_bytes"`    // the tiers' indexes, full
	Metadata uint64 `json:"metadata_bytes"` // the metadata stores' tables, at most
	IO       uint64 `json:"io_bytes"`       // request buffers held now: NBD payloads and ublk buffers
	IOMax    uint64 `json:"io_max_bytes"`   // ... at most
	Work     uint64 `json:"work_bytes"`     // the caches' buffers, at most: copies of requests in flight, the destagers'
	Runtime  uint64 `json:"runtime_bytes"`  // the Go runtime's share: its structures, stacks, small objects
	// HeldPeak is the most Held seen (sampled five times a second); Held and HeldPeak stay below Bound.
	HeldPeak uint64 `json:"held_peak_bytes"`
}

type daemonCollector struct{ read func() Daemon }

// DaemonStats is the collector of read's figures for /metrics; NewHandlers also shows them in
// /stats when it is among its collectors.
func DaemonStats(read func() Daemon) prometheus.Collector { return daemonCollector{read} }

var (
	memoryDesc = prometheus.NewDesc("tierblk_memory_bytes",
		"The daemon's memory by part: rss (resident), rss_peak, held (anonymous and shared: what the kernel cannot reclaim; "+
			"below the bound), held_peak, binary (of the shared, its binary's pages where it lies on a tmpfs: not held), go_heap, go_other (Go's runtime besides its heap), "+
			"ram_tier, index (full), metadata (at most), io (request buffers held now), io_max, work (the caches' buffers, at most), runtime (the Go runtime's share).", []string{"part"}, nil)
	memoryBoundDesc = prometheus.NewDesc("tierblk_memory_bound_bytes",
		"The most memory the daemon should hold (tierblk_memory_bytes{part=\"held\"}): the sum of ram_tier, index, metadata, io_max, work, runtime and any mem:// backends.", nil, nil)
	ioFlusherDesc = prometheus.NewDesc("tierblk_io_flusher",
		"1 when every thread of the daemon is marked PR_SET_IO_FLUSHER (never throttled for the dirty pages of a device it serves).", nil, nil)
	oomScoreDesc = prometheus.NewDesc("tierblk_oom_score_adj", "The daemon's oom_score_adj.", nil, nil)
)

func (daemonCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{memoryDesc, memoryBoundDesc, ioFlusherDesc, oomScoreDesc} {
		ch <- d
	}
}

func (c daemonCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.read()
	m := d.Memory
	for part, v := range map[string]uint64{"rss": m.RSS, "rss_peak": m.Peak, "held": m.Held, "held_peak": m.HeldPeak, "binary": m.Binary,
		"go_heap": m.GoHeap, "go_other": m.GoOther,
		"ram_tier": m.RAMTier, "index": m.Index, "metadata": m.Metadata, "io": m.IO, "io_max": m.IOMax,
		"work": m.Work, "runtime": m.Runtime} {
		ch <- prometheus.MustNewConstMetric(memoryDesc, prometheus.GaugeValue, float64(v), part)
	}
	ch <- prometheus.MustNewConstMetric(memoryBoundDesc, prometheus.GaugeValue, float64(m.Bound))
	flusher := 0.0
	if d.Process.IOFlusher {
		flusher = 1
	}
	ch <- prometheus.MustNewConstMetric(ioFlusherDesc, prometheus.GaugeValue, flusher)
	ch <- prometheus.MustNewConstMetric(oomScoreDesc, prometheus.GaugeValue, float64(d.Process.OOMScoreAdj))
}
