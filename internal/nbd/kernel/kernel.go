// Package kernel attaches the Linux kernel's NBD client (/dev/nbdN) to an export of tierblk's NBD
// server, without nbd-client: each connection is a unix socketpair whose one end the server serves
// (internal/nbd/server) and whose other end, once the client's handshake (internal/nbd/client) has
// negotiated the export on it, goes to the kernel in NBD_CMD_CONNECT, a generic netlink request
// (genl.go).
//
// A kernel device must never be left attached to connections nobody serves while the server
// lives: Detach releases it. Leave lets go of it without releasing it, for the next tierblk
// serving the same export to take over: the kernel holds its I/O meanwhile (Options.DeadConnTimeout).
// A device left by a dead process is taken over when it carries this export's backend identifier
// (Options.Identity), refused when it carries another's, and released before it is taken again
// when it carries none (an older tierblk's, nbd-client's). Nothing here serves requests or speaks the protocol itself: the server and the client do.
package kernel

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Timeouts of the kernel's client. When tierblk stops without releasing the device (Leave) or
// dies (kill -9), the kernel reads EOF on every socket and marks the connections dead; from then on:
//   - a new request finds no live connection and waits for one, up to Options.DeadConnTimeout
//     (NBD_ATTR_DEAD_CONN_TIMEOUT; with 0 it fails at once with EIO), then fails with EIO;
//   - a request that was in flight (sent, unanswered) waits for its timeout (requestTimeout):
//     the kernel does not fail those on EOF. When it expires the kernel requeues the request,
//     which then waits for a live connection as a new one does.
//
// A tierblk that takes the device over (NBD_CMD_RECONFIGURE) ends the wait: the held requests
// go to its connections.
//
// The request timeout also applies while tierblk is alive, and there expiring kills the
// connection (the kernel shuts the socket and resends the request on another one), so it must
// exceed the slowest legitimate request: 30 s, the block layer's default, is far beyond a cache
// hit or miss on a healthy backend and bounds the wait after a crash.
const (
	requestTimeout    = 30 * time.Second
	deadConnTimeout   = 0
	handshakeTimeout  = 10 * time.Second
	releaseTimeout    = 10 * time.Second
	drainTimeout      = 5 * time.Second
	releasePollPeriod = 20 * time.Millisecond
	// takeOverSettle is how long a take-over waits to see which new sockets the kernel refused
	// (they read EOF at once), takeOverRetry how long it waits before trying again when it took
	// none, up to takeOverTries times.
	takeOverSettle = 100 * time.Millisecond
	takeOverRetry  = 500 * time.Millisecond
	takeOverTries  = 10
	// sysBlock is where the kernel shows block devices.
	sysBlock = "/sys/block"
)

// Server serves the connections of a device: the NBD server (*server.Server).
type Server interface {
	// ServeLocalConn serves one connection of this process's own until it ends, and closes it
	// (no TLS: the kernel's client speaks none).
	ServeLocalConn(nc net.Conn, remote string)
	// ShuttingDown reports whether the server has begun to shut down (and so ends connections).
	ShuttingDown() bool
}

// Device is the kernel's NBD client attached to an export of a Server.
type Device struct {
	path  string
	index uint32
	srv   Server
	log   *slog.Logger
	// conns counts the server's goroutines serving the device's sockets.
	conns sync.WaitGroup
	// A connection that ends while the kernel has the device, before it is asked to let go,
	// is worth a warning.
	attached, detaching atomic.Bool

	// ended counts the connections whose serving has ended.
	ended atomic.Int32
	// lock keeps other tierblks off the device while this one serves it (lockDevice).
	lock io.Closer

	detachOnce sync.Once
	detachErr  error
}

