package policy

import "fmt"

// Auto admits every missed key while the cache pays for itself, and only keys missed twice within
// a window (as nhit:2) while it does not, of which only one promotion in autoPromoteProbe
// (Access.Promotion). Admitting costs a cache whatever it does to store a line
// (on the SSD tier: a write, a record in the metadata store, a flush at the next checkpoint, and
// later an eviction); that pays when lines are read again. Where they are not (a cold random
// workload over a disk far larger than the cache), every admission is cost for nothing (bench
// cold's 50/50 row measures it against no cache). A key read twice within the window is admitted
// even then, so that a working set that starts being reused is cached from its second pass, and
// the cache soon pays again.
//
// Whether the cache pays is judged per epoch of autoEpoch lookups (hits and misses): it pays while
// at least one in autoMinHitShare of the last epoch's lookups hit, and, for a tier that promotes
// from a lower one, while it had at least as many hits as promotions. A cache starts out paying, so
// that an empty cache fills from its first reads. Sequential reads (Access.Sequential: a stream, or
// a request spanning several lines) are admitted at any time: they fill whole lines, at a sixteenth
// of the cost a byte of random 4 KiB misses has with 64 KiB lines, and a data set read through once
// is the way users warm a cache.
//
// Auto needs to hear of the cache's hits (HitObserver); a cache that never reports them is judged
// by its misses alone and stops paying after its first epoch.
//
// Spec: "auto" (no parameters).
type Auto struct {
	door          *NHit  // the doorkeeper: sees every miss, decides while the cache does not pay
	epoch         uint64 // lookups an epoch: autoEpoch, scaled in a miniature
	lookups, hits uint64 // of the epoch under way
	paying        bool
	promoted      uint64 // promotions admitted in the epoch under way
	promotions    probe  // promotions the doorkeeper admitted while the cache did not pay
}

const (
	autoEpoch        = 4096
	autoMinHitShare  = 32
	autoPromoteProbe = 16
)

// probe counts and says yes to one in autoPromoteProbe.
type probe uint64

func (p *probe) next() bool {
	*p++
	return *p%autoPromoteProbe == 0
}

// NewAuto builds an Auto policy.
func NewAuto() *Auto { return newAuto(1) }

// newAuto builds an Auto policy for a cache that sees scale of the keys: its doorkeeper's window
// and its epoch scaled.
func newAuto(scale float64) *Auto {
	door, err := NewNHit(nhitDefaultN, scaled(nhitDefaultWindow, scale, nhitDefaultN))
	if err != nil {
		panic(err) // the defaults are valid
	}
	return &Auto{door: door, epoch: uint64(scaled(autoEpoch, scale, autoMinHitShare)), paying: true}
}

func newAutoSpec(params string, scale float64) (Admission, error) {
	if params != "" {
		return nil, fmt.Errorf("auto takes no parameters, got %q; write auto", params)
	}
	return newAuto(scale), nil
}

// Admit counts a miss and decides on a.Key. The doorkeeper counts every miss, also while the
// cache pays, so that it knows which keys were missed before when the cache stops paying.
func (p *Auto) Admit(a Access) bool {
	door := p.door.Admit(a)
	ok := p.paying || a.Sequential
	if !ok && door {
		// A promotion saves less than a fill, and a tier whose lines are read again does not
		// pay with them: the blocks promoted from a random workload over a set several times the
		// tier leave before they are read again, each at the price of an eviction (bench cache
		// --parts hits, --ram 32MiB). One in autoPromoteProbe still goes in, so that a hot set
		// that forms fills the tier and it pays again.
		ok = !a.Promotion || p.promotions.next()
	}
	if ok && a.Promotion {
		p.promoted++
	}
	p.count(1, 0)
	return ok
}

// ObserveHits implements HitObserver.
func (p *Auto) ObserveHits(n uint64) {
	for n > 0 {
		step := min(n, p.epoch-p.lookups)
		p.count(step, step)
		n -= step
	}
}

// count adds lookups, of which hits hit, to the epoch under way, and closes it when it is whole.
func (p *Auto) count(lookups, hits uint64) {
	p.lookups += lookups
	p.hits += hits
	if p.lookups >= p.epoch {
		// Promotions pay only with as many hits: a hit in RAM saves an SSD read, no more, and a
		// promotion costs an eviction and a copy.
		p.paying = p.hits*autoMinHitShare >= p.lookups && p.hits >= p.promoted
		p.lookups, p.hits, p.promoted = 0, 0, 0
	}
}

// Paying reports whether the last epoch's hits paid for admitting every miss.
func (p *Auto) Paying() bool { return p.paying }
