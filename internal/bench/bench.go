// Package bench holds the measurements behind `tierblk bench`: tierblk against a peer NBD server
// with fio, in the same run, alternating between them, reported as medians and ratios; tierblk
// with its cache against tierblk without one where the cache starts cold, with fio and with real
// block traces replayed through tierblk's NBD client; the simulator's speed; and the restart time
// and memory of a large SSD tier. Figures from one noisy shared machine mean little alone; the
// ratio against a peer measured seconds apart (for the SSD tier, an empty tier of the same size)
// is what we report.
//
// It must never be used as a test: nothing here asserts a speed.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/client"
)

// Target is one NBD server under test.
type Target struct {
	Name string
	// Command starts the server listening on the unix socket sock. It must serve a writable disk of
	// Options.Size bytes.
	Command func(sock string) *exec.Cmd
}

// Row is one fio workload.
type Row struct {
	Name    string
	FioArgs []string
	Unit    string // "IOPS" or "MiB/s"
}

// Options control a run.
type Options struct {
	Rows    []Row
	Rounds  int           // alternations per row; the median is reported
	Runtime time.Duration // fio time per measurement
	Size    string        // fio --size, e.g. "512m": the region the rows work on
	WorkDir string
	Log     io.Writer // progress
}

// Result is the median of one row on one target.
type Result struct {
	Row     string
	Unit    string
	Medians map[string]float64 // by target name
	Samples map[string][]float64
}

