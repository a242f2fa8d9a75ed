package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/sim"
	"github.com/tierblk/tierblk/internal/trace"
)

// SimTrace describes the synthetic object trace the simulator benchmark replays: requests drawn
// from a Zipf distribution over Objects objects, interleaved with sequential scans, the mix a
// block cache sees (a hot working set, and backups or table scans that wash through it).
type SimTrace struct {
	Requests int
	Objects  int
	// Alpha is the Zipf exponent: the object of popularity rank r (from 1) is drawn with a
	// probability proportional to 1/r^Alpha.
	Alpha float64
	// ScanShare is the fraction of requests that belong to scans; a scan reads ScanMin to ScanMax
	// consecutive object ids.
	ScanShare        float64
	ScanMin, ScanMax int
	Seed             uint64
}

// DefaultSimTrace is the trace of `tierblk bench sim`: 5 million requests over a million objects.
func DefaultSimTrace() SimTrace {
	return SimTrace{Requests: 5_000_000, Objects: 1_000_000, Alpha: 0.9, ScanShare: 0.1, ScanMin: 1000, ScanMax: 10000, Seed: 1}
}

// simObjectSize is every object's size. It does not matter to the benchmark (both simulators count
// objects), but a real size keeps the byte figures of the file meaningful.
const simObjectSize = 4096

func (t SimTrace) validate() error {
	if t.Requests < 1 || t.Requests > math.MaxUint32 || t.Objects < 1 || t.Alpha <= 0 ||
		t.ScanShare < 0 || t.ScanShare >= 1 || t.ScanMin < 1 || t.ScanMax < t.ScanMin || t.ScanMax > t.Objects {
		return fmt.Errorf("bad synthetic trace parameters %+v", t)
	}
	return nil
}

// FileName names the trace file by every parameter, so a cached file is only reused for the very
// same trace.
func (t SimTrace) FileName() string {
	return fmt.Sprintf("sim-n%d-o%d-a%g-s%g-%d-%d-seed%d.oracleGeneral",
		t.Requests, t.Objects, t.Alpha, t.ScanShare, t.ScanMin, t.ScanMax, t.Seed)
}

// Each calls fn with the trace's requests in order, request i at Time i, and stops at fn's first
// error. The same SimTrace always gives the same requests; they are made as they go, never held.
func (t SimTrace) Each(fn func(trace.Request) error) error {
	if err := t.validate(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(t.Seed, t.Seed^0x9e3779b97f4a7c15))
	// cdf[r] is the probability of drawing a rank up to r (from 0).
	cdf := make([]float64, t.Objects)
	sum := 0.0
	for r := range cdf {
		sum += math.Pow(float64(r+1), -t.Alpha)
		cdf[r] = sum
	}
	// Popular objects are scattered over the id space, so scans run through hot and cold alike.
	ids := rng.Perm(t.Objects)
	meanScan := float64(t.ScanMin+t.ScanMax) / 2
	// Starting a scan with this probability before each non-scan request makes ScanShare of all
	// requests scan requests, on average.
	pScan := t.ScanShare / ((1 - t.ScanShare) * meanScan)
	var scanNext, scanLeft int
	for i := range t.Requests {
		if scanLeft == 0 && rng.Float64() < pScan {
			scanLeft = t.ScanMin + rng.IntN(t.ScanMax-t.ScanMin+1)
			scanNext = rng.IntN(t.Objects - scanLeft + 1)
		}
		var id int
		if scanLeft > 0 {
			id, scanNext, scanLeft = scanNext, scanNext+1, scanLeft-1
		} else {
			id = ids[sort.SearchFloat64s(cdf, rng.Float64()*sum)]
		}
		if err := fn(trace.Request{Time: int64(i), ID: uint64(id), Offset: int64(id) * trace.OracleGeneralStride, Length: simObjectSize}); err != nil {
			return err
		}
	}
	return nil
}

// Write writes the trace in oracleGeneral format, as it is made. Every next access is -1 (none
// known): the policies compared here never look ahead.
func (t SimTrace) Write(w io.Writer) error {
	ow := trace.NewOracleGeneralWriter(w)
	if err := t.Each(func(r trace.Request) error { return ow.Write(r, -1) }); err != nil {
		return err
	}
	return ow.Flush()
}

