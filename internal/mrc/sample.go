package mrc

import (
	"fmt"
	"math"

	"github.com/tierblk/tierblk/internal/policy"
)

// DefaultSeed is the hash seed when none is given: any fixed value keeps results reproducible; a
// different seed draws a different sample, which is how a caller measures the estimate's spread.
const DefaultSeed = 0x74696572626c6b31 // "tierblk1"

// Hash is the seeded hash that decides which keys are sampled: the SplitMix64 finaliser of the key
// mixed with the seed. Keys are line numbers or trace ids, dense and sequential; the finaliser
// spreads them so that every range of hashes holds its share of every range of keys.
func Hash(k policy.Key, seed uint64) uint64 {
	z := uint64(k) ^ seed
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Sampler takes a key when its hash is below a threshold: a fixed-rate spatial sample.
type Sampler struct {
	seed uint64
	// threshold: a key is taken when its hash is below it; all takes every key (a threshold of
	// 2⁶⁴, which a uint64 cannot hold).
	threshold uint64
	all       bool
}

// NewSampler samples keys at rate, from above 0 to 1, with the hash seeded by seed (0 means
// DefaultSeed).
func NewSampler(rate float64, seed uint64) (Sampler, error) {
	if !(rate > 0 && rate <= 1) {
		return Sampler{}, fmt.Errorf("sampling rate %g must be above 0 and at most 1", rate)
	}
	if seed == 0 {
		seed = DefaultSeed
	}
	s := Sampler{seed: seed, all: rate == 1}
	if !s.all {
		s.threshold = uint64(math.Ldexp(rate, 64))
		if s.threshold == 0 {
			return Sampler{}, fmt.Errorf("sampling rate %g is too small to sample any key", rate)
		}
	}
	return s, nil
}

// Take reports whether k is in the sample.
func (s Sampler) Take(k policy.Key) bool { return s.all || Hash(k, s.seed) < s.threshold }

// Limit is the largest hash the sampler takes.
func (s Sampler) Limit() uint64 { return limit(s.threshold, s.all) }

// limit is the largest hash below threshold, or every hash.
func limit(threshold uint64, all bool) uint64 {
	if all {
		return math.MaxUint64
	}
	return max(threshold, 1) - 1
}

// Rate is the share of keys the sampler takes.
func (s Sampler) Rate() float64 {
	if s.all {
		return 1
	}
	return math.Ldexp(float64(s.threshold), -64)
}
