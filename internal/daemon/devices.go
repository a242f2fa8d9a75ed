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

// attachDevices creates the exports' ublk devices and attaches their kernel NBD devices. The
// returned stop removes them all, newest first, before the server stops, so that the kernel's
// last writes and flushes still reach the volumes. On failure it removes what it had created.
func attachDevices(cfg config.Config, devs []volume.Device, caches []*cache.Cache, srv *server.Server, log *slog.Logger) (stop func() error, left []leftDevice, err error) {
	var stops []func() error
	stop = func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}
	for i, e := range cfg.Exports {
		lastRun := lostWith(e, caches[i])
		if e.UBLK != nil {
			dev, recovered := devs[i], func() {}
			if lastRun != nil {
				d := &distrustFlush{Device: devs[i]}
				dev, recovered = d, func() {
					d.armed.Store(true)
					log.Warn("ublk: taking back a device whose daemon was killed: writes it acknowledged in write-back since its last checkpoint "+
						"may have died with it, so the first flush fails rather than vouch for them", "export", e.Name, "why", lastRun)
				}
			}
			d, err := ublk.Start(dev, ublk.Options{
				ID: e.UBLK.DeviceID(), Queues: e.UBLK.Queues, Depth: e.UBLK.Depth, Logger: log, BeforeRecover: recovered,
			})
			if err != nil {
				return nil, nil, errors.Join(fmt.Errorf("exports[%d] (%q): ublk: %w", i, e.Name, err), stop())
			}
			logDevice(log, "ublk", e.Name, d)
			stops = append(stops, d.Stop)
		}
		if e.NBDDevice != "" {
			timeout, err := e.NBDDeadConnTimeout()
			if err != nil {
				return nil, nil, errors.Join(fmt.Errorf("exports[%d] (%q): %w", i, e.Name, err), stop())
			}
			identity := nbdIdentity(e)
			d, err := kernel.Attach(srv, e.NBDDevice, kernel.Options{
				Export: e.Name,
				// One connection per CPU, as nbd-client -C does: the kernel maps each to a hardware queue.
				Conns:           min(runtime.NumCPU(), 8),
				DeadConnTimeout: timeout,
				Identity:        identity,
				TakeOver:        takeLeft(cfg.RunDir, e.NBDDevice, identity) || lastRun == nil,
				Log:             log,
			})
			if err != nil {
				return nil, nil, errors.Join(fmt.Errorf("exports[%d] (%q): nbd_device: %w", i, e.Name, err), stop())
			}
			logDevice(log, "nbd", e.Name, d)
			if e.KeepNBDDevice() {
				stops = append(stops, d.Leave)
				left = append(left, leftDevice{e.NBDDevice, identity})
			} else {
				stops = append(stops, d.Detach)
			}
		}
	}
	return stop, left, nil
}

// A kernel NBD device that a stop leaves attached is taken over by the next tierblk only if it
// cannot have lost a write the kernel believes done. Writes acknowledged in write-back live on
// the SSD tier, and the records that find them are committed at checkpoints and, in between, kept
// in the tier's run log (in the run directory, run_dir), which outlives a kill of the process: the
// next start replays it. So a device is taken over when the export's cache found every record of
// its last run (cache.Recovered), or when the export has no SSD tier, and so no write-back; a
// device found otherwise is taken over only if a stop that ended with every volume flushed marked
// it left cleanly (a file in the run directory, removed when read), and released else
// (TestNBDDeviceRestart).

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

// leftDevice is a kernel NBD device a stop leaves attached, with its identity.
type leftDevice struct{ path, identity string }

func leftMark(dir, path string) string {
	return filepath.Join(dir, "left-"+filepath.Base(path))
}

// markLeft records that a clean stop left the devices, after every volume was flushed.
func markLeft(dir string, devs []leftDevice) error {
	var errs []error
	for _, d := range devs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.WriteFile(leftMark(dir, d.path), []byte(d.identity+"\n"), 0o644))
	}
	return errors.Join(errs...)
}

// takeLeft reports whether a clean stop left the device with this identity, and forgets the mark.
func takeLeft(dir, path, identity string) bool {
	b, err := os.ReadFile(leftMark(dir, path))
	_ = os.Remove(leftMark(dir, path))
	return err == nil && strings.TrimSpace(string(b)) == identity
}

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

// nbdIdentity is the backend identifier an export's kernel NBD device carries: what the data
// behind the device is, the backend (its URL without credentials) and the SSD tier in front of it
// (its device and metadata), hashed to keep it short. A restarted tierblk takes over a device
// that carries its own identity and refuses one that carries another's: the requests the kernel
// holds were meant for that data.
func nbdIdentity(e config.Export) string {
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
