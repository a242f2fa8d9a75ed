package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/nbd/kernel"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/ublk"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
)

// kernelDevice is a block device the kernel serves from an export: ublk or the kernel NBD client.
type kernelDevice interface {
	Path() string
}

// attachDevices creates (or takes back) the exports' ublk devices and attaches their kernel NBD
// devices. The returned stop removes them all, or leaves those kept on stop, newest first, before
// the server stops, so that the kernel's last writes and flushes still reach the volumes; left
// lists the devices a clean stop leaves, for markLeft (none after a final stop, which removes
// them all: see Options.Final). On failure it removes what it had created.
func attachDevices(cfg config.Config, devs []volume.Device, caches []*cache.Cache, srv *server.Server, final func() bool,
	log *slog.Logger) (stop func() error, left func() []leftDevice, err error) {
	var stops []func() error
	var kept []leftDevice
	// keepOrRemove is a device's stop: leave it if its setting keeps it and the stop is not final.
	keepOrRemove := func(keep bool, leave, remove func() error) func() error {
		return func() error {
			if keep && !final() {
				return leave()
			}
			return remove()
		}
	}
	left = func() []leftDevice {
		if final() {
			return nil
		}
		return kept
	}
	stop = func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}
	for i, e := range cfg.Exports {
		identity := deviceIdentity(e)
		lastRun := lostWith(e, caches[i])
		if e.UBLK != nil {
			dev, distrust := devs[i], func() {}
			if lastRun != nil {
				d := &distrustFlush{Device: devs[i]}
				dev, distrust = d, func() {
					d.armed.Store(true)
					log.Warn("ublk: taking back a device whose daemon was killed: writes it acknowledged in write-back since its last checkpoint "+
						"may have died with it, so the first flush fails rather than vouch for them", "export", e.Name, "why", lastRun)
				}
			}
			id := e.UBLK.DeviceID()
			path := ublk.PathOf(id)
			d, err := ublk.Start(dev, ublk.Options{
				ID: id, Queues: e.UBLK.Queues, Depth: e.UBLK.Depth, Logger: log,
				BeforeRecover: func() error { return mayTakeBack(log, cfg.RunDir, e.Name, path, identity, distrust) },
			})
			if err != nil {
				return nil, nil, errors.Join(fmt.Errorf("exports[%d] (%q): ublk: %w", i, e.Name, err), stop())
			}
			if id >= 0 {
				forgetLeft(cfg.RunDir, path) // taken back, or a mark outlived its device
			}
			logDevice(log, "ublk", e.Name, d)
			stops = append(stops, keepOrRemove(e.UBLK.KeepOnStop(), d.Leave, d.Stop))
			if e.UBLK.KeepOnStop() {
				kept = append(kept, leftDevice{path, identity})
			}
		}
		if e.NBDDevice != "" {
			timeout, err := e.NBDDeadConnTimeout()
			if err != nil {
				return nil, nil, errors.Join(fmt.Errorf("exports[%d] (%q): %w", i, e.Name, err), stop())
			}
			d, err := kernel.Attach(srv, e.NBDDevice, kernel.Options{
				Export: e.Name,
				// One connection per CPU, as nbd-client -C does: the kernel maps each to a hardware queue.
				Conns:           min(runtime.NumCPU(), 8),
				DeadConnTimeout: timeout,
				Identity:        identity,
				TakeOver:        leftBy(cfg.RunDir, e.NBDDevice) == identity || lastRun == nil,
				Log:             log,
			})
			if err != nil {
				return nil, nil, errors.Join(fmt.Errorf("exports[%d] (%q): nbd_device: %w", i, e.Name, err), stop())
			}
			forgetLeft(cfg.RunDir, e.NBDDevice)
			logDevice(log, "nbd", e.Name, d)
			stops = append(stops, keepOrRemove(e.KeepNBDDevice(), d.Leave, d.Detach))
			if e.KeepNBDDevice() {
				kept = append(kept, leftDevice{e.NBDDevice, identity})
			}
		}
	}
	return stop, left, nil
}

// mayTakeBack decides whether the ublk device at path, which a previous tierblk left, may be
// taken back for the export with this identity: yes if a clean stop of this export left it
// (every volume was flushed first); no if the mark names another export (the requests the
// kernel holds belong to that data); and with no mark, a killed daemon's device, yes, but in
// front of an SSD tier whose run log did not give back every record, the first flush fails
// (distrust: see distrustFlush).
func mayTakeBack(log *slog.Logger, dir, export, path, identity string, distrust func()) error {
	switch by := leftBy(dir, path); by {
	case identity:
		log.Info("ublk: taking back the device a clean stop left", "export", export, "path", path)
	case "":
		distrust()
	default:
		return fmt.Errorf("%s was left by a tierblk serving another export (identity %q, this export's is %q): "+
			"refusing to take it, as the I/O it holds belongs to that export; start the tierblk that serves it, "+
			"or give this one another --ublk-id", path, by, identity)
	}
	return nil
}

