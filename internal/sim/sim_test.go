package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/trace"
)

// sliceReader replays fixed requests: the simulator's input, not a stand-in for a component.
type sliceReader struct{ reqs []trace.Request }

func (s *sliceReader) Next() (trace.Request, error) {
	if len(s.reqs) == 0 {
		return trace.Request{}, io.EOF
	}
	r := s.reqs[0]
	s.reqs = s.reqs[1:]
	return r, nil
}
func (s *sliceReader) Close() error { return nil }

func ids(ids ...uint64) *sliceReader {
	r := &sliceReader{}
	for _, id := range ids {
		r.reqs = append(r.reqs, trace.Request{ID: id, Offset: int64(id) * 4096, Length: 4096})
	}
	return r
}

// mixed has requests that straddle blocks, a write and a second volume.
func mixed() *sliceReader {
	return &sliceReader{reqs: []trace.Request{
		{ID: 7, Offset: 0, Length: 8192},                      // blocks 0, 1
		{ID: 8, Offset: 4095, Length: 2},                      // blocks 0, 1 (straddles)
		{ID: 9, Offset: 8192, Length: 100, Op: trace.OpWrite}, // block 2
		{ID: 9, Offset: 0, Length: 4096, Volume: 1},           // block 0 of another volume
	}}
}

func TestLoadSplitsIntoBlocks(t *testing.T) {
	w, err := Load(mixed(), LoadOptions{BlockSize: 4096, CountDistinct: true})
	require.NoError(t, err)
	vol1 := policy.Key(1) << volumeShift
	require.Equal(t, []policy.Key{0, 1, 0, 1, 2, vol1}, w.Keys)
	require.Equal(t, []uint32{0, 2, 4, 5, 6}, w.Starts)
	require.Equal(t, 4, w.Distinct)

	w, err = Load(mixed(), LoadOptions{CountDistinct: true})
	require.NoError(t, err)
	require.Equal(t, []policy.Key{7, 8, 9, vol1 ^ 9}, w.Keys)
	require.Equal(t, 4, w.Distinct)

	w, err = Load(mixed(), LoadOptions{})
	require.NoError(t, err)
	require.Zero(t, w.Distinct, "not counted unless asked")
}

func TestLoadReadsOnlyAndEmpty(t *testing.T) {
	r := &sliceReader{reqs: []trace.Request{{ID: 1, Op: trace.OpWrite}, {ID: 2, Op: trace.OpRead}, {ID: 3, Op: trace.OpOther}}}
	w, err := Load(r, LoadOptions{ReadsOnly: true})
	require.NoError(t, err)
	require.Equal(t, []policy.Key{2}, w.Keys)
	_, err = Load(&sliceReader{}, LoadOptions{})
	require.ErrorContains(t, err, "no requests")
}

func TestRunLRUByHand(t *testing.T) {
	// LRU with 2 slots: a b a c b a -> miss miss hit miss(evicts b) miss(evicts a) miss = 5/6.
	w, err := Load(ids(1, 2, 1, 3, 2, 1), LoadOptions{})
	require.NoError(t, err)
	res, err := Run(context.Background(), w, []Job{{Policy: "lru", Size: 2}, {Policy: "lru", Size: 3}}, RunOptions{Workers: 2})
	require.NoError(t, err)
	require.InDelta(t, 5.0/6, res[0].MissRatio, 1e-12)
	require.InDelta(t, 3.0/6, res[1].MissRatio, 1e-12) // 3 slots hold all: only cold misses
	require.EqualValues(t, 6, res[0].Requests)
	require.InDelta(t, res[0].MissRatio, res[0].ByteMissRatio, 1e-12, "equal-sized requests")

	// Warm-up: the first 3 requests are not counted; of c b a, c misses, b hits?, no: with 3 slots all
	// of 1,2,3 fit, so c misses (cold) and b, a hit.
	res, err = Run(context.Background(), w, []Job{{Policy: "lru", Size: 3}}, RunOptions{Warmup: 3})
	require.NoError(t, err)
	require.InDelta(t, 1.0/3, res[0].MissRatio, 1e-12)
	require.EqualValues(t, 3, res[0].Requests)
}

