package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/units"
)

// The order part of `tierblk bench writeback` (issue 47): tierblk in write-back with
// --write-back-order address against flush, everything else equal. Only the database-like writer
// is here, over fresh blocks and then over its own still-dirty ones; the file-system writer (ext4
// under fio with fsync) needs a kernel block device, which only the kernel VM (`tierblk bench
// kernel`) has, and is left out.
const (
	// OrderSlow and OrderFile are the backends: the write-back bench's slow disk (5 ms a request,
	// one at a time) and a file in the work directory opened with O_DIRECT.
	OrderSlow = "slow disk"
	OrderFile = "file"
	// OrderFsync is how many writes fio makes between two fsyncs, each an NBD FLUSH: an epoch.
	OrderFsync = 64
	// OrderOverwriteRegion is where the overwrite phase writes: a hot set whose blocks are written
	// again while dirty (fio without its random map), so that in FLUSH order a write often lands
	// on a block an older epoch left dirty, which the backend still needs.
	OrderOverwriteRegion = "8m"
	// OrderSSD is the SSD tier. The region fio writes may be at most OrderRegionShare of it, so
	// that the dirty ratio (dirty lines over the tier's lines) stays at or below the low watermark
	// (0.25 by default): far under the maximum (0.9), with no write throttled and no destage
	// during the write phase, whatever the line size and however long fio writes.
	OrderSSD         = CacheSSD
	OrderRegionShare = 0.25
	// orderBackendSize is both backends' size (the slow disk's is slowDiskArgs' 1G).
	orderBackendSize = "1GiB"
	orderBlock       = 4096
	orderUnitWrite   = "IOPS"
	orderUnitDrain   = "MiB/s"
	orderUnitBlocks  = "blocks"
)

// OrderOptions control `tierblk bench writeback --parts order`.
type OrderOptions struct {
	// Tierblk is the binary measured in both orders.
	Tierblk string
	Rounds  int
	// Size is the region the 4 KiB random writes fall in (fio size syntax), at most
	// OrderRegionShare of OrderSSD.
	Size string
	// Writes is how many 4 KiB writes each measurement makes: the same work in both orders, so
	// that each flush drains the same dirty data.
	Writes int
	// WorkDir holds the sockets, the SSD tiers and the backend files; it needs O_DIRECT.
	WorkDir string
	Log     io.Writer
}

// OrderResult is one row's figures, one sample per round in each order.
type OrderResult struct {
	Row, Backend, Unit string
	Address, Flush     []float64
}

// Ratios are flush/address per round, paired by round.
func (r OrderResult) Ratios() []float64 { return pairedRatios(r.Flush, r.Address) }

// OrderReport is RunOrder's outcome: four rows per backend (write IOPS, destage rate, blocks a
// backend write, overwrite IOPS) and the command lines measured.
type OrderReport struct {
	Results []OrderResult
	// Commands use WORK for the run's directory and ROUND for a measurement's own.
	Commands []string
}

// orderSample is what one measurement gives: fio's write IOPS, how fast `tierblk flush` wrote
// back the dirty data fio left, and in how many 4 KiB blocks a backend write on average (a
// backend that is bound by its requests, as the slow disk is, drains at that many blocks a
// request: FLUSH order may coalesce only within an epoch); then fio's write IOPS over blocks it
// keeps writing again while they are dirty.
type orderSample struct{ iops, drain, perWrite, overwriteIOPS float64 }

// OrderBackends are the backends, in the table's order.
func OrderBackends() []string { return []string{OrderSlow, OrderFile} }

