package config

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/units"
)

// Cache configures the tiered cache of one export. Sizes are written like 64KiB, 1GiB or 2TiB.
type Cache struct {
	// Mode is writethrough (the default), writearound, passthrough or writeback (which needs ssd).
	Mode string `yaml:"mode"`
	// Line is the unit of caching: a power of two from 4KiB to 1MiB, 64KiB by default.
	Line string `yaml:"line"`
	// RAM is the size of the RAM tier, a whole number of lines; empty or 0 for none.
	RAM string `yaml:"ram"`
	// SSD is the file or block device of the SSD tier; empty for none. A missing file is created,
	// sparse, at SSDSize.
	SSD string `yaml:"ssd"`
	// SSDSize is how much of SSD the tier uses, a whole number of lines; by default all of it
	// (rounded down to whole lines).
	SSDSize string `yaml:"ssd_size"`
	// Meta is the directory of the SSD tier's metadata; by default SSD + ".meta" (required when SSD
	// is a block device).
	Meta string `yaml:"meta"`
	// Policy and Admission apply to both tiers unless a tier has its own.
	Policy       string `yaml:"policy"`
	Admission    string `yaml:"admission"`
	RAMPolicy    string `yaml:"ram_policy"`
	RAMAdmission string `yaml:"ram_admission"`
	SSDPolicy    string `yaml:"ssd_policy"`
	SSDAdmission string `yaml:"ssd_admission"`
	// Congestion is the SSD tier's congestion threshold, a duration (2ms by default): while the
	// kernel measures its device's requests taking longer than this on average, and longer than
	// the backend's reads, the tier admits no missed line. "off" turns it off.
	Congestion string `yaml:"congestion"`
	// WriteBack tunes write-back; it applies whenever the cache is in write-back mode, including
	// after a switch at run time (`tierblk mode`).
	WriteBack WriteBack `yaml:"write_back"`
	// Reduction is what the SSD tier stores no more of: off; zero (blocks of zeros are a bit in
	// the line's state, not written); compress (the default: the packed layout, every other block
	// compressed, room allocated by size); or dedupe (compress, and a block with the bytes of a
	// unit the tier holds is stored as one more reference to that unit). Empty: the default, or
	// the layout an existing SSD tier has (cache.Config.ReductionDefault).
	Reduction string `yaml:"reduction"`
	// Scrub schedules the daemon's scrubs of the SSD tier (cache.Cache.Scrub), which read every
	// block it stores and check it against its checksum, so that damage is found before a read or
	// the write-back needs the data.
	Scrub Scrub `yaml:"scrub"`
	// Curves is on (the default) or off: the live miss-ratio curves of the tier the cache's
	// misses go to last (the SSD tier, else the RAM tier), estimated from a sample of the lines.
	Curves string `yaml:"curves"`
}

// CurvesOn reports whether the export keeps live miss-ratio curves (Curves).
func (c *Cache) CurvesOn() bool { return c.Curves != "off" }

// Scrub schedules the scrubs of an SSD tier: the first Every after the start, then every Every.
type Scrub struct {
	// Every is a duration (DefaultScrubEvery when empty); 0 schedules none.
	Every string `yaml:"every"`
	// Rate is the most a scrub reads a second, a size with or without "/s" (DefaultScrubRate when
	// empty); 0 reads as fast as the SSD goes.
	Rate string `yaml:"rate"`
}

// The defaults of Scrub: a week is often enough to find rot long before it meets a second fault,
// and 64 MiB/s reads a 1 TiB tier in under five hours while leaving the SSD to clients.
const (
	DefaultScrubEvery = 7 * 24 * time.Hour
	DefaultScrubRate  = 64 << 20
)

// Schedule parses Scrub: every is 0 for no scheduled scrub, rate 0 for no limit. Errors name the
// field (scrub.every, scrub.rate).
func (s Scrub) Schedule() (every time.Duration, rate int64, err error) {
	every, rate, errs := s.schedule()
	return every, rate, errors.Join(errs...)
}

func (s Scrub) schedule() (every time.Duration, rate int64, errs []error) {
	every, rate = DefaultScrubEvery, DefaultScrubRate
	if s.Every != "" {
		d, err := time.ParseDuration(s.Every)
		if err != nil || d < 0 {
			errs = append(errs, fieldErr("scrub.every", "%q: use a duration such as 168h or 24h (default %gh), or 0 for no scheduled scrub", s.Every, DefaultScrubEvery.Hours()))
		}
		every = d
	}
	if s.Rate != "" {
		r, err := units.ParseRate(s.Rate)
		if err != nil {
			errs = append(errs, fieldErr("scrub.rate", "%v (default %s/s)", err, units.FormatSize(DefaultScrubRate)))
		}
		rate = r
	}
	return every, rate, errs
}

