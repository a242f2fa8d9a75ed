package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
)

func TestReductionTargets(t *testing.T) {
	targets := reductionTargets("/bin/tierblk", "/work", "r", "/img/usr.ext4", 1<<30, imageTargets)
	serve := func(image, ssd, reduction string) string {
		return "/bin/tierblk serve --backend file://" + image + " --read-only --nbd unix:/t.sock --ram 0 --ssd /work/" + ssd +
			"-ssd.img --ssd-size 1073741824 --admission always --congestion off --reduction " + reduction + " --admin unix:/work/" + ssd + "-admin.sock --log-level warn"
	}
	wbServe := func(reduction string) string {
		return "/bin/tierblk serve --backend file:///work/" + reduction + "-wb-backend.img?size=1GiB --nbd unix:/t.sock --ram 0 --ssd /work/" + reduction +
			"-wb-ssd.img --ssd-size 1GiB --mode writeback --admission always --congestion off --reduction " + reduction + " --log-level warn"
	}
	want := []struct{ name, cmd string }{
		{nameReductionOff, serve("/img/usr.ext4", "roff", "off")},
		{nameReductionZero, serve("/img/usr.ext4", "rzero", "zero")},
		{nameReductionCompress, serve("/img/usr.ext4", "rcompress", "compress")},
		{nameRandomOff, serve("/work/random.img", "xoff", "off")},
		{nameRandomCompress, serve("/work/random.img", "xcompress", "compress")},
		{nameWriteBackOff, wbServe("off")},
		{nameWriteBackZero, wbServe("zero")},
		{nameWriteBackCompress, wbServe("compress")},
	}
	targets = append(targets, reductionTargets("/bin/tierblk", "/work", "x", "/work/random.img", 1<<30, randomTargets)...)
	targets = append(targets, writeBackTargets("/bin/tierblk", "/work")...)
	require.Len(t, targets, len(want))
	for i, tg := range targets {
		require.Equal(t, want[i].name, tg.Name)
		require.Equal(t, want[i].cmd, strings.Join(tg.Command("/t.sock").Args, " "))
	}
	// The literal form of one, so that the helpers above cannot hide a change of shape.
	require.Equal(t, "/bin/tierblk serve --backend file:///img/usr.ext4 --read-only --nbd unix:/t.sock --ram 0 --ssd /work/rcompress-ssd.img --ssd-size 1073741824 --admission always --congestion off --reduction compress --admin unix:/work/rcompress-admin.sock --log-level warn",
		strings.Join(targets[2].Command("/t.sock").Args, " "))
}

func TestReductionSSDSize(t *testing.T) {
	// 2 GiB and 1/7 on top, plus two lines, in whole lines: room for every line and the slots set aside.
	require.Equal(t, int64(2454388736), reductionSSDSize(2<<30))
	require.Zero(t, reductionSSDSize(8<<20+12345)%cache.DefaultLineSize)
	require.GreaterOrEqual(t, reductionSSDSize(8<<20)*7/8, int64(8<<20))
}

func TestReductionTable(t *testing.T) {
	var out bytes.Buffer
	ReductionTable(&out, ReductionReport{
		Stored: map[string]cache.TierStats{
			nameReductionOff:      {LogicalBytes: 1 << 30, PhysicalBytes: 1 << 30},
			nameReductionZero:     {LogicalBytes: 1 << 30, PhysicalBytes: 384 << 20},
			nameReductionCompress: {LogicalBytes: 1 << 30, PhysicalBytes: 256 << 20},
			nameRandomOff:         {LogicalBytes: 256 << 20, PhysicalBytes: 256 << 20},
			nameRandomCompress:    {LogicalBytes: 256 << 20, PhysicalBytes: 256 << 20},
		},
		Fill: map[string]time.Duration{nameReductionOff: 4 * time.Second, nameReductionZero: 2500 * time.Millisecond,
			nameReductionCompress: 3 * time.Second, nameRandomOff: time.Second, nameRandomCompress: 1200 * time.Millisecond},
		Hits: []Result{{Row: "4K", Unit: "IOPS", Samples: map[string][]float64{
			nameReductionOff: {100, 200, 300}, nameReductionZero: {110, 180, 330}, nameReductionCompress: {90, 200, 330},
		}}},
		Random: Result{Row: "4K random", Unit: "IOPS", Samples: map[string][]float64{
			nameRandomOff: {100, 200, 300}, nameRandomCompress: {97, 200, 270},
		}},
		Writes: Result{Row: "4K write", Unit: "IOPS", Samples: map[string][]float64{
			nameWriteBackOff: {1000, 2000}, nameWriteBackZero: {900, 2000}, nameWriteBackCompress: {800, 1800},
		}},
	})
	require.Equal(t, `| SSD tier | logical | physical | physical/logical | first read of the image |
|---|---:|---:|---:|---:|
| tierblk --reduction off | 1024.0 MiB | 1024.0 MiB | 1.000 | 4.0 s |
| tierblk --reduction zero | 1024.0 MiB | 384.0 MiB | 0.375 | 2.5 s |
| tierblk --reduction compress | 1024.0 MiB | 256.0 MiB | 0.250 | 3.0 s |
| random bytes, --reduction off | 256.0 MiB | 256.0 MiB | 1.000 | 1.0 s |
| random bytes, --reduction compress | 256.0 MiB | 256.0 MiB | 1.000 | 1.2 s |

| workload | tierblk --reduction compress | tierblk --reduction zero | tierblk --reduction off | tierblk --reduction compress / tierblk --reduction off (min-max) | tierblk --reduction zero / tierblk --reduction off (min-max) |
|---|---:|---:|---:|---:|---:|
| 4K | 200 IOPS | 180 IOPS | 200 IOPS | 1.00 (0.90-1.10) | 1.10 (0.90-1.10) |

| workload | random bytes, --reduction compress | random bytes, --reduction off | random bytes, --reduction compress / random bytes, --reduction off (min-max) |
|---|---:|---:|---:|
| 4K random | 200 IOPS | 200 IOPS | 0.97 (0.90-1.00) |

| workload | writeback --reduction compress | writeback --reduction zero | writeback --reduction off | writeback --reduction compress / writeback --reduction off (min-max) | writeback --reduction zero / writeback --reduction off (min-max) |
|---|---:|---:|---:|---:|---:|
| 4K write | 1300 IOPS | 1450 IOPS | 1500 IOPS | 0.85 (0.80-0.90) | 0.95 (0.90-1.00) |
`, out.String())
}
