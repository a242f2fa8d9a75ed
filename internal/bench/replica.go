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
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/nbd/client"
)

// `tierblk bench replica` (issue 48): a write-back cache with one replica on a peer reached
// through a relay that delays every byte by half a round trip each way, against the same cache
// without a replica, in paired rounds. The peer is another tierblk process on this machine; the
// link is loopback plus the relay's delay (netem does not work on these machines).
const (
	replicaBackendSize = "1GiB"
	replicaSSDSize     = "2GiB"
	replicaLogSize     = "4GiB"
	// ReplicaWithout and ReplicaWith are the two configurations measured.
	ReplicaWithout  = "without a replica"
	ReplicaWith     = "with a replica"
	replicaUnitIOPS = "IOPS"
	replicaUnitUS   = "µs"
)

// ReplicaOptions control `tierblk bench replica`.
type ReplicaOptions struct {
	Tierblk string
	Rounds  int
	// Delays are the round trip times the relay adds.
	Delays        []time.Duration
	Size          string // the region fio works on (fio size syntax)
	Runtime, Ramp time.Duration
	WorkDir       string
	Log           io.Writer
}

// ReplicaResult is one row at one delay: a sample per round of each configuration.
type ReplicaResult struct {
	Row   string
	Delay time.Duration
	Unit  string
	// LowerIsBetter for latencies.
	LowerIsBetter bool
	Without, With []float64
}

// Ratios are with/without, paired by round.
func (r ReplicaResult) Ratios() []float64 { return pairedRatios(r.With, r.Without) }

// ReplicaReport is RunReplica's outcome.
type ReplicaReport struct {
	Results []ReplicaResult
	// PeerFlushP99 is the replica's own FLUSH p99 (fio straight to its export, no relay), µs, per
	// round; RelayRTT the round trip the relay added during the FLUSH row, measured, µs, by delay.
	PeerFlushP99 []float64
	RelayRTT     map[time.Duration][]float64
	Commands     []string
}

// Validate checks the options a user gives.
func (o ReplicaOptions) Validate() error {
	if o.Rounds < 1 || len(o.Delays) == 0 || o.Runtime < time.Second {
		return fmt.Errorf("--rounds must be at least 1, --delays not empty, --runtime at least 1s")
	}
	for _, d := range o.Delays {
		if d < 0 || d > time.Second {
			return fmt.Errorf("--delays: %s is not a round trip from 0 to 1s", d)
		}
	}
	return nil
}

// replicaPrimary is the primary's serve command, its files in dir; replicaURL empty for none.
func replicaPrimary(tierblk, dir, replicaURL string) []string {
	args := []string{tierblk, "serve", "--backend", "file://" + filepath.Join(dir, "nas.img") + "?size=" + replicaBackendSize + "&direct=true",
		"--nbd", "unix:" + filepath.Join(dir, "nbd.sock"), "--ram", CacheRAM, "--ssd", filepath.Join(dir, "ssd.img"),
		"--ssd-size", replicaSSDSize, "--mode", "writeback", "--log-level", "warn"}
	if replicaURL != "" {
		args = append(args, "--replica", replicaURL)
	}
	return args
}

// replicaPeer is the replica's serve command, listening on addr, its log in dir.
func replicaPeer(tierblk, dir, addr string) []string {
	return []string{tierblk, "replica", "serve", "--log", filepath.Join(dir, "nas.replica"), "--size", replicaLogSize,
		"--export", "nas", "--nbd", addr, "--log-level", "warn"}
}

