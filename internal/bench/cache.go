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
	"syscall"
	"time"
)

// The cache benchmark's setup: a slow disk that serves one request at a time, each taking
// slowDelay (a 7,200 rpm disk or a small NAS), and two caches over it of that disk's kind.
const (
	slowDelay = "5ms"
	// CacheRAM and CacheSSD are tierblk's tiers: the RAM tier holds the default working set, as
	// the page cache holds nbdkit's cache file; the SSD tier is what is warm after a restart.
	CacheRAM = "256MiB"
	CacheSSD = "512MiB"
)

// The targets' names, as the table shows them.
const (
	nameTierblk = "tierblk"
	nameNbdkit  = "nbdkit cache"
	nameSlow    = "slow disk"
)

// CacheOptions control `tierblk bench cache`.
type CacheOptions struct {
	// Tierblk is the tierblk binary that serves the cache.
	Tierblk string
	Rounds  int
	// Runtime is fio's time per measurement on the caches; SlowRuntime on the slow disk alone,
	// which is so slow that a short run counts enough requests.
	Runtime, SlowRuntime time.Duration
	// Size is the working set (fio size syntax).
	Size string
	// WorkDir holds the sockets, tierblk's SSD tier and nbdkit's cache file; its file system must
	// support O_DIRECT, or the SSD tier would be the page cache.
	WorkDir string
	Log     io.Writer
}

