package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestNHit(t *testing.T) {
	k := func(key Key) Access { return Access{Key: key, Offset: int64(key) << 16, Length: 1 << 16} }
	tests := []struct {
		name   string
		n, w   int
		steps  []admitStep
		inRing int // distinct keys counted at the end
	}{
		{"first miss admits at N=1", 1, 4, []admitStep{
			{k(1), true}, {k(2), true}, {k(1), true},
		}, 2},
		{"second miss within 3", 2, 3, []admitStep{
			{k(1), false}, // window [1]
			{k(1), true},  // [1 1]
			{k(2), false}, // [1 1 2]
			{k(3), false}, // [1 2 3]
			// the third miss of 1, but the window holds none of the other two
			{k(1), false}, // [2 3 1]
			{k(2), false}, // [3 1 2]: 2's first miss has left the window
			{k(1), true},  // [1 2 1]
			{k(1), true},  // [2 1 1]: admitted again, as long as the window holds two misses of 1
		}, 2},
		{"third miss within 5", 3, 5, []admitStep{
			{k(7), false}, {k(8), false}, {k(7), false}, {k(9), false},
			{k(7), true},  // [7 8 7 9 7]
			{k(8), false}, // [8 7 9 7 8]: two misses of 8
			{k(9), false}, // [7 9 7 8 9]: 8's first miss left, two of 9
			{k(8), false}, // [9 7 8 9 8]: 8 counts 2
			{k(8), true},  // [7 8 9 8 8]
		}, 3},
		{"window of 1 with N=1", 1, 1, []admitStep{{k(1), true}, {k(2), true}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := NewNHit(tt.n, tt.w)
			require.NoError(t, err)
			runAdmission(t, h, tt.steps)
			require.Equal(t, tt.inRing, h.counts.index.Len())
		})
	}
}

// TestNHitModel checks NHit against the definition on random streams: a key is admitted when the
// last W decisions, this one included, hold at least N of its misses.
func TestNHitModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.IntRange(1, 12).Draw(t, "window")
		n := rapid.IntRange(1, w).Draw(t, "n")
		h, err := NewNHit(n, w)
		require.NoError(t, err)
		var seen []Key
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for range steps {
			k := Key(rapid.IntRange(0, 6).Draw(t, "key"))
			seen = append(seen, k)
			count := 0
			for _, s := range seen[max(0, len(seen)-w):] {
				if s == k {
					count++
				}
			}
			require.Equal(t, count >= n, h.Admit(Access{Key: k}), "key %d, last %d misses %v", k, w, seen[max(0, len(seen)-w):])
			require.LessOrEqual(t, h.counts.index.Len(), w, "distinct keys counted")
		}
	})
}

// Memory is bounded by the window and, once warm, a decision allocates nothing.
func TestNHitBounded(t *testing.T) {
	const w = 1000
	h, err := NewNHit(2, w)
	require.NoError(t, err)
	next := Key(0)
	admitNew := func() {
		h.Admit(Access{Key: next})
		next++
	}
	for range 10 * w {
		admitNew()
	}
	require.Equal(t, w, h.counts.index.Len())
	require.LessOrEqual(t, len(h.counts.nodes), w+1)
	require.Zero(t, testing.AllocsPerRun(10*w, admitNew))
}