func replicaFillArgs() []string  { return []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"} }
func replicaWriteArgs() []string { return []string{"--rw=randwrite", "--bs=4k", "--iodepth=32"} }
func replicaReadArgs() []string  { return []string{"--rw=randread", "--bs=4k", "--iodepth=32"} }

// ReplicaEqualRate is the write rate, below what either configuration reaches here, at which the
// primary's CPU a write is also measured with and without a replica: at the full rate each runs at
// its own pace, and a server's CPU a write grows as its load falls (its requests gathered less,
// its idle waits counted in), so only equal rates show what the replica itself costs the primary.
const ReplicaEqualRate = 15000

func replicaEqualRateArgs() []string {
	return append(replicaWriteArgs(), fmt.Sprintf("--rate_iops=%d", ReplicaEqualRate))
}

// replicaFlushArgs: a writer that waits for each write and FLUSH, as a journal's commit does.
func replicaFlushArgs() []string {
	return []string{"--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=1"}
}

// RunReplica measures, delay by delay and round by round (alternating which goes first), the
// cache without and with a replica: after one write of every 4K block of the region at random (not
// measured), fio's 4K random writes at QD32, the same at ReplicaEqualRate, then random reads of
// the region (cached), then a writer that flushes after every write (its FLUSH latency). Every
// measurement has a fresh primary, and with a replica a fresh peer and relay. Each round also
// measures the peer's own FLUSH latency, fio straight to its export.
func RunReplica(ctx context.Context, o ReplicaOptions) (ReplicaReport, error) {
	if err := o.Validate(); err != nil {
		return ReplicaReport{}, err
	}
	if err := checkFioRun(o.WorkDir); err != nil {
		return ReplicaReport{}, err
	}
	dir, err := os.MkdirTemp(o.WorkDir, "replica")
	if err != nil {
		return ReplicaReport{}, err
	}
	defer os.RemoveAll(dir)
	if dir, err = filepath.Abs(dir); err != nil {
		return ReplicaReport{}, err
	}
	rep := ReplicaReport{RelayRTT: map[time.Duration][]float64{}, Commands: replicaCommands(o, dir)}
	for round := range o.Rounds {
		p99, err := peerFlush(ctx, o, filepath.Join(dir, fmt.Sprintf("peer-%d", round)))
		if err != nil {
			return rep, err
		}
		rep.PeerFlushP99 = append(rep.PeerFlushP99, p99)
	}
	for _, delay := range o.Delays {
		write := ReplicaResult{Row: "4K random write, QD32", Delay: delay, Unit: replicaUnitIOPS}
		read := ReplicaResult{Row: "4K random read of the region (cached), QD32", Delay: delay, Unit: replicaUnitIOPS}
		flushP99 := ReplicaResult{Row: "FLUSH latency p99 (4K write + FLUSH, QD1)", Delay: delay, Unit: replicaUnitUS, LowerIsBetter: true}
		flushP50 := ReplicaResult{Row: "FLUSH latency p50", Delay: delay, Unit: replicaUnitUS, LowerIsBetter: true}
		cpuPrimary := ReplicaResult{Row: "the primary's CPU a write, in the write row", Delay: delay, Unit: replicaUnitUS, LowerIsBetter: true}
		cpuAll := ReplicaResult{Row: "all three processes' CPU a write (primary, replica, relay)", Delay: delay, Unit: replicaUnitUS, LowerIsBetter: true}
		cpuEqual := ReplicaResult{Row: fmt.Sprintf("the primary's CPU a write, both at %d writes a second", ReplicaEqualRate), Delay: delay, Unit: replicaUnitUS, LowerIsBetter: true}
		for round := range o.Rounds {
			fmt.Fprintf(o.Log, "replica, %s round trip, round %d of %d\n", delay, round+1, o.Rounds)
			for _, with := range roundOrder(2, round) {
				s, rtt, err := measureReplica(ctx, o, delay, with == 1, filepath.Join(dir, fmt.Sprintf("%dus-%d-%d", delay.Microseconds(), round, with)))
				if err != nil {
					return rep, err
				}
				for _, x := range []struct {
					r *ReplicaResult
					v float64
				}{{&write, s.write}, {&read, s.read}, {&flushP99, s.flushP99}, {&flushP50, s.flushP50},
					{&cpuPrimary, s.cpu[0]}, {&cpuAll, s.cpu[0] + s.cpu[1] + s.cpu[2]}, {&cpuEqual, s.cpuEqual}} {
					if with == 1 {
						x.r.With = append(x.r.With, x.v)
					} else {
						x.r.Without = append(x.r.Without, x.v)
					}
				}
				if with == 1 {
					rep.RelayRTT[delay] = append(rep.RelayRTT[delay], rtt)
				}
			}
		}
		rep.Results = append(rep.Results, write, read, flushP99, flushP50, cpuPrimary, cpuAll, cpuEqual)
	}
	return rep, nil
}

// replicaSample is one measurement's figures; cpu is the write row's CPU per write, µs, of the
// primary, the peer and the relay (this process), and busy the machine's busy share meanwhile;
// cpuEqual the primary's CPU a write at ReplicaEqualRate.
type replicaSample struct {
	write, read, flushP99, flushP50 float64
	cpu                             [3]float64
	busy, cpuEqual                  float64
}

// measureReplica runs one configuration's rows in dir (made here, removed after); rtt is the round
// trip the relay added on average during the FLUSH row, µs.
func measureReplica(ctx context.Context, o ReplicaOptions, delay time.Duration, with bool, dir string) (s replicaSample, rtt float64, err error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return s, 0, err
	}
	defer os.RemoveAll(dir)
	name := "tierblk " + ReplicaWithout
	url := ""
	var r *relay
	var primaryCmd *exec.Cmd
	var watch []Watch
	if with {
		name = "tierblk " + ReplicaWith
		peer, pid, err := startPeer(ctx, o, dir)
		if err != nil {
			return s, 0, err
		}
		defer peer.close() // after the primary's close below
		watch = append(watch, Watch{Name: "the replica", PID: pid}, Watch{Name: "the relay", PID: os.Getpid()})
		if r, err = startRelay(peer.Listen.Addr, delay/2); err != nil {
			return s, 0, err
		}
		defer r.close()
		url = "nbd://" + r.addr() + "/nas"
	}
	args := replicaPrimary(o.Tierblk, dir, url)
	tb := &server{Target: Target{Name: name, Command: func(string) *exec.Cmd { primaryCmd = exec.Command(args[0], args[1:]...); return primaryCmd }},
		sock: filepath.Join(dir, "nbd.sock")}
	if err := tb.start(ctx); err != nil {
		return s, 0, err
	}
	defer tb.close()
	watch = append([]Watch{{Name: name, PID: primaryCmd.Process.Pid}}, watch...)
	// The region written once first, in the write row's 4K blocks at random (each once): the reads
	// hit whatever the write row managed, and the write row measures a warm daemon, its RAM tier's
	// and the SSD file's pages touched already, not the page faults of a new process.
	if _, err := fio(ctx, tb.endpoint(), o.Size, 0, 0, replicaFillArgs()); err != nil {
		return s, 0, fmt.Errorf("%s, fill: %w", name, err)
	}
	var cpu []float64
	if s.write, s.busy, cpu, err = writesWithCPU(ctx, o, tb.endpoint(), watch, replicaWriteArgs()); err != nil {
		return s, 0, fmt.Errorf("%s, writes: %w", name, err)
	}
	copy(s.cpu[:], cpu)
	if _, _, cpu, err = writesWithCPU(ctx, o, tb.endpoint(), watch[:1], replicaEqualRateArgs()); err != nil {
		return s, 0, fmt.Errorf("%s, writes at %d a second: %w", name, ReplicaEqualRate, err)
	}
	s.cpuEqual = cpu[0]
	// The reads start once the write row's records have reached the peer (a FLUSH waits for them),
	// so that they measure reads, not reads beside the end of the write row's stream.
	if err := flushEndpoint(ctx, tb.sock); err != nil {
		return s, 0, fmt.Errorf("%s, FLUSH after the writes: %w", name, err)
	}
	res, err := fio(ctx, tb.endpoint(), o.Size, o.Runtime, o.Ramp, replicaReadArgs())
	if err != nil {
		return s, 0, fmt.Errorf("%s, reads: %w", name, err)
	}
	s.read = res.value
	if r != nil {
		r.reset() // the round trip the FLUSHes below met
	}
	if s.flushP50, s.flushP99, err = fioFlushLatency(ctx, tb.endpoint(), o.Size, o.Runtime); err != nil {
		return s, 0, fmt.Errorf("%s, flushes: %w", name, err)
	}
	if r != nil {
		rtt = r.meanRTT()
	}
	fmt.Fprintf(o.Log, "  %-20s %8.0f write IOPS (CPU a write: primary %.0f µs, replica %.0f, relay %.0f; machine %.0f%% busy), %8.0f read IOPS, FLUSH p50 %.0f µs p99 %.0f µs",
		name[len("tierblk "):], s.write, s.cpu[0], s.cpu[1], s.cpu[2], 100*s.busy, s.read, s.flushP50, s.flushP99)
	if r != nil {
		fmt.Fprintf(o.Log, ", relay round trip %.0f µs", rtt)
	}
	fmt.Fprintln(o.Log)
	return s, rtt, nil
}

