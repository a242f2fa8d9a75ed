package uring

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File reads and writes one file descriptor through a ring, for any number of goroutines at once.
// A caller puts its request into the submission queue under a short lock; if no other caller is
// submitting, it submits everything queued so far with one io_uring_enter, itself, and goes on
// submitting what others queued meanwhile (the others only queue and sleep). One reaping
// goroutine, asleep in the kernel until completions come, wakes each caller. With direct I/O this
// keeps no OS thread blocked per request, as pread does, and the disk sees the requests of a batch
// together (one doorbell for a virtual disk, not one each).
//
// The buffers stay the caller's, as with pread: the kernel reads or fills them before the call
// returns. Close waits for the calls in flight; calls after it fail with ErrClosed.
type File struct {
	fd   int
	name string // for errors
	ring *Ring
	// slots holds the free request slots; wakes[i] carries slot i's result to its caller.
	slots chan uint32
	wakes []chan int32

	mu         sync.Mutex // the submission queue
	submitting bool       // a caller is submitting the queue: the others leave it to that one

	closed    atomic.Bool
	closeOnce sync.Once
	done      chan struct{} // closed when the reaper has left
}

// closeTag marks the NOP that wakes the reaper at Close.
const closeTag = ^uint64(0)

// ErrClosed is returned by calls on a File after Close.
var ErrClosed = errors.New("io_uring file closed")

// NewFile sets up a ring of depth entries for fd (named name in errors). An error for which
// Unavailable is true means this kernel refuses io_uring: use plain system calls.
func NewFile(fd int, name string, depth int) (*File, error) {
	r, err := New(uint32(depth), 0)
	if err != nil {
		return nil, err
	}
	// The kernel rounds the ring up to a power of two; the slots stay at depth (plus the close
	// NOP), so the completion queue (twice the submission queue) never overflows.
	f := &File{fd: fd, name: name, ring: r, slots: make(chan uint32, depth), wakes: make([]chan int32, depth),
		done: make(chan struct{})}
	for i := range f.wakes {
		f.wakes[i] = make(chan int32, 1)
		f.slots <- uint32(i)
	}
	go func() { f.reap(); close(f.done) }()
	return f, nil
}

// ReadAt reads len(p) bytes at off, as os.File.ReadAt does: short reads go on from where they
// stopped; the end of the file gives io.EOF with the bytes read before it.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	return f.rw(OpRead, "read", p, off)
}

// WriteAt writes all of p at off, as os.File.WriteAt does.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	return f.rw(OpWrite, "write", p, off)
}

func (f *File) rw(op uint8, name string, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		res, err := f.do(op, p[n:], off+int64(n))
		switch {
		case err != nil:
			return n, err
		case res == -int32(unix.EINTR) || res == -int32(unix.EAGAIN):
			continue
		case res < 0:
			return n, &os.PathError{Op: name, Path: f.name, Err: unix.Errno(-res)}
		case res == 0 && op == OpRead:
			return n, io.EOF
		case res == 0:
			return n, &os.PathError{Op: name, Path: f.name, Err: io.ErrShortWrite}
		}
		n += int(res)
	}
	return n, nil
}

// do runs one request and returns the kernel's result.
func (f *File) do(op uint8, buf []byte, off int64) (int32, error) {
	if f.closed.Load() {
		return 0, ErrClosed
	}
	var slot uint32
	select {
	case slot = <-f.slots:
	case <-f.done: // Close took every slot and stopped
		return 0, ErrClosed
	}
	f.queue(func(s *SQE) {
		s.Opcode = op
		s.FD = int32(f.fd)
		s.Off = uint64(off)
		s.Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
		s.Len = uint32(len(buf))
		s.UserData = uint64(slot)
	})
	res := <-f.wakes[slot]
	f.slots <- slot
	return res, nil
}

// queue fills a submission entry, then submits the queue unless another caller is doing so. The
// submitter lets go of the lock during the system call, so that others can queue meanwhile, and
// submits again until nothing is left: whatever is queued is submitted without delay.
func (f *File) queue(fill func(*SQE)) {
	f.mu.Lock()
	s, _, err := f.ring.Get()
	if err != nil {
		// The ring has an entry for every slot and the close NOP, and entries are submitted
		// before their caller sleeps: it cannot be full.
		panic(fmt.Sprintf("io_uring %s: %v", f.name, err))
	}
	fill(s)
	if f.submitting {
		f.mu.Unlock()
		return
	}
	f.submitting = true
	for {
		n := f.ring.publish()
		if n == 0 {
			break
		}
		f.mu.Unlock()
		err := f.ring.enter(n, 0, 0)
		f.mu.Lock()
		if err != nil {
			f.failQueued(err)
		}
	}
	f.submitting = false
	f.mu.Unlock()
}

// failQueued ends, with err's errno, the requests queued but not taken by the kernel.
func (f *File) failQueued(err error) {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		errno = unix.EIO
	}
	f.ring.Drop(func(s *SQE) {
		if s.UserData != closeTag {
			f.wakes[s.UserData] <- -int32(errno)
		}
	})
}

// reap wakes the caller of every completion until the close NOP completes.
func (f *File) reap() {
	for {
		if err := f.ring.WaitCQ(1); err != nil {
			panic(fmt.Sprintf("io_uring %s: %v", f.name, err))
		}
		closed := false
		f.ring.Reap(func(c CQE) {
			if c.UserData == closeTag {
				closed = true
				return
			}
			f.wakes[c.UserData] <- c.Res
		})
		if closed {
			return
		}
	}
}

// Close waits for the calls in flight, stops the reaper and frees the ring; it does not close fd.
func (f *File) Close() error {
	var err error
	f.closeOnce.Do(func() {
		f.closed.Store(true)
		for range cap(f.slots) {
			<-f.slots
		}
		f.queue(func(s *SQE) { s.Opcode, s.UserData = OpNop, closeTag })
		<-f.done
		err = f.ring.Close()
	})
	return err
}
