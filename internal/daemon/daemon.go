// Package daemon wires a validated configuration into a running tierblk: backends, volumes, the NBD
// server and its listeners, and owns the ordered shutdown (stop accepting, finish in-flight
// requests, flush every volume, close backends, remove sockets).
//
// It must never return from Run with a volume unflushed after a clean stop, and never remove a
// unix socket that another live process is listening on.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/listen"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/replica"
	"github.com/tierblk/tierblk/internal/sim"
	"github.com/tierblk/tierblk/internal/trace"
	"github.com/tierblk/tierblk/internal/units"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
)

// ShutdownTimeout bounds how long a stop waits for in-flight requests before closing connections.
const ShutdownTimeout = 30 * time.Second

// Run serves cfg until ctx is cancelled, then stops cleanly. cfg must have passed Validate (after
// UseActivated, when opts.Activated holds sockets).
func Run(ctx context.Context, cfg config.Config, reg *backend.Registry, log *slog.Logger, opts Options) (err error) {
	// Before any backend is opened: a group that does not exist is a mistake of the
	// configuration, and reading /etc/group changes nothing.
	prepare, err := socketAccess(cfg)
	if err != nil {
		return err
	}
	if err := checkActivated(cfg, opts.Activated); err != nil {
		return err
	}
	if err := ssdFilesSized(cfg); err != nil {
		return err
	}
	n := &notifier{send: opts.Notify, log: log}
	// The sources the watchdog checks: none until the exports are open, so that a long open
	// (an SSD tier's index) is bounded by the unit's start timeout, not the watchdog.
	var watched atomic.Pointer[[]metrics.Source]
	if opts.Watchdog > 0 {
		wctx, stopWatchdog := context.WithCancel(context.Background())
		wait := runWatchdog(wctx, opts.Watchdog, func() {
			if s := watched.Load(); s != nil {
				alive(*s)
			}
		}, n, log)
		defer func() { stopWatchdog(); wait() }()
		log.Info("watchdog", "interval", opts.Watchdog, "ping_every", opts.Watchdog/2)
	}
	proc, err := setUpProcess(cfg, log)
	if err != nil {
		return err
	}
	n.setStatus(fmt.Sprintf("opening %d export%s", len(cfg.Exports), plural(len(cfg.Exports))))
	vols, devs, caches, sources, closeAll, err := openExports(cfg, reg, log)
	if err != nil {
		return err
	}
	plan := planMemory(cfg, caches, vols)
	defer limitGo(plan, log)()
	watch := &memoryWatch{plan: plan, log: log}
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	go watch.run(wctx)
	defer func() { err = errors.Join(err, closeAll()) }()
	watched.Store(&sources)
	if opts.Opened != nil {
		opts.Opened(sources)
	}

	exports := make([]server.Export, len(cfg.Exports))
	for i, e := range cfg.Exports {
		exports[i] = server.Export{Name: e.Name, Description: e.Description, Device: devs[i]}
	}
	allow, err := cfg.AllowPrefixes()
	if err != nil {
		return err
	}
	tlsCfg, stopTLS, err := serverTLS(cfg.TLS, log)
	if err != nil {
		return err
	}
	defer stopTLS()
	srv, err := server.New(server.Config{Exports: exports, Logger: log, MaxInFlight: cfg.MaxInFlight, Allow: allow, TLS: tlsCfg})
	if err != nil {
		return err
	}

	stopEndpoints, err := metrics.Endpoints{Admin: cfg.Admin, Metrics: cfg.Metrics}.Serve(
		metrics.NewHandlers(func() []metrics.Source { return sources }, metrics.RefusedConnections(srv.RefusedConnections),
			metrics.DaemonStats(watch.stats(proc, srv))), log)
	if err != nil {
		return err
	}
	// The endpoints outlive the NBD server, so the last stats can be read while stopping.
	defer func() { err = errors.Join(err, stopEndpoints()) }()

	var listeners []net.Listener
	if len(opts.Activated) > 0 {
		for _, l := range opts.Activated {
			listeners = append(listeners, l.Listener)
		}
	} else if listeners, err = listenAll(cfg.Listen, prepare); err != nil {
		return err
	}
	serveErr := make(chan error, len(listeners))
	addrs := make([]string, len(listeners))
	for i, l := range listeners {
		addrs[i] = l.Addr().String()
		go func() { serveErr <- srv.Serve(l) }()
	}
	final := func() bool { return opts.Final != nil && opts.Final() }
	stopDevices, left, err := attachDevices(cfg, devs, caches, srv, final, log)
	if err != nil {
		for _, l := range listeners {
			l.Close()
		}
		sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		return errors.Join(err, srv.Shutdown(sctx))
	}
	log.Info("serving", "exports", len(exports), "listen", addrs, "run_dir", cfg.RunDir)
	// The scrubs stop first when the stop begins: they would only hold it up.
	stopScrubs := scheduleScrubs(scrubSchedules(cfg, caches, log), realTicker, log)
	defer stopScrubs()
	// READY=1 only now: every listener accepts and every device is attached, so a unit ordered
	// after this one (a mount of /dev/nbdN, a client) finds them.
	n.setStatus(servingStatus(len(exports), addrs, sources), "READY=1")
	if opts.Ready != nil {
		opts.Ready(addrs)
	}

	var runErr error
	status := time.NewTicker(statusInterval)
	defer status.Stop()
wait:
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping: finishing in-flight requests")
			break wait
		case runErr = <-serveErr:
			log.Error("listener failed; stopping", "err", runErr)
			break wait
		case <-status.C:
			n.setStatus(servingStatus(len(exports), addrs, sources))
		}
	}
	n.setStatus("stopping: finishing in-flight requests", "STOPPING=1")
	stopScrubs()
	last := final()
	// The devices go first: their last requests (the page cache's writes, the flush of a
	// clean removal) still need the server and the volumes.
	if err := stopDevices(); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("remove devices: %w", err))
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("shutdown: %w", err))
	}
	for _, l := range listeners {
		if ul, ok := l.(*net.UnixListener); ok {
			// Close removes the socket file of a listener we created.
			ul.Close()
		}
	}
	n.setStatus(fmt.Sprintf("stopping: flushing %d export%s", len(vols), plural(len(vols))))
	for i, d := range devs {
		if err := d.Flush(); err != nil { // a replicated export's replicas too
			runErr = errors.Join(runErr, fmt.Errorf("flush export %q: %w", cfg.Exports[i].Name, err))
		}
	}
	for i, e := range cfg.Exports {
		if e.Cache == nil || !(last || e.Cache.WriteBack.FlushOnStop()) || sources[i].FlushAll == nil {
			continue
		}
		if err := flushOnStop(e.Name, sources[i], n, log); err != nil {
			runErr = errors.Join(runErr, fmt.Errorf("write back export %q at stop: %w", e.Name, err))
		}
	}
	if runErr == nil {
		if err := markLeft(cfg.RunDir, left()); err != nil {
			log.Warn("could not mark the kernel devices left attached as left cleanly: the next tierblk will release them", "err", err)
		}
		log.Info("stopped cleanly; every volume flushed")
	}
	return runErr
}