// Validate checks the options a user gives.
func (o OrderOptions) Validate() error {
	if o.Rounds < 1 {
		return fmt.Errorf("--rounds must be at least 1, got %d", o.Rounds)
	}
	region, err := units.ParseSize(o.Size)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	ssd, _ := units.ParseSize(OrderSSD)
	if limit := int64(float64(ssd) * OrderRegionShare); region < orderBlock || region > limit {
		return fmt.Errorf("--size %s: the order part's region must be 4KiB to %dMiB (%.2f of its %s SSD tier), so that dirty data stays far under its maximum",
			o.Size, limit>>20, OrderRegionShare, OrderSSD)
	}
	if o.Writes < OrderFsync || int64(o.Writes)*orderBlock > region {
		return fmt.Errorf("--order-writes %d: give at least %d (one FLUSH) and at most %d (the 4 KiB blocks of --size %s)",
			o.Writes, OrderFsync, region/orderBlock, o.Size)
	}
	return nil
}

// check is Validate, and that the tools and the work directory are fit to run.
func (o OrderOptions) check() error {
	if err := o.Validate(); err != nil {
		return err
	}
	return checkFioRun(o.WorkDir)
}

// orderFioArgs are the fio arguments of the write phase: a database-like writer, 4 KiB random
// writes with an fsync (fio's nbd engine sends an NBD FLUSH) every OrderFsync writes, stopping
// after writes writes.
func orderFioArgs(writes int) []string {
	return []string{"--rw=randwrite", "--bs=4k", "--iodepth=32", fmt.Sprintf("--fsync=%d", OrderFsync), fmt.Sprintf("--number_ios=%d", writes)}
}

// orderOverwriteArgs are the overwrite phase's: the same writer without fio's random map, which
// would write each block once, over OrderOverwriteRegion.
func orderOverwriteArgs(writes int) []string { return append(orderFioArgs(writes), "--norandommap") }

// orderTierblk is tierblk's serve command in write-back with the order given, over backendURI,
// with its sockets and SSD tier in dir.
func orderTierblk(tierblk, backendURI, dir, order string) []string {
	return []string{tierblk, "serve", "--backend", backendURI, "--nbd", "unix:" + filepath.Join(dir, "nbd.sock"),
		"--ram", CacheRAM, "--ssd", filepath.Join(dir, "ssd.img"), "--ssd-size", OrderSSD,
		"--mode", "writeback", "--write-back-order", order, "--log-level", "warn",
		"--admin", "unix:" + filepath.Join(dir, "admin.sock")}
}

// orderBackendURI is tierblk's --backend for a backend whose files are in dir (absolute).
func orderBackendURI(backend, dir string) string {
	if backend == OrderSlow {
		return "nbd+unix:///?socket=" + filepath.Join(dir, "backend.sock")
	}
	return "file://" + filepath.Join(dir, "backend.img") + "?size=" + orderBackendSize + "&direct=true"
}

// RunOrder measures tierblk in write-back in address order against flush order. Backend by
// backend, each round measures both orders, alternating which goes first from round to round;
// every measurement starts a fresh backend (slow disk) or backend file and a fresh tierblk with a
// new SSD tier in a directory of its own. A measurement: fio writes Writes 4 KiB blocks at random
// in Size with a FLUSH every OrderFsync (its IOPS), then `tierblk flush` writes everything back
// (the dirty bytes before it over its time: the destage rate), then fio writes Writes blocks
// again at random in OrderOverwriteRegion, many of them over their own dirty data (its IOPS).
func RunOrder(ctx context.Context, o OrderOptions) (OrderReport, error) {
	if err := o.check(); err != nil {
		return OrderReport{}, err
	}
	dir, err := os.MkdirTemp(o.WorkDir, "order")
	if err != nil {
		return OrderReport{}, err
	}
	defer os.RemoveAll(dir)
	if dir, err = filepath.Abs(dir); err != nil { // file:// URLs take absolute paths
		return OrderReport{}, err
	}
	rep := OrderReport{Commands: orderCommands(o, dir)}
	orders := []string{cache.OrderAddress, cache.OrderFlush}
	for i, backend := range OrderBackends() {
		write := OrderResult{Row: fmt.Sprintf("4K random write, QD32, a FLUSH every %d, %d writes over %s", OrderFsync, o.Writes, o.Size), Backend: backend, Unit: orderUnitWrite}
		drain := OrderResult{Row: "destage: tierblk flush after it", Backend: backend, Unit: orderUnitDrain}
		perWrite := OrderResult{Row: "destage: 4K blocks a backend write", Backend: backend, Unit: orderUnitBlocks}
		overwrite := OrderResult{Row: fmt.Sprintf("then 4K random overwrites, QD32, a FLUSH every %d, %d writes over %s", OrderFsync, o.Writes, OrderOverwriteRegion),
			Backend: backend, Unit: orderUnitWrite}
		for round := range o.Rounds {
			fmt.Fprintf(o.Log, "write-back order over the %s, round %d of %d\n", backend, round+1, o.Rounds)
			for _, t := range roundOrder(len(orders), round) {
				s, err := measureOrder(ctx, o, backend, orders[t], filepath.Join(dir, fmt.Sprintf("%d-%d-%s", i, round, orders[t])))
				if err != nil {
					return OrderReport{}, err
				}
				write.add(orders[t], s.iops)
				drain.add(orders[t], s.drain)
				perWrite.add(orders[t], s.perWrite)
				overwrite.add(orders[t], s.overwriteIOPS)
			}
		}
		rep.Results = append(rep.Results, write, drain, perWrite, overwrite)
	}
	return rep, nil
}