// WriteBack tunes write-back. Ratios are of the SSD tier's lines; an absent one takes the default
// (cache.DefaultWriteBack), and a 0 is taken as given (low: 0 destages until nothing is dirty) or
// refused, never replaced.
type WriteBack struct {
	High     *float64 `yaml:"high"`
	Low      *float64 `yaml:"low"`
	Max      *float64 `yaml:"max"`
	Destage  string   `yaml:"destage"`
	Throttle string   `yaml:"throttle"`
	// OnStop is what a clean stop (SIGTERM) does with dirty data: "keep" (or "") leaves it on the
	// SSD tier for the next start, "flush" writes it back to the backend before exiting, for a
	// cache that may not come back (a container whose cache volume is dropped, a volume that moves
	// to another host).
	OnStop string `yaml:"on_stop"`
	// Order is the order dirty data goes back to the backend in: "flush" (or ""), one epoch of
	// writes between two FLUSHes after another, so that the backend alone is always a state the
	// device had (cache.OrderFlush), or "address", coalesced across FLUSHes.
	Order string `yaml:"order"`
	// Replicas are the NBD URLs of one or two replica logs on peers (`tierblk replica serve`):
	// every change is logged there too, and a FLUSH is acknowledged only once it is durable on
	// each of them as well, so that the host's death loses nothing (`tierblk replica drain`).
	Replicas []string `yaml:"replicas,omitempty"`
	// OnReplicaLoss is what a lost replica makes the cache do: "writethrough" (or "") switches it
	// to write-through, writing its dirty data back, until the replica is back; "wait" holds
	// FLUSHes until it is back.
	OnReplicaLoss string `yaml:"on_replica_loss"`
	// TakeOver lets a start with an empty cache apply changes a replica's log holds (another
	// primary's, gone) to the backend before it serves; without it such a start is refused.
	TakeOver bool `yaml:"take_over,omitempty"`
}

// FlushOnStop reports whether a clean stop writes the dirty data back (OnStop).
func (w WriteBack) FlushOnStop() bool { return w.OnStop == "flush" }

// Ratio is a watermark given in Go: WriteBack{Low: config.Ratio(0)}.
func Ratio(v float64) *float64 { return &v }

// ratios returns the watermarks, the default for each one absent.
func (w WriteBack) ratios() (hi, lo, mx float64) {
	d := cache.DefaultWriteBack
	get := func(p *float64, def float64) float64 {
		if p == nil {
			return def
		}
		return *p
	}
	return get(w.High, d.High), get(w.Low, d.Low), get(w.Max, d.Max)
}

// Engine returns the cache's write-back configuration.
func (w WriteBack) Engine() cache.WriteBackConfig {
	hi, lo, mx := w.ratios()
	return cache.WriteBackConfig{High: hi, Low: lo, Max: mx, Destage: w.Destage, Throttle: w.Throttle, Order: w.Order}
}

