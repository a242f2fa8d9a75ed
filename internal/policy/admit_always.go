package policy

import "fmt"

// Always admits every missed key: the cache's default, and what libCacheSim does without an
// admission policy.
type Always struct{}

// Admit admits a.
func (Always) Admit(Access) bool { return true }

func newAlways(params string, _ float64) (Admission, error) {
	if params != "" {
		return nil, fmt.Errorf("always takes no parameters, got %q; write always", params)
	}
	return Always{}, nil
}