func (r *OrderResult) add(order string, v float64) {
	if order == cache.OrderFlush {
		r.Flush = append(r.Flush, v)
	} else {
		r.Address = append(r.Address, v)
	}
}

// measureOrder runs one measurement in dir (made here, removed after): a fresh backend and
// tierblk, the write phase, the timed flush, then the overwrite phase.
func measureOrder(ctx context.Context, o OrderOptions, backend, order, dir string) (orderSample, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return orderSample{}, err
	}
	defer os.RemoveAll(dir)
	name := "tierblk, " + order + " order, over the " + backend
	if backend == OrderSlow {
		disk := &server{Target: Target{Name: "the slow disk", Command: slowDisk}, sock: filepath.Join(dir, "backend.sock")}
		if err := disk.start(ctx); err != nil {
			return orderSample{}, err
		}
		defer disk.close() // after tierblk's close below
	}
	args := orderTierblk(o.Tierblk, orderBackendURI(backend, dir), dir, order)
	tb := &server{Target: Target{Name: name, Command: func(string) *exec.Cmd { return exec.Command(args[0], args[1:]...) }},
		sock: filepath.Join(dir, "nbd.sock")}
	if err := tb.start(ctx); err != nil {
		return orderSample{}, err
	}
	defer tb.close()
	// No ramp: the write phase is a fixed amount of work, counted whole.
	res, err := fio(ctx, tb.endpoint(), o.Size, 0, 0, orderFioArgs(o.Writes))
	if err != nil {
		return orderSample{}, fmt.Errorf("%s: %w", name, err)
	}
	admin := filepath.Join(dir, "admin.sock")
	dirty, err := orderDirty(ctx, admin, name, o.Log, cache.DirtyStats{})
	if err != nil {
		return orderSample{}, err
	}
	if dirty.Bytes == 0 {
		return orderSample{}, errors.New(name + ": no dirty data after the write phase, for the flush to write back")
	}
	began := time.Now()
	if err := flushTierblk(ctx, o.Tierblk, name, admin, o.Log); err != nil {
		return orderSample{}, err
	}
	took := time.Since(began)
	after, err := getDirty(ctx, adminClient(admin))
	if err != nil {
		return orderSample{}, fmt.Errorf("%s: %w", name, err)
	}
	writes := after.DestageWrites - dirty.DestageWrites
	if writes == 0 {
		return orderSample{}, errors.New(name + ": tierblk flush made no backend write")
	}
	s := orderSample{iops: res.value, drain: float64(dirty.Bytes) / (1 << 20) / took.Seconds(),
		perWrite: float64(after.DestagedBytes-dirty.DestagedBytes) / orderBlock / float64(writes)}
	if res, err = fio(ctx, tb.endpoint(), OrderOverwriteRegion, 0, 0, orderOverwriteArgs(o.Writes)); err != nil {
		return orderSample{}, fmt.Errorf("%s, overwrites: %w", name, err)
	}
	if _, err := orderDirty(ctx, admin, name+", overwrites", o.Log, after); err != nil {
		return orderSample{}, err
	}
	s.overwriteIOPS = res.value
	fmt.Fprintf(o.Log, "  %-8s %8.0f IOPS, %.1f MiB dirty (ratio %.3f), written back at %.2f MiB/s in %d backend writes (%.2f blocks each); overwrites %.0f IOPS\n",
		order, s.iops, float64(dirty.Bytes)/(1<<20), dirty.Ratio, s.drain, writes, s.perWrite, s.overwriteIOPS)
	return s, nil
}

