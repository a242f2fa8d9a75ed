package csi

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The node plugin mounts with mount(2) itself: its image (FROM scratch) has no mount binary.
// It runs the file system tools (mkfs.*, resize2fs, xfs_growfs), which must be on its PATH.

// deviceSize is the size in bytes of the block device at path.
func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

// fsOn says which file system the device at path holds, from its superblock ("" for none that
// NodeStage makes), and the file system's size in bytes. blkid is not at hand (a FROM scratch
// image), and these two superblocks are simple to read.
func fsOn(path string) (kind string, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	b := make([]byte, 2048)
	if _, err := f.ReadAt(b, 0); err != nil {
		return "", 0, fmt.Errorf("read the superblock of %s: %w", path, err)
	}
	// XFS: "XFSB", then the block size (big-endian u32) and the count of data blocks (u64).
	if string(b[:4]) == "XFSB" {
		bs, blocks := binary.BigEndian.Uint32(b[4:8]), binary.BigEndian.Uint64(b[8:16])
		return "xfs", int64(bs) * int64(blocks), nil
	}
	// ext2/3/4: the superblock at 1024, its magic 0xEF53 at offset 56 in it.
	sb := b[1024:]
	if binary.LittleEndian.Uint16(sb[56:58]) == 0xEF53 {
		blocks := uint64(binary.LittleEndian.Uint32(sb[4:8]))
		const incompat64bit = 0x80
		if binary.LittleEndian.Uint32(sb[96:100])&incompat64bit != 0 {
			blocks |= uint64(binary.LittleEndian.Uint32(sb[0x150:0x154])) << 32
		}
		bs := int64(1024) << binary.LittleEndian.Uint32(sb[24:28])
		return "ext", bs * int64(blocks), nil
	}
	return "", 0, nil
}

// tool finds a file system tool on PATH, or says what the plugin's image lacks.
func tool(name, pkg string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s is not on the node plugin's PATH (%s): its image must carry %s", name, os.Getenv("PATH"), pkg)
	}
	return p, nil
}

// run runs a tool and returns its output in the error when it fails.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// mkfs makes a file system of type fs ("" is ext4) on dev.
func mkfs(fs, dev string) error {
	fs = fsTypeOf(fs)
	if fs == "xfs" {
		p, err := tool("mkfs.xfs", "xfsprogs")
		if err != nil {
			return err
		}
		return run(p, "-f", "-q", dev)
	}
	p, err := tool("mkfs."+fs, "e2fsprogs")
	if err != nil {
		return err
	}
	return run(p, "-F", "-q", dev)
}

// growFS grows the file system on dev, mounted at dir, to the size of dev, if it is smaller: a
// volume expanded while not staged (offline) has a device larger than its file system.
func growFS(dev, dir string) error {
	kind, fsSize, err := fsOn(dev)
	if err != nil {
		return err
	}
	devSize, err := deviceSize(dev)
	if err != nil {
		return err
	}
	// A remainder under 64 KiB is the file system rounding the device down to its blocks, not an
	// expansion: volumes grow by whole MiB.
	if kind == "" || devSize-fsSize < 64<<10 {
		return nil
	}
	if kind == "xfs" {
		p, err := tool("xfs_growfs", "xfsprogs")
		if err != nil {
			return err
		}
		return run(p, dir)
	}
	p, err := tool("resize2fs", "e2fsprogs")
	if err != nil {
		return err
	}
	return run(p, dev)
}

// mountOptions splits CSI mount flags into mount(2)'s flags and the file system's own options.
func mountOptions(flags []string) (uintptr, string) {
	known := map[string]uintptr{
		"ro": unix.MS_RDONLY, "noatime": unix.MS_NOATIME, "nodiratime": unix.MS_NODIRATIME,
		"relatime": unix.MS_RELATIME, "strictatime": unix.MS_STRICTATIME, "lazytime": unix.MS_LAZYTIME,
		"nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV, "noexec": unix.MS_NOEXEC,
		"sync": unix.MS_SYNCHRONOUS, "dirsync": unix.MS_DIRSYNC, "rw": 0, "defaults": 0,
	}
	var mflags uintptr
	var data []string
	for _, f := range flags {
		for _, o := range strings.Split(f, ",") {
			if m, ok := known[o]; ok {
				mflags |= m
			} else if o != "" {
				data = append(data, o)
			}
		}
	}
	return mflags, strings.Join(data, ",")
}

// mount is an entry of the mount table: what is mounted at a mount point.
type mount struct {
	dev  string // the device number of the file system, "MAJOR:MINOR"
	root string // the path in that file system that is mounted (a bind mount's source)
	fs   string // the file system's type
}

// mountPoints maps each mount point in the mount table of this process to what is mounted there.
func mountPoints() (map[string]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountInfo(f)
}

// parseMountInfo reads /proc/PID/mountinfo: "ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS
// [TAGS...] - FSTYPE SOURCE SUPEROPTIONS", paths with space, tab, newline and backslash escaped
// in octal.
func parseMountInfo(r io.Reader) (map[string]mount, error) {
	points := map[string]mount{}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+1 >= len(fields) {
			continue
		}
		points[unescapeOctal(fields[4])] = mount{dev: fields[2], root: unescapeOctal(fields[3]), fs: fields[sep+1]}
	}
	return points, s.Err()
}

func unescapeOctal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountedElsewhere lists where, but at staging, the volume on device dev is mounted: its file
// system (a mount of the device's number), or for a block volume (block) its device node bound
// onto a file (a mount of /dev's devtmpfs whose root is the node).
func mountedElsewhere(dev, staging string, block bool) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return nil, fmt.Errorf("device %s: %w", dev, err)
	}
	points, err := mountPoints()
	if err != nil {
		return nil, err
	}
	num := fmt.Sprintf("%d:%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
	var others []string
	for p, m := range points {
		if p == staging {
			continue
		}
		if !block && m.dev == num || block && m.fs == "devtmpfs" && m.root == "/"+filepath.Base(dev) {
			others = append(others, p)
		}
	}
	slices.Sort(others)
	return others, nil
}

// isMountPoint reports whether path is a mount point.
func isMountPoint(path string) (bool, error) {
	points, err := mountPoints()
	if err != nil {
		return false, err
	}
	_, ok := points[path]
	return ok, nil
}

// unmount unmounts path if it is a mount point; a path that is not is left as it is.
func unmount(path string) error {
	mounted, err := isMountPoint(path)
	if err != nil || !mounted {
		return err
	}
	if err := unix.Unmount(path, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}

// bindMount mounts src on target (a directory for a directory, a file for a device), read-only
// if ro: a bind mount takes MS_RDONLY only in a remount.
func bindMount(src, target string, ro bool) error {
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", src, target, err)
	}
	if !ro {
		return nil
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		unix.Unmount(target, 0)
		return fmt.Errorf("remount %s read-only: %w", target, err)
	}
	return nil
}
