package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/units"
)

// The start-up benchmark's tier: 4 KiB lines, the smallest, so that a tier of millions of lines
// costs seconds to build and no disk space (the SSD file is sparse and no line's data is read).
const (
	StartupLineSize = 4096
	// startupChunk bounds how many line records are built in memory at once.
	startupChunk = 1 << 20
	// startupPoll is how often the socket is tried while tierblk starts.
	startupPoll = 2 * time.Millisecond
	// startupLimit bounds a start and a stop; far more than 10 million lines need.
	startupLimit = 5 * time.Minute
)

// StartupOptions control `tierblk bench startup`.
type StartupOptions struct {
	// Tierblk is the tierblk binary whose `serve` is measured.
	Tierblk string
	// Lines are the tiers measured, in cached lines of StartupLineSize.
	Lines  []int
	Rounds int
	// WorkDir holds the tiers, their metadata and the sockets, in a directory removed at the end.
	WorkDir string
	Log     io.Writer
}

// StartupResult is one tier's figures, one sample per round each.
type StartupResult struct {
	Lines int
	// SSDSize is the tier's --ssd-size: room for Lines lines beside the slots the cache keeps in
	// reserve.
	SSDSize int64
	// Serving is from starting `tierblk serve` until its NBD socket accepts a connection, Warm
	// until it logged "SSD tier warm"; BaseServing is Serving on an empty tier of the same size.
	Serving, Warm, BaseServing []time.Duration
	// RSS is the serving process's VmRSS on the tier holding Lines lines, BaseRSS on the empty
	// tier (bytes), read as soon as its socket accepts a connection.
	RSS, BaseRSS []int64
	// Command and BaseCommand are the measured command lines, as a shell takes them.
	Command, BaseCommand string
}

// LineBytes is the median over rounds of the RSS the cached lines add (RSS less BaseRSS of the
// same round), per line.
func (r StartupResult) LineBytes() float64 {
	d := make([]float64, len(r.RSS))
	for i := range r.RSS {
		d[i] = float64(r.RSS[i] - r.BaseRSS[i])
	}
	return median(d) / float64(r.Lines)
}

// startupTier is one tier on disk: the files both serve commands use, and what serve must report.
type startupTier struct {
	lines   int
	ssdSize int64
	// backend is the --backend URL, as the superblocks name it.
	backend string
	// full and empty are the serve commands' arguments on the tier with the lines and without.
	full, empty []string
	sock        string
}

// RunStartup builds, for each entry of Lines, an SSD tier holding that many lines (a sparse file
// and metadata written as the cache writes it) and an empty tier of the same size, then restarts
// `tierblk serve` on each, alternating between them (and which goes first) each round, and
// measures the time until it serves and its memory.
func RunStartup(ctx context.Context, o StartupOptions) ([]StartupResult, error) {
	if o.Rounds < 1 || len(o.Lines) == 0 {
		return nil, fmt.Errorf("rounds must be at least 1 and there must be a tier to measure, got %d rounds, %v", o.Rounds, o.Lines)
	}
	for _, n := range o.Lines {
		if n < 1 || n > 1<<30 {
			return nil, fmt.Errorf("a tier of %d lines: give from 1 to %d", n, 1<<30)
		}
	}
	dir, err := os.MkdirTemp(o.WorkDir, "startup")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var out []StartupResult
	for _, n := range o.Lines {
		tdir := filepath.Join(dir, strconv.Itoa(n))
		t, err := buildStartupTier(o.Tierblk, tdir, n, o.Log)
		if err != nil {
			return nil, err
		}
		r, err := measureStartup(ctx, t, o)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
		// Ten million lines of metadata take hundreds of MB: one tier on disk at a time.
		if err := os.RemoveAll(tdir); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// startupSSDSize is an SSD tier with room for n lines and for the reserve the cache keeps out of
// the eviction policy's capacity (up to 1/64 of the tier, at most 4,096 slots): a tier loaded with
// more lines than the capacity evicts the excess. Rounded up to a MiB.
func startupSSDSize(n int) int64 {
	b := int64(n+n/64+4096) * StartupLineSize
	return (b + 1<<20 - 1) &^ (1<<20 - 1)
}

// buildStartupTier writes a tier of n lines in dir: a sparse SSD file, a sparse backend file of
// 2n lines, and metadata whose superblock is the one `tierblk serve` expects for them and whose
// records put line 2i in slot i. The empty tier beside it has a superblock and no records, so
// that both starts go through the same load.
func buildStartupTier(tierblk, dir string, n int, log io.Writer) (startupTier, error) {
	t := startupTier{lines: n, ssdSize: startupSSDSize(n), sock: filepath.Join(dir, "nbd.sock")}
	disk := filepath.Join(dir, "disk.img")
	backendSize := 2 * int64(n) * StartupLineSize
	t.backend = fmt.Sprintf("file://%s?size=%d", disk, backendSize)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return t, err
	}
	for _, f := range []struct {
		path string
		size int64
	}{{disk, backendSize}, {filepath.Join(dir, "ssd.img"), t.ssdSize}, {filepath.Join(dir, "ssd-empty.img"), t.ssdSize}} {
		if err := sparseFile(f.path, f.size); err != nil {
			return t, err
		}
	}
	sb := meta.Superblock{Version: meta.FormatVersion, LineSize: StartupLineSize, Backend: t.backend,
		BackendSize: backendSize, Slots: uint32(t.ssdSize / StartupLineSize)}
	fmt.Fprintf(log, "building an SSD tier of %d lines (%s, %d slots)\n", n, units.FormatSize(t.ssdSize), sb.Slots)
	began := time.Now()
	if err := writeStartupMeta(filepath.Join(dir, "meta"), sb, n, func(done int) {
		fmt.Fprintf(log, "  %d of %d line records written, %.1fs\n", done, n, time.Since(began).Seconds())
	}); err != nil {
		return t, err
	}
	if err := writeStartupMeta(filepath.Join(dir, "meta-empty"), sb, 0, nil); err != nil {
		return t, err
	}
	args := func(ssd, metaDir string) []string {
		return []string{"serve", "--backend", t.backend, "--nbd", "unix:" + t.sock, "--ram", "0",
			"--ssd", filepath.Join(dir, ssd), "--ssd-size", strconv.FormatInt(t.ssdSize, 10),
			"--meta", filepath.Join(dir, metaDir), "--line", units.FormatSize(StartupLineSize)}
	}
	t.full, t.empty = append([]string{tierblk}, args("ssd.img", "meta")...), append([]string{tierblk}, args("ssd-empty.img", "meta-empty")...)
	return t, nil
}

func sparseFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(f.Truncate(size), f.Close())
}