// Options configure Attach.
type Options struct {
	// Export is the name of the export negotiated on every connection.
	Export string
	// Conns is the number of connections to make (one if the export does not allow several).
	Conns int
	// DeadConnTimeout is how long the kernel holds the device's requests while none of its
	// connections is alive (tierblk restarting, or killed) before it fails them; whole seconds.
	// 0: they fail at once.
	DeadConnTimeout time.Duration
	// Identity is the backend identifier the kernel keeps with the device
	// (/sys/block/nbdN/backend): a device left by a tierblk with the same Identity is taken over
	// (NBD_CMD_RECONFIGURE) where TakeOver allows, one left with another Identity is refused.
	// "": none.
	Identity string
	// TakeOver says whether a device left with this Identity may be taken over: only where no
	// write the kernel believes done can have been lost with the process that left it (it
	// stopped cleanly, or the export keeps nothing acknowledged in that process's memory alone).
	// Else the device is released, and the I/O it holds fails: a FLUSH this process answered
	// would otherwise vouch for writes it never saw.
	TakeOver bool
	// Log is told of the attachment and of connections the kernel gives up on
	// (nil: slog.Default()).
	Log *slog.Logger
}

// IdentityPrefix begins every backend identifier tierblk gives the kernel.
const IdentityPrefix = "tierblk:"

// Attach connects the kernel NBD device at path (/dev/nbdN) to o.Export over o.Conns connections
// that srv serves. The server needs no listener. A device that a tierblk with the same
// o.Identity left attached (stopped with Leave, or killed) is taken over: the kernel gets new
// connections in place of the dead ones, and the requests it held go on.
func Attach(srv Server, path string, o Options) (*Device, error) {
	index, err := nbdIndex(path)
	if err != nil {
		return nil, err
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	lock, err := lockDevice(path, index)
	if err != nil {
		return nil, err
	}
	k, err := attach(srv, path, index, o, log)
	if err != nil {
		lock.Close()
		return nil, err
	}
	k.lock = lock
	return k, nil
}

func attach(srv Server, path string, index uint32, o Options, log *slog.Logger) (*Device, error) {
	g, family, err := dialNBDFamily()
	if err != nil {
		return nil, err
	}
	defer g.Close()

	k := &Device{path: path, index: index, srv: srv, log: log}
	st := readState(index)
	switch {
	case st.pid == 0:
		// Not connected.
	case st.backend == "":
		// Attached without an identifier (nbd-client, an older tierblk): released if its
		// process is gone, refused by the kernel (in use) otherwise.
		if err := k.releaseStale(g, family, st.pid); err != nil {
			return nil, err
		}
	case o.Identity != "" && st.backend == o.Identity && o.TakeOver:
		// No tierblk serves it (we hold the lock): it was left by one serving this export.
		return k, k.takeOver(g, family, o, st)
	case o.Identity != "" && st.backend == o.Identity:
		k.log.Warn("nbd: the tierblk that served this device did not stop cleanly, and writes it acknowledged may be lost with it: "+
			"releasing the device rather than take it over (the I/O it holds fails)", "device", path, "pid", st.pid)
		if err := k.release(g, family, st.pid); err != nil {
			return nil, err
		}
	case !strings.HasPrefix(st.backend, IdentityPrefix) && processAlive(st.pid):
		return nil, connectError(path, unix.EBUSY)
	default:
		return nil, fmt.Errorf("nbd: %s is attached to another export (backend identifier %q, this export's is %q): "+
			"refusing to take it, as the I/O it holds belongs to that export; start the tierblk that serves it, "+
			"or release it (nbd-client -d %s: I/O it holds fails)", path, st.backend, o.Identity, path)
	}
	files, ex, err := k.sockets(o.Export, max(o.Conns, 1))
	if err != nil {
		k.conns.Wait()
		return nil, fmt.Errorf("nbd: %s: %w", path, err)
	}
	cfg, err := kernelConfigFor(index, ex, files)
	cfg.deadConnTimeout = uint64(o.DeadConnTimeout / time.Second)
	cfg.backend = o.Identity
	if err == nil {
		_, err = g.request(family, nbdCmdConnect, nbdGenlVersion, connectAttrs(cfg))
		err = connectError(path, err)
	}
	// The kernel holds its own references to the sockets it took.
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		k.conns.Wait()
		return nil, err
	}
	k.attached.Store(true)
	k.log.Info("nbd: kernel device attached", "device", path, "export", o.Export,
		"size", ex.Size, "block_size", cfg.blockSize, "connections", len(files),
		"dead_conn_timeout", o.DeadConnTimeout, "identity", o.Identity)
	return k, nil
}

