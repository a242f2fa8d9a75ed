package bench

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
)

// The reduction benchmark's targets: the same image served by three tierblks that differ only in
// what their SSD tier reduces.
const (
	nameReductionOff      = "tierblk --reduction off"
	nameReductionZero     = "tierblk --reduction zero"
	nameReductionCompress = "tierblk --reduction compress"
	// The incompressible row's: random bytes, served the same way.
	nameRandomOff      = "random bytes, --reduction off"
	nameRandomCompress = "random bytes, --reduction compress"
	// The write row's: write-back over a file of their own.
	nameWriteBackOff      = "writeback --reduction off"
	nameWriteBackZero     = "writeback --reduction zero"
	nameWriteBackCompress = "writeback --reduction compress"
	// The dedupe rows': clone 0 alone, and the four clones as one export (clones.go).
	nameCloneDedupe    = "clone 0, --reduction dedupe"
	nameClonesDedupe   = "four clones, --reduction dedupe"
	nameClonesCompress = "four clones, --reduction compress"
)

// ReductionWriteSize is the region the write row writes at random, prefilled first: within the
// write-back tierblks' SSD tier (1 GiB), so that the row measures writes to the SSD tier.
const ReductionWriteSize = "256m"

// ReductionRandomSize is the most random bytes the incompressible row reads: an image of them as
// large as the image given, up to this.
const ReductionRandomSize = 256 << 20

