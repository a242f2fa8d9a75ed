package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/systemd"
	"github.com/tierblk/tierblk/internal/units"
)

// Options are what Run takes besides the configuration: hooks for its caller and what the service
// manager passed to the process. The zero value runs a daemon on its own.
type Options struct {
	// Ready, if not nil, is called once every listener accepts connections and every device is
	// attached, with the listeners' addresses (useful when a port was 0).
	Ready func(addrs []string)
	// Activated are listening sockets passed by socket activation. When there are any, the
	// daemon serves NBD on them and opens none of cfg.Listen (which UseActivated has made
	// their addresses), as nbdkit ignores -p and -U when socket-activated.
	Activated []systemd.Listener
	// Notify, if not nil, tells the service manager the daemon's state (systemd.Notify):
	// STATUS= at each step, READY=1 once serving, STOPPING=1 when the stop begins.
	Notify func(state string) error
	// Watchdog, if not 0, is the service manager's watchdog interval (WatchdogSec=): WATCHDOG=1
	// is sent every half of it while the exports' caches answer (see alive).
	Watchdog time.Duration
	// Final, if not nil, is asked when the stop begins whether it is the last of these exports
	// here (the CSI node plugin unstaging a volume, which may next be staged on another node):
	// then the kernel devices are removed whatever their on_stop says, and every cache's dirty
	// data is written back, as write_back.on_stop: flush does. A stop that is not final (an
	// upgrade of the plugin) leaves the devices as configured, for the next daemon to take back.
	Final func() bool
	// Opened, if not nil, is given the exports' metric sources once they are open, for a caller
	// that serves them on an endpoint of its own (the CSI plugin's /metrics).
	Opened func(sources []metrics.Source)
}

// UseActivated makes the sockets passed by socket activation cfg's listen addresses, before
// cfg is validated, so that the settings that govern a kind of listener (allow: TCP;
// socket_mode, socket_group: unix) are checked against what will really be served. It returns
// the listen addresses that the activated sockets replace, for the caller to log.
func UseActivated(cfg *config.Config, ls []systemd.Listener) (replaced []string) {
	if len(ls) == 0 {
		return nil
	}
	replaced = cfg.Listen
	cfg.Listen = make([]string, len(ls))
	for i, l := range ls {
		cfg.Listen[i] = listenAddr(l.Addr())
	}
	return replaced
}

// listenAddr writes a listener's address as a listen setting: unix:/path or HOST:PORT.
func listenAddr(a net.Addr) string {
	if a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return a.String()
}

// checkActivated applies the access settings to activated unix sockets. The service manager made
// their files and accepted clients' connections into their backlog before tierblk ran, so a mode
// or group set now would not hold for every client (listen.ListenUnix sets them before listening
// for that reason): a socket whose file differs from socket_mode or socket_group is refused, and
// the error says to set them in the .socket unit (SocketMode=, SocketGroup=). allow needs nothing
// here: the server checks each TCP client's address as it arrives, on any listener.
func checkActivated(cfg config.Config, ls []systemd.Listener) error {
	if cfg.SocketMode == "" && cfg.SocketGroup == "" {
		return nil
	}
	var errs []error
	for _, l := range ls {
		path := l.Addr().String()
		if l.Addr().Network() != "unix" || strings.HasPrefix(path, "@") || path == "" {
			continue // TCP, or an abstract socket, which has no file and so no mode or group
		}
		fi, err := os.Stat(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("activated socket %s: %w", path, err))
			continue
		}
		if cfg.SocketMode != "" {
			want, err := config.ParseSocketMode(cfg.SocketMode)
			if err == nil && fi.Mode().Perm() != want {
				errs = append(errs, &config.Error{Field: "socket_mode", Msg: fmt.Sprintf(
					"the activated socket %s has mode %04o, not %s; the service manager made it, so set SocketMode=%s in the .socket unit",
					path, fi.Mode().Perm(), cfg.SocketMode, cfg.SocketMode)})
			}
		}
		if cfg.SocketGroup != "" {
			gid, err := lookupGroup(cfg.SocketGroup)
			st, ok := fi.Sys().(*syscall.Stat_t)
			if err == nil && ok && int(st.Gid) != gid {
				errs = append(errs, &config.Error{Field: "socket_group", Msg: fmt.Sprintf(
					"the activated socket %s has group %d, not %s; the service manager made it, so set SocketGroup=%s in the .socket unit",
					path, st.Gid, cfg.SocketGroup, cfg.SocketGroup)})
			}
		}
	}
	return errors.Join(errs...)
}

