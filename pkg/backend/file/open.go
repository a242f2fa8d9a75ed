package file

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/tierblk/tierblk/internal/units"
	"github.com/tierblk/tierblk/internal/uring"
	"github.com/tierblk/tierblk/pkg/backend"
	"golang.org/x/sys/unix"
)

// config is what a file: URL says.
type config struct {
	path   string
	direct directMode
	size   int64 // 0: not given
	noRing bool  // uring=false
	// allocate=true: the file's blocks are reserved at open (fallocate), so that a full file
	// system refuses the open rather than a write later (a cache's SSD tier).
	allocate bool
}

// directMode says which requests bypass the page cache.
type directMode uint8

var validParams = []string{"allocate", "direct", "size", "uring"}

func parseURL(u *url.URL) (config, error) {
	var c config
	if u.Scheme != "file" {
		return c, fmt.Errorf("file backend: scheme %q is not file", u.Scheme)
	}
	if u.Opaque != "" || u.Path == "" {
		return c, fmt.Errorf("file backend: the URL needs an absolute path, as in file:///srv/disk.img")
	}
	if u.Host != "" && u.Host != "localhost" {
		return c, fmt.Errorf("file backend: host %q: only local files can be served (write file:///path)", u.Host)
	}
	if u.User != nil {
		return c, fmt.Errorf("file backend: a file URL takes no user name")
	}
	if u.Fragment != "" {
		return c, fmt.Errorf("file backend: a '#' in the path must be written %%23")
	}
	c.path = filepath.Clean(u.Path)
	q := u.Query()
	var unknown []string
	for k, v := range q {
		if !slices.Contains(validParams, k) {
			unknown = append(unknown, k)
		} else if len(v) > 1 {
			return c, fmt.Errorf("file backend: parameter %s given %d times", k, len(v))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return c, fmt.Errorf("file backend: unknown parameter %s; valid: %s",
			strings.Join(unknown, ", "), strings.Join(validParams, ", "))
	}
	if v := q.Get("direct"); v == "reads" {
		c.direct = directReads
	} else if q.Has("direct") {
		d, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("file backend: direct=%q: want true, false or reads", v)
		}
		if d {
			c.direct = directAll
		}
	}
	if q.Has("allocate") {
		a, err := strconv.ParseBool(q.Get("allocate"))
		if err != nil {
			return c, fmt.Errorf("file backend: allocate=%q: want true or false", q.Get("allocate"))
		}
		c.allocate = a
	}
	if q.Has("uring") {
		u, err := strconv.ParseBool(q.Get("uring"))
		if err != nil {
			return c, fmt.Errorf("file backend: uring=%q: want true or false", q.Get("uring"))
		}
		c.noRing = !u
	}
	if q.Has("size") {
		s, err := units.ParseSize(q.Get("size"))
		if err != nil {
			return c, fmt.Errorf("file backend: size: %w", err)
		}
		if s == 0 {
			return c, fmt.Errorf("file backend: size=%s: a device needs at least one byte", q.Get("size"))
		}
		c.size = s
	}
	return c, nil
}

// Open is the backend.Factory for file:///path.
func Open(u *url.URL, opts backend.Options) (backend.Backend, error) {
	c, err := parseURL(u)
	if err != nil {
		return nil, backend.BadURL(err)
	}
	f, err := open(c, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	return f.served(), nil
}

// served is f as Open returns it: with the methods of its ring where it has one (ringFile).
func (f *File) served() backend.Backend {
	if f.ring != nil {
		return ringFile{f}
	}
	return f
}

func open(c config, readOnly bool) (*File, error) {
	fi, err := os.Stat(c.path)
	create := false
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := checkCreate(c, readOnly); err != nil {
			return nil, err
		}
		create = true
	case err != nil:
		return nil, err
	case fi.Mode().IsRegular(), isBlockDevice(fi):
	default:
		return nil, fmt.Errorf("%s is a %s, not a regular file or block device", c.path, describeMode(fi.Mode()))
	}

	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	if c.direct == directAll {
		flag |= syscall.O_DIRECT
	}
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	} else if isBlockDevice(fi) && !readOnly {
		flag |= os.O_EXCL // fails with EBUSY if the device is mounted or held by a driver
	}
	osf, err := os.OpenFile(c.path, flag, 0o644)
	if err != nil {
		if create && !errors.Is(err, fs.ErrExist) {
			// O_EXCL made any file there ours: the kernel creates it before it refuses, say, O_DIRECT.
			_ = os.Remove(c.path)
		}
		return nil, explainOpenError(c, readOnly, err)
	}
	f, err := setup(osf, c, readOnly, create)
	if err == nil && c.direct == directReads {
		err = f.openDirectReader(c)
	}
	if err == nil && f.directRead && !c.noRing {
		f.openRing()
	}
	if err != nil {
		_ = osf.Close()
		if create {
			_ = os.Remove(c.path)
		}
		return nil, err
	}
	return f, nil
}

// ringDepth is how many direct reads and writes the ring carries at once; more wait for a slot.
const ringDepth = 256

// openRing sets up the io_uring that serves direct reads, and direct writes other than FUA with
// direct=true. Where the kernel refuses io_uring, or cannot set one up, they keep to pread and
// pwrite: the ring only makes them cheaper.
func (f *File) openRing() {
	ring, err := uring.NewFile(int(f.r.Fd()), f.path, ringDepth)
	if err == nil {
		f.ring = ring
		f.rfd, f.wfd = int(f.r.Fd()), int(f.f.Fd())
	}
}