// CacheRows are the rows measured with warm caches, in the order of the table; the row after a
// restart (RestartRow) goes second.
func CacheRows() []Row {
	return []Row{
		{Name: "4K random read, QD32, warm", FioArgs: []string{"--rw=randread", "--bs=4k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "8K random 80/20 read/write, QD32", FioArgs: []string{"--rw=randrw", "--rwmixread=80", "--bs=8k", "--iodepth=32"}, Unit: "IOPS"},
		{Name: "1M sequential read, QD8", FioArgs: []string{"--rw=read", "--bs=1M", "--iodepth=8"}, Unit: "MiB/s"},
	}
}

// RestartRow is the warm 4K random read again, right after tierblk and nbdkit restart.
func RestartRow() Row {
	r := CacheRows()[0]
	r.Name = "4K random read, QD32, after a restart"
	return r
}

// cacheTargets are the three servers, in the table's order. tierblk's backend is its own slow disk
// at slowSock, so that the writes measured on the slow disk alone never change data behind
// tierblk's cache. Both caches write through, so that the 80/20 row compares the same promise
// (nbdkit's default, writeback, acknowledges writes the slow disk has not seen).
func cacheTargets(tierblk, workDir, slowSock string) []Target {
	return cacheTargetsFor(tierblk, workDir, slowSock, cacheSetup{mode: "writethrough", ssdSize: CacheSSD})
}

// cacheSetup is what differs between the cache benchmarks' servers.
type cacheSetup struct {
	// mode is tierblk's --mode and nbdkit's cache= (they name their modes alike).
	mode    string
	ssdSize string
	// admin is tierblk's admin endpoint, if it needs one.
	admin string
}

// cacheTargetsFor are cacheTargets set up as s says.
func cacheTargetsFor(tierblk, workDir, slowSock string, s cacheSetup) []Target {
	return []Target{
		{Name: nameTierblk, Command: func(sock string) *exec.Cmd {
			args := []string{"serve", "--backend", "nbd+unix:///?socket=" + slowSock, "--nbd", "unix:" + sock,
				"--ram", CacheRAM, "--ssd", filepath.Join(workDir, "ssd.img"), "--ssd-size", s.ssdSize,
				"--mode", s.mode, "--log-level", "warn"}
			if s.admin != "" {
				args = append(args, "--admin", "unix:"+s.admin)
			}
			return exec.Command(tierblk, args...)
		}},
		{Name: nameNbdkit, Command: func(sock string) *exec.Cmd {
			cmd := exec.Command("nbdkit", append([]string{"-f", "-U", sock, "--filter=cache"},
				append(slowDiskArgs(), "cache-on-read=true", "cache="+s.mode)...)...)
			// Its cache file goes where tierblk's SSD tier is, not to /var/tmp.
			cmd.Env = append(os.Environ(), "TMPDIR="+workDir)
			return cmd
		}},
		{Name: nameSlow, Command: slowDisk},
	}
}

// slowDiskArgs are nbdkit's filters, plugin and parameters for the slow disk.
func slowDiskArgs() []string {
	return []string{"--filter=noparallel", "--filter=delay", "memory", "1G", "delay-read=" + slowDelay, "delay-write=" + slowDelay}
}

func slowDisk(sock string) *exec.Cmd {
	return exec.Command("nbdkit", append([]string{"-f", "-U", sock}, slowDiskArgs()...)...)
}

// server is a Target running on its socket.
type server struct {
	Target
	sock string
	stop func()
}

func (s *server) start(ctx context.Context) error {
	stop, err := start(ctx, s.Target, s.sock)
	s.stop = stop
	return err
}

// endpoint is where clients reach s.
func (s *server) endpoint() Endpoint { return s.Target.endpoint(s.sock) }

func (s *server) close() {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

// RunCache measures tierblk's cache against nbdkit's cache filter and the slow disk alone, in the
// same run, alternating as Run does: first the CacheRows with both caches warmed by one read of the
// working set, then RestartRow with tierblk and nbdkit restarted before every round (tierblk's RAM
// tier is then empty and its SSD tier warm; nbdkit's cache is empty). The results follow the
// table's order.
func RunCache(ctx context.Context, o CacheOptions) ([]Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	// A fresh directory per run: an SSD tier left by an earlier run describes another slow disk.
	dir, err := os.MkdirTemp(o.WorkDir, "run")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sock := func(i int) string { return filepath.Join(dir, fmt.Sprintf("s%d.sock", i)) }
	var servers []*server
	defer func() {
		// tierblk before its backend.
		for _, s := range slices.Backward(servers) {
			s.close()
		}
	}()
	// tierblk's backend first (it must be there when tierblk starts), then the three targets.
	for i, t := range append([]Target{{Name: "tierblk's slow disk", Command: slowDisk}}, cacheTargets(o.Tierblk, dir, sock(0))...) {
		s := &server{Target: t, sock: sock(i)}
		if err := s.start(ctx); err != nil {
			return nil, err
		}
		servers = append(servers, s)
		if t.Name == nameTierblk {
			continue // its backend is filled already
		}
		// Fill the working set, so that every read returns written data, never a sparse fast path.
		if err := o.pass(ctx, s, "prefilling", "--rw=write"); err != nil {
			return nil, err
		}
	}
	tb, nk, slow := servers[1], servers[2], servers[3]
	for _, s := range []*server{tb, nk} {
		if err := o.pass(ctx, s, "warming up", "--rw=read"); err != nil {
			return nil, err
		}
	}
	probes := func(ramp time.Duration) []probe {
		return []probe{
			{name: tb.Name, ep: tb.endpoint(), runtime: o.Runtime, ramp: ramp},
			{name: nk.Name, ep: nk.endpoint(), runtime: o.Runtime, ramp: ramp},
			{name: slow.Name, ep: slow.endpoint(), runtime: o.SlowRuntime, ramp: ramp},
		}
	}
	var results []Result
	for _, row := range CacheRows() {
		r, err := measure(ctx, row, probes(time.Second), o.Rounds, o.Size, o.Log, nil)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	restart := func() error {
		for _, s := range []*server{tb, nk} {
			began := time.Now()
			s.close()
			if err := s.start(ctx); err != nil {
				return fmt.Errorf("restart: %w", err)
			}
			fmt.Fprintf(o.Log, "restarted %s in %.1fs\n", s.Name, time.Since(began).Seconds())
		}
		return nil
	}
	// No ramp: the first second after a restart is the one that matters.
	r, err := measure(ctx, RestartRow(), probes(0), o.Rounds, o.Size, o.Log, restart)
	if err != nil {
		return nil, err
	}
	return append(results[:1], append([]Result{r}, results[1:]...)...), nil
}

// pass runs fio once over the working set in 1 MiB requests with the given --rw.
func (o CacheOptions) pass(ctx context.Context, s *server, what, rw string) error {
	fmt.Fprintf(o.Log, "%s %s (%s)\n", what, s.Name, o.Size)
	began := time.Now()
	if _, err := fio(ctx, s.endpoint(), o.Size, 0, 0, []string{rw, "--bs=1M", "--iodepth=8"}); err != nil {
		return fmt.Errorf("%s %s: %w", what, s.Name, err)
	}
	fmt.Fprintf(o.Log, "%s %s took %.1fs\n", what, s.Name, time.Since(began).Seconds())
	return nil
}

func (o CacheOptions) check() error {
	if o.Rounds < 1 || o.Runtime < time.Second || o.SlowRuntime < time.Second {
		return fmt.Errorf("rounds must be at least 1 and run times at least 1s (fio counts whole seconds), got %d, %s, %s",
			o.Rounds, o.Runtime, o.SlowRuntime)
	}
	return checkFioRun(o.WorkDir)
}

// checkFioRun fails unless fio and nbdkit are installed and dir takes O_DIRECT (checkDirectIO):
// what the benchmarks that run fio against nbdkit and tierblk need.
func checkFioRun(dir string) error {
	for _, tool := range []string{"fio", "nbdkit"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed; run `make deps` (Debian package %s)", tool, tool)
		}
	}
	return checkDirectIO(dir)
}

// RAM file systems' statfs types (linux/magic.h).
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// checkDirectIO fails unless dir is on a disk whose file system supports O_DIRECT. tierblk falls
// back to buffered I/O without it, and tmpfs accepts O_DIRECT since Linux 6.6: either way the SSD
// tier would be a second RAM tier and the comparison meaningless.
func checkDirectIO(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	if st.Type == tmpfsMagic || st.Type == ramfsMagic {
		return fmt.Errorf("%s is in RAM (tmpfs or ramfs); the SSD tier needs a disk: choose a work directory on one", dir)
	}
	f, err := os.CreateTemp(dir, ".direct-io-probe")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	fd, err := syscall.Open(name, syscall.O_RDWR|syscall.O_DIRECT, 0)
	if errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("%s is on a file system without O_DIRECT; the SSD tier needs one: choose another work directory", dir)
	}
	if err != nil {
		return fmt.Errorf("open %s with O_DIRECT: %w", name, err)
	}
	return syscall.Close(fd)
}

// CacheTable renders RunCache's results with the ratios tierblk/nbdkit cache and tierblk/slow disk.
func CacheTable(results []Result) string {
	return Table(results, cacheTargets("", "", ""))
}
