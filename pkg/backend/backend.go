// Package backend defines the storage that tierblk exports and caches in front of: a file, a block
// device, RAM, or a remote NBD export.
//
// A Backend is deliberately small, in the spirit of io.ReaderAt and io.WriterAt: concurrent calls on
// disjoint ranges are safe, and optional abilities (trim, write-zeroes, FUA) are separate interfaces
// that callers detect once with a type assertion. Backends are chosen by URL scheme from an explicit
// Registry (see package registry for the default set).
//
// A backend must never cache data in a way that breaks the durability contract: after Flush returns
// nil, every write that returned before Flush was called is durable.
//
// # Errors
//
// Errors that wrap ErrOutOfRange, ErrReadOnly, ErrNotSupported or ErrClosed are permanent: retrying
// the same call cannot succeed. Any other error (an EIO from a disk, a dropped connection) may be
// transient; IsRetryable tells the two apart. (The NBD client already waits for a dropped
// connection to come back and sends again what was in flight.)
package backend

import (
	"errors"
	"fmt"
	"time"
)

// Backend is the storage at the bottom of the stack.
type Backend interface {
	// ReadAt reads len(p) bytes at off. A short read is an error.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes p at off. The data may sit in a volatile cache until Flush.
	WriteAt(p []byte, off int64) (int, error)
	// Size is the size of the device in bytes; it does not change while the backend is open.
	Size() int64
	// Flush makes every write that completed before the call durable.
	Flush() error
	// Close releases the backend. It does not flush.
	Close() error
}

// Trimmer is a backend that can discard a range: later reads of it return zeroes or the old data,
// and the space may be given back to the host.
type Trimmer interface {
	Trim(off, length int64) error
}

// ZeroWriter is a backend that can write zeroes over a range without a data transfer. With
// mayUnmap it may punch a hole instead of writing; without it the range stays allocated.
type ZeroWriter interface {
	WriteZeroes(off, length int64, mayUnmap bool) error
}

// FUAWriter is a backend that can make one write durable on its own (Force Unit Access), cheaper
// than a WriteAt followed by a Flush of everything.
type FUAWriter interface {
	WriteAtFUA(p []byte, off int64) (int, error)
}

// WriteFUA writes p at off durably: with b's own FUA write where it has one, else a write and a
// flush of everything. A failed flush reports 0 bytes written.
func WriteFUA(b Backend, p []byte, off int64) (int, error) {
	if w, ok := b.(FUAWriter); ok {
		return w.WriteAtFUA(p, off)
	}
	n, err := b.WriteAt(p, off)
	if err != nil {
		return n, err
	}
	if err := b.Flush(); err != nil {
		return 0, err
	}
	return n, nil
}

// CachedReader is a backend whose reads normally bypass a cache in front of its storage (the page
// cache, for a file opened with direct=reads) and that can also read through it. Data written a
// moment ago is still in that cache: a read that bypasses it makes the kernel write the data out
// to the disk first and then read it back, where a read through it is a copy.
type CachedReader interface {
	ReadAtCached(p []byte, off int64) (int, error)
}

// Waiter is a backend whose requests wait on something other than this machine's CPUs: a network
// peer, or a disk read or write that bypasses the page cache. Waits counts such requests so far.
// A server that serves fast requests on the goroutine that reads them (internal/nbd/server) hands
// requests that wait to workers instead, so that their waits overlap: served one at a time, a
// backend that answers in 30 µs carries 33,000 requests a second whatever its link or queue depth.
type Waiter interface {
	Waits() uint64
}

// WaitsOf returns b's count of requests that waited (see Waiter), 0 when b never waits.
func WaitsOf(b Backend) uint64 {
	if w, ok := b.(Waiter); ok {
		return w.Waits()
	}
	return 0
}

// AsyncReader is a backend that can start a read and return before it completes (a file read
// through io_uring), so that a server need not keep a goroutine waiting for each read.
// ReadAtAsync reports false, having done nothing, where it cannot (the caller reads with ReadAt,
// which also reports any error in the request); else done is called once the read ends, with
// ReadAt's error, on a goroutine of the backend's: done must not block, since other completions
// wait for it. p is the backend's until then.
type AsyncReader interface {
	ReadAtAsync(p []byte, off int64, done func(error)) bool
}

// AsyncWriter is AsyncReader's counterpart for writes (an iSCSI LUN, whose writes are a PDU out
// and a status back): WriteAtAsync starts a write of p at off, durable when done reports success
// if fua, and returns; it reports false, having done nothing, where it cannot (the caller writes
// with WriteAt, or WriteAtFUA). done is called as AsyncReader's is; p is the backend's until then.
type AsyncWriter interface {
	WriteAtAsync(p []byte, off int64, fua bool, done func(error)) bool
}

