// Package ublk is tierblk's ublk server: it creates /dev/ublkbN through /dev/ublk-control and
// serves its requests from a volume.Device over one io_uring per queue.
package ublk

import (
	"errors"
	"log/slog"

	"github.com/tierblk/tierblk/internal/volume"
)

// Options configure a device.
type Options struct {
	ID     int // device number, -1 for any
	Queues int // 0: one per CPU
	Depth  int // 0: 128
	Logger *slog.Logger
}

// Device is a running ublk device.
type Device struct{}

// Start creates (or takes back) the device and serves dev on it.
func Start(dev volume.Device, o Options) (*Device, error) {
	return nil, errors.New("ublk: not implemented yet")
}

// Path is the block device's path, /dev/ublkbN.
func (d *Device) Path() string { return "" }

// Stop removes the device.
func (d *Device) Stop() error { return nil }
