package policy

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// zipfWithScans is a stream of n accesses: Zipf-popular keys (s = 1.2 over 100,000 keys), with a
// scan of 3,000 never-seen keys after every 10,000 accesses, as a backup or a large copy would
// interleave with a working set.
func zipfWithScans(n int) []Key {
	r := rand.New(rand.NewPCG(3, 4))
	z := rand.NewZipf(r, 1.2, 1, 100_000)
	keys := make([]Key, 0, n)
	next := Key(1 << 40) // scan keys, apart from the Zipf keys
	for len(keys) < n {
		for range 10_000 {
			keys = append(keys, Key(z.Uint64()))
		}
		for range 3_000 {
			keys = append(keys, next)
			next++
		}
	}
	return keys[:n]
}

// The sanity check of W-TinyLFU, which has no libCacheSim figure to match: its frequency filter keeps
// scans out of the main cache, so it must beat LRU, which a scan flushes, by a clear margin.
func TestWTinyLFUBeatsLRUOnScans(t *testing.T) {
	keys := zipfWithScans(400_000)
	for _, size := range []int{500, 2_000, 5_000} {
		w := missRatio(t, "wtinylfu", size, keys)
		l := missRatio(t, "lru", size, keys)
		t.Logf("cache %d: wtinylfu %.4f, lru %.4f", size, w, l)
		require.Less(t, w, l-0.02, "cache %d: W-TinyLFU misses %.4f, LRU %.4f", size, w, l)
	}
}

func TestFreqSketch(t *testing.T) {
	tests := []struct {
		name  string
		adds  map[Key]int
		halve int
		want  map[Key]uint16
	}{
		{"empty", nil, 0, map[Key]uint16{1: 0, 2: 0}},
		{"counts", map[Key]int{1: 3, 2: 1, 1 << 40: 7}, 0, map[Key]uint16{1: 3, 2: 1, 1 << 40: 7, 3: 0}},
		{"halved twice", map[Key]int{1: 9, 2: 1}, 2, map[Key]uint16{1: 2, 2: 0}},
		{"saturates", map[Key]int{5: 70_000}, 0, map[Key]uint16{5: 65_535}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFreqSketch(1000, wtSketchError)
			require.Equal(t, uint32(10), s.hashes)
			require.Len(t, s.counters, 14_378)
			for k, n := range tt.adds {
				for range n {
					s.add(k)
				}
			}
			for range tt.halve {
				s.halve()
			}
			for k, want := range tt.want {
				require.Equal(t, want, s.estimate(k), "key %d", k)
			}
		})
	}
}

// The sketch ages: after 32 hits in main per key of main, every count halves.
func TestWTinyLFUDecay(t *testing.T) {
	p := NewWTinyLFU(Config{Capacity: 10}).(*WTinyLFU)
	require.Equal(t, 9, p.mainCap)
	for k := range Key(11) { // the 11th insert moves the window's keys into main
		p.Insert(k)
	}
	require.Equal(t, wtProbation, p.a.at(mustLookup(t, &p.a, 0)).meta)
	before := p.sketch.estimate(0) // counted at insert and on leaving the window
	require.Equal(t, uint16(2), before)
	for range p.decayEvery - 1 {
		require.True(t, p.Get(0))
	}
	require.Equal(t, before+uint16(p.decayEvery-1), p.sketch.estimate(0))
	require.True(t, p.Get(0))
	require.Equal(t, (before+uint16(p.decayEvery))/2, p.sketch.estimate(0))
}

func mustLookup[M any](t *testing.T, a *arena[M], k Key) int32 {
	i, ok := a.lookup(k)
	require.True(t, ok, "key %d has no node", k)
	return i
}