// writeStartupMeta stores sb and n clean line records in a new metadata directory, calling
// progress (if not nil) after each chunk.
func writeStartupMeta(dir string, sb meta.Superblock, n int, progress func(done int)) error {
	store, err := meta.OpenBadger(dir, nil)
	if err != nil {
		return err
	}
	err = store.SetSuperblock(sb)
	// One valid block: a 4 KiB line is one block, with its checksum (any: the benchmark reads no
	// block, and a record without one would be from before checksums, whose clean lines a start
	// drops). The store encodes the record and keeps no reference to it, so every op can share
	// the bitmap.
	valid, sum := []uint64{1}, []uint32{1}
	ops := make([]meta.Op, 0, min(n, startupChunk))
	for done := 0; err == nil && done < n; {
		ops = ops[:0]
		for i := done; i < min(n, done+startupChunk); i++ {
			ops = append(ops, meta.Op{Rec: meta.Line{Line: 2 * uint64(i), Slot: uint32(i), Valid: valid, Sum: sum}})
		}
		if err = meta.CommitParts(store, ops, false, nil); err == nil {
			done += len(ops)
			if progress != nil {
				progress(done)
			}
		}
	}
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the SSD tier's metadata in %s: %w", dir, err)
	}
	return nil
}

func measureStartup(ctx context.Context, t startupTier, o StartupOptions) (StartupResult, error) {
	r := StartupResult{Lines: t.lines, SSDSize: t.ssdSize, Command: shellJoin(t.full), BaseCommand: shellJoin(t.empty)}
	for round := 0; round < o.Rounds; round++ {
		for _, i := range roundOrder(2, round) {
			args, lines, name := t.full, t.lines, "full"
			if i == 1 {
				args, lines, name = t.empty, 0, "empty"
			}
			s, err := serveStart(ctx, args, t.sock, lines)
			if err != nil {
				return r, fmt.Errorf("%d lines, %s tier: %w", t.lines, name, err)
			}
			fmt.Fprintf(o.Log, "%d lines round %d %-5s tier: serving after %.3fs (SSD tier warm after %.3fs), VmRSS %.1f MiB\n",
				t.lines, round+1, name, s.serving.Seconds(), s.warm.Seconds(), float64(s.rss)/(1<<20))
			if i == 0 {
				r.Serving, r.Warm, r.RSS = append(r.Serving, s.serving), append(r.Warm, s.warm), append(r.RSS, s.rss)
			} else {
				r.BaseServing, r.BaseRSS = append(r.BaseServing, s.serving), append(r.BaseRSS, s.rss)
			}
		}
	}
	return r, nil
}

// startSample is one start of `tierblk serve`.
type startSample struct {
	serving, warm time.Duration
	rss           int64
}

// warmLog matches the cache's log line once the SSD tier's index is loaded.
var warmLog = regexp.MustCompile(`msg="SSD tier warm" (?:.* )?lines=(\d+)`)

// serveLog matches the daemon's log line once every listener accepts connections; it comes after
// the warm line, on the same stream.
var serveLog = regexp.MustCompile(`msg=serving `)

// serveStart starts args (a `tierblk serve` on an SSD tier that must load lines lines), waits
// until it accepts a connection on sock, reads its RSS and stops it with SIGTERM.
func serveStart(ctx context.Context, args []string, sock string, lines int) (startSample, error) {
	os.Remove(sock)
	p, err := startServe(args)
	if err != nil {
		return startSample{}, err
	}
	s, err := p.measure(ctx, sock)
	if err != nil {
		p.cmd.Process.Kill()
		<-p.done
		return s, fmt.Errorf("%w; its log:\n%s", err, p.log.tail())
	}
	if err := p.stop(); err != nil {
		return s, fmt.Errorf("%w; its log:\n%s", err, p.log.tail())
	}
	got, warm := p.log.warmLines()
	if got != lines {
		return s, fmt.Errorf("it loaded %d lines (log %q), want %d; its log:\n%s", got, "SSD tier warm", lines, p.log.tail())
	}
	s.warm = warm
	return s, nil
}