// orderDirty reads the dirty figures after a write phase that began at since and refuses a
// measurement whose premise failed: a write throttled at the dirty maximum would count the
// destager's speed in the write IOPS.
func orderDirty(ctx context.Context, admin, name string, log io.Writer, since cache.DirtyStats) (cache.DirtyStats, error) {
	client := adminClient(admin)
	defer client.CloseIdleConnections()
	d, err := getDirty(ctx, client)
	if err != nil {
		return d, fmt.Errorf("%s: %w", name, err)
	}
	if throttled := d.ThrottledWrites - since.ThrottledWrites; throttled > 0 || d.Ratio >= d.Max {
		return d, fmt.Errorf("%s: dirty ratio %.3f (max %.2f), %d writes throttled: the write phase must stay under the dirty maximum",
			name, d.Ratio, d.Max, throttled)
	}
	// The drain rate counts only what is dirty when the flush starts, so an early destage does not
	// skew it; it is logged, since it did share the write phase's time.
	if destaged := d.DestagedBytes - since.DestagedBytes; destaged > 0 {
		fmt.Fprintf(log, "  note: %d bytes destaged during the write phase\n", destaged)
	}
	return d, nil
}

// orderCommands are the command lines of a run in dir, with WORK and ROUND as RunOrder's report
// names them.
func orderCommands(o OrderOptions, dir string) []string {
	round := filepath.Join(dir, "ROUND")
	work := func(args []string) string { return strings.ReplaceAll(shellJoin(args), dir, "WORK") }
	out := []string{OrderSlow + ": " + work(slowDisk(filepath.Join(round, "backend.sock")).Args)}
	for _, backend := range OrderBackends() {
		out = append(out, "tierblk over the "+backend+": "+work(orderTierblk(o.Tierblk, orderBackendURI(backend, round), round, "ORDER")))
	}
	fioCmd := append([]string{"fio"}, fioArgs(Endpoint{Sock: filepath.Join(round, "nbd.sock")}.URI(), o.Size, 0, 0, orderFioArgs(o.Writes))...)
	out = append(out, "write phase: "+work(fioCmd))
	out = append(out, "destage, timed: "+work(append([]string{o.Tierblk}, flushArgs(filepath.Join(round, "admin.sock"))...)))
	overwrite := append([]string{"fio"}, fioArgs(Endpoint{Sock: filepath.Join(round, "nbd.sock")}.URI(), OrderOverwriteRegion, 0, 0, orderOverwriteArgs(o.Writes))...)
	out = append(out, "overwrite phase: "+work(overwrite))
	return out
}

// OrderTable renders RunOrder's results as a Markdown table: each order's median, and the median,
// lowest and highest of the per-round ratios flush/address (above 1.0: flush order is faster).
func OrderTable(rs []OrderResult) string {
	var b strings.Builder
	b.WriteString("| workload | backend | " + cache.OrderAddress + " order | " + cache.OrderFlush + " order | ratio flush/address, median | min | max |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		ratios := r.Ratios()
		format := "%.0f %s"
		if r.Unit != orderUnitWrite {
			format = "%.2f %s"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %.2f | %.2f |\n", r.Row, r.Backend,
			fmt.Sprintf(format, median(r.Address), r.Unit), fmt.Sprintf(format, median(r.Flush), r.Unit),
			median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
	return b.String()
}