// flushOnStop writes back the dirty data of an export's cache (write_back.on_stop: flush), once
// no client can write: the frontends are down. It has no deadline of its own: the service
// manager's stop timeout (podman stop -t, TimeoutStopSec=) bounds it, and a kill that cuts it
// short leaves the rest dirty on the SSD tier, where the next start finds it.
func flushOnStop(name string, s metrics.Source, n *notifier, log *slog.Logger) error {
	log.Info("stopping: writing back dirty data", "export", name)
	last := time.Now()
	var written int64
	err := s.FlushAll(context.Background(), func(done, total int64) {
		written = done
		if time.Since(last) >= time.Second {
			last = time.Now()
			n.setStatus(fmt.Sprintf("stopping: export %s: written back %s of %s", name, units.FormatSize(done), units.FormatSize(total)))
			log.Info("stopping: writing back", "export", name, "done", units.FormatSize(done), "total", units.FormatSize(total))
		}
	})
	if err == nil {
		log.Info("stopping: dirty data written back", "export", name, "bytes", units.FormatSize(written))
	}
	return err
}

// openExports opens every backend, and the trace recorders of the exports that have one; on
// failure it closes what it had opened. caches has each export's cache, nil for one without.
func openExports(cfg config.Config, reg *backend.Registry, log *slog.Logger) (vols []*volume.Volume, devs []volume.Device, caches []*cache.Cache,
	sources []metrics.Source, closeAll func() error, err error) {
	var closers []func() error
	closeAll = func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	vols = make([]*volume.Volume, 0, len(cfg.Exports))
	devs = make([]volume.Device, 0, len(cfg.Exports))
	caches = make([]*cache.Cache, len(cfg.Exports))
	for i, e := range cfg.Exports {
		fail := func(err error) error {
			return errors.Join(fmt.Errorf("exports[%d] (%q): %w", i, e.Name, err), closeAll())
		}
		b, err := reg.Open(e.Backend, backend.Options{ReadOnly: e.ReadOnly, Logger: log})
		if err != nil {
			return nil, nil, nil, nil, nil, fail(err)
		}
		var meter volume.Meter // nil for a cached export: its cache keeps the statistics
		if e.Cache != nil {
			c, err := openCache(e, b, reg, cfg.RunDir, log)
			if err != nil {
				b.Close()
				return nil, nil, nil, nil, nil, errors.Join(fmt.Errorf("exports[%d].%w", i, err), closeAll())
			}
			sources = append(sources, metrics.CacheSource(e.Name, c))
			caches[i], b = c, c
		} else {
			// Its statistics, in a cache's shape, show its backend to monitoring; without cache
			// actions, an admin action on it says it has no cache rather than "no export".
			m := &cache.Meter{}
			sources = append(sources, metrics.Source{Export: e.Name, Stats: m.Stats})
			meter = m
		}
		closers = append(closers, b.Close)
		var observers []volume.Observer
		if e.RecordTrace != "" {
			rec, closeRec, err := openRecorder(e, log)
			if err != nil {
				return nil, nil, nil, nil, nil, fail(err)
			}
			closers = append(closers, closeRec)
			observers = append(observers, volume.Recording(rec, func(err error) {
				log.Error("trace recording stopped", "export", e.Name, "file", e.RecordTrace, "err", err)
			}))
		}
		if caches[i] != nil && e.Cache.CurvesOn() {
			// The curves are an estimate: an export serves without them rather than not at all.
			if live := startCurves(caches[i].Stats(), e.Name, log); live != nil {
				stopAdvice := logAdvice(live, e.Name, log)
				closers = append(closers, func() error { stopAdvice(); live.Close(); return nil })
				sources[len(sources)-1].Curves = live.Curves
				observers = append(observers, live)
			}
		}
		v := volume.New(b, volume.Options{ReadOnly: e.ReadOnly, MultiConn: true, Meter: meter, Observers: observers})
		vols = append(vols, v)
		var dev volume.Device = v
		if e.Cache != nil && len(e.Cache.WriteBack.Replicas) > 0 {
			rep, closeRep, err := openReplicas(e, v, caches[i], reg, log)
			if err != nil {
				return nil, nil, nil, nil, nil, fail(err)
			}
			closers = append(closers, closeRep)
			sources[len(sources)-1].Replicas = rep.Stats
			dev = rep
		}
		devs = append(devs, dev)
		log.Info("export", "name", e.Name, "backend", backend.Redact(e.Backend), "size", units.FormatSize(b.Size()), "read_only", v.Info().ReadOnly)
	}
	return vols, devs, caches, sources, closeAll, nil
}

