// Package file is the backend for a local regular file or block device: file:///srv/disk.img,
// file:///dev/sdb. Query parameters: size=SIZE creates a missing regular file, sparse, at that size;
// direct=true bypasses the page cache with O_DIRECT; direct=reads bypasses it for reads only, so
// that writes are absorbed by the page cache and reach the disk at the next flush (a cache's SSD
// tier: its checkpoints flush before they commit, and its reads must not keep a second copy);
// allocate=true reserves the file's blocks at open (fallocate), so that a full file system fails
// the open rather than a write later (the SSD tier's file).
//
// The file is locked (flock) while open, exclusively when writable and shared when read-only, so two
// tierblk processes never serve one image. This package must never change the size of an existing
// file or device, and never fall back to read-only when writing was asked for.
//
// Trim and write-zeroes are passed to the kernel (fallocate on files, BLKDISCARD and fallocate on
// block devices); where the file system or device refuses, trim does nothing (it is advisory) and
// write-zeroes writes zeroes. Needs Linux 4.7 or later (pwritev2 with RWF_DSYNC for FUA writes).
package file

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/blocklock"
	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/uring"
	"github.com/tierblk/tierblk/pkg/backend"
)

// File is an open file or block device. It implements backend.Trimmer, backend.ZeroWriter,
// backend.FUAWriter, backend.CachedReader, backend.ReadOnlyReporter, backend.Waiter,
// backend.DeviceTimer, backend.AsyncReader, backend.RingReader and backend.RingWriter.
type File struct {
	f  *os.File
	rc syscall.RawConn // to run syscalls on f's descriptor without racing Close
	// r serves reads: f itself, or with direct=reads a second descriptor opened with O_DIRECT.
	r *os.File
	// ring, if not nil, serves the direct reads of r, and the direct writes other than FUA when
	// r is f (direct=true): a pread or pwrite per request costs an OS thread asleep in the
	// kernel, which the Go scheduler hands its work away from and back to, and, on a virtual
	// disk, a doorbell each (bench cache --parts hits; bench kernel's randw row, where a write
	// back's writes wait on the NAS).
	ring *uring.File
	// rfd and wfd are r's and f's descriptors, for the callers' rings (ReadAtOn, WriteAtOn), set
	// with ring.
	rfd, wfd int
	path     string
	size     int64
	readOnly bool
	// directRead and directWrite say which requests need O_DIRECT's alignment.
	directRead, directWrite bool
	blockDev                bool
	// sector is the alignment the kernel needs for discard and fallocate: the logical block size
	// of a block device, 1 for a regular file.
	sector int64
	closed atomic.Bool
	// ringOps counts the requests in flight on callers' rings (ReadAtOn, WriteAtOn), which Close
	// waits for; ringMu, held shared while one starts, lets none start once Close has begun.
	ringOps sync.WaitGroup
	ringMu  sync.RWMutex
	waits   atomic.Uint64 // requests that waited on the disk (Waits)
	// statPath is the kernel's statistics file of the block device under the file (DeviceTime),
	// "" where there is none.
	statPath string

	// What the file system or device refused once is not asked again.
	noTrim, noPunch, noZeroRange atomic.Bool

	// rmwLocks serialises read-modify-write of partial blocks in direct mode, striped by block number.
	rmwLocks blocklock.Stripes
}

// control runs fn on the file's descriptor, again while it fails with EINTR; Close waits for it, so
// the descriptor cannot be reused meanwhile. Errors come back as *fs.PathError naming op and the
// file.
func (f *File) control(op string, fn func(fd int) error) error {
	var err error
	cerr := f.rc.Control(func(fd uintptr) {
		for err = fn(int(fd)); err == unix.EINTR; err = fn(int(fd)) {
		}
	})
	if cerr != nil {
		return f.closedOr(cerr)
	}
	if err != nil {
		return &fs.PathError{Op: op, Path: f.path, Err: err}
	}
	return nil
}