// validate checks the write-back fields with the defaults filled in, so that an error about the
// order of the watermarks names the field the user set rather than the default it collides with.
func (w WriteBack) validate() []error {
	d := cache.DefaultWriteBack
	hi, lo, mx := w.ratios()
	var errs []error
	ranged := true
	for _, f := range []struct {
		name string
		v    *float64
		def  float64
	}{{"high", w.High, d.High}, {"low", w.Low, d.Low}, {"max", w.Max, d.Max}} {
		if f.v != nil && (*f.v < 0 || *f.v > 1) {
			errs = append(errs, fieldErr("write_back."+f.name, "%g is out of range; use a ratio of the SSD tier's lines from 0 to 1 (default %g)", *f.v, f.def))
			ranged = false
		}
	}
	if ranged {
		// Blame the field that was set: of a pair, the one that is not the default.
		switch {
		case lo >= hi && w.Low == nil:
			errs = append(errs, fieldErr("write_back.high", "%g must be above low (%g, the default)", hi, lo))
		case lo >= hi:
			errs = append(errs, fieldErr("write_back.low", "%g must be below high (%g)", lo, hi))
		}
		switch {
		case hi > mx && w.High == nil:
			errs = append(errs, fieldErr("write_back.max", "%g must be at least high (%g, the default)", mx, hi))
		case hi > mx:
			errs = append(errs, fieldErr("write_back.high", "%g must be at most max (%g)", hi, mx))
		}
	}
	for _, f := range []struct {
		name, v string
		valid   []string
	}{{"destage", w.Destage, policy.DestageNames()}, {"throttle", w.Throttle, policy.ThrottleNames()}} {
		if f.v != "" && !slices.Contains(f.valid, f.v) {
			errs = append(errs, fieldErr("write_back."+f.name, "unknown policy %q; use one of %s", f.v, strings.Join(f.valid, ", ")))
		}
	}
	switch w.Order {
	case "", cache.OrderAddress, cache.OrderFlush:
	default:
		errs = append(errs, fieldErr("write_back.order", "%q: use address (dirty data goes back in address order, coalesced across FLUSHes) or flush (the writes between two FLUSHes go back after every earlier FLUSH's: the backend is always consistent, only older)", w.Order))
	}
	if len(w.Replicas) > 2 {
		errs = append(errs, fieldErr("write_back.replicas", "%d replicas: give one or two", len(w.Replicas)))
	}
	for i, r := range w.Replicas {
		u, err := url.Parse(r)
		if err != nil || !strings.HasPrefix(u.Scheme, "nbd") {
			errs = append(errs, fieldErr(fmt.Sprintf("write_back.replicas[%d]", i), "%q: give the replica's NBD URL, e.g. nbd://peer:10810/nas (tierblk replica serve on the peer)", r))
		}
	}
	switch w.OnReplicaLoss {
	case "", "writethrough", "wait":
	default:
		errs = append(errs, fieldErr("write_back.on_replica_loss", "%q: use writethrough (write the dirty data back and write through until the replica is back) or wait (FLUSH waits until the replica is back)", w.OnReplicaLoss))
	}
	switch w.OnStop {
	case "", "keep", "flush":
	default:
		errs = append(errs, fieldErr("write_back.on_stop", "%q: use keep (dirty data stays on the SSD tier for the next start) or flush (written back before exiting)", w.OnStop))
	}
	return errs
}

// CacheSizes are a Cache's sizes in bytes (0 where not given).
type CacheSizes struct {
	Line, RAM, SSDSize int64
}

// Sizes parses the sizes; errors name the field.
func (c *Cache) Sizes() (CacheSizes, error) {
	var s CacheSizes
	var errs []error
	for _, f := range []struct {
		name string
		text string
		dst  *int64
	}{{"line", c.Line, &s.Line}, {"ram", c.RAM, &s.RAM}, {"ssd_size", c.SSDSize, &s.SSDSize}} {
		if f.text == "" {
			continue
		}
		v, err := units.ParseSize(f.text)
		if err != nil {
			errs = append(errs, fieldErr(f.name, "%v", err))
		}
		*f.dst = v
	}
	if s.Line == 0 {
		s.Line = cache.DefaultLineSize
	}
	return s, errors.Join(errs...)
}

// TierPolicies returns the eviction policy and admission spec of the RAM and SSD tiers.
func (c *Cache) TierPolicies() (ramPolicy, ramAdmission, ssdPolicy, ssdAdmission string) {
	or := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	return or(c.RAMPolicy, c.Policy), or(c.RAMAdmission, c.Admission), or(c.SSDPolicy, c.Policy), or(c.SSDAdmission, c.Admission)
}

