package cache

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/meta"
)

// Stats is a snapshot of one cache's counters, for the admin endpoint and `tierblk stats`.
// Counters only grow; occupancy figures are as of the snapshot.
type Stats struct {
	Mode     string      `json:"mode"`
	LineSize int         `json:"line_size"`
	Tiers    []TierStats `json:"tiers"` // in lookup order: ram, then ssd
	Backend  IOStats     `json:"backend"`
	// ReadBytes are the bytes clients read; FetchedBytes those that read misses fetched from the
	// backend for them (and for prefetches). FetchedBytes/ReadBytes is the read amplification.
	ReadBytes    uint64 `json:"read_bytes"`
	FetchedBytes uint64 `json:"fetched_bytes"`
	// Dirty describes write-back: data on the SSD tier that the backend does not have yet.
	Dirty DirtyStats `json:"dirty"`
	// Lost describes the ranges whose dirty data the SSD tier damaged (ErrLost).
	Lost LostStats `json:"lost"`
	// Scrub describes the last scrub of the SSD tier, or the one under way (Cache.Scrub).
	Scrub ScrubStats `json:"scrub"`
	// ReadLatency and WriteLatency time whole client requests through the cache.
	ReadLatency  Histogram `json:"read_latency"`
	WriteLatency Histogram `json:"write_latency"`
}

// TierStats are the counters of one tier.
type TierStats struct {
	Name       string `json:"name"` // "ram" or "ssd"
	Policy     string `json:"policy"`
	Admission  string `json:"admission"`
	Hits       uint64 `json:"hits"`      // line lookups answered by this tier
	Misses     uint64 `json:"misses"`    // line lookups this tier could not answer
	HitBytes   uint64 `json:"hit_bytes"` // bytes served from this tier
	Promotions uint64 `json:"promotions"`
	// Admitted and Rejected count the admission policy's answers about missed lines.
	Admitted uint64 `json:"admitted"`
	Rejected uint64 `json:"rejected"`
	// Congested counts the misses refused (within Rejected) because the tier's device was
	// congested; CongestedNow says it is; DeviceLatency is the device's time per request, as the
	// kernel measured it, over the last interval with requests (SSD tier on a block device only).
	Congested     uint64  `json:"congested,omitempty"`
	CongestedNow  bool    `json:"congested_now,omitempty"`
	DeviceLatency float64 `json:"device_latency_seconds,omitempty"`
	Evictions     uint64  `json:"evictions"`
	// Invalidations count lines dropped because a write made them stale (write-around, trim).
	Invalidations uint64 `json:"invalidations"`
	Lines         uint64 `json:"lines"`    // lines held now
	Capacity      uint64 `json:"capacity"` // lines the tier can hold
	LineBytes     uint64 `json:"bytes"`    // bytes held now: Lines * line size
	// LogicalBytes are the bytes of the valid blocks the tier holds, as clients read them;
	// PhysicalBytes the part of those stored on its device (zero blocks are not, zero.go);
	// ReductionRatio is LogicalBytes / PhysicalBytes: 1 for a tier that holds nothing, 0 for one
	// that holds only zero blocks (no ratio). Reduction is what the tier stores no more of (the SSD
	// tier: Config.Reduction).
	LogicalBytes   uint64  `json:"logical_bytes"`
	PhysicalBytes  uint64  `json:"physical_bytes"`
	ReductionRatio float64 `json:"reduction_ratio"`
	Reduction      string  `json:"reduction,omitempty"`
	// With reduction dedupe: blocks stored as one more reference to a unit with their bytes, and
	// content hashes that named a unit with other bytes (caught by the byte compare, dedupe.go).
	DedupeHits       uint64 `json:"dedupe_hits,omitempty"`
	DedupeCollisions uint64 `json:"dedupe_collisions,omitempty"`
	Errors           uint64 `json:"errors"` // I/O errors of the tier's storage
	// ChecksumErrors counts the blocks read from the tier whose bytes did not match their
	// checksums (sum.go): each was read from the backend instead (clean) or is lost (dirty,
	// Stats.Lost).
	ChecksumErrors uint64 `json:"checksum_errors"`
	// Adopted counts the dirty blocks that held other bytes than their checksums after an
	// unclean stop (or a failed write), as a write under way may leave them, and were taken as
	// they were (sum.go).
	Adopted uint64 `json:"checksums_adopted,omitempty"`
	// Failed is set while the tier is bypassed (after I/O or metadata errors); Reason says why.
	// A bypassed tier is tried again with backoff, in RetryIn seconds, and comes back into service
	// when its storage and metadata work; SetAside lines wait for that, out of use.
	Failed   bool    `json:"failed"`
	Reason   string  `json:"reason,omitempty"`
	RetryIn  float64 `json:"retry_in_seconds,omitempty"`
	SetAside uint64  `json:"set_aside_lines,omitempty"`
	Bypasses uint64  `json:"bypasses,omitempty"` // times the tier was bypassed
	Heals    uint64  `json:"heals,omitempty"`    // times it came back into service
	// The SSD tier's index: checkpoints committed, and the most line records one committed.
	Checkpoints       uint64 `json:"checkpoints,omitempty"`
	LargestCheckpoint uint64 `json:"largest_checkpoint_records,omitempty"`
}

