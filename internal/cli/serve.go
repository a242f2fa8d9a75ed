//go:build linux

package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"regexp"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/daemon"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// serveOpts are the flags of `tierblk serve`. A flag that was set overrides the config file.
type serveOpts struct {
	configFile  string
	backend     string
	export      string
	nbd         []string
	readOnly    bool
	logLevel    string
	maxInFlight int
	recordTrace string
	cache       config.Cache // the cache flags, applied to the first export
	admin       string
	ublk        bool
	ublkConf    config.UBLK
	ublkID      int
	nbdDevice   string
	set         func(name string) bool // reports whether a flag was given
	stderr      io.Writer
	ready       func(addrs []string)
}

func newServeCmd() *cobra.Command {
	o := serveOpts{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve backends over NBD",
		Long: `Serve one backend (--backend) or the exports of a config file (--config) over NBD.

Backends are URLs:
  file:///path/disk.img[?size=SIZE][&direct=true]   a file or block device (size= creates a sparse file)
  mem://SIZE                                         RAM, lost on exit
  nbd://HOST[:PORT]/EXPORT                           another NBD server over TCP
  nbd+unix:///EXPORT?socket=PATH                     another NBD server over a unix socket

A tiered cache goes in front of the backend with --ram and/or --ssd: reads look in RAM, then on
the SSD, then go to the backend; --mode says what writes do. The SSD tier's index is kept in --meta,
so the cache is warm after a restart. --mode writeback completes writes once they are on the SSD
and writes them back later (--dirty-high, --dirty-low, --dirty-max); 'tierblk flush' writes them
all back and 'tierblk mode' switches a running cache's mode. --admin serves /metrics and /stats ('tierblk stats').

--ublk also serves the (first) export as a ublk block device, /dev/ublkbN (Linux 6.0+, module
ublk_drv); --nbd-device /dev/nbdN attaches the kernel's NBD client to it (module nbd). Without
--nbd, a command line with either of them opens no NBD listener. A stop removes the devices.

SIGINT or SIGTERM stops accepting connections, finishes the requests in flight, flushes every
backend and exits 0.`,
		Example: `  tierblk serve --backend 'file:///srv/disk.img?size=8GiB' --nbd unix:/run/tierblk.sock --nbd 127.0.0.1:10809
  tierblk serve --backend nbd://nas:10809/lun0 --ram 2GiB --ssd /dev/nvme0n1p3 --meta /var/lib/tierblk/lun0.meta --admin 127.0.0.1:9810
  tierblk serve --backend file:///srv/nas.img --ssd /var/cache/tierblk/ssd.img --ssd-size 32GiB --mode writeback --ublk
  tierblk serve --config configs/tierblk.example.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.set = func(name string) bool { return cmd.Flags().Changed(name) }
			o.stderr = cmd.ErrOrStderr()
			return runServe(cmd.Context(), o)
		},
	}
	d := config.Defaults()
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "YAML config file (see configs/tierblk.example.yaml); flags override it")
	f.StringVar(&o.backend, "backend", "", "backend URL to serve as a single export (replaces the config's exports)")
	f.StringVar(&o.export, "export", "", "name of the export given by --backend (clients that ask for no name get it too)")
	f.StringArrayVar(&o.nbd, "nbd", d.Listen, "NBD listen address, unix:/path/to.sock or HOST:PORT; repeat for several")
	f.BoolVar(&o.readOnly, "read-only", false, "serve every export read-only")
	f.StringVar(&o.logLevel, "log-level", d.LogLevel, "debug, info, warn or error")
	f.StringVar(&o.recordTrace, "record-trace", "", "record every request to the (first) export into this new file, a fio iolog that 'tierblk sim' replays")
	f.IntVar(&o.maxInFlight, "max-in-flight", d.MaxInFlight, "requests served at once on one NBD connection")
	f.StringVar(&o.cache.RAM, "ram", "", "RAM tier size, e.g. 1GiB (0: none)")
	f.StringVar(&o.cache.SSD, "ssd", "", "SSD tier: a file (created sparse at --ssd-size if missing) or a block device")
	f.StringVar(&o.cache.SSDSize, "ssd-size", "", "how much of --ssd the cache uses (default: all of it)")
	f.StringVar(&o.cache.Meta, "meta", "", "directory of the SSD tier's metadata (default: the --ssd path + .meta)")
	f.StringVar(&o.cache.Line, "line", "", "cache line size, a power of two from 4KiB to 1MiB (default 64KiB)")
	f.StringVar(&o.cache.Mode, "mode", "", "cache mode: writethrough (default), writearound, passthrough or writeback (needs --ssd)")
	f.StringVar(&o.cache.Policy, "policy", "", "eviction policy of the cache tiers (default "+cache.DefaultPolicy+"; see 'tierblk sim --help')")
	f.StringVar(&o.cache.Admission, "admission", "", "admission policy of both cache tiers (default auto; e.g. always, nhit:2, seqcutoff)")
	f.StringVar(&o.cache.Congestion, "congestion", "", "the SSD tier admits no missed line while its device's requests take longer than this and than the backend's reads (default "+cache.DefaultCongestion.String()+"; off: never)")
	wb := cache.DefaultWriteBack
	o.cache.WriteBack.High, o.cache.WriteBack.Low, o.cache.WriteBack.Max = new(float64), new(float64), new(float64)
	f.Float64Var(o.cache.WriteBack.High, "dirty-high", wb.High, "write-back: destage starts when this ratio of the SSD tier's lines is dirty")
	f.Float64Var(o.cache.WriteBack.Low, "dirty-low", wb.Low, "write-back: destage stops below this ratio of dirty lines")
	f.Float64Var(o.cache.WriteBack.Max, "dirty-max", wb.Max, "write-back: writes wait rather than let dirty lines pass this ratio")
	f.BoolVar(&o.ublk, "ublk", false, "also serve the export as a ublk block device /dev/ublkbN")
	f.IntVar(&o.ublkID, "ublk-id", -1, "ublk device number N (-1: the kernel chooses); a restart with the same N takes back a device left by a killed daemon")
	f.IntVar(&o.ublkConf.Queues, "ublk-queues", 0, "ublk hardware queues, each with its own io_uring (0: one per CPU)")
	f.IntVar(&o.ublkConf.Depth, "ublk-depth", 0, "requests in flight per ublk queue (0: 128)")
	f.StringVar(&o.nbdDevice, "nbd-device", "", "attach the kernel's NBD client to the export as this device, e.g. /dev/nbd0 (no nbd-client needed)")
	f.StringVar(&o.admin, "admin", "", "admin endpoint (/metrics, /stats): 127.0.0.1:PORT or unix:/path; loopback only")
	return cmd
}

// buildConfig merges the config file and the flags that were set, then validates.
func buildConfig(o serveOpts, schemes []string) (config.Config, error) {
	cfg := config.Defaults()
	if o.configFile != "" {
		var err error
		if cfg, err = config.Load(o.configFile); err != nil {
			return cfg, &UsageError{Err: err}
		}
	}
	if o.set("backend") {
		cfg.Exports = []config.Export{{Name: o.export, Backend: o.backend}}
	} else if o.set("export") {
		return cfg, usageErrorf("--export names the export of --backend; give --backend too")
	}
	if o.set("nbd") {
		cfg.Listen = o.nbd
	} else if o.configFile == "" && (o.ublk || o.set("nbd-device")) {
		// The device is what was asked for; a TCP listener nobody wanted would only be exposure.
		cfg.Listen = nil
	}
	if err := applyDeviceFlags(&cfg, o); err != nil {
		return cfg, err
	}
	if o.readOnly {
		for i := range cfg.Exports {
			cfg.Exports[i].ReadOnly = true
		}
	}
	if o.set("record-trace") && len(cfg.Exports) > 0 {
		cfg.Exports[0].RecordTrace = o.recordTrace
	}
	if o.set("log-level") {
		cfg.LogLevel = o.logLevel
	}
	if o.set("max-in-flight") {
		cfg.MaxInFlight = o.maxInFlight
	}
	if o.set("admin") {
		cfg.Admin = o.admin
	}
	applyCacheFlags(&cfg, o)
	if err := cfg.Validate(schemes); err != nil {
		var ce *config.Error
		if errors.As(err, &ce) && o.configFile == "" {
			// Without a config file the user typed flags: name those.
			err = errors.New(flagNames(err.Error()))
		}
		return cfg, &UsageError{Err: err}
	}
	return cfg, nil
}

// cacheFlags maps the cache flags to the fields they set: copy copies the field from the flags'
// values (src) to the export's cache (dst).
var cacheFlags = []struct {
	flag string
	copy func(dst, src *config.Cache)
}{
	{"ram", func(d, s *config.Cache) { d.RAM = s.RAM }},
	{"ssd", func(d, s *config.Cache) { d.SSD = s.SSD }},
	{"ssd-size", func(d, s *config.Cache) { d.SSDSize = s.SSDSize }},
	{"meta", func(d, s *config.Cache) { d.Meta = s.Meta }},
	{"line", func(d, s *config.Cache) { d.Line = s.Line }},
	{"mode", func(d, s *config.Cache) { d.Mode = s.Mode }},
	{"policy", func(d, s *config.Cache) { d.Policy = s.Policy }},
	{"admission", func(d, s *config.Cache) { d.Admission = s.Admission }},
	{"congestion", func(d, s *config.Cache) { d.Congestion = s.Congestion }},
	{"dirty-high", func(d, s *config.Cache) { d.WriteBack.High = s.WriteBack.High }},
	{"dirty-low", func(d, s *config.Cache) { d.WriteBack.Low = s.WriteBack.Low }},
	{"dirty-max", func(d, s *config.Cache) { d.WriteBack.Max = s.WriteBack.Max }},
}

// applyDeviceFlags lets --ublk* and --nbd-device override the first export's devices.
func applyDeviceFlags(cfg *config.Config, o serveOpts) error {
	ublkTuned := o.set("ublk-id") || o.set("ublk-queues") || o.set("ublk-depth")
	if ublkTuned && !o.ublk {
		return usageErrorf("--ublk-id, --ublk-queues and --ublk-depth tune the device of --ublk; give --ublk too")
	}
	if len(cfg.Exports) == 0 {
		return nil
	}
	e := &cfg.Exports[0]
	if o.ublk {
		u := o.ublkConf
		if o.set("ublk-id") {
			id := o.ublkID
			u.ID = &id
		}
		e.UBLK = &u
	}
	if o.set("nbd-device") {
		e.NBDDevice = o.nbdDevice
	}
	return nil
}

// applyCacheFlags lets the cache flags that were given override the first export's cache.
func applyCacheFlags(cfg *config.Config, o serveOpts) {
	if len(cfg.Exports) == 0 {
		return
	}
	for _, f := range cacheFlags {
		if !o.set(f.flag) {
			continue
		}
		e := &cfg.Exports[0]
		if e.Cache == nil {
			e.Cache = &config.Cache{}
		}
		f.copy(e.Cache, &o.cache)
	}
}

func runServe(ctx context.Context, o serveOpts) error {
	reg := registry.Default()
	cfg, err := buildConfig(o, reg.Schemes())
	if err != nil {
		return err
	}
	log, err := newLogger(o.stderr, cfg.LogLevel)
	if err != nil {
		return err
	}
	raiseProcs()
	runtime.SetMutexProfileFraction(mutexFraction)
	err = daemon.Run(ctx, cfg, reg, log, o.ready)
	if err == nil {
		return nil
	}
	bad := errors.Is(err, backend.ErrBadURL)
	if o.configFile == "" {
		// Without a config file the user typed flags: name those.
		err = errors.New(flagNames(err.Error()))
	}
	if bad {
		return &UsageError{Err: err}
	}
	return err
}

// fieldToFlag renames config fields to the flags that set them, for errors about a command line.
var fieldToFlag = []struct {
	re   *regexp.Regexp
	flag string
}{
	{regexp.MustCompile(`exports\[0\]\.backend`), "--backend"},
	{regexp.MustCompile(`exports\[0\] \("[^"]*"\)`), "--backend"},
	{regexp.MustCompile(`exports\[0\]\.name`), "--export"},
	{regexp.MustCompile(`exports\[0\]\.record_trace`), "--record-trace"},
	{regexp.MustCompile(`listen\[\d+\]`), "--nbd"},
	{regexp.MustCompile(`\blog_level\b`), "--log-level"},
	{regexp.MustCompile(`\bmax_in_flight\b`), "--max-in-flight"},
	{regexp.MustCompile(`exports\[0\]\.cache: `), ""},
	{regexp.MustCompile(`exports\[0\]\.cache\.ssd_size`), "--ssd-size"},
	{regexp.MustCompile(`exports\[0\]\.cache\.write_back\.(high|low|max)\b`), "--dirty-$1"},
	{regexp.MustCompile(`exports\[0\]\.cache\.(ssd|ram|meta|line|mode|policy|admission|congestion)\b`), "--$1"},
	{regexp.MustCompile(`exports\[0\]\.cache\.(ram|ssd)_(policy|admission)\b`), "--$2"},
	{regexp.MustCompile(`(?m)^admin\b`), "--admin"},
	{regexp.MustCompile(`exports\[0\]\.ublk\.(id|queues|depth)\b`), "--ublk-$1"},
	{regexp.MustCompile(`exports\[0\]\.nbd_device\b`), "--nbd-device"},
	{regexp.MustCompile(`(?m)^listen: no listen address`), "no listen address"},
}

func flagNames(msg string) string {
	for _, m := range fieldToFlag {
		msg = m.re.ReplaceAllString(msg, m.flag)
	}
	return msg
}

// minProcs is the fewest Ps (GOMAXPROCS) serve runs the daemon with, unless GOMAXPROCS is set.
// File and block-device I/O are blocking system calls, and a goroutine in one keeps its P until
// the runtime's monitor takes it back, which can take up to 10 ms: with one P per core, two disk
// reads in flight on a two-core machine stall every other request. Spare Ps cost nothing while
// idle. It is the process's setting, so serve makes it, not package daemon.
const minProcs = 32

func raiseProcs() {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < minProcs {
		runtime.GOMAXPROCS(minProcs)
	}
}

// mutexFraction samples one in this many contended lock hand-offs for the admin endpoint's
// /debug/pprof/mutex: cheap enough to leave on, enough to show which lock the hit path waits on.
const mutexFraction = 100
