package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// libCacheSim's split of the capacity: Kin = floor(0.25 x capacity), A1out floor(0.5 x capacity).
func TestTwoQLimits(t *testing.T) {
	tests := []struct{ capacity, in, out int }{
		{1, 0, 0}, {3, 0, 1}, {4, 1, 2}, {48, 12, 24}, {489, 122, 244},
	}
	for _, tt := range tests {
		p := NewTwoQ(Config{Capacity: tt.capacity}).(*TwoQ)
		require.Equal(t, tt.in, p.inCap, "capacity %d", tt.capacity)
		require.Equal(t, tt.out, p.outCap, "capacity %d", tt.capacity)
	}
}

// A miss that the admission policy turns away (Get without Insert) leaves A1out alone: the key's
// next admitted miss still finds it there and enters Am.
func TestTwoQGhostSurvivesRefusedMiss(t *testing.T) {
	p := NewTwoQ(Config{Capacity: 4}).(*TwoQ)
	for k := range Key(5) { // 0 leaves A1in for A1out
		require.False(t, p.Get(k))
		p.Insert(k)
	}
	require.False(t, p.Get(0)) // refused: no Insert
	require.False(t, p.Get(0))
	p.Insert(0)
	i := mustLookup(t, &p.a, 0)
	require.Equal(t, twoqMain, p.a.at(i).meta)
	require.True(t, p.Get(0))
}
