package bench

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseProcMem(t *testing.T) {
	for _, tc := range []struct {
		name, status string
		want         procMem
		err          string
	}{
		{name: "all four", status: "Name:\ttierblk\nVmPeak:\t 900 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n" +
			"RssAnon:\t   81920 kB\nRssFile:\t   10240 kB\nRssShmem:\t   16384 kB\nThreads:\t9\n",
			want: procMem{hwm: 200 << 20, rss: 100 << 20, anon: 80 << 20, shmem: 16 << 20}},
		{name: "no shmem", status: "VmHWM:\t1 kB\nVmRSS:\t1 kB\nRssAnon:\t1 kB\n", err: "lacks"},
		{name: "not kB", status: "VmHWM:\t1 MB\nVmRSS:\t1 kB\nRssAnon:\t1 kB\nRssShmem:\t0 kB\n", err: "not a figure in kB"},
		{name: "not a number", status: "VmHWM:\tmany kB\nVmRSS:\t1 kB\nRssAnon:\t1 kB\nRssShmem:\t0 kB\n", err: "invalid syntax"},
		{name: "empty", status: "", err: "lacks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcMem([]byte(tc.status))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.Equal(t, uint64(96<<20), got.held())
		})
	}
	m, err := procStatus(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, m.hwm)
	require.GreaterOrEqual(t, m.hwm, m.rss)
}

func TestParseMemory(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		bound      uint64 // 0: no memory object
		err        bool
	}{
		{name: "this build", body: `{"exports":[],"memory":{"rss_bytes":10,"rss_peak_bytes":20,"held_bytes":5,` +
			`"held_peak_bytes":7,"go_heap_bytes":3,"bound_bytes":100,"ram_tier_bytes":32,"index_bytes":4}}`, bound: 100},
		{name: "a build from before the bound", body: `{"exports":[{"name":"","stats":{}}]}`},
		{name: "not stats", body: `<html>`, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseMemory([]byte(tc.body))
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			if tc.bound == 0 {
				require.Nil(t, m)
				return
			}
			require.NotNil(t, m)
			require.Equal(t, tc.bound, m.Bound)
			require.Equal(t, uint64(7), m.HeldPeak)
			require.Equal(t, uint64(3), m.GoHeap)
			require.Equal(t, uint64(20), m.Peak)
			require.Equal(t, uint64(4), m.Index)
		})
	}
}

func TestMemoryPhases(t *testing.T) {
	ps := MemoryPhases()
	require.Len(t, ps, 3)
	for _, p := range ps {
		args := memoryFioArgs("nbd+unix:///?socket=/w/nbd.sock", p)
		require.Contains(t, args, "--ioengine=nbd", p.Name)
		require.Contains(t, args, "--group_reporting", p.Name, "parseFio wants one job in the report")
		require.Contains(t, args, "--uri=nbd+unix:///?socket=/w/nbd.sock", p.Name)
	}
	// The writers of the first phase split the GiB between them.
	require.Subset(t, ps[0].FioArgs, []string{"--numjobs=4", "--iodepth=64", "--bs=512k", "--size=256m", "--offset_increment=256m"})
	require.Subset(t, ps[1].FioArgs, []string{"--numjobs=4", "--iodepth=64", "--bs=1m", "--rw=randread"})
	require.Subset(t, ps[2].FioArgs, []string{"--numjobs=1", "--iodepth=32", "--bs=4k", "--rw=randwrite"})
}

func TestMemoryServeArgs(t *testing.T) {
	args := memoryServeArgs("/bin/tierblk", "/w/run", 256<<20)
	require.Equal(t, "/bin/tierblk serve --backend 'file:///w/run/backend.img?size=2GiB' --nbd unix:/w/run/nbd.sock --ram 256MiB "+
		"--ssd /w/run/ssd.img --ssd-size 512MiB --mode writeback --admin unix:/w/run/admin.sock --log-level warn", shellJoin(args))
	require.Equal(t, []int64{32 << 20, 256 << 20, 1 << 30}, MemoryRAMTiers())
}

func TestMemoryTable(t *testing.T) {
	this := MemoryResult{RAM: 32 << 20, Build: memoryThis, Samples: []MemorySample{
		{HasStats: true, Bound: 120 << 20, HeldPeak: 100 << 20, GoHeap: 60 << 20, RSSPeak: 144 << 20, ProcHeld: 98 << 20},
		{HasStats: true, Bound: 120 << 20, HeldPeak: 90 << 20, GoHeap: 70 << 20, RSSPeak: 96 << 20, ProcHeld: 88 << 20},
		{HasStats: true, Bound: 120 << 20, HeldPeak: 108 << 20, GoHeap: 50 << 20, RSSPeak: 120 << 20, ProcHeld: 104 << 20},
	}}
	base := MemoryResult{RAM: 32 << 20, Build: memoryBaseline, Samples: []MemorySample{
		{RSSPeak: 192 << 20, ProcHeld: 150 << 20},
		{RSSPeak: 240 << 20, ProcHeld: 200 << 20},
	}}
	got := MemoryTable([]MemoryResult{this, base})
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, strings.Count(lines[0], "|"), strings.Count(lines[1], "|"))
	// VmHWM / (32 + 64 MiB): 1.5, 1.0 and 1.25; held peak / bound 0.83, 0.75 and 0.9.
	require.Equal(t, "| 32MiB | this build | 120.0 (120.0-120.0) | 100.0 (90.0-108.0) | 0.83 (0.75-0.90) | 98.0 (88.0-104.0) | "+
		"120.0 (96.0-144.0) | 1.25 (1.00-1.50) | 60.0 (50.0-70.0) |", lines[2])
	// Two rounds: the median is their mean. No memory object: "-" where only /stats has a figure.
	require.Equal(t, "| 32MiB | baseline | - | - | - | 175.0 (150.0-200.0) | 216.0 (192.0-240.0) | 2.25 (2.00-2.50) | - |", lines[3])
	for _, l := range lines[2:] {
		require.Equal(t, strings.Count(lines[0], "|"), strings.Count(l, "|"), l)
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		in          []float64
		mid, lo, hi float64
	}{
		{nil, 0, 0, 0},
		{[]float64{3}, 3, 3, 3},
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 2, 10}, 3, 1, 10},
	} {
		in := slices.Clone(tc.in)
		mid, lo, hi := spread(tc.in)
		require.Equal(t, []float64{tc.mid, tc.lo, tc.hi}, []float64{mid, lo, hi}, "%v", tc.in)
		require.Equal(t, in, tc.in, "spread must not sort its input")
	}
}

func TestMemoryOptionsRejected(t *testing.T) {
	for _, o := range []MemoryOptions{
		{Tierblk: "/bin/true", RAMTiers: MemoryRAMTiers()},
		{Tierblk: "/bin/true", Rounds: 1},
		{Rounds: 1, RAMTiers: MemoryRAMTiers()},
	} {
		_, err := RunMemory(t.Context(), o)
		require.Error(t, err, "%+v", o)
	}
}