// closedOr returns ErrClosed if the file was closed (whatever error that caused), else err.
func (f *File) closedOr(err error) error {
	if f.closed.Load() {
		return fmt.Errorf("%w: %s", backend.ErrClosed, f.path)
	}
	return err
}

// check validates a request before it reaches the kernel.
func (f *File) check(off, length int64, write bool) error {
	switch {
	case f.closed.Load():
		return fmt.Errorf("%w: %s", backend.ErrClosed, f.path)
	case write && f.readOnly:
		return fmt.Errorf("%w: %s", backend.ErrReadOnly, f.path)
	}
	return backend.CheckRange(off, length, f.size)
}

// Size implements backend.Backend.
func (f *File) Size() int64 { return f.size }

// ReadOnly implements backend.ReadOnlyReporter.
func (f *File) ReadOnly() bool { return f.readOnly }

// Waits implements backend.Waiter: direct reads and writes, FUA writes and flushes wait on the
// disk; the rest are copies to and from the page cache.
func (f *File) Waits() uint64 { return f.waits.Load() }

// ReadAt implements backend.Backend.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(off, int64(len(p)), false); err != nil {
		return 0, err
	}
	if f.directRead {
		f.waits.Add(1)
	}
	var err error
	if f.directRead && !aligned(p, off) {
		err = f.bounceRead(p, off)
	} else {
		err = f.pread(p, off)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// ringFile is a File with its io_uring (read direct, the ring not refused): the only kind that
// starts reads without waiting (backend.AsyncReader) and runs requests on a caller's ring
// (backend.RingReader, backend.RingWriter). Open returns a File without a ring as it is, so that a
// caller that asks whether the backend can start its reads (the cache, for its misses) is told no
// once, at the start, rather than by every read: a miss taken on for a backend that then declines
// it costs a hand-off more than the server's own ReadAt.
type ringFile struct{ *File }

// ReadAtAsync implements backend.AsyncReader: a direct read through the ring, when the request is
// aligned for O_DIRECT as it is. It keeps no goroutine waiting, so it is not counted in Waits.
func (f ringFile) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	if !aligned(p, off) || f.check(off, int64(len(p)), false) != nil {
		return false
	}
	err := f.ring.ReadAtAsync(p, off, func(_ int, err error) { done(f.readResult(off, err)) })
	return err == nil
}

// ReadAtOn implements backend.RingReader: a direct read on the caller's ring, under the
// conditions of ReadAtAsync.
func (f ringFile) ReadAtOn(r backend.Ring, p []byte, off int64, done func(error)) bool {
	if !aligned(p, off) || f.check(off, int64(len(p)), false) != nil {
		return false
	}
	if !f.ringBegin() {
		return false
	}
	if !r.ReadFile(f.rfd, p, off, func(_ int, err error) {
		done(f.readResult(off, f.pathError("read", err)))
		f.ringOps.Done()
	}) {
		f.ringOps.Done()
		return false
	}
	return true
}

// WriteAtOn implements backend.RingWriter: a direct write on the caller's ring, with RWF_DSYNC
// if fua, where the file is written direct and the request aligned.
func (f ringFile) WriteAtOn(r backend.Ring, p []byte, off int64, fua bool, done func(error)) bool {
	if !f.directWrite || !aligned(p, off) || f.check(off, int64(len(p)), true) != nil {
		return false
	}
	if !f.ringBegin() {
		return false
	}
	if !r.WriteFile(f.wfd, p, off, fua, func(_ int, err error) {
		done(f.closedOr(f.pathError("write", err)))
		f.ringOps.Done()
	}) {
		f.ringOps.Done()
		return false
	}
	return true
}

// ringBegin counts an op about to start on a caller's ring, unless f is closed, and has Close
// wait for it: the op uses f's descriptors. The op's end, or its failure to start, calls
// ringOps.Done.
func (f *File) ringBegin() bool {
	f.ringMu.RLock()
	defer f.ringMu.RUnlock()
	if f.closed.Load() {
		return false
	}
	f.ringOps.Add(1)
	return true
}