// EnsureSimTrace returns the path of t's oracleGeneral file in dir, generating it first unless a
// complete one is already there.
func EnsureSimTrace(dir string, t SimTrace, log io.Writer) (string, error) {
	path := filepath.Join(dir, t.FileName())
	if fi, err := os.Stat(path); err == nil && fi.Size() == int64(t.Requests)*24 {
		return path, nil
	}
	fmt.Fprintf(log, "generating %s\n", path)
	// Write beside the target and rename, so that an interrupted run never leaves a short file
	// that a later run would take for the trace.
	f, err := os.CreateTemp(dir, ".sim-trace-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := t.Write(f); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return path, os.Rename(f.Name(), path)
}

// SimOptions control `tierblk bench sim`.
type SimOptions struct {
	TracePath string
	Policies  []string
	// Fraction of the trace's distinct objects that the cache holds.
	Fraction float64
	Rounds   int
	// Cachesim, if not empty, is libCacheSim's cachesim binary to compare with.
	Cachesim string
	WorkDir  string
	Log      io.Writer
}

// CachesimNames are cachesim's names for the tierblk policies whose names differ; the others are
// passed as they are.
var CachesimNames = map[string]string{"2q": "twoq"}

// SimResult is one policy's figures: samples in requests per second, one per round.
type SimResult struct {
	Policy    string
	CacheSize int
	Requests  int
	// Replay is the time the cache spent replaying; EndToEnd includes opening, reading and decoding
	// the trace (which run beside the replay).
	Replay, EndToEnd []float64
	MissRatio        float64
	Cachesim         *CachesimResult
}

// CachesimResult is cachesim's side of a SimResult.
type CachesimResult struct {
	Name string
	// Own is the throughput cachesim reports (its replay loop, which reads the trace as it goes);
	// Wall is requests over the process's wall time.
	Own, Wall []float64
	MissRatio float64
}

// RunSim replays the trace once per policy and round through the code path of `tierblk sim`
// (trace.Open, sim.Run with one worker), alternating with cachesim when one is given.
func RunSim(ctx context.Context, o SimOptions) ([]SimResult, error) {
	if o.Cachesim != "" {
		if _, err := exec.LookPath(o.Cachesim); err != nil {
			return nil, fmt.Errorf("--cachesim: %w", err)
		}
	}
	// The cache size is fixed once, as for cachesim, so that the timed rounds need not count the
	// distinct objects.
	distinct, err := countDistinct(ctx, o.TracePath)
	if err != nil {
		return nil, err
	}
	size := int(o.Fraction * float64(distinct))
	var out []SimResult
	for _, p := range o.Policies {
		r := SimResult{Policy: p, CacheSize: size}
		if o.Cachesim != "" {
			r.Cachesim = &CachesimResult{Name: p}
			if n, ok := CachesimNames[p]; ok {
				r.Cachesim.Name = n
			}
		}
		for round := 1; round <= o.Rounds; round++ {
			if err := tierblkRound(ctx, o, &r); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			fmt.Fprintf(o.Log, "%-9s round %d tierblk  replay %6.2f Mreq/s, end-to-end %6.2f Mreq/s, miss ratio %.4f\n",
				p, round, last(r.Replay)/1e6, last(r.EndToEnd)/1e6, r.MissRatio)
			if r.Cachesim == nil {
				continue
			}
			if err := cachesimRound(ctx, o, &r); err != nil {
				return nil, fmt.Errorf("cachesim %s: %w", r.Cachesim.Name, err)
			}
			fmt.Fprintf(o.Log, "%-9s round %d cachesim own    %6.2f Mreq/s, wall       %6.2f Mreq/s, miss ratio %.4f\n",
				p, round, last(r.Cachesim.Own)/1e6, last(r.Cachesim.Wall)/1e6, r.Cachesim.MissRatio)
		}
		out = append(out, r)
	}
	return out, nil
}

func countDistinct(ctx context.Context, path string) (int, error) {
	tr, err := trace.Open(path, "oraclegeneral")
	if err != nil {
		return 0, err
	}
	defer tr.Close()
	s, err := sim.CountKeys(ctx, tr, sim.Options{})
	return int(s.Distinct), err
}

func last(s []float64) float64 { return s[len(s)-1] }

func tierblkRound(ctx context.Context, o SimOptions, r *SimResult) error {
	start := time.Now()
	tr, err := trace.Open(o.TracePath, "oraclegeneral")
	if err != nil {
		return err
	}
	// No warm-up: cachesim (without --warmup-sec) counts every request too.
	s, err := sim.Run(ctx, tr, []sim.Job{{Policy: r.Policy, Size: r.CacheSize}}, sim.Options{Workers: 1})
	tr.Close()
	if err != nil {
		return err
	}
	r.Requests = int(s.Requests)
	r.EndToEnd = append(r.EndToEnd, float64(r.Requests)/time.Since(start).Seconds())
	r.Replay = append(r.Replay, s.Results[0].ThroughputMQPS*1e6)
	r.MissRatio = s.Results[0].MissRatio
	return nil
}

func cachesimRound(ctx context.Context, o SimOptions, r *SimResult) error {
	c := r.Cachesim
	// cachesim appends its result to the -o file too; we read its stdout and drop the file.
	resultFile := filepath.Join(o.WorkDir, "cachesim.out")
	defer os.Remove(resultFile)
	cmd := exec.CommandContext(ctx, o.Cachesim, o.TracePath, "oraclegeneral", c.Name, strconv.Itoa(r.CacheSize),
		"--ignore-obj-size", "1", "--num-thread", "1", "--report-interval", strconv.Itoa(math.MaxInt32),
		"-o", resultFile)
	cmd.Dir = o.WorkDir
	start := time.Now()
	out, err := cmd.Output()
	wall := time.Since(start).Seconds()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("%v: %s", err, ee.Stderr)
		}
		return err
	}
	own, miss, err := parseCachesim(out)
	if err != nil {
		return err
	}
	c.Own = append(c.Own, own)
	c.Wall = append(c.Wall, float64(r.Requests)/wall)
	c.MissRatio = miss
	return nil
}

