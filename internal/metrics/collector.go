package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/replica"
	"github.com/tierblk/tierblk/internal/sim"
)

// statMetric is one series read from a part S of a snapshot: a tierSnap per tier, the backend's
// IOStats, or the DirtyStats, LostStats or ScrubStats per export.
type statMetric[S any] struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(S) float64
}

func tierDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"export", "tier"}, nil)
}

// exportDesc is a per-export series.
func exportDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"export"}, nil)
}

// tierSnap is one tier's counters with the cache's line size, which turns counts of lines into
// bytes.
type tierSnap struct {
	cache.TierStats
	lineSize uint64
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var (
	tierMetrics = []statMetric[tierSnap]{
		{tierDesc("tierblk_cache_hits_total", "Line lookups answered by this tier."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Hits) }},
		{tierDesc("tierblk_cache_misses_total", "Line lookups this tier could not answer."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Misses) }},
		{tierDesc("tierblk_cache_hit_bytes_total", "Bytes served from this tier."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.HitBytes) }},
		{tierDesc("tierblk_cache_promotions_total", "Lines promoted into this tier."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Promotions) }},
		{tierDesc("tierblk_cache_evictions_total", "Lines evicted from this tier."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Evictions) }},
		{tierDesc("tierblk_cache_invalidations_total", "Lines dropped because a write made them stale."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Invalidations) }},
		{tierDesc("tierblk_cache_errors_total", "I/O errors of this tier's storage."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Errors) }},
		{tierDesc("tierblk_cache_checksum_errors_total", "Blocks read from this tier whose bytes did not match their checksums: clean ones were read from the backend again, dirty ones are lost (tierblk_cache_lost_blocks_total)."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.ChecksumErrors) }},
		{tierDesc("tierblk_cache_checksums_adopted_total", "Dirty blocks that did not match their checksums after an unclean stop (a write under way), taken as they were."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Adopted) }},
		{tierDesc("tierblk_cache_lines", "Lines held by this tier now."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return float64(t.Lines) }},
		{tierDesc("tierblk_cache_capacity_lines", "Lines this tier can hold."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return float64(t.Capacity) }},
		{tierDesc("tierblk_cache_bytes", "Bytes held by this tier now."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return float64(t.LineBytes) }},
		{tierDesc("tierblk_cache_logical_bytes", "Bytes of the valid blocks this tier holds, as clients read them."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return float64(t.LogicalBytes) }},
		{tierDesc("tierblk_cache_physical_bytes", "Bytes of the valid blocks this tier holds that are stored on its device (zero blocks are not)."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return float64(t.PhysicalBytes) }},
		{tierDesc("tierblk_cache_reduction_ratio", "Logical over physical bytes of this tier: 1 while it holds nothing, 0 while it holds only zero blocks."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return t.ReductionRatio }},
		{tierDesc("tierblk_cache_dedupe_hits_total", "Blocks this tier stored as one more reference to a unit holding their bytes (reduction dedupe)."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.DedupeHits) }},
		{tierDesc("tierblk_cache_dedupe_collisions_total", "Content hashes that named a unit with other bytes, caught by the byte compare (reduction dedupe)."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.DedupeCollisions) }},
		{tierDesc("tierblk_cache_admitted_total", "Missed lines this tier's admission policy took."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Admitted) }},
		{tierDesc("tierblk_cache_rejected_total", "Missed lines this tier's admission policy turned away."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Rejected) }},
		// node_exporter's bcache collector calls the I/O that skipped the cache bypassed
		// (node_bcache_bypassed_bytes_total); here it is the lines a tier did not take (read
		// misses, lines written through), counted whole, as the admission policy decides per line.
		{tierDesc("tierblk_cache_bypassed_bytes_total", "Bytes of lines this tier's admission policy turned away (read misses, lines written through), which bypassed the tier: rejected lines times the line size."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Rejected * t.lineSize) }},
		{tierDesc("tierblk_cache_congested_total", "Missed lines turned away because this tier's device was congested (within rejected)."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Congested) }},
		{tierDesc("tierblk_cache_tier_congested", "1 while this tier's device is congested and the tier admits no missed line, else 0."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return boolValue(t.CongestedNow) }},
		{tierDesc("tierblk_cache_device_latency_seconds", "This tier's device's time per request, as the kernel measured it, over the last interval with requests (0: not measured)."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return t.DeviceLatency }},
		{tierDesc("tierblk_cache_tier_bypasses_total", "Times this tier was bypassed after I/O or metadata errors."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Bypasses) }},
		{tierDesc("tierblk_cache_tier_heals_total", "Times this tier came back into service after a bypass."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Heals) }},
		{tierDesc("tierblk_cache_set_aside_lines", "Lines a bypassed tier keeps for its return, out of use."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return float64(t.SetAside) }},
		{tierDesc("tierblk_cache_checkpoints_total", "Checkpoints that committed this tier's index."), prometheus.CounterValue,
			func(t tierSnap) float64 { return float64(t.Checkpoints) }},
		{tierDesc("tierblk_cache_tier_failed", "1 while this tier is bypassed after I/O or metadata errors (it is tried again with backoff), else 0."), prometheus.GaugeValue,
			func(t tierSnap) float64 { return boolValue(t.Failed) }},
	}
	backendMetrics = []statMetric[cache.IOStats]{
		{exportDesc("tierblk_backend_reads_total", "Read requests sent to the backend."), prometheus.CounterValue,
			func(s cache.IOStats) float64 { return float64(s.Reads) }},
		{exportDesc("tierblk_backend_writes_total", "Write requests sent to the backend."), prometheus.CounterValue,
			func(s cache.IOStats) float64 { return float64(s.Writes) }},
		{exportDesc("tierblk_backend_read_bytes_total", "Bytes read from the backend."), prometheus.CounterValue,
			func(s cache.IOStats) float64 { return float64(s.ReadBytes) }},
		{exportDesc("tierblk_backend_write_bytes_total", "Bytes written to the backend."), prometheus.CounterValue,
			func(s cache.IOStats) float64 { return float64(s.WriteBytes) }},
		{exportDesc("tierblk_backend_errors_total", "Backend requests that failed."), prometheus.CounterValue,
			func(s cache.IOStats) float64 { return float64(s.Errors) }},
	}
	// readMetrics are the read amplification's two sides.
	readMetrics = []statMetric[cache.Stats]{
		{exportDesc("tierblk_cache_read_bytes_total", "Bytes clients read through the cache."), prometheus.CounterValue,
			func(s cache.Stats) float64 { return float64(s.ReadBytes) }},
		{exportDesc("tierblk_cache_fetched_bytes_total", "Bytes read misses fetched from the backend (over read_bytes: the read amplification)."), prometheus.CounterValue,
			func(s cache.Stats) float64 { return float64(s.FetchedBytes) }},
	}
	dirtyMetrics = []statMetric[cache.DirtyStats]{
		{exportDesc("tierblk_cache_dirty_lines", "Lines of the SSD tier holding data the backend does not have yet (write-back)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return float64(d.Lines) }},
		{exportDesc("tierblk_cache_dirty_data_bytes", "Bytes on the SSD tier the backend does not have yet (write-back)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return float64(d.Bytes) }},
		{exportDesc("tierblk_cache_dirty_ratio", "Dirty lines over the SSD tier's lines (write-back)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return d.Ratio }},
		{exportDesc("tierblk_cache_destaged_bytes_total", "Dirty bytes written back to the backend."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return float64(d.DestagedBytes) }},
		{exportDesc("tierblk_cache_destage_writes_total", "Backend writes that wrote dirty data back (after coalescing)."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return float64(d.DestageWrites) }},
		{exportDesc("tierblk_cache_destaging", "1 while the destager is writing dirty data back, else 0."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return boolValue(d.Destaging) }},
		{exportDesc("tierblk_cache_destage_errors_total", "Write-backs to the backend that failed (and are retried)."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return float64(d.DestageErrors) }},
		{exportDesc("tierblk_cache_destage_bytes_per_second", "How fast dirty data was written back over about the last second."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return d.DestageRate }},
		{exportDesc("tierblk_cache_throttle_delay_seconds", "The delay a write of one line gets now (write-back throttling)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return d.ThrottleDelay }},
		{exportDesc("tierblk_cache_throttled_writes_total", "Writes slowed down because dirty data neared its maximum."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return float64(d.ThrottledWrites) }},
		{exportDesc("tierblk_cache_throttle_seconds_total", "Delay given to throttled writes."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return d.ThrottleSeconds }},
		{exportDesc("tierblk_cache_backend_waits_total", "Retries of writes that had to reach a failing backend at once (around a full SSD tier)."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return float64(d.BackendWaits) }},
		{exportDesc("tierblk_cache_pending_epochs", "Write-back in FLUSH order: epochs (the writes between two FLUSHes) with data the backend does not have yet."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return float64(d.PendingEpochs) }},
		{exportDesc("tierblk_cache_backend_behind_seconds", "Write-back in FLUSH order: how long ago the first write the backend lacks was; the backend alone holds the device as it was then (0: nothing pending)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return d.BackendBehind }},
		{exportDesc("tierblk_cache_ghosts", "Write-back in FLUSH order: older versions of dirty blocks kept for their epoch's write back, which writes over those blocks replaced."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return float64(d.Ghosts) }},
		{exportDesc("tierblk_cache_ghost_bytes", "Write-back in FLUSH order: the bytes of the older versions of dirty blocks kept (tierblk_cache_ghosts)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return float64(d.GhostBytes) }},
		{exportDesc("tierblk_cache_ghosts_kept_total", "Write-back in FLUSH order: older versions of dirty blocks kept for writes over them since the start."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return float64(d.GhostsKept) }},
		{exportDesc("tierblk_cache_lost_epoch", "Write-back in FLUSH order: the oldest epoch that lost a dirty block to damage on the SSD tier (0: none); no later epoch is written back."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return float64(d.LostEpoch) }},
	}
	lostMetrics = []statMetric[cache.LostStats]{
		{exportDesc("tierblk_cache_lost_bytes", "Bytes in lost ranges now: dirty data the SSD tier damaged before it reached the backend; reads of them fail until they are written again."), prometheus.GaugeValue,
			func(l cache.LostStats) float64 { return float64(l.Bytes) }},
		{exportDesc("tierblk_cache_lost_blocks_total", "Dirty blocks lost since the start: they failed their checksums before they were written back."), prometheus.CounterValue,
			func(l cache.LostStats) float64 { return float64(l.Blocks) }},
	}
	// scrubMetrics describe the SSD tier's scrub under way, or the last one (zero before any).
	scrubMetrics = []statMetric[cache.ScrubStats]{
		{exportDesc("tierblk_cache_scrub_running", "1 while a scrub reads and checks the SSD tier's blocks, else 0."), prometheus.GaugeValue,
			func(s cache.ScrubStats) float64 { return boolValue(s.Running) }},
		{exportDesc("tierblk_cache_scrub_progress_ratio", "The lines the scrub under way (or the last one) has checked, over those the SSD tier held when it started; 0 before any scrub."), prometheus.GaugeValue,
			scrubProgress},
		{exportDesc("tierblk_cache_scrub_damaged_blocks", "Blocks that failed their checksums in the scrub under way, or the last one."), prometheus.GaugeValue,
			func(s cache.ScrubStats) float64 { return float64(s.Damaged) }},
		{exportDesc("tierblk_cache_scrub_last_end_time_seconds", "When the last scrub of the SSD tier ended, in seconds since the Unix epoch; 0 before any has ended since the start, and while one runs."), prometheus.GaugeValue,
			func(s cache.ScrubStats) float64 { return s.Ended }},
	}
	// dirtyWatermark is present for a cache with write-back set up (a maximum above 0).
	dirtyWatermark = prometheus.NewDesc("tierblk_cache_dirty_watermark_ratio",
		"Write-back's watermarks, as ratios of the SSD tier's lines (compare tierblk_cache_dirty_ratio): destage starts above high and stops below low; writes wait at max.",
		[]string{"export", "watermark"}, nil)
	modeInfo = prometheus.NewDesc("tierblk_cache_mode_info", "The cache's mode now, in the mode label (always 1).",
		[]string{"export", "mode"}, nil)
	flushesInProgress = exportDesc("tierblk_cache_flushes_in_progress",
		"Flushes and mode switches of the admin endpoint (tierblk flush, tierblk mode) running now; they write every dirty line back.")
	flushStart = exportDesc("tierblk_cache_flush_start_time_seconds",
		"When the oldest flush or mode switch of the admin endpoint running now started, in seconds since the Unix epoch; 0 while none runs.")
	requestDuration = prometheus.NewDesc("tierblk_request_duration_seconds",
		"Time to complete a client request through the cache.", []string{"export", "op"}, nil)
	// replicaMetrics are a replicated export's, one series per replica.
	replicaMetrics = []struct {
		desc  *prometheus.Desc
		typ   prometheus.ValueType
		value func(replica.PeerStats) float64
	}{
		{replicaDesc("tierblk_replica_up", "1 while the replica is in service (its log holds every change the backend lacks), 0 while lost or being resynchronised."), prometheus.GaugeValue,
			func(s replica.PeerStats) float64 { return b2f(s.State == "ok") }},
		{replicaDesc("tierblk_replica_lag_bytes", "Bytes of the replica's log not yet released: changes the backend may still lack."), prometheus.GaugeValue,
			func(s replica.PeerStats) float64 { return float64(s.LagBytes) }},
		{replicaDesc("tierblk_replica_losses_total", "Times the replica was lost (a write or flush to it failed)."), prometheus.CounterValue,
			func(s replica.PeerStats) float64 { return float64(s.Losses) }},
		{replicaDesc("tierblk_replica_resyncs_total", "Times a lost replica was brought back into service."), prometheus.CounterValue,
			func(s replica.PeerStats) float64 { return float64(s.Resyncs) }},
		{replicaDesc("tierblk_replica_flushes_total", "Flushes of the replica's log (FLUSH and FUA requests)."), prometheus.CounterValue,
			func(s replica.PeerStats) float64 { return float64(s.Flushes) }},
		{replicaDesc("tierblk_replica_flush_seconds_total", "Time spent in flushes of the replica's log: divided by tierblk_replica_flushes_total, a FLUSH's round trip to the peer."), prometheus.CounterValue,
			func(s replica.PeerStats) float64 { return float64(s.FlushNS) / 1e9 }},
	}
)

func replicaDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"export", "replica"}, nil)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// scrubProgress is the scrub's lines done over its lines, 1 for one that ended on an empty tier.
func scrubProgress(s cache.ScrubStats) float64 {
	switch {
	case s.Lines > 0:
		return float64(s.Done) / float64(s.Lines)
	case s.Ended > 0:
		return 1
	}
	return 0
}

// cacheCollector turns the sources' snapshots into const metrics at every scrape, so the cache
// keeps its own lock-free counters and nothing is registered or unregistered as exports change.
type cacheCollector struct {
	sources func() []Source
	flushes *flushTracker
}

func (c cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range tierMetrics {
		ch <- m.desc
	}
	for _, m := range backendMetrics {
		ch <- m.desc
	}
	for _, m := range readMetrics {
		ch <- m.desc
	}
	for _, m := range dirtyMetrics {
		ch <- m.desc
	}
	for _, m := range lostMetrics {
		ch <- m.desc
	}
	for _, m := range scrubMetrics {
		ch <- m.desc
	}
	ch <- dirtyWatermark
	ch <- modeInfo
	ch <- flushesInProgress
	ch <- flushStart
	ch <- requestDuration
	for _, m := range replicaMetrics {
		ch <- m.desc
	}
	ch <- curveMissRatio
	ch <- curveBest
	ch <- curveAdvice
}

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range c.sources() {
		if src.Stats == nil {
			continue
		}
		s := src.Stats()
		ch <- prometheus.MustNewConstMetric(modeInfo, prometheus.GaugeValue, 1, src.Export, s.Mode)
		for _, t := range s.Tiers {
			ts := tierSnap{TierStats: t, lineSize: uint64(s.LineSize)}
			for _, m := range tierMetrics {
				ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(ts), src.Export, t.Name)
			}
		}
		for _, m := range backendMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(s.Backend), src.Export)
		}
		for _, m := range readMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(s), src.Export)
		}
		for _, m := range dirtyMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(s.Dirty), src.Export)
		}
		for _, m := range lostMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(s.Lost), src.Export)
		}
		for _, m := range scrubMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(s.Scrub), src.Export)
		}
		if s.Dirty.Max > 0 {
			for _, w := range []struct {
				name  string
				ratio float64
			}{{"low", s.Dirty.Low}, {"high", s.Dirty.High}, {"max", s.Dirty.Max}} {
				ch <- prometheus.MustNewConstMetric(dirtyWatermark, prometheus.GaugeValue, w.ratio, src.Export, w.name)
			}
		}
		n, start := c.flushes.running(src.Export)
		ch <- prometheus.MustNewConstMetric(flushesInProgress, prometheus.GaugeValue, float64(n), src.Export)
		var started float64
		if n > 0 {
			started = float64(start.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(flushStart, prometheus.GaugeValue, started, src.Export)
		ch <- constHistogram(s.ReadLatency, src.Export, "read")
		ch <- constHistogram(s.WriteLatency, src.Export, "write")
		if src.Replicas != nil {
			for _, r := range src.Replicas() {
				for _, m := range replicaMetrics {
					ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(r), src.Export, r.Name)
				}
			}
		}
		if src.Curves != nil {
			collectCurves(ch, src.Export, src.Curves())
		}
	}
}

