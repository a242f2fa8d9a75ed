package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
)

func TestOrderCommands(t *testing.T) {
	for _, tc := range []struct {
		name, backend, order, want string
	}{
		{"address order over the slow disk", OrderSlow, cache.OrderAddress,
			"/bin/tierblk serve --backend nbd+unix:///?socket=/w/r/backend.sock --nbd unix:/w/r/nbd.sock --ram 256MiB --ssd /w/r/ssd.img --ssd-size 512MiB " +
				"--mode writeback --write-back-order address --log-level warn --admin unix:/w/r/admin.sock"},
		{"flush order over a file", OrderFile, cache.OrderFlush,
			"/bin/tierblk serve --backend file:///w/r/backend.img?size=1GiB&direct=true --nbd unix:/w/r/nbd.sock --ram 256MiB --ssd /w/r/ssd.img --ssd-size 512MiB " +
				"--mode writeback --write-back-order flush --log-level warn --admin unix:/w/r/admin.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, strings.Join(orderTierblk("/bin/tierblk", orderBackendURI(tc.backend, "/w/r"), "/w/r", tc.order), " "))
		})
	}
	require.Equal(t, []string{"--rw=randwrite", "--bs=4k", "--iodepth=32", "--fsync=64", "--number_ios=16384"}, orderFioArgs(16384))
}

func TestOrderCommandsPrinted(t *testing.T) {
	got := orderCommands(OrderOptions{Tierblk: "/bin/tierblk", Size: "128m", Writes: 1024}, "/tmp/order1")
	require.Equal(t, []string{
		"slow disk: nbdkit -f -U WORK/ROUND/backend.sock --filter=noparallel --filter=delay memory 1G delay-read=5ms delay-write=5ms",
		"tierblk over the slow disk: /bin/tierblk serve --backend 'nbd+unix:///?socket=WORK/ROUND/backend.sock' --nbd unix:WORK/ROUND/nbd.sock " +
			"--ram 256MiB --ssd WORK/ROUND/ssd.img --ssd-size 512MiB --mode writeback --write-back-order ORDER --log-level warn --admin unix:WORK/ROUND/admin.sock",
		"tierblk over the file: /bin/tierblk serve --backend 'file://WORK/ROUND/backend.img?size=1GiB&direct=true' --nbd unix:WORK/ROUND/nbd.sock " +
			"--ram 256MiB --ssd WORK/ROUND/ssd.img --ssd-size 512MiB --mode writeback --write-back-order ORDER --log-level warn --admin unix:WORK/ROUND/admin.sock",
		"write phase: fio --name=bench --ioengine=nbd '--uri=nbd+unix:///?socket=WORK/ROUND/nbd.sock' --size=128m --numjobs=1 --output-format=json " +
			"--random_generator=tausworthe64 --rw=randwrite --bs=4k --iodepth=32 --fsync=64 --number_ios=1024",
		"destage, timed: /bin/tierblk flush --admin unix:WORK/ROUND/admin.sock",
		"overwrite phase: fio --name=bench --ioengine=nbd '--uri=nbd+unix:///?socket=WORK/ROUND/nbd.sock' --size=8m --numjobs=1 --output-format=json " +
			"--random_generator=tausworthe64 --rw=randwrite --bs=4k --iodepth=32 --fsync=64 --number_ios=1024 --norandommap",
	}, got)
}

func TestOrderTable(t *testing.T) {
	got := OrderTable([]OrderResult{
		{Row: "4K", Backend: OrderSlow, Unit: "IOPS", Address: []float64{40000, 50000, 40000}, Flush: []float64{38000, 40000, 44000}},
		{Row: "destage", Backend: OrderSlow, Unit: "MiB/s", Address: []float64{2, 4}, Flush: []float64{1, 1}},
	})
	// The ratios are paired by round: 0.95, 0.80 and 1.10, whose median is not the medians' ratio.
	require.Equal(t, `| workload | backend | address order | flush order | ratio flush/address, median | min | max |
|---|---|---:|---:|---:|---:|---:|
| 4K | slow disk | 40000 IOPS | 40000 IOPS | 0.95 | 0.80 | 1.10 |
| destage | slow disk | 3.00 MiB/s | 1.00 MiB/s | 0.38 | 0.25 | 0.50 |
`, got)
}

func TestOrderResultAdd(t *testing.T) {
	var r OrderResult
	r.add(cache.OrderFlush, 2)
	r.add(cache.OrderAddress, 4)
	r.add(cache.OrderAddress, 8)
	r.add(cache.OrderFlush, 2)
	require.Equal(t, []float64{4, 8}, r.Address)
	require.Equal(t, []float64{2, 2}, r.Flush)
	require.Equal(t, []float64{0.5, 0.25}, r.Ratios())
	require.Equal(t, []string{"slow disk", "file"}, OrderBackends())
}

func TestOrderOptionsRejected(t *testing.T) {
	ok := OrderOptions{Rounds: 1, Size: "128m", Writes: 64, WorkDir: t.TempDir()}
	require.NoError(t, ok.Validate())
	for _, tc := range []struct {
		name, want string
		mut        func(*OrderOptions)
	}{
		{"no round", "--rounds", func(o *OrderOptions) { o.Rounds = 0 }},
		{"no size", "--size", func(o *OrderOptions) { o.Size = "" }},
		{"not a size", "--size", func(o *OrderOptions) { o.Size = "lots" }},
		{"region over a quarter of the SSD tier", "4KiB to 128MiB", func(o *OrderOptions) { o.Size = "129m" }},
		{"fewer writes than an epoch", "at least 64", func(o *OrderOptions) { o.Writes = 63 }},
		{"more writes than blocks", "at most 256", func(o *OrderOptions) { o.Size, o.Writes = "1m", 257 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.mut(&o)
			require.ErrorContains(t, o.Validate(), tc.want)
			_, err := RunOrder(t.Context(), o)
			require.ErrorContains(t, err, tc.want, "RunOrder checks as Validate does")
		})
	}
}