// cachesimLine matches the result line of a single-cache cachesim run:
// "TRACE POLICY cache size N, R req, miss ratio 0.1234, throughput 5.67 MQPS".
var cachesimLine = regexp.MustCompile(`miss ratio ([0-9.]+), throughput ([0-9.]+) MQPS`)

// parseCachesim returns the throughput (requests per second) and miss ratio cachesim printed.
func parseCachesim(out []byte) (throughput, missRatio float64, err error) {
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		m := cachesimLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		missRatio, err1 := strconv.ParseFloat(m[1], 64)
		mqps, err2 := strconv.ParseFloat(m[2], 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, fmt.Errorf("cachesim output %q: %w", sc.Text(), err)
		}
		return mqps * 1e6, missRatio, nil
	}
	return 0, 0, fmt.Errorf("no result line in cachesim's output: %q", clip(out))
}

func clip(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// SimTable renders results as a Markdown table of medians in millions of requests per second.
// With cachesim, the ratios are tierblk/cachesim (above 1: tierblk is faster): replay against
// cachesim's own throughput (both loops include nothing but the simulation, though cachesim's
// also decodes the trace as it goes), and end to end against its wall time.
func SimTable(rs []SimResult) string {
	var b strings.Builder
	withC := len(rs) > 0 && rs[0].Cachesim != nil
	if withC {
		b.WriteString("| policy | cache size | tierblk replay | tierblk end-to-end | cachesim own | cachesim wall | ratio replay | ratio end-to-end | miss ratio tierblk | miss ratio cachesim |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	} else {
		b.WriteString("| policy | cache size | tierblk replay | tierblk end-to-end | miss ratio |\n|---|---:|---:|---:|---:|\n")
	}
	for _, r := range rs {
		rep, e2e := median(r.Replay), median(r.EndToEnd)
		fmt.Fprintf(&b, "| %s | %d | %.2f | %.2f |", r.Policy, r.CacheSize, rep/1e6, e2e/1e6)
		if c := r.Cachesim; c != nil {
			own, wall := median(c.Own), median(c.Wall)
			fmt.Fprintf(&b, " %.2f | %.2f | %.2f | %.2f | %.4f | %.4f |\n", own/1e6, wall/1e6, rep/own, e2e/wall, r.MissRatio, c.MissRatio)
		} else {
			fmt.Fprintf(&b, " %.4f |\n", r.MissRatio)
		}
	}
	return b.String()
}