// CongestionThreshold parses Congestion for cache.Config: 0 for the default, -1 for off.
func (c *Cache) CongestionThreshold() (time.Duration, error) {
	switch c.Congestion {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	d, err := time.ParseDuration(c.Congestion)
	if err != nil || d <= 0 {
		return 0, fieldErr("congestion", "%q: use a duration such as 2ms or 500us (default %v), or off", c.Congestion, cache.DefaultCongestion)
	}
	return d, nil
}

// ReductionLevel parses Reduction for cache.Config: cache.DefaultReduction when it is empty.
func (c *Cache) ReductionLevel() (cache.Reduction, error) {
	if c.Reduction == "" {
		return cache.DefaultReduction, nil
	}
	r, err := cache.ParseReduction(c.Reduction)
	if err != nil {
		return 0, fieldErr("reduction", "%v", err)
	}
	return r, nil
}

// MetaDir returns the metadata directory of the SSD tier.
func (c *Cache) MetaDir() string {
	if c.Meta != "" || c.SSD == "" {
		return c.Meta
	}
	return c.SSD + ".meta"
}

func (c *Cache) validate() []error {
	var errs []error
	if c.Mode != "" {
		if m, err := cache.ParseMode(c.Mode); err != nil {
			errs = append(errs, fieldErr("mode", "%v", err))
		} else if m == cache.WriteBack && c.SSD == "" {
			errs = append(errs, fieldErr("mode", "writeback needs an SSD tier: the RAM tier may never hold the only copy of written data; give ssd too"))
		} else if m != cache.WriteBack && len(c.WriteBack.Replicas) > 0 {
			errs = append(errs, fieldErr("write_back.replicas", "replicas hold write-back's dirty data: set mode: writeback too"))
		}
	} else if len(c.WriteBack.Replicas) > 0 {
		errs = append(errs, fieldErr("write_back.replicas", "replicas hold write-back's dirty data: set mode: writeback too"))
	}
	errs = append(errs, c.WriteBack.validate()...)
	if c.Curves != "" && c.Curves != "on" && c.Curves != "off" {
		errs = append(errs, fieldErr("curves", "%q: use on (the default) or off", c.Curves))
	}
	s, err := c.Sizes()
	if err != nil {
		errs = append(errs, err)
	}
	l := s.Line
	lineOK := l >= cache.MinLineSize && l <= cache.MaxLineSize && l&(l-1) == 0
	if !lineOK {
		errs = append(errs, fieldErr("line", "%q: use a power of two from 4KiB to 1MiB (default 64KiB)", c.Line))
	}
	// A tier holds whole lines: a size between two would be rounded down without a word.
	if s.RAM < 0 || (s.RAM > 0 && s.RAM < s.Line) {
		errs = append(errs, fieldErr("ram", "%q is less than one line (%s); use 0 for no RAM tier", c.RAM, units.FormatSize(s.Line)))
	} else if lineOK && s.RAM%l != 0 {
		errs = append(errs, fieldErr("ram", "%q is not a whole number of lines (%s); use %s", c.RAM, units.FormatSize(l), units.Nearest(s.RAM, l)))
	}
	if c.SSD == "" {
		if c.SSDSize != "" {
			errs = append(errs, fieldErr("ssd_size", "is set but ssd is not; give the SSD tier's path too"))
		}
		if c.Congestion != "" {
			errs = append(errs, fieldErr("congestion", "is set but ssd is not; it judges the SSD tier's device"))
		}
		if c.Reduction != "" {
			errs = append(errs, fieldErr("reduction", "is set but ssd is not; it reduces what the SSD tier stores"))
		}
		for _, f := range []struct{ name, v string }{{"scrub.every", c.Scrub.Every}, {"scrub.rate", c.Scrub.Rate}} {
			if f.v != "" {
				errs = append(errs, fieldErr(f.name, "is set but ssd is not; a scrub checks the blocks the SSD tier stores"))
			}
		}
		if _, refused := units.ParseSize(c.RAM); s.RAM == 0 && (c.RAM == "" || refused == nil) { // a ram refused has its own error
			errs = append(errs, fieldErr("ram", "a cache needs a RAM tier, an SSD tier or both; give ram (e.g. 1GiB), ssd (a path) or both"))
		}
	} else if s.SSDSize != 0 && s.SSDSize < 2*s.Line {
		errs = append(errs, fieldErr("ssd_size", "%q is less than two lines (%s)", c.SSDSize, units.FormatSize(2*s.Line)))
	} else if lineOK && s.SSDSize%l != 0 {
		errs = append(errs, fieldErr("ssd_size", "%q is not a whole number of lines (%s); use %s", c.SSDSize, units.FormatSize(l), units.Nearest(s.SSDSize, l)))
	}
	if _, err := c.CongestionThreshold(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.ReductionLevel(); err != nil {
		errs = append(errs, err)
	}
	_, _, scrubErrs := c.Scrub.schedule()
	errs = append(errs, scrubErrs...)
	rp, ra, sp, sa := c.TierPolicies()
	seen := map[string]bool{} // the shared policy fields are reported once, not per tier
	for _, p := range []struct {
		field, spec string
		check       func(string) error
	}{
		{"ram_policy", rp, checkEviction}, {"ssd_policy", sp, checkEviction},
		{"ram_admission", ra, checkAdmission}, {"ssd_admission", sa, checkAdmission},
	} {
		field := policyField(c, p.field)
		if p.spec == "" || seen[field] {
			continue
		}
		seen[field] = true
		if err := p.check(p.spec); err != nil {
			errs = append(errs, fieldErr(field, "%v", err))
		}
	}
	return errs
}

func checkEviction(name string) error {
	_, err := policy.NewEviction(name, policy.Config{Capacity: 1})
	return err
}

func checkAdmission(spec string) error {
	_, err := policy.NewAdmission(spec)
	return err
}

// policyField names the field a tier's policy came from: its own, or the shared one.
func policyField(c *Cache, field string) string {
	own := map[string]string{"ram_policy": c.RAMPolicy, "ssd_policy": c.SSDPolicy,
		"ram_admission": c.RAMAdmission, "ssd_admission": c.SSDAdmission}[field]
	if own != "" {
		return field
	}
	return strings.TrimPrefix(strings.TrimPrefix(field, "ram_"), "ssd_")
}