// Ring runs file reads and writes on the io_uring of the goroutine that calls it (a ublk queue's
// loop, internal/uring's Ops): the request is that goroutine's own work, and done runs on it, so
// done must neither block nor wait for that goroutine. ReadFile and WriteFile report false, having
// started nothing, where the ring has no room; fd must stay open until done.
type Ring interface {
	ReadFile(fd int, p []byte, off int64, done func(n int, err error)) bool
	WriteFile(fd int, p []byte, off int64, dsync bool, done func(n int, err error)) bool
}

// RingReader is a backend that can serve a read, or some reads, as file reads on a caller's Ring
// (a file opened for direct I/O; a cache's SSD-tier hits). ReadAtOn reports false, having done
// nothing, where it cannot (the caller reads with ReadAt); else done is called once, with
// ReadAt's error, on the ring's goroutine, or on one of the backend's if it finishes the read its
// own way. p is the backend's until then.
type RingReader interface {
	ReadAtOn(r Ring, p []byte, off int64, done func(error)) bool
}

// RingWriter is RingReader's counterpart for writes: durable when done reports success if fua.
type RingWriter interface {
	WriteAtOn(r Ring, p []byte, off int64, fua bool, done func(error)) bool
}

// Plugger is an asynchronous backend that can hold the reads and writes started on it and send
// them together, as the kernel's block layer plugs a queue: a caller that knows more requests
// follow at once (an NBD server with pipelined requests in its buffer) calls Plug, starts them,
// then Unplug, which sends what was held. Requests started while no caller holds the plug go at
// once. A caller must unplug before it waits for anything a held request may be needed for (a
// completion, a slot, the client).
type Plugger interface {
	Plug()
	Unplug()
}

// RunDeferrer is an asynchronous backend that calls its requests' done functions in runs, one
// after the other on a goroutine of its own (an iSCSI session's reader, for what one read of its
// socket brought). AtRunEnd, called from a done, has that goroutine call f after the run's last
// done, before it waits for more, and reports true; it reports false, having done nothing, where
// no run is under way. A server answers a run's requests there, together, rather than hand them
// to a goroutine it wakes. f must not block: other completions wait for it.
type RunDeferrer interface {
	AtRunEnd(f func()) bool
}

// DeviceTimer is a backend on a block device whose requests the kernel times (a file or block
// device on Linux: the device's /sys/dev/block/MAJ:MIN/stat). Go's own clock around a request also
// counts the wait for a CPU, which on a saturated machine swamps a device's latency; the kernel's
// count starts when the request reaches the block layer and ends when the device completes it, so
// a congestion check (package cache) judges the device by it. DeviceTime fails, wrapping
// ErrNotSupported, where no block device is under the backend (tmpfs, a network file system).
type DeviceTimer interface {
	DeviceTime() (DeviceTime, error)
}

// DeviceTime is what a device has done since it appeared: requests completed, the time they took
// in all (to the millisecond), and the requests under way now. The device serves every user of
// it, not only this backend.
type DeviceTime struct {
	Reads, Writes       uint64
	ReadTime, WriteTime time.Duration
	InFlight            uint64
}

// ReadOnlyReporter is a backend that knows it cannot be written (a read-only file or export).
type ReadOnlyReporter interface {
	ReadOnly() bool
}

// Permanent errors: retrying cannot help.
var (
	ErrOutOfRange   = errors.New("backend: range beyond the end of the device")
	ErrReadOnly     = errors.New("backend: read-only")
	ErrNotSupported = errors.New("backend: operation not supported")
	ErrClosed       = errors.New("backend: closed")
)

// ErrNoDirectIO is wrapped by the error of opening, with direct I/O asked for in its URL, a file on
// a file system without O_DIRECT (tmpfs): a caller may open it again without.
var ErrNoDirectIO = errors.New("no direct I/O here")

// ErrBadURL marks a mistake in a backend URL itself (syntax, an unknown parameter, a bad size, a
// missing file with no size to create it), as opposed to a failure to open what it names. The
// command line turns it into a usage error.
var ErrBadURL = errors.New("bad backend URL")

// BadURL marks err as a mistake in the URL; its message is unchanged.
func BadURL(err error) error { return badURL{err} }

type badURL struct{ err error }

func (b badURL) Error() string   { return b.err.Error() }
func (b badURL) Unwrap() []error { return []error{b.err, ErrBadURL} }

// IsRetryable reports whether err may succeed when the same call is tried again.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	for _, p := range []error{ErrOutOfRange, ErrReadOnly, ErrNotSupported, ErrClosed} {
		if errors.Is(err, p) {
			return false
		}
	}
	return true
}

// CheckRange returns an error wrapping ErrOutOfRange unless [off, off+length) lies within size.
func CheckRange(off, length, size int64) error {
	if off < 0 || length < 0 || off > size || length > size-off {
		return fmt.Errorf("%w: offset %d length %d size %d", ErrOutOfRange, off, length, size)
	}
	return nil
}
