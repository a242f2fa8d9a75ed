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
// A caller takes a request slot, hands it to the submitting goroutine and sleeps; the submitter
// puts every request waiting at that moment into the ring with one io_uring_enter, and the reaping
// goroutine, asleep in the kernel until completions come, wakes each caller. With direct I/O this
// keeps one OS thread per side instead of one blocked in pread per request, and the disk sees the
// requests of a batch together (one doorbell for a virtual disk, not one each).
//
// The buffers stay the caller's, as with pread: the kernel reads or fills them before the call
// returns. Close waits for the calls in flight; calls after it fail with ErrClosed.
type File struct {
	fd   int
	name string // for errors
	ring *Ring
	// slots holds the free request slots; wakes[i] carries slot i's result to its caller. A
	// request's data goes to the submitter by value: nothing of it is shared but through channels.
	slots chan uint32
	wakes []chan int32
	queue chan submission

	closed    atomic.Bool
	closeOnce sync.Once
	done      chan struct{} // closed when the submitter and reaper have left
}

// submission is one request on its way to the submitter.
type submission struct {
	slot uint32
	op   uint8
	buf  []byte
	off  int64
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
	// The kernel rounds the ring up to a power of two; the slots stay at depth, so the completion
	// queue (twice the submission queue) never overflows.
	f := &File{fd: fd, name: name, ring: r, slots: make(chan uint32, depth), wakes: make([]chan int32, depth),
		queue: make(chan submission, depth), done: make(chan struct{})}
	for i := range f.wakes {
		f.wakes[i] = make(chan int32, 1)
		f.slots <- uint32(i)
	}
	var wg sync.WaitGroup
	wg.Go(f.submit)
	wg.Go(f.reap)
	go func() { wg.Wait(); close(f.done) }()
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
	f.queue <- submission{slot: slot, op: op, buf: buf, off: off}
	res := <-f.wakes[slot]
	f.slots <- slot
	return res, nil
}

// submit puts queued requests into the ring: all that wait when it wakes, with one system call.
// The closed queue ends it, after a NOP that tells the reaper to leave.
func (f *File) submit() {
	for {
		sub, ok := <-f.queue
		if !ok {
			f.put(func(s *SQE) { s.Opcode, s.UserData = OpNop, closeTag })
			if err := f.ring.Submit(0); err != nil {
				panic(fmt.Sprintf("io_uring %s: %v", f.name, err)) // the reaper would wait forever
			}
			return
		}
		f.prep(sub)
	more:
		for {
			select {
			case sub, ok := <-f.queue:
				if !ok {
					break more // the next round finds the queue closed at once
				}
				f.prep(sub)
			default:
				break more
			}
		}
		if err := f.ring.Submit(0); err != nil {
			f.failQueued(err)
		}
	}
}

// prep fills a submission entry for sub.
func (f *File) prep(sub submission) {
	f.put(func(s *SQE) {
		s.Opcode = sub.op
		s.FD = int32(f.fd)
		s.Off = uint64(sub.off)
		s.Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(sub.buf))))
		s.Len = uint32(len(sub.buf))
		s.UserData = uint64(sub.slot)
	})
}

// put fills the next submission entry. The ring has room: it has as many entries as there are
// slots, and the submitter hands them to the kernel before it takes more.
func (f *File) put(fill func(*SQE)) {
	s, _, err := f.ring.Get()
	if err != nil {
		panic(fmt.Sprintf("io_uring %s: %v", f.name, err))
	}
	fill(s)
}

// failQueued ends, with err's errno, the requests prepared but not taken by the kernel.
func (f *File) failQueued(err error) {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		errno = unix.EIO
	}
	f.ring.Drop(func(s *SQE) { f.wakes[s.UserData] <- -int32(errno) })
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

// Close waits for the calls in flight, stops the submitter and reaper and frees the ring; it does
// not close fd.
func (f *File) Close() error {
	var err error
	f.closeOnce.Do(func() {
		f.closed.Store(true)
		for range cap(f.slots) {
			<-f.slots
		}
		close(f.queue)
		<-f.done
		err = f.ring.Close()
	})
	return err
}