// A kernel device (NBD or ublk) that a stop leaves is taken over by the next tierblk only if it
// cannot have lost a write the kernel believes done. Writes acknowledged in write-back live on
// the SSD tier, and the records that find them are committed at checkpoints and, in between, kept
// in the tier's run log (in the run directory, run_dir), which outlives a kill of the process: the
// next start replays it. So a device is taken over when the export's cache found every record of
// its last run (cache.Recovered), or when the export has no SSD tier, and so no write-back
// (TestNBDDeviceRestart, TestUBLKRecovery). A stop that ends with every volume flushed also marks
// the device left cleanly (a file in the run directory naming the export's identity, removed once
// the device is taken back or made anew); a device found without the mark and without its run's
// records is released (NBD) or taken back with distrustFlush (ublk). A ublk device carries no
// identity in the kernel, so its mark is what refuses another export (TestUBLKRestart).

// distrustFlush fails the first FLUSH once armed: a ublk device taken back from a killed daemon
// (user recovery) holds the kernel's belief that writes the killed process acknowledged were
// done, and in write-back those written since its last checkpoint died with it unless its run log
// was replayed (lostWith). The kernel's next FLUSH must not succeed as if they were durable
// (TestUBLKRecovery).
type distrustFlush struct {
	volume.Device
	armed atomic.Bool
}

// errKilledDaemon is what the first FLUSH after taking a device back from a killed daemon fails with.
var errKilledDaemon = errors.New("the daemon this device was taken back from was killed: writes it acknowledged since its last checkpoint may be lost")

func (d *distrustFlush) Flush() error {
	if d.armed.Swap(false) {
		return errKilledDaemon
	}
	return d.Device.Flush()
}

// ReadAtOn implements backend.RingReader where the device does: the ublk queue's reads on its own
// ring do not go through Flush.
func (d *distrustFlush) ReadAtOn(r backend.Ring, p []byte, off int64, done func(error)) bool {
	rr, ok := d.Device.(backend.RingReader)
	return ok && rr.ReadAtOn(r, p, off, done)
}

// WriteAtOn implements backend.RingWriter where the device does, as ReadAtOn.
func (d *distrustFlush) WriteAtOn(r backend.Ring, p []byte, off int64, fua bool, done func(error)) bool {
	rw, ok := d.Device.(backend.RingWriter)
	return ok && rw.WriteAtOn(r, p, off, fua, done)
}

// leftDevice is a kernel device a stop leaves, with its export's identity.
type leftDevice struct{ path, identity string }

func leftMark(dir, path string) string {
	return filepath.Join(dir, "left-"+filepath.Base(path))
}

// markLeft records that a clean stop left the devices, after every volume was flushed.
func markLeft(dir string, devs []leftDevice) error {
	var errs []error
	for _, d := range devs {
		if err := prepareRunDir(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.WriteFile(leftMark(dir, d.path), []byte(d.identity+"\n"), 0o644))
	}
	return errors.Join(errs...)
}

// leftBy returns the identity of the export whose clean stop left the device, "" if none did.
func leftBy(dir, path string) string {
	b, err := os.ReadFile(leftMark(dir, path))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// forgetLeft removes the device's mark once a start has taken it (or made it anew).
func forgetLeft(dir, path string) { _ = os.Remove(leftMark(dir, path)) }

// lostWith returns nil if no write the kernel believes done can have been lost with the last run
// of export e, whose cache is c (nil: none): the export has no SSD tier, or c found every index
// record that run wrote. Else it says why not.
func lostWith(e config.Export, c *cache.Cache) error {
	if !mayWriteBack(e) || c == nil {
		return nil
	}
	return c.Recovered()
}

// runLog is the path in dir of the run log of export e's SSD tier, named after the tier (its
// device and metadata) as the kernel NBD device's identity is.
func runLog(dir string, e config.Export) string {
	h := sha256.Sum256([]byte("ssd=" + e.Cache.SSD + "\nmeta=" + e.Cache.MetaDir() + "\n"))
	return filepath.Join(dir, "runlog-"+hex.EncodeToString(h[:8]))
}

// mayWriteBack reports whether an export can hold writes in write-back: it has an SSD tier (the
// mode can be switched at run time, so the configured one does not say).
func mayWriteBack(e config.Export) bool { return e.Cache != nil && e.Cache.SSD != "" }

// deviceIdentity is what the data behind an export's kernel device is: the backend (its URL
// without credentials) and the SSD tier in front of it (its device and metadata), hashed to keep
// it short. A kernel NBD device carries it as its backend identifier, and a clean stop's mark
// names it. A restarted tierblk takes over a device left with its own identity and refuses one
// left with another's: the requests the kernel holds were meant for that data.
func deviceIdentity(e config.Export) string {
	h := sha256.New()
	fmt.Fprintf(h, "backend=%s\n", backend.Redact(e.Backend))
	if e.Cache != nil && e.Cache.SSD != "" {
		fmt.Fprintf(h, "ssd=%s\nmeta=%s\n", e.Cache.SSD, e.Cache.MetaDir())
	}
	return kernel.IdentityPrefix + hex.EncodeToString(h.Sum(nil)[:8])
}

func logDevice(log *slog.Logger, kind, export string, d kernelDevice) {
	log.Info("block device", "kind", kind, "export", export, "path", d.Path())
}