// startCurves starts the live miss-ratio curves of the cache's last tier, the one whose misses go
// to the backend: its size, policy and admission are the curves' "today"; a RAM tier in front of
// it gets LRU's curve. It logs why and returns nil where they cannot run.
func startCurves(st cache.Stats, name string, log *slog.Logger) *sim.Live {
	t := st.Tiers[len(st.Tiers)-1]
	c := sim.LiveConfig{LineSize: int64(st.LineSize), Lines: int(t.Capacity), Tier: t.Name, Policy: t.Policy, Admission: t.Admission}
	if len(st.Tiers) > 1 {
		c.RAMLines = int(st.Tiers[0].Capacity)
	}
	live, err := sim.NewLive(c)
	if err != nil {
		log.Warn("live miss-ratio curves off", "export", name, "tier", t.Name, "err", err)
		return nil
	}
	log.Info("live miss-ratio curves", "export", name, "tier", t.Name, "sizes", fmt.Sprintf("%s to %s", units.FormatSize(int64(st.LineSize)*max(1, int64(t.Capacity)/64)), units.FormatSize(8*int64(st.LineSize)*int64(t.Capacity))))
	return live
}

// adviceEvery is how often the log says what an export's curves advise.
const adviceEvery = time.Hour

// logAdvice logs what the curves say of the tier's size every adviceEvery, until stopped.
func logAdvice(live *sim.Live, name string, log *slog.Logger) (stop func()) {
	done := make(chan struct{})
	t := time.NewTicker(adviceEvery)
	go func() {
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				c := live.Curves()
				if c == nil || c.Requests[0] == 0 {
					continue
				}
				size := func(lines int) string { return units.Approx(int64(lines) * c.LineSize) }
				a := c.Advice
				args := []any{"export", name, "tier", c.Tier, "policy", c.Policy, "hit_ratio", a.Target, "hit_ratio_half", a.Half, "hit_ratio_double", a.Double,
					"best_hit_ratio", c.BestHit[0], "size_for_90", size(a.For90), "size_for_95", size(a.For95),
					"size_for_99", size(a.For99), "best_policy", c.Best().Policy}
				if r := c.RAM; r != nil {
					args = append(args, "ram_hit_ratio", r.Advice.Target, "ram_hit_ratio_half", r.Advice.Half, "ram_hit_ratio_double", r.Advice.Double,
						"ram_best_hit_ratio", r.BestHit, "ram_size_for_90", size(r.Advice.For90), "ram_size_for_95", size(r.Advice.For95), "ram_size_for_99", size(r.Advice.For99))
				}
				log.Info("live curves", args...)
			}
		}
	}()
	return func() { close(done) }
}