// DirtyStats are the write-back figures of a cache (zero in the other modes, but for dirty data
// left by an earlier write-back run).
type DirtyStats struct {
	Lines uint64  `json:"lines"` // lines holding dirty blocks
	Bytes uint64  `json:"bytes"` // dirty bytes (4 KiB blocks)
	Ratio float64 `json:"ratio"` // dirty lines / SSD tier lines
	// The watermarks: destage starts above High and stops below Low; writes wait at Max.
	High float64 `json:"high"`
	Low  float64 `json:"low"`
	Max  float64 `json:"max"`
	// Destaging is set while the destager is writing back.
	Destaging     bool   `json:"destaging"`
	DestagedBytes uint64 `json:"destaged_bytes"`
	DestageWrites uint64 `json:"destage_writes"` // backend writes the destager made (after coalescing)
	DestageErrors uint64 `json:"destage_errors"`
	// DestageRate is how fast the destager wrote back over about the last second, in bytes per
	// second.
	DestageRate float64 `json:"destage_bytes_per_second"`
	// Throttling: writes slowed down because dirty data neared Max, and the delay they were given.
	ThrottledWrites uint64  `json:"throttled_writes"`
	ThrottleSeconds float64 `json:"throttle_seconds"`
	// ThrottleDelay is the delay a write of one line gets now, in seconds.
	ThrottleDelay float64 `json:"throttle_delay_seconds"`
	// BackendWaits counts the retries of writes that had to reach a failing backend at once
	// (around an SSD tier with no room for them, or the dirty data before them).
	BackendWaits uint64 `json:"backend_waits"`
	// Order is the order dirty data goes back in (WriteBackConfig.Order). In FLUSH order, the
	// epochs (writes between two FLUSHes) with data the backend does not have yet, the oldest of
	// them, and how long ago its first write was: the backend alone holds the device as it was
	// then (0 while nothing is pending).
	Order         string  `json:"order"`
	PendingEpochs int     `json:"pending_epochs,omitempty"`
	OldestEpoch   uint64  `json:"oldest_pending_epoch,omitempty"`
	BackendBehind float64 `json:"backend_behind_seconds,omitempty"`
	// LostEpoch is the oldest epoch that lost a dirty block (0: none): the write back stops
	// before it, and the backend stays as of the epoch before.
	LostEpoch uint64 `json:"lost_epoch,omitempty"`
	// Ghosts are the older versions of dirty blocks that writes replaced before their epoch was
	// written back, kept for it (docs/architecture.md): held now, their bytes, and kept so far.
	Ghosts     int    `json:"ghosts,omitempty"`
	GhostBytes int64  `json:"ghost_bytes,omitempty"`
	GhostsKept uint64 `json:"ghosts_kept,omitempty"`
}

// LostStats describe the lost ranges: reads of them fail until they are written again.
type LostStats struct {
	Bytes  uint64       `json:"bytes"`            // in the lost ranges now
	Ranges []meta.Range `json:"ranges,omitempty"` // the first maxLostListed of them
	Blocks uint64       `json:"blocks"`           // blocks lost since the start (a counter)
	// Repaired counts the damaged dirty blocks that were not lost: written to the SSD tier again
	// from the RAM tier's copy or from a replica's log.
	Repaired uint64 `json:"repaired_blocks"`
}

