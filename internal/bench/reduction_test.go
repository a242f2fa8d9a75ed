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
	targets := reductionTargets("/bin/tierblk", "/work", "/img/usr.ext4", 1<<30)
	want := []struct{ name, cmd string }{
		{nameReductionOff, "/bin/tierblk serve --backend file:///img/usr.ext4 --read-only --nbd unix:/t.sock --ram 0 --ssd /work/off-ssd.img --ssd-size 1073741824 --admission always --congestion off --reduction off --admin unix:/work/off-admin.sock --log-level warn"},
		{nameReductionZero, "/bin/tierblk serve --backend file:///img/usr.ext4 --read-only --nbd unix:/t.sock --ram 0 --ssd /work/zero-ssd.img --ssd-size 1073741824 --admission always --congestion off --reduction zero --admin unix:/work/zero-admin.sock --log-level warn"},
	}
	wb := writeBackTargets("/bin/tierblk", "/work")
	want = append(want,
		struct{ name, cmd string }{nameWriteBackOff, "/bin/tierblk serve --backend file:///work/off-wb-backend.img?size=1GiB --nbd unix:/t.sock --ram 0 --ssd /work/off-wb-ssd.img --ssd-size 1GiB --mode writeback --admission always --congestion off --reduction off --log-level warn"},
		struct{ name, cmd string }{nameWriteBackZero, "/bin/tierblk serve --backend file:///work/zero-wb-backend.img?size=1GiB --nbd unix:/t.sock --ram 0 --ssd /work/zero-wb-ssd.img --ssd-size 1GiB --mode writeback --admission always --congestion off --reduction zero --log-level warn"})
	targets = append(targets, wb...)
	require.Len(t, targets, len(want))
	for i, tg := range targets {
		require.Equal(t, want[i].name, tg.Name)
		require.Equal(t, want[i].cmd, strings.Join(tg.Command("/t.sock").Args, " "))
	}
}

func TestReductionTable(t *testing.T) {
	var out bytes.Buffer
	ReductionTable(&out, ReductionReport{
		Stored: map[string]cache.TierStats{
			nameReductionOff:  {LogicalBytes: 1 << 30, PhysicalBytes: 1 << 30},
			nameReductionZero: {LogicalBytes: 1 << 30, PhysicalBytes: 384 << 20},
		},
		Fill: map[string]time.Duration{nameReductionOff: 4 * time.Second, nameReductionZero: 2500 * time.Millisecond},
		Hits: []Result{{Row: "4K", Unit: "IOPS", Samples: map[string][]float64{
			nameReductionOff: {100, 200, 300}, nameReductionZero: {110, 180, 330},
		}}},
		Writes: Result{Row: "4K write", Unit: "IOPS", Samples: map[string][]float64{
			nameWriteBackOff: {1000, 2000}, nameWriteBackZero: {900, 2000},
		}},
	})
	require.Equal(t, `| SSD tier | logical | physical | physical/logical | first read of the image |
|---|---:|---:|---:|---:|
| tierblk --reduction off | 1024.0 MiB | 1024.0 MiB | 1.000 | 4.0 s |
| tierblk --reduction zero | 1024.0 MiB | 384.0 MiB | 0.375 | 2.5 s |

| workload | tierblk --reduction zero | tierblk --reduction off | tierblk --reduction zero / tierblk --reduction off (min-max) |
|---|---:|---:|---:|
| 4K | 180 IOPS | 200 IOPS | 1.10 (0.90-1.10) |

| workload | writeback --reduction zero | writeback --reduction off | writeback --reduction zero / writeback --reduction off (min-max) |
|---|---:|---:|---:|
| 4K write | 1450 IOPS | 1500 IOPS | 0.95 (0.90-1.00) |
`, out.String())
}
