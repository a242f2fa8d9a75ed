package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierblk/tierblk/internal/cache"
)

// statMetric is one series read from a part S of a snapshot: a TierStats per tier, the backend's
// IOStats or the DirtyStats per export.
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

var (
	tierMetrics = []statMetric[cache.TierStats]{
		{tierDesc("tierblk_cache_hits_total", "Line lookups answered by this tier."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Hits) }},
		{tierDesc("tierblk_cache_misses_total", "Line lookups this tier could not answer."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Misses) }},
		{tierDesc("tierblk_cache_hit_bytes_total", "Bytes served from this tier."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.HitBytes) }},
		{tierDesc("tierblk_cache_promotions_total", "Lines promoted into this tier."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Promotions) }},
		{tierDesc("tierblk_cache_evictions_total", "Lines evicted from this tier."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Evictions) }},
		{tierDesc("tierblk_cache_invalidations_total", "Lines dropped because a write made them stale."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Invalidations) }},
		{tierDesc("tierblk_cache_errors_total", "I/O errors of this tier's storage."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Errors) }},
		{tierDesc("tierblk_cache_lines", "Lines held by this tier now."), prometheus.GaugeValue,
			func(t cache.TierStats) float64 { return float64(t.Lines) }},
		{tierDesc("tierblk_cache_capacity_lines", "Lines this tier can hold."), prometheus.GaugeValue,
			func(t cache.TierStats) float64 { return float64(t.Capacity) }},
		{tierDesc("tierblk_cache_bytes", "Bytes held by this tier now."), prometheus.GaugeValue,
			func(t cache.TierStats) float64 { return float64(t.LineBytes) }},
		{tierDesc("tierblk_cache_admitted_total", "Missed lines this tier's admission policy took."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Admitted) }},
		{tierDesc("tierblk_cache_rejected_total", "Missed lines this tier's admission policy turned away."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Rejected) }},
		{tierDesc("tierblk_cache_congested_total", "Missed lines turned away because this tier's device was congested (within rejected)."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Congested) }},
		{tierDesc("tierblk_cache_device_latency_seconds", "This tier's device's time per request, as the kernel measured it, over the last interval with requests (0: not measured)."), prometheus.GaugeValue,
			func(t cache.TierStats) float64 { return t.DeviceLatency }},
		{tierDesc("tierblk_cache_tier_bypasses_total", "Times this tier was bypassed after I/O or metadata errors."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Bypasses) }},
		{tierDesc("tierblk_cache_tier_heals_total", "Times this tier came back into service after a bypass."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Heals) }},
		{tierDesc("tierblk_cache_set_aside_lines", "Lines a bypassed tier keeps for its return, out of use."), prometheus.GaugeValue,
			func(t cache.TierStats) float64 { return float64(t.SetAside) }},
		{tierDesc("tierblk_cache_checkpoints_total", "Checkpoints that committed this tier's index."), prometheus.CounterValue,
			func(t cache.TierStats) float64 { return float64(t.Checkpoints) }},
		{tierDesc("tierblk_cache_tier_failed", "1 while this tier is bypassed after I/O or metadata errors (it is tried again with backoff), else 0."), prometheus.GaugeValue,
			func(t cache.TierStats) float64 {
				if t.Failed {
					return 1
				}
				return 0
			}},
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
		{exportDesc("tierblk_cache_dirty_bytes", "Bytes on the SSD tier the backend does not have yet (write-back)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return float64(d.Bytes) }},
		{exportDesc("tierblk_cache_dirty_ratio", "Dirty lines over the SSD tier's lines (write-back)."), prometheus.GaugeValue,
			func(d cache.DirtyStats) float64 { return d.Ratio }},
		{exportDesc("tierblk_cache_destaged_bytes_total", "Dirty bytes written back to the backend."), prometheus.CounterValue,
			func(d cache.DirtyStats) float64 { return float64(d.DestagedBytes) }},
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
	}
	requestDuration = prometheus.NewDesc("tierblk_request_duration_seconds",
		"Time to complete a client request through the cache.", []string{"export", "op"}, nil)
)

// cacheCollector turns the sources' snapshots into const metrics at every scrape, so the cache
// keeps its own lock-free counters and nothing is registered or unregistered as exports change.
type cacheCollector struct {
	sources func() []Source
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
	ch <- requestDuration
}

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range c.sources() {
		if src.Stats == nil {
			continue
		}
		s := src.Stats()
		for _, t := range s.Tiers {
			for _, m := range tierMetrics {
				ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(t), src.Export, t.Name)
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
		ch <- constHistogram(s.ReadLatency, src.Export, "read")
		ch <- constHistogram(s.WriteLatency, src.Export, "write")
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