// pathError names the file in a bare error from a ring (an errno); io.EOF stays as it is.
func (f *File) pathError(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &fs.PathError{Op: op, Path: f.path, Err: err}
}

// ReadAtCached implements backend.CachedReader. With direct=reads it reads through the page cache,
// which every write goes through: pages written a moment ago come back as a copy, where a direct
// read would wait for the kernel to write them to the disk first (the destager of a cache's SSD
// tier reads what it writes back that way, and waited on every batch). Otherwise it is ReadAt.
func (f *File) ReadAtCached(p []byte, off int64) (int, error) {
	if f.r == f.f {
		return f.ReadAt(p, off)
	}
	if err := f.check(off, int64(len(p)), false); err != nil {
		return 0, err
	}
	if err := f.preadFrom(f.f, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt implements backend.Backend.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	return f.write(p, off, false)
}

// WriteAtFUA implements backend.FUAWriter: the write is durable when it returns (RWF_DSYNC).
func (f *File) WriteAtFUA(p []byte, off int64) (int, error) {
	return f.write(p, off, true)
}

func (f *File) write(p []byte, off int64, dsync bool) (int, error) {
	if err := f.check(off, int64(len(p)), true); err != nil {
		return 0, err
	}
	if f.directWrite || dsync {
		f.waits.Add(1)
	}
	if err := f.writeData(p, off, dsync); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeData writes p at off, through the bounce buffer when direct I/O needs it.
func (f *File) writeData(p []byte, off int64, dsync bool) error {
	if f.directWrite && !aligned(p, off) {
		return f.bounceWrite(p, off, dsync)
	}
	return f.pwrite(p, off, dsync)
}

// pread reads all of p at off from the descriptor that serves reads.
func (f *File) pread(p []byte, off int64) error {
	if f.ring != nil {
		_, err := f.ring.ReadAt(p, off)
		return f.readResult(off, err)
	}
	return f.preadFrom(f.r, p, off)
}

// preadFrom reads all of p at off from d. os.File retries EINTR and short reads.
func (f *File) preadFrom(d *os.File, p []byte, off int64) error {
	_, err := d.ReadAt(p, off)
	return f.readResult(off, err)
}

// readResult is a whole read's outcome: an early end of the file, or an error.
func (f *File) readResult(off int64, err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("read %s at %d: the file ends early (truncated by someone else?): %w",
			f.path, off, io.ErrUnexpectedEOF)
	}
	if err != nil {
		return f.closedOr(err)
	}
	return nil
}

// pwrite writes all of p at off; with dsync the data is durable when it returns. The loop goes on
// after a short write or EINTR, from where it stopped.
func (f *File) pwrite(p []byte, off int64, dsync bool) error {
	if !dsync && f.directWrite && f.ring != nil {
		// Aligned (writeData): the ring's descriptor is f's, opened O_DIRECT.
		if _, err := f.ring.WriteAt(p, off); err != nil {
			return f.closedOr(err)
		}
		return nil
	}
	if !dsync {
		_, err := f.f.WriteAt(p, off) // retries EINTR and short writes
		if err != nil {
			return f.closedOr(err)
		}
		return nil
	}
	return f.control("pwritev2", func(fd int) error {
		// Copies: a closure that changed p and off themselves would put them on the heap for
		// every write, dsync or not.
		p, off := p, off
		for len(p) > 0 {
			n, err := unix.Pwritev2(fd, [][]byte{p}, off, unix.RWF_DSYNC)
			switch {
			case err == unix.EINTR:
				continue
			case err != nil:
				return err
			case n == 0:
				return io.ErrShortWrite
			}
			p, off = p[n:], off+int64(n)
		}
		return nil
	})
}

// Flush implements backend.Backend with fdatasync.
func (f *File) Flush() error {
	if f.closed.Load() {
		return fmt.Errorf("%w: %s", backend.ErrClosed, f.path)
	}
	f.waits.Add(1)
	return f.control("fdatasync", unix.Fdatasync)
}

// Trim implements backend.Trimmer. On a regular file it punches a hole; on a block device it
// discards the whole logical blocks inside the range. Where that is refused it does nothing.
func (f *File) Trim(off, length int64) error {
	if err := f.check(off, length, true); err != nil {
		return err
	}
	s, e := inner(off, length, f.sector)
	if s >= e {
		return nil
	}
	if f.blockDev {
		r := [2]uint64{uint64(s), uint64(e - s)}
		_, err := f.try(&f.noTrim, "ioctl BLKDISCARD", func(fd int) error {
			return ioctlPtr(fd, unix.BLKDISCARD, unsafe.Pointer(&r))
		})
		return err
	}
	_, err := f.tryFallocate(&f.noPunch, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, s, e-s)
	return err
}

// WriteZeroes implements backend.ZeroWriter. With mayUnmap it punches a hole; otherwise, or where
// that is refused, it asks for a zeroed allocated range; where that is refused too it writes zeroes.
// On a block device the partial logical blocks at the ends are written as data.
func (f *File) WriteZeroes(off, length int64, mayUnmap bool) error {
	if err := f.check(off, length, true); err != nil {
		return err
	}
	s, e := inner(off, length, f.sector)
	if s >= e {
		return f.writeZeroData(off, length)
	}
	if err := f.writeZeroData(off, s-off); err != nil {
		return err
	}
	if err := f.writeZeroData(e, off+length-e); err != nil {
		return err
	}
	if mayUnmap {
		done, err := f.tryFallocate(&f.noPunch, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, s, e-s)
		if done || err != nil {
			return err
		}
	}
	done, err := f.tryFallocate(&f.noZeroRange, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, s, e-s)
	if done || err != nil {
		return err
	}
	return f.writeZeroData(s, e-s)
}

// try runs fn unless refused says the kernel refused it before. done reports that fn succeeded;
// a refusal (EOPNOTSUPP) is remembered in refused and is not an error.
func (f *File) try(refused *atomic.Bool, op string, fn func(fd int) error) (done bool, err error) {
	if refused.Load() {
		return false, nil
	}
	err = f.control(op, fn)
	if errors.Is(err, unix.EOPNOTSUPP) {
		refused.Store(true)
		return false, nil
	}
	return err == nil, err
}

func (f *File) tryFallocate(refused *atomic.Bool, mode uint32, off, length int64) (bool, error) {
	return f.try(refused, "fallocate", func(fd int) error { return unix.Fallocate(fd, mode, off, length) })
}

// inner returns the largest range [s, e) inside [off, off+length) whose ends are multiples of a.
// s >= e when there is none.
func inner(off, length, a int64) (s, e int64) {
	return (off + a - 1) / a * a, (off + length) / a * a
}

// zeroes is a shared, aligned buffer of zeroes; nothing writes into it.
var zeroes = sync.OnceValue(func() []byte { return bufpool.Aligned(maxBounce) })

func (f *File) writeZeroData(off, length int64) error {
	for length > 0 {
		n := min(length, maxBounce)
		if err := f.writeData(zeroes()[:n], off, false); err != nil {
			return err
		}
		off, length = off+n, length-n
	}
	return nil
}

// Close implements backend.Backend. It releases the lock; it does not flush.
func (f *File) Close() error {
	f.ringMu.Lock() // no request starts on a ring after this
	already := f.closed.Swap(true)
	f.ringMu.Unlock()
	if already {
		return fmt.Errorf("%w: %s", backend.ErrClosed, f.path)
	}
	f.ringOps.Wait()
	var err error
	if f.ring != nil {
		err = f.ring.Close() // waits for the reads in flight, which use r's descriptor
	}
	if f.r != f.f {
		err = errors.Join(err, f.r.Close())
	}
	return errors.Join(f.f.Close(), err)
}
