package bench

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
)

func TestColdRows(t *testing.T) {
	rp := &Replay{Name: "t.vscsi", reqs: make([]replayReq, 7)}
	all := coldRows("512g", []*Replay{rp, rp}, nil)
	var ids []string
	for _, r := range all {
		ids = append(ids, r.ID)
		require.Contains(t, r.Name, map[bool]string{true: "over 512g", false: "lower is better"}[r.Fio != nil])
		require.Contains(t, []string{ColdNAS, ColdSlow}, r.Backend)
	}
	require.Equal(t, []string{"nas-read", "nas-rw", "slow-read", "replay", "replay"}, ids)
	require.Equal(t, "IOPS", all[0].Unit())
	require.Equal(t, "s", all[3].Unit())
	require.Contains(t, all[3].Name, "7 requests, 32 in flight")
	require.Contains(t, all[1].Fio.FioArgs, "--rwmixread=50")

	picked := coldRows("1g", []*Replay{rp}, []string{"slow-read", "replay"})
	require.Len(t, picked, 2)
	require.Equal(t, ColdSlow, picked[0].Backend)
	require.Equal(t, rp, picked[1].Replay)
}

func TestColdTargets(t *testing.T) {
	require.Equal(t, "nbdkit -f -U /w/nas.sock --filter=rate memory 1T rate=1G",
		strings.Join(coldBackend(ColdNAS)("/w/nas.sock").Args, " "))
	require.Equal(t, "nbdkit -f -U /w/slow.sock --filter=noparallel --filter=delay memory 1T delay-read=5ms delay-write=5ms",
		strings.Join(coldBackend(ColdSlow)("/w/slow.sock").Args, " "))
	require.Equal(t, "/bin/tierblk serve --backend nbd+unix:///?socket=/w/nas.sock --nbd unix:/w/r/nbd.sock --log-level warn",
		strings.Join(coldTierblk("/bin/tierblk", "/w/nas.sock", "/w/r", false, []string{"--line=4KiB"}), " "),
		"the cache's flags go to the cached tierblk only")
	// The cache's defaults but for its tiers: no --line, --policy, --admission or --mode.
	require.Equal(t, "/bin/tierblk serve --backend nbd+unix:///?socket=/w/nas.sock --nbd unix:/w/r/nbd.sock --log-level warn "+
		"--ram 1GiB --ssd /w/r/ssd.img --ssd-size 8GiB --admin unix:/w/r/admin.sock",
		strings.Join(coldTierblk("/bin/tierblk", "/w/nas.sock", "/w/r", true, nil), " "))
	require.Equal(t, "/bin/tierblk serve --backend nbd+unix:///?socket=/w/nas.sock --nbd unix:/w/r/nbd.sock --log-level warn "+
		"--ram 1GiB --ssd /w/r/ssd.img --ssd-size 8GiB --admin unix:/w/r/admin.sock --admission=nhit:2",
		strings.Join(coldTierblk("/bin/tierblk", "/w/nas.sock", "/w/r", true, []string{"--admission=nhit:2"}), " "))
}

func TestColdTable(t *testing.T) {
	got := ColdTable([]ColdResult{
		{Row: "4K", Backend: ColdNAS, Unit: "IOPS", Cache: []float64{30000, 20000, 33000}, NoCache: []float64{30000, 40000, 30000}, Bound: 37000},
		{Row: "slow", Backend: ColdSlow, Unit: "IOPS", Cache: []float64{190}, NoCache: []float64{200}},
		{Row: "replay", Backend: ColdNAS, Unit: "s", Cache: []float64{4, 3}, NoCache: []float64{20, 30}, Bound: 5.5},
	})
	// The ratios are paired by round: 1.0, 0.5 and 1.1, whose median is not the medians' ratio.
	require.Equal(t, `| workload | backend | tierblk, cache | tierblk, no cache | ratio cache/no cache, median | min | max | NAS alone (once) |
|---|---|---:|---:|---:|---:|---:|---:|
| 4K | NAS | 30000 IOPS | 30000 IOPS | 1.00 | 0.50 | 1.10 | 37000 IOPS |
| slow | slow disk | 190 IOPS | 200 IOPS | 0.95 | 0.95 | 0.95 | — |
| replay | NAS | 3.50 s | 25.00 s | 0.15 | 0.10 | 0.20 | 5.50 s |
`, got)
}

func TestCacheNote(t *testing.T) {
	st := cache.Stats{Tiers: []cache.TierStats{{Name: "ram", Hits: 1, Misses: 9}, {Name: "ssd", Hits: 2, Misses: 7}},
		ReadBytes: 4096, FetchedBytes: 8192}
	require.Equal(t, "ram 1 hits 9 misses, ssd 2 hits 7 misses, read amplification 2.00", cacheNote(st))
	require.Equal(t, "read amplification 0.00", cacheNote(cache.Stats{}))
}

func TestProcCPU(t *testing.T) {
	total, idle, err := parseProcStatCPU("cpu  100 5 50 800 40 1 2 3 7 0\n")
	require.NoError(t, err)
	require.Equal(t, uint64(100+5+50+800+40+1+2+3), total, "guest time is in user time already")
	require.Equal(t, uint64(840), idle)
	_, _, err = parseProcStatCPU("intr 1 2 3 4 5 6")
	require.Error(t, err)

	ticks, err := parsePidStatTicks("42 (tier blk) S 1 42 42 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 9 0 1234 0 0")
	require.NoError(t, err)
	require.Equal(t, uint64(325), ticks)
	_, err = parsePidStatTicks("42 tierblk S 1")
	require.Error(t, err)

	s, err := readCPU(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, s.total)
	require.Contains(t, s.since(cpuSample{}), "% busy")
}

func TestColdOptionsRejected(t *testing.T) {
	ok := ColdOptions{Rounds: 1, Runtime: time.Second, SlowRuntime: time.Second, Size: "8m", WorkDir: t.TempDir()}
	for _, mut := range []func(*ColdOptions){
		func(o *ColdOptions) { o.Rounds = 0 },
		func(o *ColdOptions) { o.Runtime = 0 },
		func(o *ColdOptions) { o.SlowRuntime = 500 * time.Millisecond },
		func(o *ColdOptions) { o.Settle = -time.Second },
		func(o *ColdOptions) { o.Size = "" },
		func(o *ColdOptions) { o.Rows = []string{"nas-read", "warm"} },
	} {
		o := ok
		mut(&o)
		_, err := RunCold(t.Context(), o)
		require.Error(t, err, "%+v", o)
	}
}