// openDirectReader opens the second, O_DIRECT descriptor of direct=reads. It is opened through
// /proc/self/fd so that it is the same file even if the path was replaced meanwhile.
func (f *File) openDirectReader(c config) error {
	r, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.f.Fd()), os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("the file system of %s does not support direct I/O (%w); drop direct=reads: %w", c.path, err, backend.ErrNoDirectIO)
		}
		return err
	}
	f.r = r
	return nil
}

// newFileBlock is what the size of a file the backend creates must be a multiple of: 4 KiB, the
// block the cache keeps its state in and a ublk device's logical block, and what direct I/O needs
// (dioAlign), so that the file can be served with direct= later. A file of another size, made from
// a typo or a decimal size, would leave a partial block at its end that no client expects.
const newFileBlock = 4 << 10

// checkCreate says why a missing file cannot be created, if it cannot.
func checkCreate(c config, readOnly bool) error {
	switch {
	case c.size == 0:
		return backend.BadURL(fmt.Errorf("%s does not exist; add ?size=SIZE to create it (for example file://%s?size=1GiB)",
			c.path, c.path))
	case readOnly:
		return fmt.Errorf("%s does not exist, and a read-only backend does not create it", c.path)
	case c.size%newFileBlock != 0:
		return backend.BadURL(fmt.Errorf("cannot create %s of %d bytes (size=): a new file must be a whole number of %s blocks; use %s",
			c.path, c.size, units.FormatSize(newFileBlock), units.Nearest(c.size, newFileBlock)))
	}
	dir := filepath.Dir(c.path)
	di, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot create %s: directory %s does not exist", c.path, dir)
	}
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", c.path, err)
	}
	if !di.IsDir() {
		return fmt.Errorf("cannot create %s: %s is not a directory", c.path, dir)
	}
	return nil
}

func isBlockDevice(fi fs.FileInfo) bool {
	return fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0
}

func describeMode(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

func explainOpenError(c config, readOnly bool, err error) error {
	switch {
	case !readOnly && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EROFS)):
		return fmt.Errorf("%s cannot be opened for writing (%w); fix its permissions, or open it read-only", c.path, err)
	case c.direct == directAll && errors.Is(err, unix.EINVAL):
		return fmt.Errorf("the file system of %s does not support direct I/O (%w); drop direct=true: %w", c.path, err, backend.ErrNoDirectIO)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s is in use (mounted, or held by another program): %w", c.path, err)
	}
	return err
}

// setup locks the opened file and learns its size.
func setup(osf *os.File, c config, readOnly, created bool) (*File, error) {
	rc, err := osf.SyscallConn()
	if err != nil {
		return nil, err
	}
	f := &File{f: osf, r: osf, rc: rc, path: c.path, readOnly: readOnly, sector: 1,
		directRead: c.direct != directNone, directWrite: c.direct == directAll}
	how := unix.LOCK_EX
	if readOnly {
		how = unix.LOCK_SH
	}
	if err := f.control("flock", func(fd int) error { return unix.Flock(fd, how|unix.LOCK_NB) }); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is in use by another tierblk or program (it holds a lock on it)", c.path)
		}
		return nil, err
	}
	fi, err := osf.Stat()
	if err != nil {
		return nil, err
	}
	if created {
		if err := osf.Truncate(c.size); err != nil { // sparse: no block is allocated
			return nil, err
		}
		fi, err = osf.Stat()
		if err != nil {
			return nil, err
		}
	}
	f.blockDev = isBlockDevice(fi)
	f.size = fi.Size()
	f.statPath = statPath(fi)
	if f.blockDev {
		if err := f.blockDevGeometry(); err != nil {
			return nil, err
		}
	}
	switch {
	case f.size == 0:
		return nil, fmt.Errorf("%s is empty; a device needs at least one byte", c.path)
	case c.size != 0 && c.size != f.size:
		return nil, fmt.Errorf("%s is %s (%d bytes) but size=%s (%d bytes) was asked; it is not resized",
			c.path, units.FormatSize(f.size), f.size, units.FormatSize(c.size), c.size)
	case c.direct != directNone && !f.blockDev && f.size%dioAlign != 0:
		return nil, fmt.Errorf("%s is %d bytes; direct I/O needs a size that is a multiple of %d",
			c.path, f.size, dioAlign)
	}
	if c.allocate && !f.blockDev && !readOnly {
		err := f.control("fallocate", func(fd int) error { return unix.Fallocate(fd, 0, 0, f.size) })
		switch {
		case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
			return nil, fmt.Errorf("%s needs %s on its file system, which has less free: %w", c.path, units.FormatSize(f.size), err)
		case errors.Is(err, unix.EOPNOTSUPP):
			// A file system that cannot reserve blocks: the file stays sparse.
		case err != nil:
			return nil, err
		}
	}
	return f, nil
}

// blockDevGeometry asks the kernel for a block device's size and logical block size.
func (f *File) blockDevGeometry() error {
	var size uint64
	if err := f.control("ioctl BLKGETSIZE64", func(fd int) error {
		return ioctlPtr(fd, unix.BLKGETSIZE64, unsafe.Pointer(&size))
	}); err != nil {
		return err
	}
	var sector uint32
	if err := f.control("ioctl BLKSSZGET", func(fd int) (err error) {
		sector, err = unix.IoctlGetUint32(fd, unix.BLKSSZGET)
		return err
	}); err != nil {
		return err
	}
	f.size, f.sector = int64(size), int64(sector)
	return nil
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

const (
	directNone  directMode = iota
	directAll              // direct=true
	directReads            // direct=reads: a second descriptor, opened O_DIRECT, serves reads
)
