package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierblk/tierblk/internal/cache"
)

// tierMetric is one per-tier series, read from a TierStats.
type tierMetric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(cache.TierStats) float64
}

// backendMetric is one per-export backend series, read from an IOStats.
type backendMetric struct {
	desc  *prometheus.Desc
	value func(cache.IOStats) float64
}

func tierDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"export", "tier"}, nil)
}

func backendDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"export"}, nil)
}

var (
	tierMetrics = []tierMetric{
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
		{tierDesc("tierblk_cache_tier_failed", "1 once this tier is bypassed after I/O errors, else 0."), prometheus.GaugeValue,
			func(t cache.TierStats) float64 {
				if t.Failed {
					return 1
				}
				return 0
			}},
	}
	backendMetrics = []backendMetric{
		{backendDesc("tierblk_backend_reads_total", "Read requests sent to the backend."),
			func(s cache.IOStats) float64 { return float64(s.Reads) }},
		{backendDesc("tierblk_backend_writes_total", "Write requests sent to the backend."),
			func(s cache.IOStats) float64 { return float64(s.Writes) }},
		{backendDesc("tierblk_backend_read_bytes_total", "Bytes read from the backend."),
			func(s cache.IOStats) float64 { return float64(s.ReadBytes) }},
		{backendDesc("tierblk_backend_write_bytes_total", "Bytes written to the backend."),
			func(s cache.IOStats) float64 { return float64(s.WriteBytes) }},
		{backendDesc("tierblk_backend_errors_total", "Backend requests that failed."),
			func(s cache.IOStats) float64 { return float64(s.Errors) }},
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
	ch <- requestDuration
}

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range c.sources() {
		s := src.Stats()
		for _, t := range s.Tiers {
			for _, m := range tierMetrics {
				ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(t), src.Export, t.Name)
			}
		}
		for _, m := range backendMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, m.value(s.Backend), src.Export)
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
