package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
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

// run replays reqs through jobs in one pass.
func run(t *testing.T, reqs []trace.Request, jobs []Job, o Options) (Summary, error) {
	t.Helper()
	return Run(context.Background(), &sliceReader{reqs: reqs}, jobs, o)
}

func TestBatchSplitsIntoBlocks(t *testing.T) {
	vol1 := policy.Key(1) << volumeShift
	for _, tc := range []struct {
		blockSize int64
		keys      []policy.Key
		starts    []uint32
	}{
		{4096, []policy.Key{0, 1, 0, 1, 2, vol1}, []uint32{0, 2, 4, 5, 6}},
		{0, []policy.Key{7, 8, 9, vol1 ^ 9}, []uint32{0, 1, 2, 3, 4}},
	} {
		var b batch
		b.reset()
		for i, r := range mixed().reqs {
			added, err := b.add(&r, int64(i), tc.blockSize, nil, nil)
			require.NoError(t, err)
			require.True(t, added)
		}
		require.Equal(t, tc.keys, b.keys)
		require.Equal(t, tc.starts, b.starts)
		s, err := CountKeys(context.Background(), mixed(), Options{BlockSize: tc.blockSize})
		require.NoError(t, err)
		require.Equal(t, Summary{Requests: 4, Distinct: 4}, s)
	}
	var b batch
	b.reset()
	_, err := b.add(&trace.Request{Length: 1 << 40}, 0, 512, nil, nil)
	require.ErrorContains(t, err, "use a larger --block-size")
}

func TestReadsOnlyAndEmpty(t *testing.T) {
	reqs := []trace.Request{{ID: 1, Op: trace.OpWrite}, {ID: 2, Op: trace.OpRead}, {ID: 3, Op: trace.OpOther}}
	s, err := CountKeys(context.Background(), &sliceReader{reqs: reqs}, Options{ReadsOnly: true})
	require.NoError(t, err)
	require.Equal(t, Summary{Requests: 1, Distinct: 1}, s)
	s, err = run(t, reqs, []Job{{Policy: "lru", Size: 1}}, Options{ReadsOnly: true})
	require.NoError(t, err)
	require.EqualValues(t, 1, s.Requests)
	require.EqualValues(t, 1, s.Results[0].Accesses)
	_, err = CountKeys(context.Background(), &sliceReader{}, Options{})
	require.ErrorContains(t, err, "no requests")
	_, err = run(t, nil, []Job{{Policy: "lru", Size: 1}}, Options{})
	require.ErrorContains(t, err, "no requests")
}

func TestRunLRUByHand(t *testing.T) {
	// LRU with 2 slots: a b a c b a -> miss miss hit miss(evicts b) miss(evicts a) miss = 5/6.
	reqs := ids(1, 2, 1, 3, 2, 1).reqs
	s, err := run(t, reqs, []Job{{Policy: "lru", Size: 2}, {Policy: "lru", Size: 3}}, Options{Workers: 2})
	require.NoError(t, err)
	res := s.Results
	require.EqualValues(t, 6, s.Requests)
	require.InDelta(t, 5.0/6, res[0].MissRatio, 1e-12)
	require.InDelta(t, 3.0/6, res[1].MissRatio, 1e-12) // 3 slots hold all: only cold misses
	require.EqualValues(t, 6, res[0].Requests)
	require.InDelta(t, res[0].MissRatio, res[0].ByteMissRatio, 1e-12, "equal-sized requests")
	require.Equal(t, [2]int64{2, 3}, [2]int64{int64(res[0].Held), res[0].Evicted}, "c evicts b, b evicts a, a evicts c")
	require.Equal(t, [2]int64{3, 0}, [2]int64{int64(res[1].Held), res[1].Evicted}, "3 slots hold all: nothing evicted")

	// Warm-up: the first 3 requests are not counted; with 3 slots all of 1, 2, 3 fit, so of
	// 3 2 1, 3 misses (cold) and 2 and 1 hit.
	s, err = run(t, reqs, []Job{{Policy: "lru", Size: 3}}, Options{Warmup: 3})
	require.NoError(t, err)
	require.InDelta(t, 1.0/3, s.Results[0].MissRatio, 1e-12)
	require.EqualValues(t, 3, s.Results[0].Requests)
}

func TestRunErrors(t *testing.T) {
	reqs := ids(1, 2).reqs
	_, err := run(t, reqs, []Job{{Policy: "nope", Size: 2}}, Options{})
	require.ErrorContains(t, err, `unknown eviction policy "nope"`)
	_, err = run(t, reqs, []Job{{Policy: "lru", Size: 2}}, Options{Warmup: 2})
	require.ErrorContains(t, err, "--warmup 2 must be below the 2 requests")
	_, err = run(t, reqs, []Job{{Policy: "lru", Size: 2}}, Options{Warmup: -1})
	require.ErrorContains(t, err, "--warmup")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Run(ctx, &sliceReader{reqs: reqs}, []Job{{Policy: "lru", Size: 2}}, Options{})
	require.ErrorIs(t, err, context.Canceled)
}

