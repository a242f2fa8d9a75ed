package file

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/pkg/backend"
)

// statPath is the kernel's I/O statistics file of the block device under fi: the device itself,
// or the one holding the file system of a regular file. It is "" where there is none: tmpfs,
// overlayfs and btrfs give their files an anonymous device number that /sys/dev/block does not
// list.
func statPath(fi os.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	dev := st.Dev
	if isBlockDevice(fi) {
		dev = st.Rdev
	}
	p := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(dev), unix.Minor(dev))
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// DeviceTime implements backend.DeviceTimer.
func (f *File) DeviceTime() (backend.DeviceTime, error) {
	if f.statPath == "" {
		return backend.DeviceTime{}, fmt.Errorf("%w: no block device under %s to time", backend.ErrNotSupported, f.path)
	}
	b, err := os.ReadFile(f.statPath)
	if err != nil {
		return backend.DeviceTime{}, err
	}
	return parseStat(b)
}

// parseStat parses a block device's stat file (Documentation/block/stat.rst): of its fields, 1 and
// 5 count the reads and writes completed, 4 and 8 the milliseconds they took, 9 the requests in
// flight. Kernels since 4.18 add discard and flush fields after the eleventh; they are not read.
func parseStat(b []byte) (backend.DeviceTime, error) {
	f := bytes.Fields(b)
	if len(f) < 11 {
		return backend.DeviceTime{}, fmt.Errorf("block device stat: %d fields, want at least 11", len(f))
	}
	var v [9]uint64
	for i := range v {
		n, err := strconv.ParseUint(string(f[i]), 10, 64)
		if err != nil {
			return backend.DeviceTime{}, fmt.Errorf("block device stat: field %d: %w", i+1, err)
		}
		v[i] = n
	}
	ms := time.Duration(time.Millisecond)
	return backend.DeviceTime{Reads: v[0], ReadTime: time.Duration(v[3]) * ms, Writes: v[4], WriteTime: time.Duration(v[7]) * ms, InFlight: v[8]}, nil
}