// notifier sends states to the service manager and remembers the last STATUS= so that an
// unchanged one is not sent again. A failure is logged once: the service manager going away
// must not stop the data path.
type notifier struct {
	send   func(string) error
	log    *slog.Logger
	mu     sync.Mutex
	status string
	failed bool
}

func (n *notifier) notify(state string) {
	if n.send == nil {
		return
	}
	if err := n.send(state); err != nil {
		n.mu.Lock()
		first := !n.failed
		n.failed = true
		n.mu.Unlock()
		if first {
			n.log.Warn("cannot notify the service manager", "state", state, "err", err)
		}
	}
}

// setStatus sends STATUS=s (with extra assignments, e.g. READY=1) unless s is the last status sent.
func (n *notifier) setStatus(s string, extra ...string) {
	n.mu.Lock()
	same := s == n.status
	n.status = s
	n.mu.Unlock()
	if same && len(extra) == 0 {
		return
	}
	n.notify(strings.Join(append([]string{"STATUS=" + s}, extra...), "\n"))
}

// servingStatus is the STATUS= of a serving daemon: its exports and addresses, and the dirty
// data its caches hold, which is what a stop or a crash leaves to write back (after a restart:
// what the last run left, written back while serving).
func servingStatus(exports int, addrs []string, sources []metrics.Source) string {
	s := fmt.Sprintf("serving %d export%s", exports, plural(exports))
	if len(addrs) > 0 {
		s += " on " + strings.Join(addrs, ", ")
	}
	var dirty uint64
	destaging := false
	for _, src := range sources {
		if src.Stats == nil {
			continue
		}
		d := src.Stats().Dirty
		dirty += d.Bytes
		destaging = destaging || d.Destaging
	}
	if dirty > 0 {
		s += "; " + units.FormatSize(int64(dirty)) + " dirty"
		if destaging {
			s += ", writing back"
		}
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// statusInterval is how often a serving daemon's STATUS= is brought up to date (sent only when
// it changed): often enough to follow a write-back, rarely enough to cost nothing.
const statusInterval = 2 * time.Second

// alive is the watchdog's check of the data path: every cache's Stats, which takes each tier's
// lock and so does not return while the engine is wedged (a deadlock, a tier stuck in a call
// under its lock). It does no I/O to the backend or the SSD: a slow or absent NAS is the
// backend's fault, retried and reported, and a restart by the watchdog would not bring it back
// (and would interrupt every client and the write-back). An export without a cache has no state
// of the daemon's own to check.
func alive(sources []metrics.Source) {
	for _, s := range sources {
		if s.Stats != nil {
			s.Stats()
		}
	}
}

// runWatchdog sends WATCHDOG=1 every interval/2 while check returns within that half interval,
// until ctx ends. A check still running when the next tick comes is not started again: the
// missing pings let the service manager act (WatchdogSec= then restarts or kills the daemon).
func runWatchdog(ctx context.Context, interval time.Duration, check func(), n *notifier, log *slog.Logger) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		half := interval / 2
		t := time.NewTicker(half)
		defer t.Stop()
		var pending atomic.Bool
		lastOK := true
		for {
			ok := false
			if pending.CompareAndSwap(false, true) {
				answered := make(chan struct{})
				go func() {
					check()
					pending.Store(false)
					close(answered)
				}()
				select {
				case <-answered:
					ok = true
				case <-time.After(half):
				case <-ctx.Done():
					return
				}
			}
			if ok {
				n.notify("WATCHDOG=1")
			}
			if ok != lastOK {
				if ok {
					log.Info("watchdog: the caches answer again")
				} else {
					log.Error("watchdog: a cache does not answer; not telling the service manager that the daemon is alive", "within", half)
				}
				lastOK = ok
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { <-done }
}