// A truncated trace fails the pass with the reader's error, which names the file, the record and
// the format, however many batches went before it.
func TestRunTruncatedTrace(t *testing.T) {
	const records = 3*batchRequests + 10
	data := make([]byte, records*24+5)
	for i := range records {
		binary.LittleEndian.PutUint64(data[i*24+4:], uint64(i%100))
		binary.LittleEndian.PutUint64(data[i*24+16:], math.MaxUint64) // next access: none
	}
	for _, pass := range []func(trace.Reader) error{
		func(r trace.Reader) error {
			_, err := Run(context.Background(), r, []Job{{Policy: "lru", Size: 10}, {Policy: "arc", Size: 10}}, Options{Workers: 2})
			return err
		},
		func(r trace.Reader) error { _, err := CountKeys(context.Background(), r, Options{}); return err },
	} {
		r, err := trace.NewReader(bytes.NewReader(data), "cut.oracleGeneral", "oraclegeneral")
		require.NoError(t, err)
		err = pass(r)
		require.NoError(t, r.Close())
		var te *trace.Error
		require.ErrorAs(t, err, &te)
		require.ErrorIs(t, err, trace.ErrTruncated)
		require.EqualError(t, err, fmt.Sprintf("trace cut.oracleGeneral: record %d: oraclegeneral: truncated record (5 of 24 bytes)", records+1))
	}
}

// One pass feeding many caches, in any number of workers, gives each cache what it gives alone:
// over several batches, in both models, with warm-up.
func TestOnePassEqualsSeparateRuns(t *testing.T) {
	var reqs []trace.Request
	x := uint64(1)
	for range 3*batchRequests + 123 {
		x = x*6364136223846793005 + 1442695040888963407
		id := (x >> 33) % 3000
		op := trace.OpRead
		if x>>60 == 0 {
			op = trace.OpWrite
		}
		reqs = append(reqs, trace.Request{ID: id, Offset: int64(id) * 8192, Length: 4096 + int64(x>>50%3)*4096, Op: op})
	}
	var jobs []Job
	for _, p := range policy.EvictionNames() {
		for _, s := range []int{10, 300, 2000} {
			jobs = append(jobs, Job{Policy: p, Size: s, Admission: "nhit:2"})
		}
	}
	for _, o := range []Options{{Warmup: 1000}, {BlockSize: 64 << 10, Blocks: true, Warmup: 10}} {
		var alone []Result
		for _, j := range jobs {
			s, err := run(t, reqs, []Job{j}, o)
			require.NoError(t, err)
			alone = append(alone, s.Results[0])
		}
		for _, workers := range []int{1, 3} {
			o.Workers = workers
			s, err := run(t, reqs, jobs, o)
			require.NoError(t, err)
			require.EqualValues(t, len(reqs), s.Requests)
			for i := range jobs {
				got, want := s.Results[i], alone[i]
				got.ThroughputMQPS, want.ThroughputMQPS = 0, 0
				require.Equal(t, want, got, "%+v, %d workers", jobs[i], workers)
			}
		}
		require.Greater(t, alone[0].MissRatio, alone[2].MissRatio, "a larger cache misses less")
	}
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
	_, err = ParseSizes("1GiB,1GB")
	require.ErrorContains(t, err, `size "1GB": decimal units are not accepted`, "a unit's own error, naming 1GiB")
	_, err = ParseSizes("lots")
	require.ErrorContains(t, err, "neither a fraction (0.01), a number of objects (5000) nor bytes (1GiB)")
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
	require.NoError(t, WriteTable(&b, rs, "lines"))
	require.Contains(t, b.String(), "size  lines  requests  miss ratio")
	require.Contains(t, b.String(), "0.5000")
	require.Contains(t, b.String(), "fetched/read")

	dir := t.TempDir()
	for _, name := range []string{"mrc.png", "mrc.svg"} {
		p := filepath.Join(dir, name)
		require.NoError(t, Plot(p, "test", "objects", rs, &Mark{X: 3, Label: "today"}))
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		if strings.HasSuffix(name, ".png") {
			require.True(t, bytes.HasPrefix(data, []byte("\x89PNG")), "a PNG file")
		} else {
			require.Contains(t, string(data), "<svg")
		}
	}
	require.ErrorContains(t, Plot(filepath.Join(dir, "mrc.jpg"), "t", "objects", rs, nil), ".png or .svg")
}

// TestPlotAxis: the size axis counts keys, named by the caller, unless every size was given in
// bytes: then it is in bytes, marked in binary units.
func TestPlotAxis(t *testing.T) {
	res := func(sizes ...int64) []Result {
		var rs []Result
		for i, b := range sizes {
			rs = append(rs, Result{Policy: "lru", CacheSize: 100 * (i + 1), SizeBytes: b, MissRatio: 0.5 - float64(i)/10})
		}
		return rs
	}
	for _, tc := range []struct {
		name  string
		rs    []Result
		label string
		ticks []string // tick labels the axis must have
	}{
		{"keys", res(0, 0, 0), "cache size (64KiB lines)", []string{"100", "300"}},
		{"keys and bytes", res(0, 1<<30, 0), "cache size (64KiB lines)", []string{"100", "300"}},
		{"bytes", res(1<<30, 2<<30, 3<<30), "cache size", []string{"1GiB", "1536MiB", "2GiB", "3GiB"}},
		{"bytes, log scale", res(64<<20, 1<<30, 64<<30), "cache size, log scale", []string{"64MiB", "1GiB", "64GiB"}},
		{"one size in bytes", res(8 << 30), "cache size", []string{"8GiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mrc.svg")
			require.NoError(t, Plot(path, "test", "64KiB lines", tc.rs, nil))
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			svg := string(data)
			has := func(text string) bool { return strings.Contains(svg, ">"+text+"</text>") }
			require.True(t, has(tc.label), "the axis' label is %q", tc.label)
			for _, tick := range tc.ticks {
				require.True(t, has(tick), "a tick labelled %q", tick)
			}
			require.False(t, strings.Contains(svg, "e+0"), "no tick in powers of ten")
		})
	}
}
