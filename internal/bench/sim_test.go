package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/trace"
)

func smallSimTrace() SimTrace {
	return SimTrace{Requests: 50_000, Objects: 10_000, Alpha: 0.9, ScanShare: 0.1, ScanMin: 100, ScanMax: 500, Seed: 7}
}

func traceBytes(t *testing.T, st SimTrace) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, st.Write(&b))
	return b.Bytes()
}

func generate(st SimTrace) ([]trace.Request, error) {
	var reqs []trace.Request
	err := st.Each(func(r trace.Request) error { reqs = append(reqs, r); return nil })
	return reqs, err
}

func TestSimTraceDeterministic(t *testing.T) {
	st := smallSimTrace()
	a, b := traceBytes(t, st), traceBytes(t, st)
	require.Len(t, a, st.Requests*24)
	require.Equal(t, a, b, "same seed, same bytes")
	st.Seed++
	require.NotEqual(t, a, traceBytes(t, st), "another seed, another trace")
}

func TestSimTraceShape(t *testing.T) {
	st := smallSimTrace()
	reqs, err := generate(st)
	require.NoError(t, err)
	require.Len(t, reqs, st.Requests)
	counts := map[uint64]int{}
	sequential := 0
	for i, r := range reqs {
		require.Less(t, r.ID, uint64(st.Objects))
		require.Equal(t, int64(i), r.Time)
		counts[r.ID]++
		if i > 0 && r.ID == reqs[i-1].ID+1 {
			sequential++
		}
	}
	freq := make([]int, 0, len(counts))
	for _, c := range counts {
		freq = append(freq, c)
	}
	slices.Sort(freq)
	slices.Reverse(freq)
	// Zipf 0.9 over 10,000 objects: the top 1 % of objects draw about 30 % of the Zipf requests,
	// far above the 1 % a uniform draw would give them.
	top := 0
	for _, c := range freq[:st.Objects/100] {
		top += c
	}
	require.Greater(t, float64(top)/float64(st.Requests), 0.2, "skew")
	require.Greater(t, freq[0], 50*freq[len(freq)/2], "the most popular object is far above the median one")
	// Scans make about ScanShare of the requests consecutive ids (a Zipf draw rarely does).
	share := float64(sequential) / float64(st.Requests)
	require.InDelta(t, st.ScanShare, share, 0.05, "scan share")
}

func TestSimTraceRejectsBadParameters(t *testing.T) {
	for _, mut := range []func(*SimTrace){
		func(s *SimTrace) { s.Requests = 0 },
		func(s *SimTrace) { s.Objects = 0 },
		func(s *SimTrace) { s.Alpha = 0 },
		func(s *SimTrace) { s.ScanShare = 1 },
		func(s *SimTrace) { s.ScanMax = s.ScanMin - 1 },
		func(s *SimTrace) { s.ScanMax = s.Objects + 1 },
	} {
		st := smallSimTrace()
		mut(&st)
		_, err := generate(st)
		require.Error(t, err, "%+v", st)
	}
}

func TestEnsureSimTraceCaches(t *testing.T) {
	dir := t.TempDir()
	st := smallSimTrace()
	path, err := EnsureSimTrace(dir, st, io.Discard)
	require.NoError(t, err)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, traceBytes(t, st), got)
	// A complete file is reused (this one is marked so we can tell); a short one is replaced.
	marked := slices.Clone(got)
	marked[0] ^= 0xff
	require.NoError(t, os.WriteFile(path, marked, 0o644))
	var log bytes.Buffer
	again, err := EnsureSimTrace(dir, st, &log)
	require.NoError(t, err)
	require.Equal(t, path, again)
	require.Empty(t, log.String())
	reread, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, marked, reread)
	require.NoError(t, os.WriteFile(path, got[:100], 0o644))
	_, err = EnsureSimTrace(dir, st, &log)
	require.NoError(t, err)
	reread, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, got, reread)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left behind")
}

func TestRunSimReadsTheTrace(t *testing.T) {
	dir := t.TempDir()
	st := smallSimTrace()
	path, err := EnsureSimTrace(dir, st, io.Discard)
	require.NoError(t, err)
	res, err := RunSim(context.Background(), SimOptions{
		TracePath: path, Policies: []string{"lru", "s3fifo"}, Fraction: 0.1, Rounds: 2, WorkDir: dir, Log: io.Discard,
	})
	require.NoError(t, err)
	require.Len(t, res, 2)
	for _, r := range res {
		require.Equal(t, st.Requests, r.Requests)
		require.Len(t, r.Replay, 2)
		require.Len(t, r.EndToEnd, 2)
		require.Nil(t, r.Cachesim)
		require.Greater(t, r.CacheSize, 0)
		require.Greater(t, r.MissRatio, 0.0)
		require.Less(t, r.MissRatio, 1.0)
	}
	_, err = RunSim(context.Background(), SimOptions{
		TracePath: path, Policies: []string{"lru"}, Fraction: 0.1, Rounds: 1, Cachesim: filepath.Join(dir, "no-such-cachesim"), Log: io.Discard,
	})
	require.ErrorContains(t, err, "--cachesim")
}

func TestParseCachesim(t *testing.T) {
	// The stdout of cachesim (libCacheSim) for one cache with --ignore-obj-size 1.
	out := "small.oracleGeneral LRU cache size     1000,           100000 req, miss ratio 0.8133, throughput 0.54 MQPS\n"
	own, miss, err := parseCachesim([]byte("some log line\n" + out))
	require.NoError(t, err)
	require.InDelta(t, 0.54e6, own, 1e-6)
	require.Equal(t, 0.8133, miss)
	_, _, err = parseCachesim([]byte("[ERROR] unknown eviction algorithm\n"))
	require.ErrorContains(t, err, "no result line")
}

func TestSimTable(t *testing.T) {
	rs := []SimResult{{Policy: "lru", CacheSize: 100, Replay: []float64{3e6, 1e6, 2e6}, EndToEnd: []float64{1e6}, MissRatio: 0.5}}
	require.Equal(t, "| policy | cache size | tierblk replay | tierblk end-to-end | miss ratio |\n|---|---:|---:|---:|---:|\n"+
		"| lru | 100 | 2.00 | 1.00 | 0.5000 |\n", SimTable(rs))
	rs[0].Cachesim = &CachesimResult{Name: "lru", Own: []float64{1e6, 4e6}, Wall: []float64{0.5e6}, MissRatio: 0.5001}
	got := SimTable(rs)
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	require.Len(t, lines, 3)
	require.Contains(t, lines[0], "ratio replay")
	require.Equal(t, "| lru | 100 | 2.00 | 1.00 | 2.50 | 0.50 | 0.80 | 2.00 | 0.5000 | 0.5001 |", lines[2])
}
