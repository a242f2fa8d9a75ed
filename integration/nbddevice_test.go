package integration

import "testing"

// TestNBDDevice runs vm/guest/nbd-device.sh: tierblk attaches the kernel's NBD client to its
// write-back export with --nbd-device (no nbd-client), then ext4, fio verify, a clean stop and a
// kill -9 on /dev/nbd0. /dev/vda is the backend, /dev/vdb the SSD tier.
func TestNBDDevice(t *testing.T) {
	runVMWith(t, vmOptions{fio: true}, "vm/guest/nbd-device.sh", "256M", "128M")
}

// TestNBDDeviceRestart runs vm/guest/nbd-restart.sh: ext4 on tierblk's /dev/nbd0 under a writer
// that fsyncs every file, while tierblk is stopped (SIGTERM) and started again: the new tierblk
// takes the device over, the writer sees no error, the files are intact and the SSD tier is warm.
// After a kill -9 in write-back the device is released rather than taken over, and every fsynced
// file is there; without an SSD tier a kill -9 is taken over under the writer, with no error. A
// tierblk with another backend refuses the device.
func TestNBDDeviceRestart(t *testing.T) {
	runVMWith(t, vmOptions{}, "vm/guest/nbd-restart.sh", "256M", "128M")
}

// TestWriteBackOrderSSDLost runs vm/guest/writeback-order.sh: ext4 on tierblk's /dev/nbd0 in
// write-back with --write-back-order flush over a slow NAS (null_blk, 50 ms a request), a writer
// that fsyncs every file, and the SSD tier's device (null_blk) powered off for good while the NAS
// lags. The NAS alone then mounts and passes e2fsck -fn, and holds every file synced before the
// oldest epoch it lacked began.
func TestWriteBackOrderSSDLost(t *testing.T) {
	runVMWith(t, vmOptions{}, "vm/guest/writeback-order.sh")
}