// takeOver gives a device left attached by a tierblk serving the same export new connections in
// place of its dead ones (NBD_CMD_RECONFIGURE). The kernel takes a new socket only in place of a
// connection it has seen die; one it does not take reads EOF at once, as nobody else holds its
// other end, and its serving goroutine ends: then, if it took none, takeOver tries again a few
// times (the previous process's sockets may not have been seen closed yet).
func (k *Device) takeOver(g *genlConn, family uint16, o Options, st deviceState) error {
	n := st.queues
	if n <= 0 {
		n = max(o.Conns, 1)
	}
	for try := 1; ; try++ {
		files, ex, err := k.sockets(o.Export, n)
		if err != nil {
			k.conns.Wait()
			return fmt.Errorf("nbd: %s: %w", k.path, err)
		}
		if want := st.sectors * 512; st.sectors > 0 && uint64(ex.Size) != want {
			closeAll(files)
			k.conns.Wait()
			return fmt.Errorf("nbd: %s was left attached with %d bytes, the export now has %d: refusing to take it over (release it first: nbd-client -d %s)",
				k.path, want, ex.Size, k.path)
		}
		cfg, err := kernelConfigFor(k.index, ex, files)
		if err == nil {
			cfg.deadConnTimeout = uint64(o.DeadConnTimeout / time.Second)
			cfg.backend = o.Identity
			_, err = g.request(family, nbdCmdReconfigure, nbdGenlVersion, reconfigureAttrs(cfg))
		}
		before := k.ended.Load()
		closeAll(files)
		if err != nil {
			k.conns.Wait()
			return fmt.Errorf("nbd: reconfigure %s (left attached by a tierblk serving this export): %w", k.path, err)
		}
		// A socket the kernel did not take ends at once.
		time.Sleep(takeOverSettle)
		taken := len(files) - int(k.ended.Load()-before)
		if taken > 0 {
			k.attached.Store(true)
			k.log.Info("nbd: kernel device attached: took over the device a previous tierblk left", "device", k.path,
				"export", o.Export, "size", ex.Size, "connections", taken, "offered", len(files), "pid_before", st.pid,
				"dead_conn_timeout", o.DeadConnTimeout, "identity", o.Identity)
			return nil
		}
		if try == takeOverTries {
			k.conns.Wait()
			return fmt.Errorf("nbd: %s: the kernel took none of %d new connections in place of its old ones (are they still alive?)", k.path, len(files))
		}
		time.Sleep(takeOverRetry)
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// lockDevice makes sure that one tierblk at a time serves device index: it binds an abstract
// unix socket named after it, which the kernel frees when the process ends, even killed.
func lockDevice(path string, index uint32) (io.Closer, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("nbd: lock %s: %w", path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: fmt.Sprintf("@tierblk/nbd%d", index)}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("nbd: %s is in use (another tierblk serves it)", path)
		}
		return nil, fmt.Errorf("nbd: lock %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), "tierblk-nbd-lock"), nil
}

// Path is the device's path.
func (k *Device) Path() string { return k.path }

// Detach disconnects the kernel client: the device's dirty pages are written and flushed, the
// requests in flight finish (Detach waits a few seconds for the device to be idle), the kernel
// sends NBD_CMD_DISC on every connection, the server finishes the requests it had read, and
// Detach returns once the kernel has released the device (size 0). If the device stays open
// (a mounted file system), the kernel fails its I/O and Detach says so after a while.
func (k *Device) Detach() error {
	k.detachOnce.Do(func() {
		k.detachErr = k.detach()
		k.lock.Close()
	})
	return k.detachErr
}

// Leave lets go of the device without releasing it, for a restart: the server's shutdown ends
// the connections once it has answered the requests it read, the kernel sees them die and holds
// the device's I/O, up to Options.DeadConnTimeout, until a tierblk serving the same export takes
// it over. A request the kernel sent after the server stopped reading stays unanswered and is
// sent again to the next tierblk after the request timeout (30 s). Leave or Detach: the first
// called wins.
func (k *Device) Leave() error {
	k.detachOnce.Do(func() {
		k.detaching.Store(true)
		k.log.Info("nbd: leaving the kernel device attached for the next tierblk", "device", k.path)
		go func() {
			// The device is ours until its connections are closed.
			k.conns.Wait()
			k.lock.Close()
		}()
	})
	return nil
}

func (k *Device) detach() error {
	k.detaching.Store(true)
	syncErr := syncBlockDevice(k.path)
	// The kernel fails the requests still queued when it disconnects: let those in flight finish.
	waitIdle(k.index, drainTimeout)
	g, family, err := dialNBDFamily()
	if err != nil {
		return errors.Join(syncErr, err)
	}
	defer g.Close()
	if _, err := g.request(family, nbdCmdDisconnect, nbdGenlVersion, disconnectAttrs(k.index)); err != nil {
		return errors.Join(syncErr, fmt.Errorf("nbd: disconnect %s: %w", k.path, err))
	}
	// The kernel shut its sockets down: each connection ends once its requests are answered.
	k.conns.Wait()
	return errors.Join(syncErr, waitReleased(k.path, k.index, releaseTimeout))
}

// syncBlockDevice writes the device's dirty pages and flushes its cache, so that nothing buffered
// in the kernel is lost when it lets go of the device.
func syncBlockDevice(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("nbd: sync %s before disconnecting: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("nbd: sync %s before disconnecting: %w", path, err)
	}
	return nil
}

// nbdIndex is the index of an NBD device, N in /dev/nbdN (the path may be a symbolic link to it).
func nbdIndex(path string) (uint32, error) {
	name := path
	if real, err := filepath.EvalSymlinks(path); err == nil {
		name = real
	}
	digits, ok := strings.CutPrefix(filepath.Base(name), "nbd")
	n, err := strconv.ParseUint(digits, 10, 20)
	if !ok || err != nil {
		return 0, fmt.Errorf("nbd: %q is not an NBD device (/dev/nbdN)", path)
	}
	return uint32(n), nil
}

// dialNBDFamily opens a generic netlink socket and finds the nbd family on it.
func dialNBDFamily() (*genlConn, uint16, error) {
	g, err := dialGenl()
	if err != nil {
		return nil, 0, fmt.Errorf("nbd: %w", err)
	}
	family, err := g.family(nbdGenlFamily)
	if err != nil {
		g.Close()
		return nil, 0, familyError(err)
	}
	return g, family, nil
}

// familyError explains a failure to find the nbd family.
func familyError(err error) error {
	if errors.Is(err, errFamilyNotFound) {
		return errors.New("nbd: the kernel's nbd module is not loaded (modprobe nbd)")
	}
	return fmt.Errorf("nbd: %w", err)
}

// connectError turns the kernel's refusal of NBD_CMD_CONNECT into a message an operator can act on.
func connectError(path string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("nbd: %s is in use (connected by another process; nbd-client -d %s releases it)", path, path)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("nbd: connecting %s needs CAP_SYS_ADMIN (run as root): %w", path, err)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("nbd: the kernel refused the configuration of %s (its log, dmesg, says why): %w", path, err)
	}
	return fmt.Errorf("nbd: connect %s: %w", path, err)
}

// releaseStale disconnects the device when the process that connected it no longer exists (a
// tierblk killed with -9): its connections are dead and nothing else will ever release it.
func (k *Device) releaseStale(g *genlConn, family uint16, pid int) error {
	if pid <= 0 || processAlive(pid) {
		return nil
	}
	k.log.Warn("nbd: device left connected by a process that is gone; disconnecting it", "device", k.path, "pid", pid)
	return k.release(g, family, pid)
}

// release disconnects the device, which the dead process pid had connected.
func (k *Device) release(g *genlConn, family uint16, pid int) error {
	if _, err := g.request(family, nbdCmdDisconnect, nbdGenlVersion, disconnectAttrs(k.index)); err != nil {
		return fmt.Errorf("nbd: disconnect stale %s (connected by the dead process %d): %w", k.path, pid, err)
	}
	return waitReleased(k.path, k.index, releaseTimeout)
}