// maxLostListed is how many lost ranges Stats lists.
const maxLostListed = 64

// IOStats count requests to the backend.
type IOStats struct {
	Reads      uint64 `json:"reads"`
	Writes     uint64 `json:"writes"`
	ReadBytes  uint64 `json:"read_bytes"`
	WriteBytes uint64 `json:"write_bytes"`
	Errors     uint64 `json:"errors"`
}

// latencyBounds are the upper bounds of the latency buckets, in seconds: 10 µs to about 10 s,
// four per decade, so both a RAM hit and a slow NAS fall in the middle of the range.
var latencyBounds = func() []float64 {
	var b []float64
	for e := -5.0; e <= 1.0; e += 0.25 {
		b = append(b, math.Round(math.Pow(10, e)*1e7)/1e7)
	}
	return b
}()

// Histogram is a snapshot of a latency histogram in Prometheus' shape: Counts[i] counts the
// observations at most Bounds[i] (not cumulative), and Counts[len(Bounds)] the rest.
type Histogram struct {
	Bounds []float64 `json:"bounds_seconds"`
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	Sum    float64   `json:"sum_seconds"`
}

// histogram records latencies without locks.
type histogram struct {
	counts [32]atomic.Uint64 // len(latencyBounds)+1 <= 32
	sumNs  atomic.Uint64
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(latencyBounds) && s > latencyBounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNs.Add(uint64(d.Nanoseconds()))
}

func (h *histogram) snapshot() Histogram {
	out := Histogram{Bounds: latencyBounds, Counts: make([]uint64, len(latencyBounds)+1)}
	for i := range out.Counts {
		out.Counts[i] = h.counts[i].Load()
		out.Count += out.Counts[i]
	}
	out.Sum = float64(h.sumNs.Load()) / 1e9
	return out
}

func (t *tier) stats() TierStats {
	t.mu.Lock()
	lines, aside := t.index.Len(), len(t.setAside)
	logical, physical := uint64(t.validBlocks)*blockSize, t.st.physicalBytesLocked(t.validBlocks-t.zeroBlocks)
	t.mu.Unlock()
	s := TierStats{
		Name:           t.name,
		Policy:         t.policyName,
		Admission:      t.admissionName,
		Hits:           t.hits.Load(),
		Misses:         t.misses.Load(),
		HitBytes:       t.hitBytes.Load(),
		Promotions:     t.promotions.Load(),
		Admitted:       t.admitted.Load(),
		Rejected:       t.rejected.Load(),
		Evictions:      t.evictions.Load(),
		Invalidations:  t.invalids.Load(),
		Lines:          uint64(lines),
		Capacity:       uint64(t.slots),
		LineBytes:      uint64(lines) * uint64(t.lineSize),
		Errors:         t.errs.Load(),
		ChecksumErrors: t.sumErrs.Load(),
		Adopted:        t.adopted.Load(),
		Failed:         t.failed.Load(),
		SetAside:       uint64(aside),
		LogicalBytes:   logical,
		PhysicalBytes:  physical,
	}
	switch {
	case logical == 0:
		s.ReductionRatio = 1
	case physical > 0:
		s.ReductionRatio = float64(logical) / float64(physical)
	}
	if t.lines > 0 {
		s.Reduction = t.reduction.String()
	}
	t.st.addStats(&s)
	if r := t.reason.Load(); r != nil {
		s.Reason = *r
	}
	s.Bypasses, s.Heals = t.bypasses.Load(), t.heals.Load()
	var lat time.Duration
	s.Congested, s.CongestedNow, lat = t.cong.Stats()
	s.DeviceLatency = lat.Seconds()
	if t.j != nil {
		s.Checkpoints, s.LargestCheckpoint = t.j.checkpoints.Load(), t.j.largestCheckpoint.Load()
		if s.Failed {
			s.RetryIn = max(0, time.Until(t.j.healAt()).Seconds())
		}
	}
	return s
}
