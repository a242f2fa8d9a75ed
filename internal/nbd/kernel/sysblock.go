package kernel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// deviceState is what /sys/block/nbdN shows of a device.
type deviceState struct {
	pid     int    // the thread that connected it; 0: not connected
	backend string // its backend identifier
	sectors uint64 // its size in 512-byte sectors
	queues  int    // its hardware queues: one per connection
}

// readState reads what /sys/block shows of device index; what it cannot read stays zero.
func readState(index uint32) deviceState {
	var st deviceState
	if b, err := os.ReadFile(sysBlockFile(index, "pid")); err == nil {
		st.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if b, err := os.ReadFile(sysBlockFile(index, "backend")); err == nil {
		st.backend = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile(sysBlockFile(index, "size")); err == nil {
		st.sectors, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	if ents, err := os.ReadDir(sysBlockFile(index, "mq")); err == nil {
		st.queues = len(ents)
	}
	return st
}

// processAlive reports whether the thread pid exists (the kernel records the connecting
// thread's id; /proc/ID exists for threads too).
func processAlive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return !errors.Is(err, os.ErrNotExist)
}

// waitReleased waits until the kernel shows device index with size 0: it has dropped its
// configuration, which it keeps while anyone has the device open.
func waitReleased(path string, index uint32, timeout time.Duration) error {
	size, done := waitSysBlock(sysBlockFile(index, "size"), timeout, func(v string) bool { return v == "0" })
	if !done {
		return fmt.Errorf("nbd: %s still has %s sectors %v after the disconnect: something keeps it open (a mounted file system?); its I/O fails until it is closed",
			path, size, timeout)
	}
	return nil
}

// waitIdle waits until the kernel has no request of device index in flight, or timeout passes.
func waitIdle(index uint32, timeout time.Duration) {
	// The file holds the reads and the writes in flight.
	waitSysBlock(sysBlockFile(index, "inflight"), timeout, func(v string) bool { return strings.Join(strings.Fields(v), " ") == "0 0" })
}

// sysBlockFile is the path of an attribute of NBD device index.
func sysBlockFile(index uint32, attr string) string {
	return filepath.Join(sysBlock, fmt.Sprintf("nbd%d", index), attr)
}

// waitSysBlock polls the attribute file name until ok accepts its value (spaces trimmed) or
// timeout passes. It returns the last value, and done true when ok accepted it or the file is
// gone (the device with it).
func waitSysBlock(name string, timeout time.Duration, ok func(string) bool) (value string, done bool) {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(name)
		value = strings.TrimSpace(string(b))
		if err != nil || ok(value) {
			return value, true
		}
		if time.Now().After(deadline) {
			return value, false
		}
		time.Sleep(releasePollPeriod)
	}
}
