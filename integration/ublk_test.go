package integration

import "testing"

// The ublk tests boot the test kernel (Linux 6.12, ublk_drv loaded) and run tierblk --ublk over
// the write-back cache: backend /dev/vda (256M), SSD tier /dev/vdb (64M), metadata on the
// guest's tmpfs. See the guest scripts for what each checks.

// TestUBLK: ext4 through /dev/ublkb0 across a remount, fio randwrite with crc32c verify at
// iodepth 32, a clean SIGTERM that removes the device, and a kill -9 under fio that fails its
// I/O instead of hanging it.
func TestUBLK(t *testing.T) {
	runVMWith(t, vmOptions{fio: true}, "vm/guest/ublk.sh", "256M", "64M")
}

// TestUBLKRecovery: with --ublk-id 0, a restarted daemon replaces the stopped device a killed
// daemon left, and takes back (user recovery) the device of a daemon killed with ext4 mounted,
// which then keeps working without an unmount.
func TestUBLKRecovery(t *testing.T) {
	runVMWith(t, vmOptions{fio: true}, "vm/guest/ublk-recovery.sh", "256M", "64M")
}

// TestUBLKRestart runs vm/guest/ublk-restart.sh: ext4 on /dev/ublkb0 (--ublk-id 0, write-back
// with an SSD tier) under a writer that fsyncs every file, while tierblk is stopped (SIGTERM) and
// started again: the stop leaves the device, the new tierblk takes it back, the writer sees no
// error, the files are intact and data written before the stop is read from the SSD tier. A
// tierblk with another backend refuses the device; --ublk-on-stop remove removes it.
func TestUBLKRestart(t *testing.T) {
	runVMWith(t, vmOptions{}, "vm/guest/ublk-restart.sh", "256M", "128M")
}

// TestUBLKUnprivileged runs vm/guest/ublk-unprivileged.sh: a user without capabilities (as in a
// container that is not privileged) serves an unprivileged ublk device once /dev/ublk-control
// is open to it and udev's part gives the device's nodes to their owner; only the owner may open
// it; a stop removes it; without the nodes handed over the error says what is missing.
func TestUBLKUnprivileged(t *testing.T) {
	runVM(t, "vm/guest/ublk-unprivileged.sh")
}
