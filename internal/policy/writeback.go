package policy

import (
	"fmt"
	"strings"
	"time"
)

// Watermarks are write-back's ratios of the SSD tier's lines: destage starts above High and stops
// below Low; writes wait rather than let dirty lines pass Max.
type Watermarks struct {
	High, Low, Max float64
}

// DestageState is what a destage policy decides on.
type DestageState struct {
	Ratio    float64       // dirty lines / SSD tier lines
	Running  bool          // the destager is writing back now
	Idle     time.Duration // since the last client request
	Draining bool          // everything must go (the cache left write-back; a flush drains its own snapshot)
	Waiting  bool          // writes are waiting for room below the maximum
	Watermarks
}

// Destage decides when dirty data is written back. Like the eviction policies it sees figures,
// never data.
type Destage interface {
	// Run reports whether the destager should write back (more).
	Run(s DestageState) bool
	// Urgent reports whether it should go at full speed rather than leave the backend to clients
	// half of the time.
	Urgent(s DestageState) bool
}

// ThrottleState is what a throttle policy decides on.
type ThrottleState struct {
	Ratio float64
	// BlockTime is how long the destager takes per 4 KiB block written back (a moving average):
	// the rate writes must come down to for dirty data to stop growing.
	BlockTime time.Duration
	Blocks    int // the blocks the write dirties
	Watermarks
}

// Throttle slows writers down as dirty data fills the SSD tier.
type Throttle interface {
	Delay(s ThrottleState) time.Duration
}

// NewDestage builds the destage policy called name.
func NewDestage(name string) (Destage, error) {
	f, ok := destages[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("unknown destage policy %q; use one of %s", name, strings.Join(DestageNames(), ", "))
	}
	return f(), nil
}

// NewThrottle builds the throttle policy called name.
func NewThrottle(name string) (Throttle, error) {
	f, ok := throttles[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("unknown throttle policy %q; use one of %s", name, strings.Join(ThrottleNames(), ", "))
	}
	return f(), nil
}

// DestageNames lists the registered destage policies, sorted.
func DestageNames() []string { return sortedKeys(destages) }

// ThrottleNames lists the registered throttle policies, sorted.
func ThrottleNames() []string { return sortedKeys(throttles) }

// watermark destages above High until Low, when idle, and when draining, as bcache and Open CAS do.
type watermark struct{}

func newWatermark() Destage { return watermark{} }

func (watermark) Run(s DestageState) bool {
	switch {
	case s.Ratio == 0:
		return false
	case s.Draining, s.Waiting, s.Idle >= time.Second:
		return true
	case s.Running:
		return s.Ratio > s.Low
	default:
		return s.Ratio > s.High
	}
}

func (watermark) Urgent(s DestageState) bool {
	return s.Draining || s.Waiting || s.Ratio > s.High
}

// proportional delays a write, from nothing at High to the destager's own time for the blocks it
// dirties at Max: there ingress meets the destage rate, as PernixData FVP's flow control does.
type proportional struct{}

func newProportional() Throttle { return proportional{} }

func (proportional) Delay(s ThrottleState) time.Duration {
	if s.Ratio <= s.High || s.Max <= s.High {
		return 0
	}
	f := min((s.Ratio-s.High)/(s.Max-s.High), 1)
	return time.Duration(f * float64(s.BlockTime) * float64(s.Blocks))
}

// noThrottle never delays: writes only wait at Max.
type noThrottle struct{}

func newNoThrottle() Throttle { return noThrottle{} }

func (noThrottle) Delay(ThrottleState) time.Duration { return 0 }