// DefaultRows are the rows of `make bench`: 4K random read and write at iodepth 32, 1M sequential
// read.
func DefaultRows() []Row {
	return []Row{
		{Name: "4K random read, QD32", FioArgs: []string{"--rw=randread", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "4K random write, QD32", FioArgs: []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "1M sequential read, QD8", FioArgs: []string{"--rw=read", "--bs=1M", "--iodepth=8"}, Unit: "MiB/s"},
	}
}

// Run measures every row on every target, alternating targets within each round, and which goes
// first from round to round, so that drifts in machine load hit both alike.
func Run(ctx context.Context, targets []Target, o Options) ([]Result, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, errors.New("fio is not installed; run `make deps` (Debian package fio)")
	}
	socks := make([]string, len(targets))
	for i, t := range targets {
		sock := filepath.Join(o.WorkDir, fmt.Sprintf("bench%d.sock", i))
		stop, err := start(ctx, t, sock)
		if err != nil {
			return nil, err
		}
		defer stop()
		socks[i] = sock
		fmt.Fprintf(o.Log, "prefilling %s (%s)\n", t.Name, o.Size)
		// Fill the region first so that reads touch written data on every target, not a sparse fast path.
		if _, err := fio(ctx, sock, o.Size, 0, 0, []string{"--rw=write", "--bs=1M", "--iodepth=8"}); err != nil {
			return nil, fmt.Errorf("prefill %s: %w", t.Name, err)
		}
	}
	probes := make([]probe, len(targets))
	for i, t := range targets {
		probes[i] = probe{name: t.Name, sock: socks[i], runtime: o.Runtime, ramp: time.Second}
	}
	var results []Result
	for _, row := range o.Rows {
		r, err := measure(ctx, row, probes, o.Rounds, o.Size, o.Log, nil)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// probe is how one row is measured on one running server.
type probe struct {
	name, sock    string
	runtime, ramp time.Duration
}

// measure runs row on every probe for the given rounds, alternating as Run describes, and returns
// the medians. beforeRound, if not nil, runs before each round (to restart servers, say).
func measure(ctx context.Context, row Row, probes []probe, rounds int, size string, log io.Writer, beforeRound func() error) (Result, error) {
	r := Result{Row: row.Name, Unit: row.Unit, Medians: map[string]float64{}, Samples: map[string][]float64{}}
	for round := 0; round < rounds; round++ {
		if beforeRound != nil {
			if err := beforeRound(); err != nil {
				return Result{}, fmt.Errorf("%s: %w", row.Name, err)
			}
		}
		for _, i := range roundOrder(len(probes), round) {
			p := probes[i]
			v, err := fio(ctx, p.sock, size, p.runtime, p.ramp, row.FioArgs)
			if err != nil {
				return Result{}, fmt.Errorf("%s on %s: %w", row.Name, p.name, err)
			}
			if row.Unit == "MiB/s" {
				v.value = v.bytesPerSec / (1 << 20)
			}
			fmt.Fprintf(log, "%-26s round %d %-12s %10.0f %s\n", row.Name, round+1, p.name, v.value, row.Unit)
			r.Samples[p.name] = append(r.Samples[p.name], v.value)
		}
	}
	for name, s := range r.Samples {
		r.Medians[name] = median(s)
	}
	return r, nil
}

// roundOrder rotates which target goes first each round, so that neither always runs right after
// the prefill or the other's load.
func roundOrder(n, round int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = (i + round) % n
	}
	return order
}

// Table renders results as a Markdown table with the ratio of the first target to each other one.
func Table(results []Result, targets []Target) string {
	var b strings.Builder
	a := targets[0].Name
	b.WriteString("| workload |")
	for _, t := range targets {
		fmt.Fprintf(&b, " %s |", t.Name)
	}
	for _, t := range targets[1:] {
		fmt.Fprintf(&b, " ratio %s/%s |", a, t.Name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", 2*len(targets)-1) + "\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s |", r.Row)
		for _, t := range targets {
			fmt.Fprintf(&b, " %.0f %s |", r.Medians[t.Name], r.Unit)
		}
		for _, t := range targets[1:] {
			fmt.Fprintf(&b, " %.2f |", r.Medians[a]/r.Medians[t.Name])
		}
		b.WriteString("\n")
	}
	return b.String()
}

func start(ctx context.Context, t Target, sock string) (stop func(), err error) {
	os.Remove(sock)
	cmd := t.Command(sock)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", t.Name, err)
	}
	stop = func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		// A whole handshake, then a polite disconnect: a bare connect and hang-up makes nbdkit
		// log an error.
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := client.Dial(dctx, client.Config{Network: "unix", Address: sock, Logger: slog.New(slog.DiscardHandler)})
		cancel()
		if err == nil {
			c.Close()
			return stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return nil, fmt.Errorf("%s did not listen on %s within 20s", t.Name, sock)
}

type fioResult struct{ value, bytesPerSec float64 }

// fio runs one job against the socket (see fioArgs).
func fio(ctx context.Context, sock, size string, runtime, ramp time.Duration, args []string) (fioResult, error) {
	out, err := exec.CommandContext(ctx, "fio", fioArgs(sock, size, runtime, ramp, args)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fioResult{}, fmt.Errorf("fio: %v: %s", err, ee.Stderr)
		}
		return fioResult{}, fmt.Errorf("fio: %w", err)
	}
	return parseFio(out)
}

// fioArgs are fio's arguments for one job with args against the socket; runtime 0 means "once over
// the size". The first ramp of a timed run is not counted.
func fioArgs(sock, size string, runtime, ramp time.Duration, args []string) []string {
	full := append([]string{
		"--name=bench", "--ioengine=nbd", "--uri=nbd+unix:///?socket=" + sock,
		"--size=" + size, "--numjobs=1", "--output-format=json", "--random_generator=tausworthe64",
	}, args...)
	if runtime > 0 {
		full = append(full, "--time_based", fmt.Sprintf("--runtime=%ds", int(runtime.Seconds())))
		if ramp > 0 {
			full = append(full, fmt.Sprintf("--ramp_time=%ds", int(ramp.Seconds())))
		}
	}
	return full
}

func parseFio(out []byte) (fioResult, error) {
	// fio may print warnings before the JSON document.
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	var doc struct {
		Jobs []struct {
			Read, Write struct {
				IOPS     float64 `json:"iops"`
				BwBytes  float64 `json:"bw_bytes"`
				TotalIOs int64   `json:"total_ios"`
			}
			Error int `json:"error"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return fioResult{}, fmt.Errorf("fio output: %w", err)
	}
	if len(doc.Jobs) != 1 {
		return fioResult{}, fmt.Errorf("fio output has %d jobs, want 1", len(doc.Jobs))
	}
	j := doc.Jobs[0]
	if j.Error != 0 {
		return fioResult{}, fmt.Errorf("fio job error %d", j.Error)
	}
	return fioResult{value: j.Read.IOPS + j.Write.IOPS, bytesPerSec: j.Read.BwBytes + j.Write.BwBytes}, nil
}

// pairedRatios are a[i]/b[i], round by round: two servers measured back to back in each round.
func pairedRatios(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] / b[i]
	}
	return out
}

func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}
