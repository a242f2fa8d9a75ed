//go:build linux

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/daemon"
	"github.com/tierblk/tierblk/internal/systemd"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// serveOpts are the flags of `tierblk serve`. A flag that was given overrides the config file.
type serveOpts struct {
	configFile string
	given      map[string][]string // the values of each config.Flags flag given, in order
	stderr     io.Writer
	ready      func(addrs []string)
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
  nbds://HOST[:PORT]/EXPORT?tls-certificates=DIR     the same over TLS (also nbds+unix://; docs/operations.md#tls)
  iscsi://HOST[:PORT]/TARGET-IQN/LUN                 a LUN of an iSCSI target, through tierblk's own initiator
                                                     (CHAP from TIERBLK_ISCSI_USER, TIERBLK_ISCSI_PASSWORD);
                                                     'tierblk iscsi-ls iscsi://HOST' lists a portal's LUNs

A tiered cache goes in front of the backend with --ram and/or --ssd: reads look in RAM, then on
the SSD, then go to the backend; --mode says what writes do. The SSD tier's index is kept in --meta,
so the cache is warm after a restart. --mode writeback completes writes once they are on the SSD
and writes them back later (--dirty-high, --dirty-low, --dirty-max); 'tierblk flush' writes them
all back and 'tierblk mode' switches a running cache's mode. --admin serves /metrics and /stats ('tierblk stats').

--ublk also serves the (first) export as a ublk block device, /dev/ublkbN (Linux 6.0+, module
ublk_drv); --nbd-device /dev/nbdN attaches the kernel's NBD client to it (module nbd). Without
--nbd, a command line with either of them opens no NBD listener. A stop leaves a device, its I/O
held, for the next tierblk to take back, so a restart does not disturb a mounted file system:
the NBD device stays attached unless --nbd-device-on-stop release; the ublk device stays when it
has a fixed number (--ublk-id N) unless --ublk-on-stop remove, and one the kernel numbered (no
--ublk-id) is removed (docs/operations.md#restarts-and-upgrades-of-a-block-device).

--allow CIDR lets TCP clients connect only from the networks given (others are closed at once,
logged and counted in /metrics); --socket-mode and --socket-group set the NBD unix sockets' mode
and group, which govern local clients.

SIGINT or SIGTERM stops accepting connections, finishes the requests in flight, flushes every
backend and exits 0.

Under systemd (configs/tierblk@.service, Type=notify) serve reports READY=1 once every listener
accepts and every device is attached, STATUS= lines, STOPPING=1, and WATCHDOG=1 when WatchdogSec=
is set. Socket-activated (LISTEN_FDS, e.g. configs/tierblk@.socket or systemd-socket-activate),
it serves NBD on the passed unix and TCP sockets and opens none of the listen addresses of the
config or --nbd, as nbdkit does; --allow still governs TCP clients.`,
		Example: `  tierblk serve --backend 'file:///srv/disk.img?size=8GiB' --nbd unix:/run/tierblk.sock --nbd 127.0.0.1:10809
  tierblk serve --backend nbd://nas:10809/lun0 --ram 2GiB --ssd /dev/nvme0n1p3 --meta /var/lib/tierblk/lun0.meta --admin 127.0.0.1:9810
  tierblk serve --backend file:///srv/nas.img --ssd /var/cache/tierblk/ssd.img --ssd-size 32GiB --mode writeback --ublk
  tierblk serve --config configs/tierblk.example.yaml`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stderr = cmd.ErrOrStderr()
			return runServe(cmd.Context(), o)
		},
	}
	o.given = map[string][]string{}
	addServeFlags(cmd.Flags(), &o)
	return cmd
}

// addServeFlags makes serve's flags: --config, and one for each of config.Flags, which records what
// it is given in o.given.
func addServeFlags(f *pflag.FlagSet, o *serveOpts) {
	f.StringVar(&o.configFile, "config", "", "YAML config file (see configs/tierblk.example.yaml); flags override it")
	for i := range config.Flags {
		c := &config.Flags[i]
		f.Var(settingValue{c, o.given}, c.Name, c.Usage)
		if c.Kind == config.Bool {
			f.Lookup(c.Name).NoOptDefVal = "true"
		}
	}
}

// settingValue is the pflag.Value of one of config.Flags: it checks the text against the flag's
// kind and keeps it for config.Override.
type settingValue struct {
	flag  *config.Flag
	given map[string][]string
}

func (v settingValue) String() string { return v.flag.Def }
func (v settingValue) Type() string   { return v.flag.Kind.Type() }

func (v settingValue) Set(s string) error {
	if err := v.flag.Kind.Check(s); err != nil {
		return err
	}
	v.given[v.flag.Name] = append(v.given[v.flag.Name], s)
	return nil
}

// buildConfig merges the config file and the flags that were given, puts the sockets passed by
// socket activation in place of the listen addresses (returning those it replaced), then validates.
func buildConfig(o serveOpts, schemes []string, activated []systemd.Listener) (config.Config, []string, error) {
	cfg := config.Defaults()
	if o.configFile != "" {
		var err error
		if cfg, err = config.Load(o.configFile); err != nil {
			return cfg, nil, &UsageError{Err: err}
		}
	}
	if err := config.Override(&cfg, o.given, o.configFile != ""); err != nil {
		return cfg, nil, &UsageError{Err: err}
	}
	replaced := daemon.UseActivated(&cfg, activated)
	if err := cfg.Validate(schemes); err != nil {
		var ce *config.Error
		if errors.As(err, &ce) && o.configFile == "" {
			// Without a config file the user typed flags: name those.
			err = errors.New(config.FlagNames(err.Error()))
		}
		return cfg, nil, &UsageError{Err: err}
	}
	return cfg, replaced, nil
}

func runServe(ctx context.Context, o serveOpts) error {
	reg := registry.Default()
	// The service manager's environment is malformed input like a bad flag: said, exit status 2.
	activated, err := systemd.Listeners()
	if err != nil {
		return &UsageError{Err: fmt.Errorf("socket activation: %w", err)}
	}
	watchdog, err := systemd.WatchdogInterval()
	if err != nil {
		return &UsageError{Err: fmt.Errorf("watchdog: %w", err)}
	}
	cfg, replaced, err := buildConfig(o, reg.Schemes(), activated)
	if err != nil {
		return err
	}
	log, err := newLogger(o.stderr, cfg.LogLevel)
	if err != nil {
		return err
	}
	if len(activated) > 0 {
		names := make([]string, len(activated))
		for i, l := range activated {
			names[i] = l.Name
		}
		log.Info("socket-activated: serving NBD on the passed sockets, not on the listen addresses of the config or --nbd", "sockets", cfg.Listen, "names", names, "ignored_listen", replaced)
	}
	raiseProcs()
	runtime.SetMutexProfileFraction(mutexFraction)
	err = daemon.Run(ctx, cfg, reg, log, daemon.Options{
		Ready: o.ready, Activated: activated, Notify: systemd.Notify, Watchdog: watchdog,
	})
	if err == nil {
		return nil
	}
	// The daemon marks what is wrong with the settings themselves: the backend's URL, and the
	// values it checks only as it starts (a --socket-group that names no group, an SSD file that
	// does not exist with no size to create it at) as *config.Error.
	var setting *config.Error
	bad := errors.Is(err, backend.ErrBadURL) || errors.As(err, &setting)
	if o.configFile == "" {
		// Without a config file the user typed flags: name those.
		err = errors.New(config.FlagNames(err.Error()))
	}
	if bad {
		return &UsageError{Err: err}
	}
	return err
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
