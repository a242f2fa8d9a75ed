package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/nbd/kernel"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/ublk"
	"github.com/tierblk/tierblk/internal/volume"
)

// kernelDevice is a block device the kernel serves from an export: ublk or the kernel NBD client.
type kernelDevice interface {
	Path() string
}

// attachDevices creates the exports' ublk devices and attaches their kernel NBD devices. The
// returned stop removes them all, newest first, before the server stops, so that the kernel's
// last writes and flushes still reach the volumes. On failure it removes what it had created.
func attachDevices(cfg config.Config, devs []volume.Device, srv *server.Server, log *slog.Logger) (stop func() error, err error) {
	var stops []func() error
	stop = func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}
	for i, e := range cfg.Exports {
		if e.UBLK != nil {
			d, err := ublk.Start(devs[i], ublk.Options{
				ID: e.UBLK.DeviceID(), Queues: e.UBLK.Queues, Depth: e.UBLK.Depth, Logger: log,
			})
			if err != nil {
				return nil, errors.Join(fmt.Errorf("exports[%d] (%q): ublk: %w", i, e.Name, err), stop())
			}
			logDevice(log, "ublk", e.Name, d)
			stops = append(stops, d.Stop)
		}
		if e.NBDDevice != "" {
			// One connection per CPU, as nbd-client -C does: the kernel maps each to a hardware queue.
			d, err := kernel.Attach(srv, e.NBDDevice, e.Name, min(runtime.NumCPU(), 8), log)
			if err != nil {
				return nil, errors.Join(fmt.Errorf("exports[%d] (%q): nbd_device: %w", i, e.Name, err), stop())
			}
			logDevice(log, "nbd", e.Name, d)
			stops = append(stops, d.Detach)
		}
	}
	return stop, nil
}

func logDevice(log *slog.Logger, kind, export string, d kernelDevice) {
	log.Info("block device", "kind", kind, "export", export, "path", d.Path())
}
