package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The hit benchmark's setup: what the cache's hit paths deliver against what the same disk gives
// a plain NBD server. Every read is a hit: the working set is written through tierblk and read
// once before the first measurement.
const (
	// HitsSSD is the SSD tier of both tierblks, larger than the default working set (128 MiB).
	HitsSSD = "512MiB"
	// HitsRAM is the second tierblk's RAM tier, a quarter of the default working set: most reads
	// miss RAM and hit the SSD tier, and promotion must not make them slower.
	HitsRAM = "32MiB"
)

// The hit benchmark's targets, as the table names them.
const (
	nameHitsSSD = "tierblk --ram 0"
	nameHitsRAM = "tierblk --ram " + HitsRAM
	nameQemuNBD = "qemu-nbd"
)

// HitRows are the rows of `tierblk bench cache --parts hits`.
func HitRows() []Row {
	return []Row{
		{Name: "4K random read, QD32, hits", FioArgs: []string{"--rw=randread", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "1M random read, QD8, hits", FioArgs: []string{"--rw=randread", "--bs=1M", "--iodepth=8"}, Unit: "MiB/s"},
	}
}

// hitTarget is a tierblk over a backend file with a RAM tier of ram in front of an SSD tier of
// HitsSSD, more args after. Each has its own SSD tier and backend file in dir; the backend's speed
// does not matter, as nothing is read from it once the working set is written.
func hitTarget(tierblk, dir, name, ram string, args ...string) Target {
	return Target{Name: name, Command: func(sock string) *exec.Cmd {
		key := strings.TrimSuffix(filepath.Base(sock), ".sock")
		return exec.Command(tierblk, append([]string{"serve", "--backend", "file://" + filepath.Join(dir, key+"-backend.img") + "?size=1GiB",
			"--nbd", "unix:" + sock, "--ram", ram, "--ssd", filepath.Join(dir, key+"-ssd.img"), "--ssd-size", HitsSSD,
			"--log-level", "warn"}, args...)...)
	}}
}

// hitTargets are the servers: tierblk with every read an SSD-tier hit, tierblk with a RAM tier
// smaller than the working set in front of the same SSD tier, and qemu-nbd serving a file on the
// same file system with O_DIRECT and Linux AIO, the peer an NBD server gets from that disk.
func hitTargets(tierblk, dir string) []Target {
	return []Target{
		hitTarget(tierblk, dir, nameHitsSSD, "0"),
		hitTarget(tierblk, dir, nameHitsRAM, HitsRAM),
		{Name: nameQemuNBD, Command: func(sock string) *exec.Cmd {
			img := filepath.Join(dir, "qemu-nbd.img")
			// -t: serve client after client; the image is made by RunHits.
			return exec.Command("qemu-nbd", "-t", "-f", "raw", "--cache=none", "--aio=native", "-k", sock, img)
		}},
	}
}

// HitResult is one row: each target's samples, one per round, and the ratios paired by round.
type HitResult struct {
	Row, Unit string
	Samples   map[string][]float64
}

// Ratio is the median of the per-round ratios a/b, and the lowest and highest of them.
func (r HitResult) Ratio(a, b string) (mid, lo, hi float64) {
	return Result{Samples: r.Samples}.Ratio(a, b)
}

// RunHits measures the cache's hit paths: 4K and 1M random reads of a working set (o.Size) that
// the SSD tier holds whole, on tierblk without a RAM tier, tierblk with a RAM tier a quarter of
// the set, and qemu-nbd over a file of the set on the same file system, alternating which goes
// first from round to round. o.SlowRuntime is not used.
func RunHits(ctx context.Context, o CacheOptions) ([]HitResult, error) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		return nil, fmt.Errorf("qemu-nbd is not installed; run `make deps` (Debian package qemu-utils)")
	}
	return runHits(ctx, o, "hits", hitTargets)
}

