package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
)

// The reduction benchmark's targets: the same image served by two tierblks that differ only in
// what their SSD tier reduces.
const (
	nameReductionOff  = "tierblk --reduction off"
	nameReductionZero = "tierblk --reduction zero"
	// The write row's: write-back over a file of their own.
	nameWriteBackOff  = "writeback --reduction off"
	nameWriteBackZero = "writeback --reduction zero"
)

// ReductionWriteSize is the region the write row writes at random, prefilled first: within the
// write-back tierblks' SSD tier (1 GiB), so that the row measures writes to the SSD tier.
const ReductionWriteSize = "256m"

// ReductionRows are the rows of `tierblk bench cache --parts reduction`: what reduction costs the
// SSD tier's hits, on the image's own blocks (its zero blocks among them).
func ReductionRows() []Row {
	return []Row{
		{Name: "4K random read, QD32, hits", FioArgs: []string{"--rw=randread", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "1M random read, QD8, hits", FioArgs: []string{"--rw=randread", "--bs=1M", "--iodepth=8"}, Unit: "MiB/s"},
	}
}

// ReductionWriteRow is what reduction costs write-back writes of data (fio's buffers are random
// bytes, never a zero block).
func ReductionWriteRow() Row {
	return Row{Name: "4K random write, QD32, write-back", FioArgs: []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"}
}

// ReductionReport is what RunReduction measured.
type ReductionReport struct {
	Image      string
	ImageBytes int64
	// Stored is each target's SSD tier after one read of the whole image; Fill how long that read
	// took (every block a miss, fetched and stored).
	Stored map[string]cache.TierStats
	Fill   map[string]time.Duration
	Hits   []Result
	Writes Result // ReductionWriteRow
}

// reductionTargets serve image read-only, each with an SSD tier in dir that holds all of it
// (ssdSize), every miss admitted even while the SSD is slow (a congested tier would turn some
// away, and the figures would be of what it happened to take), no RAM tier, and an admin endpoint
// for the stats.
func reductionTargets(tierblk, dir, image string, ssdSize int64) []Target {
	tb := func(name, reduction string) Target {
		return Target{Name: name, Command: func(sock string) *exec.Cmd {
			return exec.Command(tierblk, "serve", "--backend", "file://"+image, "--read-only", "--nbd", "unix:"+sock,
				"--ram", "0", "--ssd", filepath.Join(dir, reduction+"-ssd.img"), "--ssd-size", strconv.FormatInt(ssdSize, 10),
				"--admission", "always", "--congestion", "off", "--reduction", reduction, "--admin", "unix:"+reductionAdmin(dir, reduction),
				"--log-level", "warn")
		}}
	}
	return []Target{tb(nameReductionOff, "off"), tb(nameReductionZero, "zero")}
}

func reductionAdmin(dir, reduction string) string { return filepath.Join(dir, reduction+"-admin.sock") }

// writeBackTargets are two tierblks in write-back, reduction off and zero, each over a backend file
// of its own in dir with an SSD tier of 1 GiB.
func writeBackTargets(tierblk, dir string) []Target {
	tb := func(name, reduction string) Target {
		return Target{Name: name, Command: func(sock string) *exec.Cmd {
			return exec.Command(tierblk, "serve", "--backend", "file://"+filepath.Join(dir, reduction+"-wb-backend.img")+"?size=1GiB",
				"--nbd", "unix:"+sock, "--ram", "0", "--ssd", filepath.Join(dir, reduction+"-wb-ssd.img"), "--ssd-size", "1GiB",
				"--mode", "writeback", "--admission", "always", "--congestion", "off", "--reduction", reduction, "--log-level", "warn")
		}}
	}
	return []Target{tb(nameWriteBackOff, "off"), tb(nameWriteBackZero, "zero")}
}

// RunReduction reads image (a raw disk image, say a file system with files in it) once through
// tierblk with reduction off and zero, and reports what each SSD tier stores of it (logical and
// physical bytes), then measures hits on it (ReductionRows), alternating the two from round to
// round; then 4K random writes of data in write-back (ReductionWriteRow) on two more tierblks, off
// and zero, over ReductionWriteSize written once first. o.Size and o.SlowRuntime are not used.
func RunReduction(ctx context.Context, o CacheOptions, image string) (ReductionReport, error) {
	if err := o.check(); err != nil {
		return ReductionReport{}, err
	}
	image, err := filepath.Abs(image) // file:// URLs take absolute paths
	if err != nil {
		return ReductionReport{}, err
	}
	st, err := os.Stat(image)
	if err != nil {
		return ReductionReport{}, fmt.Errorf("image: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() < 1<<20 {
		return ReductionReport{}, fmt.Errorf("image %s: want a raw disk image file of at least 1MiB", image)
	}
	dir, err := os.MkdirTemp(o.WorkDir, "reduction")
	if err != nil {
		return ReductionReport{}, err
	}
	defer os.RemoveAll(dir)
	if dir, err = filepath.Abs(dir); err != nil {
		return ReductionReport{}, err
	}
	// The SSD tiers hold the whole image: lines of 64 KiB, rounded up, and the slots the tier keeps
	// out of its policy's reach (at most 1/8 of them) on top.
	line := int64(cache.DefaultLineSize)
	ssdSize := (st.Size() + st.Size()/7 + 2*line) / line * line
	rep := ReductionReport{Image: image, ImageBytes: st.Size(), Stored: map[string]cache.TierStats{}, Fill: map[string]time.Duration{}}
	size := strconv.FormatInt(st.Size()/line*line, 10) // fio reads whole lines
	var probes []probe
	for i, t := range reductionTargets(o.Tierblk, dir, image, ssdSize) {
		s := &server{Target: t, sock: filepath.Join(dir, fmt.Sprintf("r%d.sock", i))}
		if err := s.start(ctx); err != nil {
			return ReductionReport{}, err
		}
		defer s.close()
		fmt.Fprintf(o.Log, "reading %s through %s\n", image, t.Name)
		began := time.Now()
		if _, err := fio(ctx, s.endpoint(), size, 0, 0, []string{"--rw=read", "--bs=1M", "--iodepth=8"}); err != nil {
			return ReductionReport{}, fmt.Errorf("reading the image through %s: %w", t.Name, err)
		}
		rep.Fill[t.Name] = time.Since(began)
		reduction := map[string]string{nameReductionOff: "off", nameReductionZero: "zero"}[t.Name]
		client := adminClient(reductionAdmin(dir, reduction))
		stats, err := getStats(ctx, client)
		client.CloseIdleConnections()
		if err != nil {
			return ReductionReport{}, fmt.Errorf("%s: %w", t.Name, err)
		}
		if len(stats.Tiers) != 1 {
			return ReductionReport{}, fmt.Errorf("%s: %d cache tiers, want the SSD tier alone", t.Name, len(stats.Tiers))
		}
		if held := stats.Tiers[0].LogicalBytes; held < uint64(st.Size()/line*line) {
			return ReductionReport{}, fmt.Errorf("%s holds %d bytes of the image's %d after reading it: its SSD tier did not take all of it", t.Name, held, st.Size())
		}
		rep.Stored[t.Name] = stats.Tiers[0]
		probes = append(probes, probe{name: t.Name, ep: s.endpoint(), runtime: o.Runtime, ramp: time.Second})
	}
	for _, row := range ReductionRows() {
		r, err := measure(ctx, row, probes, o.Rounds, size, o.Log, nil)
		if err != nil {
			return ReductionReport{}, err
		}
		rep.Hits = append(rep.Hits, r)
	}
	var wprobes []probe
	for i, t := range writeBackTargets(o.Tierblk, dir) {
		s := &server{Target: t, sock: filepath.Join(dir, fmt.Sprintf("w%d.sock", i))}
		if err := s.start(ctx); err != nil {
			return ReductionReport{}, err
		}
		defer s.close()
		wo := o
		wo.Size = ReductionWriteSize
		if err := wo.pass(ctx, s, "prefilling", "--rw=write"); err != nil {
			return ReductionReport{}, err
		}
		wprobes = append(wprobes, probe{name: t.Name, ep: s.endpoint(), runtime: o.Runtime, ramp: time.Second})
	}
	if rep.Writes, err = measure(ctx, ReductionWriteRow(), wprobes, o.Rounds, ReductionWriteSize, o.Log, nil); err != nil {
		return ReductionReport{}, err
	}
	return rep, nil
}

// ReductionTable renders the report: what each SSD tier stores of the image and how long the read
// that filled it took, then the hit rows and the write row with the medians of the per-round
// ratios zero/off.
func ReductionTable(w io.Writer, rep ReductionReport) {
	fmt.Fprintf(w, "| SSD tier | logical | physical | physical/logical | first read of the image |\n|---|---:|---:|---:|---:|\n")
	for _, name := range []string{nameReductionOff, nameReductionZero} {
		s := rep.Stored[name]
		frac := 0.0
		if s.LogicalBytes > 0 {
			frac = float64(s.PhysicalBytes) / float64(s.LogicalBytes)
		}
		fmt.Fprintf(w, "| %s | %.1f MiB | %.1f MiB | %.3f | %.1f s |\n", name, float64(s.LogicalBytes)/(1<<20),
			float64(s.PhysicalBytes)/(1<<20), frac, rep.Fill[name].Seconds())
	}
	fmt.Fprintln(w)
	pairedTable(w, rep.Hits, []string{nameReductionZero, nameReductionOff}, [][2]string{{nameReductionZero, nameReductionOff}})
	fmt.Fprintln(w)
	pairedTable(w, []Result{rep.Writes}, []string{nameWriteBackZero, nameWriteBackOff}, [][2]string{{nameWriteBackZero, nameWriteBackOff}})
}