// serveProc is a running `tierblk serve`.
type serveProc struct {
	cmd   *exec.Cmd
	began time.Time
	log   *startLog
	done  chan struct{} // closed once it has exited, with its status in err
	err   error
}

func startServe(args []string) (*serveProc, error) {
	p := &serveProc{cmd: exec.Command(args[0], args[1:]...), log: &startLog{served: make(chan struct{}), nWarm: -1},
		done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p.began = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.log.read(stderr, p.began)
		p.err = p.cmd.Wait() // after the last read of the pipe, as Wait requires
		close(p.done)
	}()
	return p, nil
}

// measure polls sock until it accepts a connection, then reads the process's RSS and waits for
// its log to say it serves (by which time the warm line, if any, was read).
func (p *serveProc) measure(ctx context.Context, sock string) (startSample, error) {
	var s startSample
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			s.serving = time.Since(p.began)
			c.Close()
			break
		}
		select {
		case <-p.done:
			return s, fmt.Errorf("it exited before serving (%v)", p.err)
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(startupPoll):
		}
		if time.Since(p.began) > startupLimit {
			return s, fmt.Errorf("it did not accept a connection on %s within %s", sock, startupLimit)
		}
	}
	var err error
	if s.rss, err = vmRSS(p.cmd.Process.Pid); err != nil {
		return s, err
	}
	select {
	case <-p.log.served:
		return s, nil
	case <-p.done:
		return s, fmt.Errorf("it exited while starting (%v)", p.err)
	case <-ctx.Done():
		return s, ctx.Err()
	case <-time.After(startupLimit):
		return s, errors.New("it accepted a connection but never logged that it serves")
	}
}

// stop stops the process with SIGTERM, as a service manager does, and requires a clean exit.
func (p *serveProc) stop() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("it did not stop cleanly: %w", p.err)
		}
		return nil
	case <-time.After(startupLimit):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("it did not stop within %s of SIGTERM", startupLimit)
	}
}

// startLog keeps what a serve logs: the warm line's figure and when it came, and the last lines
// for error messages.
type startLog struct {
	served chan struct{} // closed at the serving line

	mu    sync.Mutex
	lines []string
	warm  time.Duration
	nWarm int // -1: no warm line
}

func (l *startLog) read(r io.Reader, began time.Time) {
	served := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		at := time.Since(began)
		l.mu.Lock()
		if l.lines = append(l.lines, line); len(l.lines) > 40 {
			l.lines = l.lines[1:]
		}
		if m := warmLog.FindStringSubmatch(line); m != nil && l.nWarm < 0 {
			l.nWarm, _ = strconv.Atoi(m[1])
			l.warm = at
		}
		l.mu.Unlock()
		if !served && serveLog.MatchString(line) {
			served = true
			close(l.served)
		}
	}
	// Drain the pipe to its end: the child must never block on a full pipe.
	io.Copy(io.Discard, r)
}

func (l *startLog) warmLines() (int, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nWarm, l.warm
}

func (l *startLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// vmRSS returns the resident set of process pid, in bytes, from /proc/PID/status.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmRSS(b)
}

func parseVmRSS(status []byte) (int64, error) {
	for line := range strings.SplitSeq(string(status), "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			break
		}
		return kb << 10, nil
	}
	return 0, errors.New("no VmRSS line in kB in /proc/PID/status")
}

// shellJoin writes args as a shell command line: arguments with characters a shell treats
// specially are single-quoted.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@%") == "" {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// StartupTable renders RunStartup's results as a Markdown table of medians.
func StartupTable(rs []StartupResult) string {
	var b strings.Builder
	b.WriteString("| cached lines | SSD tier | to serving, empty tier | to serving | SSD tier warm logged | VmRSS, empty tier | VmRSS | RSS per cached line | RSS of the lines |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	sec := func(d []time.Duration) float64 {
		f := make([]float64, len(d))
		for i, v := range d {
			f[i] = v.Seconds()
		}
		return median(f)
	}
	mib := func(v []int64) float64 {
		f := make([]float64, len(v))
		for i, x := range v {
			f[i] = float64(x) / (1 << 20)
		}
		return median(f)
	}
	for _, r := range rs {
		per := r.LineBytes()
		fmt.Fprintf(&b, "| %d | %s | %.3f s | %.3f s | %.3f s | %.1f MiB | %.1f MiB | %.1f B | %.1f MiB |\n",
			r.Lines, units.FormatSize(r.SSDSize), sec(r.BaseServing), sec(r.Serving), sec(r.Warm),
			mib(r.BaseRSS), mib(r.RSS), per, per*float64(r.Lines)/(1<<20))
	}
	return b.String()
}
