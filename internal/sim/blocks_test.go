package sim

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/trace"
)

// TestLinesModelByHand replays reads through 64 KiB lines as the daemon serves them, and checks
// each count by hand against the whole-object model.
func TestLinesModelByHand(t *testing.T) {
	const line = 64 << 10
	reqs := []trace.Request{
		{Offset: 0, Length: 4096},                            // line 0: a miss at the device's start; fetches its block
		{Offset: 4096, Length: 4096},                         // continues it: a miss that fetches on to the line's end
		{Offset: 8192, Length: 4096},                         // a hit
		{Offset: 10 * line, Length: 100},                     // line 10: a miss; fetches the touched block
		{Offset: 10*line + 8192, Length: 1},                  // line 10 again, another block: a miss, its block
		{Offset: 10 * line, Length: 4096},                    // a hit on the first block
		{Offset: 20 * line, Length: 4096, Op: trace.OpWrite}, // line 20: a write caches its block
		{Offset: 20 * line, Length: 4096},                    // a hit
	}
	jobs := []Job{{Policy: "lru", Size: 8}}
	s, err := run(t, reqs, jobs, Options{BlockSize: line, Blocks: true})
	require.NoError(t, err)
	r := s.Results[0]
	require.Equal(t, int64(8), r.Accesses)
	require.InDelta(t, 5.0/8, r.MissRatio, 1e-9, "misses: reads 1, 2, 4 and 5, and the write to a line not held")
	read := 4096*5 + 100 + 1
	fetched := 4096 + (line - 4096) + 4096 + 4096
	require.InDelta(t, float64(fetched)/float64(read), r.FetchRatio, 1e-9)
	require.Equal(t, 3, r.Held, "lines 0, 10 and 20")
	require.Zero(t, r.Evicted)
	s, err = run(t, reqs, []Job{{Policy: "fifo", Size: 2}}, Options{BlockSize: line, Blocks: true})
	require.NoError(t, err)
	require.Equal(t, 2, s.Results[0].Held)
	require.EqualValues(t, 1, s.Results[0].Evicted, "line 20 evicts line 0")

	// The object model: a line held is a hit whatever blocks it holds, and a miss fetches it whole.
	s, err = run(t, reqs, jobs, Options{BlockSize: line})
	require.NoError(t, err)
	res := s.Results
	require.InDelta(t, 3.0/8, res[0].MissRatio, 1e-9, "misses: lines 0, 10 and 20 (the write) once each")
	require.InDelta(t, float64(2*line)/float64(read), res[0].FetchRatio, 1e-9, "the write fetches nothing")
}

// TestLinesModelNeedsLines: the line model refuses keys that are not lines of 4 KiB blocks.
func TestLinesModelNeedsLines(t *testing.T) {
	for _, bs := range []int64{0, 512, 6144, 2 << 20} {
		_, err := run(t, ids(1, 2).reqs, []Job{{Policy: "lru", Size: 2}}, Options{BlockSize: bs, Blocks: true})
		require.ErrorContains(t, err, "multiple of 4KiB", "block size %d", bs)
	}
}
