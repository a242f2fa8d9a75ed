package bench

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The guest's result lines are read from a console with other lines between them; a line that
// does not parse is an error, not a sample lost.
func TestParseKernelBench(t *testing.T) {
	console := `TIERBLK-VM: booted 6.12.117, running /test.sh
TIERBLK-VM: none, zipf: devices made again (NAS 1024 MiB at 2 ms, SSD 256 MiB)
TIERBLK-BENCH: contender=none row=zipf iops=6297 mbps=25.8 busy=0.510 lat_p50_us=2400 lat_p99_us=3100
[   12.3] random kernel line
TIERBLK-STATS: contender=tierblk row=seq export nas: 1 GiB
TIERBLK-STATS: contender=tierblk row=seq   ssd: hits 12, misses 3` + "\r" + `
TIERBLK-BENCH: contender=tierblk row=seq iops=24 mbps=24.1 busy=0.900 lat_p50_us=150000 lat_p99_us=400000
`
	got, err := parseKernelBench(strings.NewReader(console))
	require.NoError(t, err)
	require.Equal(t, []KernelSample{
		{Contender: "none", Row: "zipf", IOPS: 6297, MBps: 25.8, Busy: 0.51, P50: 2400, P99: 3100},
		{Contender: "tierblk", Row: "seq", IOPS: 24, MBps: 24.1, Busy: 0.9, P50: 150000, P99: 400000,
			Stats: []string{"export nas: 1 GiB", "  ssd: hits 12, misses 3"}},
	}, got)
	require.InDelta(t, 0.51*2*1e6/6297, got[0].cpuPerRequest(), 1e-9)

	for _, bad := range []string{
		"TIERBLK-BENCH: contender=none row=zipf iops=many",
		"TIERBLK-BENCH: row=zipf iops=1",
		"TIERBLK-BENCH: contender=none row=zipf iops",
		"TIERBLK-STATS: row=zipf hits 3",
	} {
		_, err := parseKernelBench(strings.NewReader(bad + "\n"))
		require.Error(t, err, bad)
	}
}

// The guest's CPU profiles come base64 in lines of 76 characters, between other lines; each is
// put together by contender and row and decoded; a line or an encoding that does not parse is an
// error.
func TestKernelProfiles(t *testing.T) {
	a, b := bytes.Repeat([]byte("profile of ublk, zipf "), 10), []byte("tierblk, randw")
	lines := func(c, r string, p []byte) string {
		enc := base64.StdEncoding.EncodeToString(p)
		var out strings.Builder
		for len(enc) > 0 {
			n := min(76, len(enc))
			fmt.Fprintf(&out, "TIERBLK-PPROF: contender=%s row=%s %s\n", c, r, enc[:n])
			enc = enc[n:]
		}
		return out.String()
	}
	console := "TIERBLK-VM: booted\n" + lines("ublk", "zipf", a) + "[ 1.2] kernel line\r\n" + lines("tierblk", "randw", b)
	got, err := kernelProfiles(console)
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"ublk-zipf": a, "tierblk-randw": b}, got)

	for _, bad := range []string{
		"TIERBLK-PPROF: contender=ublk AAAA",
		"TIERBLK-PPROF: row=zipf contender=ublk AAAA",
		"TIERBLK-PPROF: contender=ublk row=zipf not*base64",
	} {
		_, err := kernelProfiles(bad + "\n")
		require.Error(t, err, bad)
	}
}

// tierblk's ratio is to the better peer of each round, paired by round.
func TestKernelTable(t *testing.T) {
	s := func(c string, iops ...float64) map[string][]KernelSample {
		var out []KernelSample
		for _, v := range iops {
			out = append(out, KernelSample{Contender: c, Row: "zipf", IOPS: v, Busy: 0.5})
		}
		return map[string][]KernelSample{"zipf": out}
	}
	res := []KernelResult{{NASms: 2, Samples: map[string]map[string][]KernelSample{
		"none":        s("none", 100, 100, 100),
		"dmcache":     s("dmcache", 200, 400, 100),
		"bcache":      s("bcache", 400, 200, 200),
		"tierblk":     s("tierblk", 200, 200, 300),
		"tierblkaddr": s("tierblkaddr", 250, 100, 300),
	}}}
	table := KernelTable(res)
	require.Contains(t, table, "| none | dmcache | bcache | tierblk | tierblkaddr |")
	// Per round: 200/400, 200/400, 300/200; 200/100...; and flush order over address
	// order: 200/250, 200/100, 300/300.
	require.Contains(t, table, "| 0.50 (0.50-1.50) | 2.00 (2.00-3.00) | 1.00 (0.80-2.00) |")
	require.Contains(t, table, "| 200 (5000 µs CPU) |") // dmcache's median, 0.5 x 2 CPUs / 200 a second
}

func TestKernelOptionsValidate(t *testing.T) {
	ok := KernelOptions{Rounds: 1, NASms: []int{2}, Warm: time.Second, Measure: time.Second, MemMiB: 3072}
	require.NoError(t, ok.Validate())
	for _, c := range []struct {
		name string
		mod  func(*KernelOptions)
		want string
	}{
		{"no rounds", func(o *KernelOptions) { o.Rounds = 0 }, "--rounds"},
		{"no latency", func(o *KernelOptions) { o.NASms = nil }, "--nas-ms"},
		{"a contender unknown", func(o *KernelOptions) { o.Contenders = []string{"lvmcache"} }, `unknown contender "lvmcache"`},
		{"a row unknown", func(o *KernelOptions) { o.Rows = []string{"mixed"} }, `unknown row "mixed"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := ok
			c.mod(&o)
			require.ErrorContains(t, o.Validate(), c.want)
		})
	}
}