// openReplicas connects to the export's replicas and starts logging its changes there; the close
// stops that and disconnects.
func openReplicas(e config.Export, v *volume.Volume, c *cache.Cache, reg *backend.Registry, log *slog.Logger) (*replica.Replicated, func() error, error) {
	var peers []replica.Peer
	closeDevs := func() error {
		var errs []error
		for _, p := range peers {
			errs = append(errs, p.Dev.Close())
		}
		return errors.Join(errs...)
	}
	for _, u := range e.Cache.WriteBack.Replicas {
		d, err := reg.Open(u, backend.Options{Logger: log})
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("write_back.replicas: %s: %w", backend.Redact(u), err), closeDevs())
		}
		peers = append(peers, replica.Peer{Name: backend.Redact(u), Dev: d})
	}
	rep, err := replica.Replicate(v, c, peers, replica.Options{OnLoss: e.Cache.WriteBack.OnReplicaLoss, TakeOver: e.Cache.WriteBack.TakeOver, Log: log.With("export", e.Name)})
	if err != nil {
		return nil, nil, errors.Join(err, closeDevs())
	}
	log.Info("replicating write-back", "export", e.Name, "replicas", len(peers), "on_replica_loss", e.Cache.WriteBack.OnReplicaLoss)
	return rep, func() error { return errors.Join(rep.Close(), closeDevs()) }, nil
}

// recordFlushInterval bounds what a crash of the daemon loses of a recorded trace.
const recordFlushInterval = time.Second

// openRecorder creates the export's trace file. An existing file is refused, never overwritten:
// it may be a trace the user wants to keep.
func openRecorder(e config.Export, log *slog.Logger) (*trace.FioLogWriter, func() error, error) {
	f, err := os.OpenFile(e.RecordTrace, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, nil, fmt.Errorf("record_trace: %s exists; remove it or name a new file", e.RecordTrace)
		}
		return nil, nil, fmt.Errorf("record_trace: %w", err)
	}
	name := e.Name
	if name == "" || strings.ContainsAny(name, " \t\r\n") || len(name) > 256 {
		name = "tierblk"
	}
	w, err := trace.NewFioLogWriter(f, name)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(recordFlushInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := w.Flush(); err != nil {
					log.Error("trace recording", "file", e.RecordTrace, "err", err)
				}
			}
		}
	}()
	log.Info("recording requests", "export", e.Name, "file", e.RecordTrace, "format", "fio iolog v3")
	return w, func() error {
		close(stop)
		<-done
		return errors.Join(w.Close(), f.Close())
	}, nil
}

// listenAll listens on every address; prepare, if not nil, prepares each unix socket's file
// (socketAccess).
func listenAll(addrs []string, prepare func(path string) error) ([]net.Listener, error) {
	var ls []net.Listener
	for _, a := range addrs {
		l, err := listenOn(a, prepare)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func listenOn(a string, prepare func(path string) error) (net.Listener, error) {
	network, address, err := config.ParseListenAddr(a)
	if err != nil {
		return nil, err
	}
	var l net.Listener
	if network == "unix" {
		l, err = listen.ListenUnix(address, prepare)
	} else {
		l, err = listen.Listen(network, address)
	}
	var setting *config.Error
	if errors.As(err, &setting) {
		return nil, err // prepare's, which names the setting and the path
	}
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", a, err)
	}
	return l, nil
}