var (
	curveMissRatio = prometheus.NewDesc("tierblk_mrc_miss_ratio",
		"Estimated miss ratio of a cache of size_bytes running policy, over the live curves' window (tierblk stats --mrc); stream is all or reads, method mini (miniature simulation) or shards.",
		[]string{"export", "stream", "policy", "method", "size_bytes"}, nil)
	curveBest = prometheus.NewDesc("tierblk_mrc_best_hit_ratio",
		"Best estimated hit ratio of any policy at the live curves' largest sizes (up to 8 times the tier), over their window.",
		[]string{"export", "stream"}, nil)
	curveAdvice = prometheus.NewDesc("tierblk_mrc_advised_size_bytes",
		"The tier size at which its policy reaches share (0.9, 0.95, 0.99) of its best hit ratio up to 8 times today's size (tierblk_mrc_best_hit_ratio for the curves' tier; the RAM tier in front of it by LRU's curve); 0 when not reached there.",
		[]string{"export", "tier", "share"}, nil)
)

// collectCurves turns an export's live curves into gauges, one per stream, policy and size.
func collectCurves(ch chan<- prometheus.Metric, export string, c *sim.Curves) {
	if c == nil {
		return
	}
	for i, stream := range []string{"all", "reads"} {
		curves := c.All
		if i == 1 {
			curves = c.Reads
		}
		for _, cv := range curves {
			for si, size := range c.Sizes {
				ch <- prometheus.MustNewConstMetric(curveMissRatio, prometheus.GaugeValue, cv.MissRatio[si],
					export, stream, cv.Policy, cv.Method, strconv.FormatInt(int64(size)*c.LineSize, 10))
			}
		}
		ch <- prometheus.MustNewConstMetric(curveBest, prometheus.GaugeValue, c.BestHit[i], export, stream)
	}
	advice := func(tier string, a sim.Advice) {
		for _, x := range []struct {
			share string
			lines int
		}{{"0.9", a.For90}, {"0.95", a.For95}, {"0.99", a.For99}} {
			ch <- prometheus.MustNewConstMetric(curveAdvice, prometheus.GaugeValue, float64(int64(x.lines)*c.LineSize), export, tier, x.share)
		}
	}
	advice(c.Tier, c.Advice)
	if c.RAM != nil {
		advice("ram", c.RAM.Advice)
	}
}

