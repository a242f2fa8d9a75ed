package integration

import "testing"

// TestNBDDevice runs vm/guest/nbd-device.sh: tierblk attaches the kernel's NBD client to its
// write-back export with --nbd-device (no nbd-client), then ext4, fio verify, a clean stop and a
// kill -9 on /dev/nbd0. /dev/vda is the backend, /dev/vdb the SSD tier.
func TestNBDDevice(t *testing.T) {
	runVMWith(t, vmOptions{fio: true}, "vm/guest/nbd-device.sh", "256M", "128M")
}
