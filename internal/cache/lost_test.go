package cache

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/meta"
)

func rs(pairs ...int64) []meta.Range {
	var out []meta.Range
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, meta.Range{Off: pairs[i], Len: pairs[i+1]})
	}
	return out
}

func TestLostRanges(t *testing.T) {
	for _, tc := range []struct {
		name      string
		have      []meta.Range
		add, cut  []meta.Range
		want      []meta.Range
		overlaps  [][2]int64 // off, n: reported lost
		untouched [][2]int64 // off, n: not lost
	}{
		{name: "empty", want: nil, untouched: [][2]int64{{0, 1 << 30}}},
		{name: "one", add: rs(4096, 4096), want: rs(4096, 4096),
			overlaps: [][2]int64{{4096, 1}, {0, 4097}, {8191, 10}}, untouched: [][2]int64{{0, 4096}, {8192, 4096}}},
		{name: "adjacent join", add: rs(0, 4096, 8192, 4096, 4096, 4096), want: rs(0, 12288)},
		{name: "apart stay apart", add: rs(8192, 512, 0, 512), want: rs(0, 512, 8192, 512),
			untouched: [][2]int64{{512, 7680}}},
		{name: "overlapping join", add: rs(0, 1024, 512, 1024, 4096, 512, 1000, 3200), want: rs(0, 4608)},
		{name: "add inside", have: rs(0, 8192), add: rs(512, 512), want: rs(0, 8192)},
		{name: "cut middle", have: rs(0, 8192), cut: rs(512, 1024), want: rs(0, 512, 1536, 6656)},
		{name: "cut all", have: rs(512, 512, 4096, 512), cut: rs(0, 1<<20), want: rs()},
		{name: "cut edges", have: rs(0, 4096, 8192, 4096), cut: rs(2048, 8192), want: rs(0, 2048, 10240, 2048)},
		{name: "cut elsewhere", have: rs(0, 4096), cut: rs(4096, 4096), want: rs(0, 4096)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stored [][]meta.Range
			l := &lostSet{persist: func(r []meta.Range) error { stored = append(stored, r); return nil }}
			l.load(tc.have)
			for _, r := range tc.add {
				require.NoError(t, l.add(r.Off, r.Len))
			}
			for _, r := range tc.cut {
				require.NoError(t, l.clear(r.Off, r.Len))
			}
			require.Equal(t, len(tc.want), len(l.list()))
			if len(tc.want) > 0 {
				require.Equal(t, tc.want, l.list())
			}
			if len(stored) > 0 {
				require.Equal(t, l.list(), stored[len(stored)-1], "what was stored last is the set")
			}
			for _, o := range tc.overlaps {
				require.ErrorIs(t, l.check(o[0], o[1]), ErrLost, "[%d, +%d)", o[0], o[1])
			}
			for _, o := range tc.untouched {
				require.NoError(t, l.check(o[0], o[1]), "[%d, +%d)", o[0], o[1])
			}
		})
	}
}

// TestLostRangeNotStored: a range that cannot be stored is lost all the same (reads fail), and add
// says why; a write that does not touch a lost range stores nothing.
func TestLostRangeNotStored(t *testing.T) {
	fail := errors.New("store down")
	calls := 0
	l := &lostSet{persist: func([]meta.Range) error { calls++; return fail }}
	require.ErrorIs(t, l.add(0, 4096), fail)
	require.ErrorIs(t, l.check(0, 4096), ErrLost)
	require.NoError(t, l.clear(8192, 4096))
	require.Equal(t, 1, calls, "a clear that changes nothing stores nothing")
}