// constHistogram converts a snapshot's per-bucket counts into the cumulative buckets Prometheus
// expects: bucket le=b counts every observation at most b. The +Inf bucket is the total, so the
// count is summed from the buckets rather than taken from h.Count, which keeps the two consistent.
func constHistogram(h cache.Histogram, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	var total uint64
	for i, n := range h.Counts {
		total += n
		if i < len(h.Bounds) {
			buckets[h.Bounds[i]] = total
		}
	}
	return prometheus.MustNewConstHistogram(requestDuration, total, h.Sum, buckets, labels...)
}

var refusedConnections = prometheus.NewDesc("tierblk_nbd_connections_refused_total",
	"NBD connections closed as they arrived, before the handshake, by reason: not allowed (--allow), too many connections, too many from one host.",
	[]string{"reason"}, nil)

// RefusedConnections collects the NBD server's counts of connections refused as they arrived, by
// reason (server.Server.RefusedConnections), read at every scrape.
type RefusedConnections func() map[string]uint64

func (c RefusedConnections) Describe(ch chan<- *prometheus.Desc) { ch <- refusedConnections }

func (c RefusedConnections) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c() {
		ch <- prometheus.MustNewConstMetric(refusedConnections, prometheus.CounterValue, float64(n), reason)
	}
}

// flushTracker knows which flushes and mode switches the admin endpoint is running, per export,
// and since when: the cache itself keeps no such record, and a flush that never ends (a backend
// that stopped answering) is what an alert must see.
type flushTracker struct {
	mu      sync.Mutex
	started map[string][]time.Time // per export, in the order they started
	now     func() time.Time
}

func newFlushTracker() *flushTracker {
	return &flushTracker{started: map[string][]time.Time{}, now: time.Now}
}

// begin records a flush of export starting now; the func it returns records its end.
func (f *flushTracker) begin(export string) (end func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.now()
	f.started[export] = append(f.started[export], t)
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			ts := f.started[export]
			for i, s := range ts {
				if s.Equal(t) {
					ts = append(ts[:i:i], ts[i+1:]...)
					break
				}
			}
			if len(ts) == 0 {
				delete(f.started, export)
			} else {
				f.started[export] = ts
			}
		})
	}
}

// running returns how many flushes of export run now and when the oldest of them started.
func (f *flushTracker) running(export string) (int, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ts := f.started[export]
	if len(ts) == 0 {
		return 0, time.Time{}
	}
	return len(ts), ts[0]
}