// startPeer starts a replica with its log in dir on a loopback port; pid is its process's.
func startPeer(ctx context.Context, o ReplicaOptions, dir string) (peer *server, pid int, err error) {
	addr, err := freeLoopback()
	if err != nil {
		return nil, 0, err
	}
	args := replicaPeer(o.Tierblk, dir, addr)
	var cmd *exec.Cmd
	peer = &server{Target: Target{Name: "the replica", Listen: &Endpoint{Addr: addr},
		Command: func(string) *exec.Cmd { cmd = exec.Command(args[0], args[1:]...); return cmd }}}
	if err := peer.start(ctx); err != nil {
		return nil, 0, err
	}
	return peer, cmd.Process.Pid, nil
}

// peerFlush is the replica's own FLUSH latency p99, µs: fio straight to a fresh peer's export.
func peerFlush(ctx context.Context, o ReplicaOptions, dir string) (float64, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	peer, _, err := startPeer(ctx, o, dir)
	if err != nil {
		return 0, err
	}
	defer peer.close()
	_, p99, err := fioFlushLatency(ctx, peer.endpoint(), o.Size, o.Runtime)
	if err != nil {
		return 0, fmt.Errorf("the replica's own flushes: %w", err)
	}
	fmt.Fprintf(o.Log, "the replica's own FLUSH p99: %.0f µs\n", p99)
	return p99, nil
}

