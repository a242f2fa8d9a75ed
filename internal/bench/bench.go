// Package bench measures tierblk against a peer NBD server with fio, in the same run, alternating
// between them, and reports medians and ratios. Figures from one noisy shared machine mean little
// alone; the ratio against a peer measured seconds apart is what we report.
//
// It must never be used as a test: nothing here asserts a speed.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
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
		if _, err := fio(ctx, sock, o.Size, 0, []string{"--rw=write", "--bs=1M", "--iodepth=8"}); err != nil {
			return nil, fmt.Errorf("prefill %s: %w", t.Name, err)
		}
	}
	var results []Result
	for _, row := range o.Rows {
		r := Result{Row: row.Name, Unit: row.Unit, Medians: map[string]float64{}, Samples: map[string][]float64{}}
		for round := 0; round < o.Rounds; round++ {
			for _, i := range roundOrder(len(targets), round) {
				t := targets[i]
				v, err := fio(ctx, socks[i], o.Size, o.Runtime, row.FioArgs)
				if err != nil {
					return nil, fmt.Errorf("%s on %s: %w", row.Name, t.Name, err)
				}
				if row.Unit == "MiB/s" {
					v.value = v.bytesPerSec / (1 << 20)
				}
				fmt.Fprintf(o.Log, "%-26s round %d %-8s %10.0f %s\n", row.Name, round+1, t.Name, v.value, row.Unit)
				r.Samples[t.Name] = append(r.Samples[t.Name], v.value)
			}
		}
		for name, s := range r.Samples {
			r.Medians[name] = median(s)
		}
		results = append(results, r)
	}
	return results, nil
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

// Table renders results as a Markdown table with the ratio of the first target to the second.
func Table(results []Result, targets []Target) string {
	var b strings.Builder
	a, p := targets[0].Name, targets[1].Name
	fmt.Fprintf(&b, "| workload | %s | %s | ratio %s/%s |\n|---|---:|---:|---:|\n", a, p, a, p)
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %.0f %s | %.0f %s | %.2f |\n", r.Row, r.Medians[a], r.Unit, r.Medians[p], r.Unit, r.Medians[a]/r.Medians[p])
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
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return nil, fmt.Errorf("%s did not listen on %s within 20s", t.Name, sock)
}

type fioResult struct{ value, bytesPerSec float64 }

// fio runs one job against the socket; runtime 0 means "once over the size".
func fio(ctx context.Context, sock, size string, runtime time.Duration, args []string) (fioResult, error) {
	full := append([]string{
		"--name=bench", "--ioengine=nbd", "--uri=nbd+unix:///?socket=" + sock,
		"--size=" + size, "--numjobs=1", "--output-format=json", "--random_generator=tausworthe64",
	}, args...)
	if runtime > 0 {
		full = append(full, "--time_based", fmt.Sprintf("--runtime=%ds", int(runtime.Seconds())), "--ramp_time=1s")
	}
	out, err := exec.CommandContext(ctx, "fio", full...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fioResult{}, fmt.Errorf("fio: %v: %s", err, ee.Stderr)
		}
		return fioResult{}, fmt.Errorf("fio: %w", err)
	}
	return parseFio(out)
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