// ReductionRows are the rows of `tierblk bench cache --parts reduction`: what reduction costs the
// SSD tier's hits, on the image's own blocks (its zero blocks among them).
func ReductionRows() []Row {
	return []Row{
		{Name: "4K random read, QD32, hits", FioArgs: []string{"--rw=randread", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "1M random read, QD8, hits", FioArgs: []string{"--rw=randread", "--bs=1M", "--iodepth=8"}, Unit: "MiB/s"},
	}
}

// ReductionRandomRow is what compression costs the SSD tier's 4K hits on data that does not
// compress: random bytes, every block stored as it is after a failed compression.
func ReductionRandomRow() Row {
	return Row{Name: "4K random read, QD32, hits, random bytes", FioArgs: []string{"--rw=randread", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"}
}

// ReductionWriteRow is what reduction costs write-back writes of data (fio's buffers are random
// bytes, never a zero block, and do not compress).
func ReductionWriteRow() Row {
	return Row{Name: "4K random write, QD32, write-back", FioArgs: []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"}
}

// ReductionReport is what RunReduction measured.
type ReductionReport struct {
	Image      string
	ImageBytes int64
	// RandomBytes is the size of the image of random bytes the incompressible row reads.
	RandomBytes int64
	// Stored is each target's SSD tier after one read of the whole image (of the random image for
	// the random targets); Fill how long that read took (every block a miss, fetched and stored).
	Stored map[string]cache.TierStats
	Fill   map[string]time.Duration
	Hits   []Result
	Random Result // ReductionRandomRow
	Writes Result // ReductionWriteRow
	// Clones are the clones of the image the dedupe rows read (one run, no rounds), whose SSD
	// tiers are in Stored and Fill too.
	Clones CloneSet
}

// DedupeRatios are the four clones' physical bytes over clone 0's (with dedupe), with dedupe (the
// goal: at most DedupeGoal) and with compress; 0 where a figure is missing.
func (r ReductionReport) DedupeRatios() (dedupe, compress float64) {
	one := r.Stored[nameCloneDedupe].PhysicalBytes
	if one == 0 {
		return 0, 0
	}
	return float64(r.Stored[nameClonesDedupe].PhysicalBytes) / float64(one), float64(r.Stored[nameClonesCompress].PhysicalBytes) / float64(one)
}

// reductionTarget is one tierblk of the read part: its name as the tables show it and its
// reduction.
type reductionTarget struct{ name, reduction string }

// reductionTargets serve image read-only, each with an SSD tier in dir that holds all of it
// (ssdSize, the same for every reduction), every miss admitted even while the SSD is slow (a
// congested tier would turn some away, and the figures would be of what it happened to take), no
// RAM tier, and an admin endpoint for the stats. Their files in dir are named from key and the
// reduction.
func reductionTargets(tierblk, dir, key, image string, ssdSize int64, ts []reductionTarget) []Target {
	var out []Target
	for _, rt := range ts {
		out = append(out, Target{Name: rt.name, Command: func(sock string) *exec.Cmd {
			return exec.Command(tierblk, "serve", "--backend", "file://"+image, "--read-only", "--nbd", "unix:"+sock,
				"--ram", "0", "--ssd", filepath.Join(dir, key+rt.reduction+"-ssd.img"), "--ssd-size", strconv.FormatInt(ssdSize, 10),
				"--admission", "always", "--congestion", "off", "--reduction", rt.reduction, "--admin", "unix:"+reductionAdmin(dir, key, rt.reduction),
				"--log-level", "warn")
		}})
	}
	return out
}

// The read part's tierblks: on the image, and on the random bytes.
var (
	imageTargets  = []reductionTarget{{nameReductionOff, "off"}, {nameReductionZero, "zero"}, {nameReductionCompress, "compress"}}
	randomTargets = []reductionTarget{{nameRandomOff, "off"}, {nameRandomCompress, "compress"}}
	clonesTargets = []reductionTarget{{nameClonesDedupe, "dedupe"}, {nameClonesCompress, "compress"}}
	cloneTargets  = []reductionTarget{{nameCloneDedupe, "dedupe"}}
)

// removeTiers removes the SSD tiers (and their metadata) of ts, which reductionTargets made with
// key, once their servers have stopped: the part's later groups need the room (the dedupe rows'
// take gigabytes).
func removeTiers(dir, key string, ts []reductionTarget) {
	for _, rt := range ts {
		ssd := filepath.Join(dir, key+rt.reduction+"-ssd.img")
		os.Remove(ssd)
		os.RemoveAll(ssd + ".meta")
	}
}

func reductionAdmin(dir, key, reduction string) string {
	return filepath.Join(dir, key+reduction+"-admin.sock")
}

// writeBackTargets are three tierblks in write-back, reduction off, zero and compress, each over a
// backend file of its own in dir with an SSD tier of 1 GiB.
func writeBackTargets(tierblk, dir string) []Target {
	tb := func(name, reduction string) Target {
		return Target{Name: name, Command: func(sock string) *exec.Cmd {
			return exec.Command(tierblk, "serve", "--backend", "file://"+filepath.Join(dir, reduction+"-wb-backend.img")+"?size=1GiB",
				"--nbd", "unix:"+sock, "--ram", "0", "--ssd", filepath.Join(dir, reduction+"-wb-ssd.img"), "--ssd-size", "1GiB",
				"--mode", "writeback", "--admission", "always", "--congestion", "off", "--reduction", reduction, "--log-level", "warn")
		}}
	}
	return []Target{tb(nameWriteBackOff, "off"), tb(nameWriteBackZero, "zero"), tb(nameWriteBackCompress, "compress")}
}

// reductionSSDSize is an SSD tier that holds all of an image of size bytes, stored as it is: lines
// of 64 KiB, rounded up, and the slots the tier keeps out of its policy's reach (at most 1/8 of
// them) on top.
func reductionSSDSize(size int64) int64 {
	line := int64(cache.DefaultLineSize)
	return (size + size/7 + 2*line) / line * line
}

// fillReduction starts each of ts over image, reads the image once through it and records what its
// SSD tier holds in rep; it returns the servers, running, and their probes.
func fillReduction(ctx context.Context, o CacheOptions, rep *ReductionReport, dir, key, image string, ts []reductionTarget) ([]*server, []probe, error) {
	st, err := os.Stat(image)
	if err != nil {
		return nil, nil, err
	}
	line := int64(cache.DefaultLineSize)
	size := st.Size() / line * line // fio reads whole lines
	var servers []*server
	var probes []probe
	fail := func(err error) ([]*server, []probe, error) {
		for _, s := range servers {
			s.close()
		}
		return nil, nil, err
	}
	for i, t := range reductionTargets(o.Tierblk, dir, key, image, reductionSSDSize(st.Size()), ts) {
		s := &server{Target: t, sock: filepath.Join(dir, fmt.Sprintf("%s%d.sock", key, i))}
		if err := s.start(ctx); err != nil {
			return fail(err)
		}
		servers = append(servers, s)
		fmt.Fprintf(o.Log, "reading %s through %s\n", image, t.Name)
		began := time.Now()
		if _, err := fio(ctx, s.endpoint(), strconv.FormatInt(size, 10), 0, 0, []string{"--rw=read", "--bs=1M", "--iodepth=8"}); err != nil {
			return fail(fmt.Errorf("reading %s through %s: %w", image, t.Name, err))
		}
		rep.Fill[t.Name] = time.Since(began)
		client := adminClient(reductionAdmin(dir, key, ts[i].reduction))
		stats, err := getStats(ctx, client)
		client.CloseIdleConnections()
		if err != nil {
			return fail(fmt.Errorf("%s: %w", t.Name, err))
		}
		if len(stats.Tiers) != 1 {
			return fail(fmt.Errorf("%s: %d cache tiers, want the SSD tier alone", t.Name, len(stats.Tiers)))
		}
		if held := stats.Tiers[0].LogicalBytes; held < uint64(size) {
			return fail(fmt.Errorf("%s holds %d bytes of the %d of %s after reading it: its SSD tier did not take all of it", t.Name, held, st.Size(), image))
		}
		rep.Stored[t.Name] = stats.Tiers[0]
		probes = append(probes, probe{name: t.Name, ep: s.endpoint(), runtime: o.Runtime, ramp: time.Second})
	}
	return servers, probes, nil
}

// writeRandom writes size random bytes to a new file path.
func writeRandom(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// RunReduction reads image (a raw disk image, say a file system with files in it) once through
// tierblk with reduction off, zero and compress, and reports what each SSD tier stores of it
// (logical and physical bytes), then measures hits on it (ReductionRows), alternating the three
// from round to round. Then the same for off and compress over an image of random bytes
// (ReductionRandomRow: data that does not compress), as large as image up to ReductionRandomSize;
// then 4K random writes of data in write-back (ReductionWriteRow) on three more tierblks, off, zero
// and compress, over ReductionWriteSize written once first. Last the dedupe rows, one run of
// each (runDedupe). Each group of servers is stopped before the next starts. o.Size and
// o.SlowRuntime are not used.
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
	rep := ReductionReport{Image: image, ImageBytes: st.Size(), RandomBytes: min(st.Size(), ReductionRandomSize),
		Stored: map[string]cache.TierStats{}, Fill: map[string]time.Duration{}}
	line := int64(cache.DefaultLineSize)
	closeAll := func(servers []*server) {
		for _, s := range servers {
			s.close()
		}
	}

	servers, probes, err := fillReduction(ctx, o, &rep, dir, "r", image, imageTargets)
	if err != nil {
		return ReductionReport{}, err
	}
	for _, row := range ReductionRows() {
		r, err := measure(ctx, row, probes, o.Rounds, strconv.FormatInt(st.Size()/line*line, 10), o.Log, nil)
		if err != nil {
			closeAll(servers)
			return ReductionReport{}, err
		}
		rep.Hits = append(rep.Hits, r)
	}
	closeAll(servers)
	removeTiers(dir, "r", imageTargets)

	random := filepath.Join(dir, "random.img")
	fmt.Fprintf(o.Log, "writing %d random bytes to %s\n", rep.RandomBytes, random)
	if err := writeRandom(random, rep.RandomBytes); err != nil {
		return ReductionReport{}, fmt.Errorf("the image of random bytes: %w", err)
	}
	servers, probes, err = fillReduction(ctx, o, &rep, dir, "x", random, randomTargets)
	if err != nil {
		return ReductionReport{}, err
	}
	rep.Random, err = measure(ctx, ReductionRandomRow(), probes, o.Rounds, strconv.FormatInt(rep.RandomBytes/line*line, 10), o.Log, nil)
	closeAll(servers)
	removeTiers(dir, "x", randomTargets)
	os.Remove(random)
	if err != nil {
		return ReductionReport{}, err
	}

	if rep.Writes, err = measureWrites(ctx, o, dir); err != nil {
		return ReductionReport{}, err
	}
	if err := runDedupe(ctx, o, &rep, dir, image); err != nil {
		return ReductionReport{}, err
	}
	return rep, nil
}

// measureWrites measures ReductionWriteRow on writeBackTargets, and stops them.
func measureWrites(ctx context.Context, o CacheOptions, dir string) (Result, error) {
	var servers []*server
	defer func() {
		for _, s := range servers {
			s.close()
		}
		for _, r := range []string{"off", "zero", "compress"} { // writeBackTargets' files
			os.Remove(filepath.Join(dir, r+"-wb-backend.img"))
			os.Remove(filepath.Join(dir, r+"-wb-ssd.img"))
			os.RemoveAll(filepath.Join(dir, r+"-wb-ssd.img.meta"))
		}
	}()
	var wprobes []probe
	for i, t := range writeBackTargets(o.Tierblk, dir) {
		s := &server{Target: t, sock: filepath.Join(dir, fmt.Sprintf("w%d.sock", i))}
		if err := s.start(ctx); err != nil {
			return Result{}, err
		}
		servers = append(servers, s)
		wo := o
		wo.Size = ReductionWriteSize
		if err := wo.pass(ctx, s, "prefilling", "--rw=write"); err != nil {
			return Result{}, err
		}
		wprobes = append(wprobes, probe{name: t.Name, ep: s.endpoint(), runtime: o.Runtime, ramp: time.Second})
	}
	return measure(ctx, ReductionWriteRow(), wprobes, o.Rounds, ReductionWriteSize, o.Log, nil)
}

// runDedupe is the dedupe rows: DedupeClones clones of image's whole lines written to
// dir (makeClones) one after another into one file, served as one export by a tierblk with
// reduction dedupe and by one with compress, and clone 0 alone by one with dedupe; each is read
// once (as fillReduction reads an image) and what its SSD tier stores goes to rep. One run: a size,
// not a speed. Each file of clones is removed once it has been read.
func runDedupe(ctx context.Context, o CacheOptions, rep *ReductionReport, dir, image string) error {
	line := int64(cache.DefaultLineSize)
	one, four := filepath.Join(dir, "clone0.img"), filepath.Join(dir, "clones.img")
	defer os.Remove(one)
	defer os.Remove(four)
	fmt.Fprintf(o.Log, "writing %d clones of %s, %d %% of each one's 4 KiB blocks rewritten, to %s (and clone 0 to %s)\n",
		DedupeClones, image, DedupeRewritePercent, four, one)
	cs, err := makeClones(image, rep.ImageBytes/line*line, one, four)
	if err != nil {
		return err
	}
	rep.Clones = cs
	for _, g := range []struct {
		key, image string
		ts         []reductionTarget
	}{{"d", four, clonesTargets}, {"c", one, cloneTargets}} {
		servers, _, err := fillReduction(ctx, o, rep, dir, g.key, g.image, g.ts)
		for _, s := range servers {
			s.close()
		}
		removeTiers(dir, g.key, g.ts)
		os.Remove(g.image) // clone 0 is read last, from a file of its own
		if err != nil {
			return err
		}
	}
	return nil
}

// ReductionTable renders the report: what each SSD tier stores of the image (and of the random
// bytes) and how long the read that filled it took, then the hit rows, the incompressible row and
// the write row with the medians of the per-round ratios compress/off and zero/off.
func ReductionTable(w io.Writer, rep ReductionReport) {
	fmt.Fprintf(w, "| SSD tier | logical | physical | physical/logical | first read of the image |\n|---|---:|---:|---:|---:|\n")
	for _, name := range []string{nameReductionOff, nameReductionZero, nameReductionCompress, nameRandomOff, nameRandomCompress} {
		s, ok := rep.Stored[name]
		if !ok {
			continue
		}
		frac := 0.0
		if s.LogicalBytes > 0 {
			frac = float64(s.PhysicalBytes) / float64(s.LogicalBytes)
		}
		fmt.Fprintf(w, "| %s | %.1f MiB | %.1f MiB | %.3f | %.1f s |\n", name, float64(s.LogicalBytes)/(1<<20),
			float64(s.PhysicalBytes)/(1<<20), frac, rep.Fill[name].Seconds())
	}
	fmt.Fprintln(w)
	pairedTable(w, rep.Hits, []string{nameReductionCompress, nameReductionZero, nameReductionOff},
		[][2]string{{nameReductionCompress, nameReductionOff}, {nameReductionZero, nameReductionOff}})
	fmt.Fprintln(w)
	pairedTable(w, []Result{rep.Random}, []string{nameRandomCompress, nameRandomOff}, [][2]string{{nameRandomCompress, nameRandomOff}})
	fmt.Fprintln(w)
	pairedTable(w, []Result{rep.Writes}, []string{nameWriteBackCompress, nameWriteBackZero, nameWriteBackOff},
		[][2]string{{nameWriteBackCompress, nameWriteBackOff}, {nameWriteBackZero, nameWriteBackOff}})
	if rep.Clones.Size > 0 {
		fmt.Fprintln(w)
		DedupeTable(w, rep)
	}
}

// DedupeTable renders the dedupe rows: what each SSD tier stores of the clones, beside what a tier
// that stores each distinct non-zero block once as its S2 unit (each one, for compress) would,
// then the four clones' physical bytes over clone 0's.
func DedupeTable(w io.Writer, rep ReductionReport) {
	cs := rep.Clones
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "Dedupe: %d clones of the image (%.1f MiB each), %d of each one's %d blocks of 4 KiB (%d %%) rewritten with 4 KiB of the image read at an offset that is not a multiple of 4 KiB (of them, blocks of zeros in the image:",
		DedupeClones, mib(cs.Size), cs.Rewritten, cs.Blocks, DedupeRewritePercent)
	for _, z := range cs.WasZero {
		fmt.Fprintf(w, " %d", z)
	}
	fmt.Fprintf(w, "; their S2 units, MiB:")
	for _, b := range cs.NewBytes {
		fmt.Fprintf(w, " %.1f", mib(b))
	}
	fmt.Fprintf(w, "); the four served as one export; one run:\n\n")
	fmt.Fprintf(w, "| SSD tier | logical | physical | expected physical | dedupe hits | dedupe collisions | first read |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range []struct {
		name   string
		expect int64
	}{{nameCloneDedupe, cs.ExpectOne}, {nameClonesDedupe, cs.ExpectFour}, {nameClonesCompress, cs.ExpectFourCompress}} {
		s, ok := rep.Stored[r.name]
		if !ok {
			continue
		}
		fmt.Fprintf(w, "| %s | %.1f MiB | %.1f MiB | %.1f MiB | %d | %d | %.1f s |\n", r.name, float64(s.LogicalBytes)/(1<<20),
			float64(s.PhysicalBytes)/(1<<20), mib(r.expect), s.DedupeHits, s.DedupeCollisions, rep.Fill[r.name].Seconds())
	}
	d, c := rep.DedupeRatios()
	fmt.Fprintf(w, "\nPhysical bytes of the four clones over clone 0's: dedupe %.3f (goal: at most %.1f), compress %.3f\n", d, DedupeGoal, c)
}
