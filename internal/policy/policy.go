// Package policy holds the cache policies that both the cache engine and the trace-replay
// simulator run: eviction (which cached key leaves) and admission (whether a missed key enters).
//
// A policy sees keys (cache line numbers or trace object ids) and events, never bytes, so one
// implementation serves the simulator and the daemon. Policies are not safe for concurrent use: the
// engine serialises calls per tier. A policy must never allocate per access on its hot path beyond
// what its bookkeeping needs: the simulator replays millions of requests a second through it.
package policy

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Key identifies a cached object: a cache line number or a trace's object id.
type Key uint64

// Eviction decides what a cache of Capacity keys holds.
type Eviction interface {
	// Get reports whether k is cached; a hit updates the policy's state (recency, frequency).
	Get(k Key) bool
	// Insert caches k, which must not be cached, after evicting as many keys as needed to keep
	// Len() <= Capacity(). Each evicted key is reported to the OnEvict hook of Config.
	Insert(k Key)
	// Remove drops k (an invalidation, not an eviction: OnEvict is not called). It reports whether k
	// was cached.
	Remove(k Key) bool
	// Len is the number of cached keys.
	Len() int
	// Capacity is the most keys the policy holds.
	Capacity() int
}

// Config configures an eviction policy.
type Config struct {
	Capacity int
	// OnEvict, if not nil, is called with each key Insert evicts (the engine frees its line).
	OnEvict func(Key)
	// Preallocate says the capacity will be used: the policy allocates its state for a full cache
	// (ghost entries included) at once, packed for memory rather than the last bit of speed, and
	// does not grow afterwards (TestMemoryPerKey measures the bytes per key). Without it, the state
	// starts small and doubles as keys arrive, which suits the simulator, whose capacities may be
	// far larger than a trace fills.
	Preallocate bool
}

// Access describes the request behind a miss, for admission policies.
type Access struct {
	Key    Key
	Offset int64 // bytes
	Length int64 // bytes
	Write  bool
	// Sequential says the access continues a sequential stream, as the cache follows them
	// (package fetch), or belongs to one request that spans several lines, itself a sequential
	// run (a sequential reader's requests at a queue depth above one reach the stream follower
	// out of order); false where the caller does not follow streams.
	Sequential bool
	// Promotion says the key is held by a lower tier already (an SSD-tier hit asking to be copied
	// into RAM): storing it here saves only that tier's latency, not a backend read.
	Promotion bool
}

// Admission decides whether a missed key enters the cache.
type Admission interface {
	Admit(a Access) bool
}

// HitObserver is an admission policy that also wants to know how often the cache hits: the cache
// reports the hits since its last report before each Admit (and the simulator each hit).
type HitObserver interface {
	ObserveHits(n uint64)
}

// EvictionFactory builds an eviction policy.
type EvictionFactory func(Config) Eviction

// AdmissionFactory builds an admission policy from its parameters (the text after "name:" in a
// spec such as "nhit:2"; empty for the defaults) for a cache that sees scale of the keys, 1 but in
// a miniature simulation: a policy's history of keys (nhit's window) is scaled as the cache is.
type AdmissionFactory func(params string, scale float64) (Admission, error)

// NewEviction builds the eviction policy called name with cfg.
func NewEviction(name string, cfg Config) (Eviction, error) {
	f, ok := evictions[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("unknown eviction policy %q; use one of %s", name, strings.Join(EvictionNames(), ", "))
	}
	if cfg.Capacity < 1 {
		return nil, fmt.Errorf("policy %s: capacity %d must be at least 1", name, cfg.Capacity)
	}
	return f(cfg), nil
}

// NewAdmission builds an admission policy from a spec "name" or "name:params".
func NewAdmission(spec string) (Admission, error) { return NewMiniatureAdmission(spec, 1) }

// NewMiniatureAdmission builds the admission policy of spec for a miniature cache fed the keys
// sampled at rate (above 0, at most 1): what it remembers of keys, counted in misses or lookups,
// is rate times the full policy's, as the cache's capacity is.
func NewMiniatureAdmission(spec string, rate float64) (Admission, error) {
	if !(rate > 0 && rate <= 1) {
		return nil, fmt.Errorf("admission %s: a miniature's rate %g must be above 0 and at most 1", spec, rate)
	}
	name, params, _ := strings.Cut(spec, ":")
	f, ok := admissions[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("unknown admission policy %q; use one of %s", name, strings.Join(AdmissionNames(), ", "))
	}
	a, err := f(params, rate)
	if err != nil {
		return nil, fmt.Errorf("admission %s: %w", spec, err)
	}
	return a, nil
}

// scaled is n scaled by scale below 1, at least least; n itself at 1, where a spec's own errors
// (nhit's N above its window) must show.
func scaled(n int, scale float64, least int) int {
	if scale == 1 {
		return n
	}
	return max(least, int(math.Round(float64(n)*scale)))
}

// EvictionNames lists the registered eviction policies, sorted.
func EvictionNames() []string { return sortedKeys(evictions) }

// AdmissionNames lists the registered admission policies, sorted.
func AdmissionNames() []string { return sortedKeys(admissions) }

func sortedKeys[V any](m map[string]V) []string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}
