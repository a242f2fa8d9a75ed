// Package bench holds the measurements behind `tierblk bench`: tierblk against a peer NBD server
// with fio (over unix sockets, or TCP with TLS), in the same run, alternating between them,
// reported as medians and ratios; tierblk with its cache against tierblk without one where the
// cache starts cold, with fio and with real block traces replayed through tierblk's NBD client;
// the simulator's speed; and the restart time and memory of a large SSD tier. Figures from one noisy shared machine mean little alone; the
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
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/tlsconf"
)

// Target is one NBD server under test.
type Target struct {
	Name string
	// Command starts the server listening on the unix socket sock, or where Listen says if it is
	// set (sock is then not used). It must serve a writable disk of Options.Size bytes.
	Command func(sock string) *exec.Cmd
	// Listen, if set, is where the server listens instead of a unix socket of the run's choosing:
	// a TCP port, with TLS or not.
	Listen *Endpoint
}

// endpoint is where t is reached when its unix socket, if it uses one, is sock.
func (t Target) endpoint(sock string) Endpoint {
	if t.Listen != nil {
		return *t.Listen
	}
	return Endpoint{Sock: sock}
}

// Endpoint is where a client reaches a server: a unix socket, or a TCP address, plain or with TLS.
// URI says it to fio's nbd engine (libnbd), clientConfig to tierblk's NBD client, which checks
// that a server is ready.
type Endpoint struct {
	Sock string // a unix socket's path; or
	Addr string // HOST:PORT over TCP
	// TLSDir, if set (with Addr), is a directory WriteTLS wrote: clients start TLS and
	// tierblk's client checks the server's certificate against its ca-cert.pem, for Addr's host.
	// fio runs with its GnuTLS priority file (see WriteTLS) and does not check the certificate:
	// its nbd engine does not let libnbd read tls-certificates= from a URI.
	TLSDir string
}

// URI is the endpoint as libnbd reads it: nbd+unix:///?socket=SOCK, nbd://ADDR/ or
// nbds://ADDR/?tls-verify-peer=false.
func (e Endpoint) URI() string {
	switch {
	case e.Sock != "":
		return "nbd+unix:///?socket=" + e.Sock
	case e.TLSDir != "":
		return "nbds://" + e.Addr + "/?tls-verify-peer=false"
	default:
		return "nbd://" + e.Addr + "/"
	}
}

// fioEnv is what fio's environment needs beyond this process's to reach the endpoint.
func (e Endpoint) fioEnv() []string {
	if e.Sock != "" || e.TLSDir == "" {
		return nil
	}
	return []string{"GNUTLS_SYSTEM_PRIORITY_FILE=" + filepath.Join(e.TLSDir, GnuTLSPriorityFile)}
}

// clientConfig is tierblk's NBD client's configuration for the endpoint, without a logger.
func (e Endpoint) clientConfig() (client.Config, error) {
	if e.Sock != "" {
		return client.Config{Network: "unix", Address: e.Sock}, nil
	}
	cfg := client.Config{Network: "tcp", Address: e.Addr}
	if e.TLSDir != "" {
		host, _, err := net.SplitHostPort(e.Addr)
		if err != nil {
			return client.Config{}, err
		}
		if cfg.TLS, err = tlsconf.Client(tlsconf.Options{Dir: e.TLSDir, VerifyPeer: true, Hostname: host}); err != nil {
			return client.Config{}, fmt.Errorf("TLS client for %s: %w", e.URI(), err)
		}
	}
	return cfg, nil
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
	// Watch are processes whose CPU is recorded besides the servers' (see Result.CPU).
	Watch []Watch
}

// Result is the median of one row on one target.
type Result struct {
	Row     string
	Unit    string
	Medians map[string]float64 // by target name
	Samples map[string][]float64
	// CPU is, by target name, what the CPUs did during that target's measurements, where the run
	// watched them (Run does; nil otherwise).
	CPU map[string]*CPUUse
}

// CPUUse is what the CPUs did during one target's measurements of a row, round by round: each from
// just before fio started to just after it ended (its ramp included).
type CPUUse struct {
	Busy []float64 // the share of the machine's CPUs that were busy, 0 to 1
	// Cores are the cores each watched process used: the target's server under the target's name,
	// the others (Options.Watch) under theirs.
	Cores map[string][]float64
}