// fioFlushLatency runs the flushing writer and returns its FLUSHes' latency p50 and p99, µs.
func fioFlushLatency(ctx context.Context, ep Endpoint, size string, runtime time.Duration) (p50, p99 float64, err error) {
	cmd := exec.CommandContext(ctx, "fio", fioArgs(ep.URI(), size, runtime, 0, replicaFlushArgs())...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0, 0, fmt.Errorf("fio: %v: %s", err, ee.Stderr)
		}
		return 0, 0, fmt.Errorf("fio: %w", err)
	}
	return parseFioSync(out)
}

// parseFioSync reads the p50 and p99 of fio's sync (FLUSH) latencies, µs.
func parseFioSync(out []byte) (p50, p99 float64, err error) {
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	var doc struct {
		Jobs []struct {
			Sync struct {
				TotalIOs int64 `json:"total_ios"`
				Lat      struct {
					Percentile map[string]float64 `json:"percentile"`
				} `json:"lat_ns"`
			} `json:"sync"`
			Error int `json:"error"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return 0, 0, fmt.Errorf("fio output: %w", err)
	}
	if len(doc.Jobs) != 1 || doc.Jobs[0].Error != 0 || doc.Jobs[0].Sync.TotalIOs == 0 {
		return 0, 0, errors.New("fio output: no job with flushes")
	}
	pc := doc.Jobs[0].Sync.Lat.Percentile
	a, okA := pc["50.000000"]
	b, okB := pc["99.000000"]
	if !okA || !okB {
		return 0, 0, errors.New("fio output: no p50 and p99 of the flushes")
	}
	return a / 1e3, b / 1e3, nil
}

// freeLoopback returns a loopback address with a port that was free a moment ago.
func freeLoopback() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// replicaCommands are the command lines, WORK for the run's directory and ROUND a measurement's.
func replicaCommands(o ReplicaOptions, dir string) []string {
	round := filepath.Join(dir, "ROUND")
	work := func(args []string) string { return strings.ReplaceAll(shellJoin(args), dir, "WORK") }
	ep := Endpoint{Sock: filepath.Join(round, "nbd.sock")}.URI()
	return []string{
		"the replica: " + work(replicaPeer(o.Tierblk, round, "127.0.0.1:PEER")),
		"the relay: in tierblk bench, 127.0.0.1:RELAY to 127.0.0.1:PEER, half the round trip each way",
		"the primary: " + work(replicaPrimary(o.Tierblk, round, "nbd://127.0.0.1:RELAY/nas")) + " (without --replica for the other)",
		"fill: " + work(append([]string{"fio"}, fioArgs(ep, o.Size, 0, 0, replicaFillArgs())...)),
		"writes: " + work(append([]string{"fio"}, fioArgs(ep, o.Size, o.Runtime, o.Ramp, replicaWriteArgs())...)),
		fmt.Sprintf("writes at %d a second: ", ReplicaEqualRate) + work(append([]string{"fio"}, fioArgs(ep, o.Size, o.Runtime, o.Ramp, replicaEqualRateArgs())...)),
		"reads: " + work(append([]string{"fio"}, fioArgs(ep, o.Size, o.Runtime, o.Ramp, replicaReadArgs())...)),
		"flushes: " + work(append([]string{"fio"}, fioArgs(ep, o.Size, o.Runtime, 0, replicaFlushArgs())...)),
	}
}

// ReplicaTable renders the results: each configuration's median, and the median, lowest and
// highest of the per-round ratios with/without.
func ReplicaTable(rs []ReplicaResult) string {
	var b strings.Builder
	b.WriteString("| added round trip | workload | " + ReplicaWithout + " | " + ReplicaWith + " | ratio with/without, median | min | max |\n")
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		ratios := r.Ratios()
		fmt.Fprintf(&b, "| %s | %s | %.0f %s | %.0f %s | %.2f | %.2f | %.2f |\n", r.Delay, r.Row,
			median(r.Without), r.Unit, median(r.With), r.Unit, median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
	return b.String()
}

// ReplicaBounds says what bounds the FLUSH latency: the peer's own FLUSH p99 and the round trip
// the relay added at each delay, medians over the rounds with their range.
func ReplicaBounds(rep ReplicaReport, delays []time.Duration) string {
	var b strings.Builder
	p := rep.PeerFlushP99
	fmt.Fprintf(&b, "the replica's own FLUSH p99 (fio straight to its export): median %.0f µs (%.0f to %.0f)\n", median(p), slices.Min(p), slices.Max(p))
	for _, d := range delays {
		if rtt := rep.RelayRTT[d]; len(rtt) > 0 {
			fmt.Fprintf(&b, "the relay's added round trip at %s: median %.0f µs (%.0f to %.0f)\n", d, median(rtt), slices.Min(rtt), slices.Max(rtt))
		}
	}
	return b.String()
}

// relay forwards TCP connections to an address, holding every byte for a delay in each
// direction: a link with that much latency, which netem would give where it works.
type relay struct {
	l      net.Listener
	to     string
	oneWay time.Duration
	// slack is what a sleep overshoots here (calibrated at start): sleeps are that much shorter.
	slack time.Duration
	// held sums how long chunks were held, and n counts them: the delay actually added.
	held, n atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startRelay(to string, oneWay time.Duration) (*relay, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{l: l, to: to, oneWay: oneWay, slack: sleepSlack()}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *relay) addr() string { return r.l.Addr().String() }

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		d, err := net.Dial("tcp", r.to)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, d)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pump(c, d)
		go r.pump(d, c)
	}
}

type chunk struct {
	b  []byte
	at time.Time // when it was read
}

// pump copies src to dst, each chunk no earlier than oneWay after it was read, in order.
func (r *relay) pump(src, dst net.Conn) {
	defer r.wg.Done()
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		buf := make([]byte, 256<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{slices.Clone(buf[:n]), time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	// Go's timers wake a millisecond late here; nanosleep with the thread's timer slack at its
	// least is precise to tens of microseconds, which the calibrated slack takes off.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	due := func(c chunk) time.Duration { return time.Until(c.at.Add(r.oneWay)) - r.slack }
	var next *chunk // taken from ch, not due yet
	for open := true; open; {
		c := next
		if c == nil {
			got, ok := <-ch
			if !ok {
				break
			}
			c = &got
		}
		next = nil
		if wait := due(*c); wait > 0 {
			ts := unix.NsecToTimespec(int64(wait))
			unix.Nanosleep(&ts, nil)
		}
		// The chunks read meanwhile whose time has come go with it, in one write: the relay
		// stands for a network, and its CPU is taken from the processes measured.
		out := net.Buffers{c.b}
		r.hold(c.at)
	gather:
		for {
			select {
			case n, ok := <-ch:
				if !ok {
					open = false
					break gather
				}
				if due(n) > 0 {
					next = &n
					break gather
				}
				out = append(out, n.b)
				r.hold(n.at)
			default:
				break gather
			}
		}
		if _, err := out.WriteTo(dst); err != nil {
			break
		}
	}
	for range ch { // drain the reader, which ends when src is closed
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// hold counts a chunk read at at as sent now.
func (r *relay) hold(at time.Time) {
	r.held.Add(int64(time.Since(at)))
	r.n.Add(1)
}

func (r *relay) reset() {
	r.held.Store(0)
	r.n.Store(0)
}

// meanRTT is the round trip the relay added on average, µs: twice the mean hold of a chunk.
func (r *relay) meanRTT() float64 {
	n := r.n.Load()
	if n == 0 {
		return 0
	}
	return 2 * float64(r.held.Load()) / float64(n) / 1e3
}

func (r *relay) close() {
	r.l.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// sleepSlack measures how much a nanosleep of 10 µs overshoots on this machine (the median of a
// few), with the thread's timer slack at its least.
func sleepSlack() time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	const want = 10 * time.Microsecond
	var s []float64
	for range 21 {
		t := time.Now()
		ts := unix.NsecToTimespec(int64(want))
		unix.Nanosleep(&ts, nil)
		s = append(s, float64(time.Since(t)-want))
	}
	return time.Duration(median(s))
}

// flushEndpoint sends one FLUSH to the NBD server on the unix socket sock and waits for it.
func flushEndpoint(ctx context.Context, sock string) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cl, err := client.Dial(dctx, client.Config{Network: "unix", Address: sock, Logger: slog.New(slog.DiscardHandler)})
	cancel()
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.Flush()
}

// writesWithCPU runs fio's writes with args and returns their rate, the machine's busy share
// meanwhile and the CPU each watched process spent a write, µs (cores over writes a second; the
// ramp's CPU is counted over the measured writes: a close estimate).
func writesWithCPU(ctx context.Context, o ReplicaOptions, ep Endpoint, watch []Watch, args []string) (iops, busy float64, cpu []float64, err error) {
	c0, err := snapCPU(watch)
	if err != nil {
		return 0, 0, nil, err
	}
	res, err := fio(ctx, ep, o.Size, o.Runtime, o.Ramp, args)
	if err != nil {
		return 0, 0, nil, err
	}
	c1, err := snapCPU(watch)
	if err != nil {
		return 0, 0, nil, err
	}
	busy, cores := c1.since(c0)
	for _, c := range cores {
		cpu = append(cpu, c*1e6/res.value)
	}
	return res.value, busy, cpu, nil
}
