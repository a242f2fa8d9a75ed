package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
)

func TestChecksumTargets(t *testing.T) {
	serve := func(bin, key, reduction, mode string) string {
		return bin + " serve --backend file:///w/" + key + "-backend.img?size=1GiB --nbd unix:/t.sock --ram 0 --ssd /w/" + key +
			"-ssd.img --ssd-size 512MiB --reduction " + reduction + mode + " --admin unix:/w/" + key + "-admin.sock --log-level warn"
	}
	for _, tc := range []struct{ group, mode, flag string }{{"h", "", ""}, {"w", "writeback", " --mode writeback"}} {
		t.Run(tc.group, func(t *testing.T) {
			targets := checksumTargets("/bin/tierblk", "/old/tierblk", "/w", tc.group, tc.mode)
			want := []struct{ name, cmd string }{
				{"this compress", serve("/bin/tierblk", tc.group+"-this-compress", "compress", tc.flag)},
				{"baseline compress", serve("/old/tierblk", tc.group+"-baseline-compress", "compress", tc.flag)},
				{"this off", serve("/bin/tierblk", tc.group+"-this-off", "off", tc.flag)},
				{"baseline off", serve("/old/tierblk", tc.group+"-baseline-off", "off", tc.flag)},
				{nameQemuNBD, "qemu-nbd -t -f raw --cache=none --aio=native -k /t.sock /w/" + tc.group + "-qemu-nbd.img"},
			}
			require.Len(t, targets, len(want))
			for i, tg := range targets {
				require.Equal(t, want[i].name, tg.Name)
				require.Equal(t, want[i].cmd, strings.Join(tg.Command("/t.sock").Args, " "))
			}
		})
	}
	// The literal form of one, so that the helper above cannot hide a change of shape.
	require.Equal(t, "/old/tierblk serve --backend file:///w/w-baseline-off-backend.img?size=1GiB --nbd unix:/t.sock --ram 0 --ssd /w/w-baseline-off-ssd.img --ssd-size 512MiB --reduction off --mode writeback --admin unix:/w/w-baseline-off-admin.sock --log-level warn",
		strings.Join(checksumTargets("/bin/tierblk", "/old/tierblk", "/w", "w", "writeback")[3].Command("/t.sock").Args, " "))
}

func TestChecksumRows(t *testing.T) {
	require.Equal(t, "compress", ChecksumReductions()[0], "the default reduction first")
	rows := append(ChecksumHitRows(), ChecksumWriteRow())
	require.Len(t, rows, 3)
	for _, r := range rows {
		require.Contains(t, []string{"IOPS", "MiB/s"}, r.Unit, r.Name)
	}
	require.Equal(t, []string{"--rw=randread", "--bs=4k", "--iodepth=32"}, rows[0].FioArgs)
	require.Equal(t, []string{"--rw=randread", "--bs=1M", "--iodepth=8"}, rows[1].FioArgs)
	require.Equal(t, []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"}, rows[2].FioArgs)
}

func TestLookupsBetween(t *testing.T) {
	require.Equal(t, Lookups{Hits: 900, Misses: 2},
		lookupsBetween(cache.TierStats{Hits: 100, Misses: 5}, cache.TierStats{Hits: 1000, Misses: 7}))
}

func TestChecksumTable(t *testing.T) {
	samples := func(this, base, qemu []float64) map[string][]float64 {
		return map[string][]float64{"this compress": this, "baseline compress": base, "this off": base, "baseline off": this, nameQemuNBD: qemu}
	}
	res := Result{Row: "4K", Unit: "IOPS", Samples: samples([]float64{95, 90, 100}, []float64{100, 100, 100}, []float64{50, 60, 100})}
	res.CPU = map[string]*CPUUse{}
	for name, c := range map[string]float64{"this compress": 1.0, "baseline compress": 0.9} {
		res.CPU[name] = &CPUUse{Busy: []float64{0.9}, Cores: map[string][]float64{name: {c}}}
	}
	var out bytes.Buffer
	ChecksumTable(&out, ChecksumReport{
		Version: "tierblk abc (go)", BaselineVersion: "tierblk 19fdf5f (go)",
		Results:    []Result{res},
		HitLookups: map[string]Lookups{"this compress": {Hits: 10, Misses: 0}, "baseline off": {Hits: 9, Misses: 1}},
	})
	require.Equal(t, `this: tierblk abc (go); baseline: tierblk 19fdf5f (go)

| workload | this compress | baseline compress | this off | baseline off | qemu-nbd | this compress / baseline compress (min-max) | this compress / qemu-nbd (min-max) | this off / baseline off (min-max) | this off / qemu-nbd (min-max) |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 4K | 95 IOPS | 100 IOPS | 100 IOPS | 95 IOPS | 60 IOPS | 0.95 (0.90-1.00) | 1.50 (1.00-1.90) | 1.05 (1.00-1.11) | 1.67 (1.00-2.00) |

SSD-tier line lookups during the hit rows (a miss is a read that was not a hit): this compress 10 hits, 0 misses; baseline off 9 hits, 1 misses.

CPU during each server's runs (fio's ramp included), medians; µs per I/O (IOPS rows) or per MiB (MiB/s rows):

| workload | server | server cores | machine busy | server µs per I/O or MiB |
|---|---|---:|---:|---:|
| 4K | this compress | 1.00 | 90 % | 10526.3 |
|  | baseline compress | 0.90 | 90 % | 9000.0 |
`, out.String())
}

func TestChecksumOptionsRejected(t *testing.T) {
	o := CacheOptions{Tierblk: "/bin/true", Rounds: 1, Runtime: time.Second, SlowRuntime: time.Second, WorkDir: t.TempDir()}
	_, err := RunChecksums(t.Context(), o, "")
	require.ErrorContains(t, err, "no baseline")
	notTierblk := filepath.Join(t.TempDir(), "tierblk")
	require.NoError(t, os.WriteFile(notTierblk, []byte("#!/bin/sh\necho hello\n"), 0o755))
	o.Tierblk = notTierblk
	_, err = RunChecksums(t.Context(), o, notTierblk)
	require.ErrorContains(t, err, "is not a tierblk binary")
	o.Rounds = 0
	_, err = RunChecksums(t.Context(), o, notTierblk)
	require.Error(t, err)
}

func TestTierblkVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tierblk")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n[ \"$1\" = version ] && echo 'tierblk 19fdf5f (go1.26 linux/amd64)'\n"), 0o755))
	v, err := tierblkVersion(t.Context(), bin)
	require.NoError(t, err)
	require.Equal(t, "tierblk 19fdf5f (go1.26 linux/amd64)", v)
	_, err = tierblkVersion(t.Context(), filepath.Join(t.TempDir(), "missing"))
	require.ErrorContains(t, err, "is not a tierblk binary")
}