// Watch is a process whose CPU a run records during every measurement, besides the servers': one
// that serves them all, such as the iSCSI target behind both.
type Watch struct {
	Name string
	PID  int
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
// first from round to round, so that drifts in machine load hit both alike. Around every
// measurement it records the CPU of the target's server and of o.Watch (Result.CPU).
func Run(ctx context.Context, targets []Target, o Options) ([]Result, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, errors.New("fio is not installed; run `make deps` (Debian package fio)")
	}
	probes := make([]probe, len(targets))
	for i, t := range targets {
		sock := filepath.Join(o.WorkDir, fmt.Sprintf("bench%d.sock", i))
		// The server's process, for its CPU.
		var proc *exec.Cmd
		command := t.Command
		t.Command = func(sock string) *exec.Cmd {
			proc = command(sock)
			return proc
		}
		stop, err := start(ctx, t, sock)
		if err != nil {
			return nil, err
		}
		defer stop()
		ep := t.endpoint(sock)
		fmt.Fprintf(o.Log, "prefilling %s (%s)\n", t.Name, o.Size)
		// Fill the region first so that reads touch written data on every target, not a sparse fast path.
		if _, err := fio(ctx, ep, o.Size, 0, 0, []string{"--rw=write", "--bs=1M", "--iodepth=8"}); err != nil {
			return nil, fmt.Errorf("prefill %s: %w", t.Name, err)
		}
		cpu := append([]Watch{{Name: t.Name, PID: proc.Process.Pid}}, o.Watch...)
		probes[i] = probe{name: t.Name, ep: ep, runtime: o.Runtime, ramp: time.Second, cpu: cpu}
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
	name          string
	ep            Endpoint
	runtime, ramp time.Duration
	// cpu, if not empty, are the processes whose CPU is recorded during each measurement.
	cpu []Watch
	// after, if not nil, runs after each measurement, untimed (to flush the server, say).
	after func() error
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
			var cpu0 cpuSnap
			if len(p.cpu) > 0 {
				var err error
				if cpu0, err = snapCPU(p.cpu); err != nil {
					return Result{}, fmt.Errorf("%s on %s: %w", row.Name, p.name, err)
				}
			}
			v, err := fio(ctx, p.ep, size, p.runtime, p.ramp, row.FioArgs)
			if err != nil {
				return Result{}, fmt.Errorf("%s on %s: %w", row.Name, p.name, err)
			}
			if len(p.cpu) > 0 {
				cpu1, err := snapCPU(p.cpu)
				if err != nil {
					return Result{}, fmt.Errorf("%s on %s: %w", row.Name, p.name, err)
				}
				r.addCPU(p.name, p.cpu, cpu1, cpu0)
			}
			if p.after != nil {
				if err := p.after(); err != nil {
					return Result{}, fmt.Errorf("%s on %s: %w", row.Name, p.name, err)
				}
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

// start starts t, its unix socket (unless it has Listen) at sock, and waits until it serves.
func start(ctx context.Context, t Target, sock string) (stop func(), err error) {
	ep := t.endpoint(sock)
	cfg, err := ep.clientConfig()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", t.Name, err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	if ep.Sock != "" {
		os.Remove(ep.Sock)
	}
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
		// A whole handshake (TLS included), then a polite disconnect: a bare connect and hang-up
		// makes nbdkit log an error.
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := client.Dial(dctx, cfg)
		cancel()
		if err == nil {
			c.Close()
			return stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return nil, fmt.Errorf("%s did not serve on %s within 20s", t.Name, ep.URI())
}

type fioResult struct{ value, bytesPerSec float64 }

// fio runs one job against the endpoint (see fioArgs).
func fio(ctx context.Context, ep Endpoint, size string, runtime, ramp time.Duration, args []string) (fioResult, error) {
	cmd := exec.CommandContext(ctx, "fio", fioArgs(ep.URI(), size, runtime, ramp, args)...)
	if env := ep.fioEnv(); env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	return runFio(cmd)
}

// runFio runs a fio command and reads its JSON output; its error has fio's stderr.
func runFio(cmd *exec.Cmd) (fioResult, error) {
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fioResult{}, fmt.Errorf("fio: %v: %s", err, ee.Stderr)
		}
		return fioResult{}, fmt.Errorf("fio: %w", err)
	}
	return parseFio(out)
}

// fioArgs are fio's arguments for one job with args against the NBD URI; runtime 0 means "once
// over the size". The first ramp of a timed run is not counted.
func fioArgs(uri, size string, runtime, ramp time.Duration, args []string) []string {
	full := append([]string{
		"--name=bench", "--ioengine=nbd", "--uri=" + uri,
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

// Ratio is the median of the per-round ratios a/b (two targets measured back to back in each
// round), and the lowest and highest of them.
func (r Result) Ratio(a, b string) (mid, lo, hi float64) {
	ratios := pairedRatios(r.Samples[a], r.Samples[b])
	return median(ratios), slices.Min(ratios), slices.Max(ratios)
}

// pairedTable renders results as a Markdown table: the median of each of the targets named, and
// for each pair {a, b} the median of the per-round ratios a/b, with the lowest and highest.
func pairedTable(w io.Writer, results []Result, names []string, pairs [][2]string) {
	var b strings.Builder
	b.WriteString("| workload |")
	for _, n := range names {
		fmt.Fprintf(&b, " %s |", n)
	}
	for _, p := range pairs {
		fmt.Fprintf(&b, " %s / %s (min-max) |", p[0], p[1])
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(names)+len(pairs)) + "\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s |", r.Row)
		for _, n := range names {
			fmt.Fprintf(&b, " %.0f %s |", median(r.Samples[n]), r.Unit)
		}
		for _, p := range pairs {
			m, lo, hi := r.Ratio(p[0], p[1])
			fmt.Fprintf(&b, " %.2f (%.2f-%.2f) |", m, lo, hi)
		}
		b.WriteString("\n")
	}
	io.WriteString(w, b.String())
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
