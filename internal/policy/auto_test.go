package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAuto drives Auto through epochs of lookups with a given share of hits and checks what it
// admits in the epoch after: every miss while the cache pays, and otherwise only keys missed
// before (within the doorkeeper's window) and sequential reads.
func TestAuto(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hitEvery: a hit is reported before every hitEvery-th miss (0: never).
		hitEvery int
		paying   bool
	}{
		{"no hits: does not pay", 0, false},
		{"one hit in 64 lookups: does not pay", 63, false},
		{"one hit in 16 lookups: pays", 15, true},
		{"one hit a miss: pays", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewAuto()
			require.True(t, p.Paying(), "a new cache starts out paying")
			require.True(t, p.Admit(Access{Key: 1}), "a first miss, before any epoch closed")
			next := Key(1 << 20)
			for i := range 3 * autoEpoch {
				if tc.hitEvery > 0 && i%tc.hitEvery == 0 {
					p.ObserveHits(1)
				}
				p.Admit(Access{Key: next}) // a cold key each time
				next++
			}
			require.Equal(t, tc.paying, p.Paying())
			require.Equal(t, tc.paying, p.Admit(Access{Key: next}), "a key missed for the first time")
			require.True(t, p.Admit(Access{Key: next}), "the same key missed again")
			require.True(t, p.Admit(Access{Key: next + 1, Sequential: true}), "a sequential read")
		})
	}
}

// TestAutoEpochShare: the share of hits that pays is one in autoMinHitShare lookups, judged on
// whole epochs, and a cache that starts paying again admits every miss again.
func TestAutoEpochShare(t *testing.T) {
	p := NewAuto()
	key := Key(0)
	miss := func(n int) {
		for range n {
			p.Admit(Access{Key: key})
			key++
		}
	}
	// An epoch just under the share: autoEpoch/autoMinHitShare - 1 hits.
	hits := uint64(autoEpoch/autoMinHitShare - 1)
	p.ObserveHits(hits)
	miss(autoEpoch - int(hits))
	require.False(t, p.Paying(), "%d hits in %d lookups", hits, autoEpoch)
	// One at the share.
	p.ObserveHits(hits + 1)
	miss(autoEpoch - int(hits+1) - 1)
	require.False(t, p.Paying(), "the epoch is not whole yet")
	miss(1)
	require.True(t, p.Paying(), "%d hits in %d lookups", hits+1, autoEpoch)
	require.True(t, p.Admit(Access{Key: key}))
	// Hits reported in one large batch close several epochs, all of them paying.
	p.ObserveHits(10 * autoEpoch)
	require.True(t, p.Paying())
}

// TestAutoPromotions: while the cache pays, every promotion is admitted; while it does not, one in
// autoPromoteProbe of those the doorkeeper lets in (keys missed twice), and every sequential one.
func TestAutoPromotions(t *testing.T) {
	p := NewAuto()
	require.True(t, p.Admit(Access{Key: 7, Promotion: true}), "a promotion while the cache pays")
	// Every promotion admitted, and a hit for every 8 lookups: more than enough hits for the
	// epoch's lookups, but fewer than its promotions.
	for k := range autoEpoch {
		if k%8 == 0 {
			p.ObserveHits(1)
		}
		p.Admit(Access{Key: Key(1<<20 + k), Promotion: true})
	}
	require.False(t, p.Paying(), "fewer hits than promotions")
	admitted := 0
	for k := range 10 * autoPromoteProbe {
		key := Key(1<<30 + k)
		require.False(t, p.Admit(Access{Key: key, Promotion: true}), "a promotion of a key missed once")
		if p.Admit(Access{Key: key, Promotion: true}) {
			admitted++
		}
	}
	require.Equal(t, 10, admitted, "promotions of keys missed twice: one in %d", autoPromoteProbe)
	require.True(t, p.Admit(Access{Key: 1 << 40, Promotion: true, Sequential: true}), "a sequential promotion")
	require.False(t, p.Admit(Access{Key: 1 << 41}), "a fill of a key missed once")
	require.True(t, p.Admit(Access{Key: 1 << 41}), "a fill of a key missed twice")
}