func TestRunErrors(t *testing.T) {
	w, err := Load(ids(1, 2), LoadOptions{})
	require.NoError(t, err)
	_, err = Run(context.Background(), w, []Job{{Policy: "nope", Size: 2}}, RunOptions{})
	require.ErrorContains(t, err, `unknown eviction policy "nope"`)
	_, err = Run(context.Background(), w, []Job{{Policy: "lru", Size: 2}}, RunOptions{Warmup: 2})
	require.ErrorContains(t, err, "--warmup")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Run(ctx, w, []Job{{Policy: "lru", Size: 2}}, RunOptions{})
	require.ErrorIs(t, err, context.Canceled)
}

func TestParallelEqualsSerial(t *testing.T) {
	var keys []uint64
	x := uint64(1)
	for range 20000 {
		x = x*6364136223846793005 + 1442695040888963407
		keys = append(keys, (x>>33)%2000)
	}
	w, err := Load(ids(keys...), LoadOptions{})
	require.NoError(t, err)
	var jobs []Job
	for _, s := range []int{10, 100, 1000} {
		jobs = append(jobs, Job{Policy: "lru", Size: s}, Job{Policy: "fifo", Size: s})
	}
	serial, err := Run(context.Background(), w, jobs, RunOptions{Workers: 1})
	require.NoError(t, err)
	par, err := Run(context.Background(), w, jobs, RunOptions{Workers: 4, Progress: io.Discard})
	require.NoError(t, err)
	for i := range serial {
		require.Equal(t, serial[i].MissRatio, par[i].MissRatio, jobs[i])
	}
	require.Greater(t, serial[0].MissRatio, serial[4].MissRatio, "a larger LRU misses less")
}

func TestSizes(t *testing.T) {
	ss, err := ParseSizes("0.1, 500,64KiB")
	require.NoError(t, err)
	k, err := ss[0].Keys(48974, 0)
	require.NoError(t, err)
	require.Equal(t, 4897, k, "floor(0.1 x 48974), as libCacheSim counts")
	k, _ = ss[1].Keys(10, 0)
	require.Equal(t, 500, k)
	k, err = ss[2].Keys(10, 4096)
	require.NoError(t, err)
	require.Equal(t, 16, k)
	_, err = ss[2].Keys(10, 0)
	require.ErrorContains(t, err, "--block-size")

	for _, bad := range []string{"", "0", "-3", "1.5", "lots", "0.0"} {
		_, err := ParseSizes(bad)
		require.Error(t, err, bad)
	}
	ss, _ = ParseSizes("0.001")
	_, err = ss[0].Keys(10, 0)
	require.ErrorContains(t, err, "less than one object")
}

func TestOutputs(t *testing.T) {
	rs := []Result{
		{Policy: "lru", CacheSize: 10, SizeLabel: "0.1", Requests: 100, Accesses: 100, MissRatio: 0.5, ByteMissRatio: 0.25, ThroughputMQPS: 12.5, FetchRatio: 1.25},
		{Policy: "arc", Admission: "nhit:2", CacheSize: 20, SizeLabel: "0.2", Requests: 100, MissRatio: 0.4},
	}
	var b bytes.Buffer
	require.NoError(t, WriteCSV(&b, rs))
	require.Equal(t, "policy,cache_size,requests,miss_ratio,byte_miss_ratio,throughput_mqps,fetch_ratio\n"+
		"lru,10,100,0.500000,0.250000,12.500,1.2500\n"+
		"arc+nhit:2,20,100,0.400000,0.000000,0.000,0.0000\n", b.String())

	b.Reset()
	require.NoError(t, WriteJSON(&b, rs))
	var back []Result
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	require.Equal(t, rs, back)

	b.Reset()
	require.NoError(t, WriteTable(&b, rs))
	require.Contains(t, b.String(), "miss ratio")
	require.Contains(t, b.String(), "0.5000")
	require.Contains(t, b.String(), "fetched/read")

	dir := t.TempDir()
	for _, name := range []string{"mrc.png", "mrc.svg"} {
		p := filepath.Join(dir, name)
		require.NoError(t, Plot(p, "test", rs))
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		if strings.HasSuffix(name, ".png") {
			require.True(t, bytes.HasPrefix(data, []byte("\x89PNG")), "a PNG file")
		} else {
			require.Contains(t, string(data), "<svg")
		}
	}
	require.ErrorContains(t, Plot(filepath.Join(dir, "mrc.jpg"), "t", rs), ".png or .svg")
}