// runHits measures HitRows on the targets made by targets in a directory of its own (named after
// what), each target's working set written and read once first, alternating which goes first
// from round to round.
func runHits(ctx context.Context, o CacheOptions, what string, targets func(tierblk, dir string) []Target) ([]HitResult, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(o.WorkDir, what)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if dir, err = filepath.Abs(dir); err != nil { // file:// URLs take absolute paths
		return nil, err
	}
	if err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "raw", filepath.Join(dir, "qemu-nbd.img"), "1G").Run(); err != nil {
		return nil, fmt.Errorf("qemu-img create: %w", err)
	}
	var probes []probe
	for i, t := range targets(o.Tierblk, dir) {
		s := &server{Target: t, sock: filepath.Join(dir, fmt.Sprintf("h%d.sock", i))}
		if err := s.start(ctx); err != nil {
			return nil, err
		}
		defer s.close()
		// Written, then read once: every block of the working set is in the SSD tier.
		for _, pass := range []struct{ what, rw string }{{"prefilling", "--rw=write"}, {"warming up", "--rw=read"}} {
			if err := o.pass(ctx, s, pass.what, pass.rw); err != nil {
				return nil, err
			}
		}
		probes = append(probes, probe{name: t.Name, ep: s.endpoint(), runtime: o.Runtime, ramp: time.Second})
	}
	var results []HitResult
	for _, row := range HitRows() {
		r, err := measure(ctx, row, probes, o.Rounds, o.Size, o.Log, nil)
		if err != nil {
			return nil, err
		}
		results = append(results, HitResult{Row: row.Name, Unit: row.Unit, Samples: r.Samples})
	}
	return results, nil
}

// HitTable renders the hit benchmark's results: each target's median, and the medians of the
// per-round ratios that its goals name (tierblk without a RAM tier against qemu-nbd; with a small
// RAM tier against without), with their lowest and highest.
func HitTable(w io.Writer, results []HitResult) {
	hitTable(w, results, []string{nameHitsSSD, nameHitsRAM, nameQemuNBD}, [][2]string{{nameHitsSSD, nameQemuNBD}, {nameHitsRAM, nameHitsSSD}})
}

func hitTable(w io.Writer, results []HitResult, names []string, pairs [][2]string) {
	rs := make([]Result, len(results))
	for i, r := range results {
		rs[i] = Result{Row: r.Row, Unit: r.Unit, Samples: r.Samples}
	}
	pairedTable(w, rs, names, pairs)
}

// The curves benchmark's targets: the hit paths with the live miss-ratio curves on (the default)
// and off, RAM-tier hits (a RAM tier that holds the working set) and SSD-tier hits (no RAM tier).
const (
	// CurvesRAM holds the default working set (128 MiB) whole.
	CurvesRAM        = "256MiB"
	nameCurvesRAM    = "tierblk --ram " + CurvesRAM
	nameCurvesRAMOff = nameCurvesRAM + " --curves off"
	nameCurvesSSD    = "tierblk --ram 0"
	nameCurvesSSDOff = nameCurvesSSD + " --curves off"
)

func curvesTargets(tierblk, dir string) []Target {
	return []Target{
		hitTarget(tierblk, dir, nameCurvesRAM, CurvesRAM),
		hitTarget(tierblk, dir, nameCurvesRAMOff, CurvesRAM, "--curves", "off"),
		hitTarget(tierblk, dir, nameCurvesSSD, "0"),
		hitTarget(tierblk, dir, nameCurvesSSDOff, "0", "--curves", "off"),
	}
}

// RunCurves measures what the live miss-ratio curves cost the hit paths: HitRows on tierblk with
// them on and off, RAM-tier and SSD-tier hits, all in the same rounds.
func RunCurves(ctx context.Context, o CacheOptions) ([]HitResult, error) {
	return runHits(ctx, o, "curves", curvesTargets)
}

// CurvesTable renders the curves benchmark's results: each target's median, and the medians of the
// per-round ratios on/off for each tier, with their lowest and highest.
func CurvesTable(w io.Writer, results []HitResult) {
	hitTable(w, results, []string{nameCurvesRAM, nameCurvesRAMOff, nameCurvesSSD, nameCurvesSSDOff},
		[][2]string{{nameCurvesRAM, nameCurvesRAMOff}, {nameCurvesSSD, nameCurvesSSDOff}})
}
