package uring

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File reads and writes one file descriptor through a ring, for any number of goroutines at once.
// A caller puts its request into the submission queue under a short lock; if no other caller is
// submitting, it submits everything queued so far with one io_uring_enter, itself, and goes on
// submitting what others queued meanwhile (the others only queue and sleep). One reaping
// goroutine wakes each caller; while requests are in flight it looks again at an empty completion
// queue a few times before it sleeps in the kernel until completions come. With direct I/O this
// keeps no OS thread blocked per request, as pread does, and the disk sees the requests of a batch
// together (one doorbell for a virtual disk, not one each).
//
// The buffers stay the caller's, as with pread: the kernel reads or fills them before the call
// returns. Close waits for the calls in flight; calls after it fail with ErrClosed.
type File struct {
	fd   int
	name string // for errors
	ring *Ring
	// events is an eventfd the kernel signals at each completion, for the reaper to wait in Go's
	// netpoller; nil where the kernel refuses one, and the reaper sleeps in io_uring_enter.
	events *os.File
	// slots holds the free request slots; wakes[i] carries slot i's result to its caller, or
	// for a request made with ReadAtAsync, async[i] says what is left of it and whom to tell.
	slots chan uint32
	wakes []chan int32
	async []asyncOp
	// isAsync[i] is set after async[i] is filled and before the request is queued: its store
	// and the reaper's load order the two, as the kernel's ring does but the race detector
	// cannot see.
	isAsync []atomic.Bool

	mu         sync.Mutex // the submission queue
	submitting bool       // a caller is submitting the queue: the others leave it to that one

	closed    atomic.Bool
	closeOnce sync.Once
	done      chan struct{} // closed when the reaper has left
}

// asyncOp is a request made with ReadAtAsync: its buffer and offset, the bytes done so far, and
// the function to call when it ends.
type asyncOp struct {
	buf  []byte
	off  int64
	n    int
	done func(n int, err error)
}

// spinTries is how many times the reaper looks again at an empty completion queue while requests
// are in flight, yielding to other goroutines in between, before it sleeps in the kernel: under a
// queue of 4K reads the next completion is usually that close, and each sleep and wake-up is a
// context switch of the reaper's thread (bench cache --parts hits; the CPU a request in paired
// runs).
const spinTries = 32

// closeTag marks the NOP that wakes the reaper at Close.
const closeTag = ^uint64(0)

// ErrClosed is returned by calls on a File after Close.
var ErrClosed = errors.New("io_uring file closed")

// NewFile sets up a ring for depth requests at once on fd (named name in errors). An error for
// which Unavailable is true means this kernel refuses io_uring: use plain system calls.
func NewFile(fd int, name string, depth int) (*File, error) {
	return newFile(fd, name, depth, true)
}

// newFile is NewFile; without events its reaper sleeps in io_uring_enter, as on a kernel that
// refuses the eventfd (the tests run both).
func newFile(fd int, name string, depth int, events bool) (*File, error) {
	// Two submission entries a slot, and one for the close NOP: the kernel advances the queue's
	// head only after it has taken the whole batch, and a request that completes while it is
	// submitted (a write to the page cache) frees its slot before that, for another request to
	// queue an entry in (TestFileConcurrent panicked on a full queue once the reaper looked for
	// completions without sleeping).
	r, err := New(uint32(2*depth+1), 0)
	if err != nil {
		return nil, err
	}
	// The kernel rounds the ring up to a power of two; the slots stay at depth (plus the close
	// NOP), so the completion queue (twice the submission queue) never overflows.
	f := &File{fd: fd, name: name, ring: r, slots: make(chan uint32, depth), wakes: make([]chan int32, depth),
		async: make([]asyncOp, depth), isAsync: make([]atomic.Bool, depth), done: make(chan struct{})}
	if events {
		f.events = completionEvents(r)
	}
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
	return f.rw(OpRead, p, off)
}

// WriteAt writes all of p at off, as os.File.WriteAt does.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	return f.rw(OpWrite, p, off)
}

func (f *File) rw(op uint8, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		res, err := f.do(op, p[n:], off+int64(n))
		if err != nil {
			return n, err
		}
		var more bool
		if n, more, err = f.result(op, res, n, len(p)); !more {
			return n, err
		}
	}
	return n, nil
}

// result is progress, with the errors of os.File's ReadAt and WriteAt: io.EOF as it is, the rest
// naming the file.
func (f *File) result(op uint8, res int32, n, total int) (int, bool, error) {
	n, more, err := progress(op, res, n, total)
	if err != nil && err != io.EOF {
		name := "read"
		if op == OpWrite {
			name = "write"
		}
		err = &os.PathError{Op: name, Path: f.name, Err: err}
	}
	return n, more, err
}

// do runs one request and returns the kernel's result.
func (f *File) do(op uint8, buf []byte, off int64) (int32, error) {
	slot, err := f.slot()
	if err != nil {
		return 0, err
	}
	f.queue(f.fill(op, slot, buf, off))
	res := <-f.wakes[slot]
	f.slots <- slot
	return res, nil
}

// slot takes a free request slot, waiting for one while the ring is full.
func (f *File) slot() (uint32, error) {
	if f.closed.Load() {
		return 0, ErrClosed
	}
	select {
	case slot := <-f.slots:
		return slot, nil
	case <-f.done: // Close took every slot and stopped
		return 0, ErrClosed
	}
}

// fill returns what queue puts in the submission entry of a read or write of buf at off.
func (f *File) fill(op uint8, slot uint32, buf []byte, off int64) func(*SQE) {
	return func(s *SQE) {
		s.Opcode = op
		s.FD = int32(f.fd)
		s.Off = uint64(off)
		s.Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
		s.Len = uint32(len(buf))
		s.UserData = uint64(slot)
	}
}

// ReadAtAsync starts reading len(p) bytes at off and returns at once; done is called, on the
// goroutine that reaps completions, with what ReadAt would have returned. done must not block:
// the completions of every other caller wait for it. p is the kernel's until then. The only error
// ReadAtAsync returns itself is ErrClosed, and done is then never called.
func (f *File) ReadAtAsync(p []byte, off int64, done func(n int, err error)) error {
	slot, err := f.slot()
	if err != nil {
		return err
	}
	f.async[slot] = asyncOp{buf: p, off: off, done: done}
	f.isAsync[slot].Store(true)
	f.queue(f.fill(OpRead, slot, p, off))
	return nil
}

// completeAsync carries on with the request of slot, made by ReadAtAsync, after the kernel
// answered res: it asks for the rest, or ends the request and calls its done.
func (f *File) completeAsync(slot uint32, res int32) {
	a := &f.async[slot]
	n, more, err := f.result(OpRead, res, a.n, len(a.buf))
	if more {
		a.n = n
		f.queue(f.fill(OpRead, slot, a.buf[n:], a.off+int64(n)))
		return
	}
	done := a.done
	*a = asyncOp{}
	f.isAsync[slot].Store(false)
	f.slots <- slot
	done(n, err)
}

// queue fills a submission entry, then submits the queue unless another caller is doing so. The
// submitter lets go of the lock during the system call, so that others can queue meanwhile, and
// submits again until nothing is left: whatever is queued is submitted without delay.
func (f *File) queue(fill func(*SQE)) {
	f.mu.Lock()
	s, _, err := f.ring.Get()
	if err != nil {
		// The ring has two entries for every slot and one for the close NOP (see NewFile),
		// and entries are submitted before their caller sleeps: it cannot be full.
		panic(fmt.Sprintf("io_uring %s: %v", f.name, err))
	}
	fill(s)
	if f.submitting {
		f.mu.Unlock()
		return
	}
	f.submitting = true
	var failed []failure
	for {
		n := f.ring.publish()
		if n == 0 {
			break
		}
		f.mu.Unlock()
		err := f.ring.enter(n, 0, 0)
		f.mu.Lock()
		if err != nil {
			failed = f.failQueued(err, failed)
		}
	}
	f.submitting = false
	f.mu.Unlock()
	// Outside the lock: an asynchronous request may be submitted again (EAGAIN), and its done
	// may start another.
	for _, x := range failed {
		f.wake(x.slot, x.res)
	}
}

// failure is a request the kernel never took, and the result to end it with.
type failure struct {
	slot uint32
	res  int32
}

// failQueued takes back the requests queued but not taken by the kernel, to be ended with err's
// errno.
func (f *File) failQueued(err error, failed []failure) []failure {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		errno = unix.EIO
	}
	f.ring.Drop(func(s *SQE) {
		if s.UserData != closeTag {
			failed = append(failed, failure{uint32(s.UserData), -int32(errno)})
		}
	})
	return failed
}

// reap wakes the caller of every completion until the close NOP completes.
func (f *File) reap() {
	for {
		for i := 0; i < spinTries && f.ring.Ready() == 0 && len(f.slots) < cap(f.slots); i++ {
			runtime.Gosched()
		}
		if err := f.wait(); err != nil {
			panic(fmt.Sprintf("io_uring %s: %v", f.name, err))
		}
		closed := false
		f.ring.Reap(func(c CQE) {
			if c.UserData == closeTag {
				closed = true
				return
			}
			f.wake(uint32(c.UserData), c.Res)
		})
		if closed {
			return
		}
	}
}

// completionEvents returns an eventfd the kernel signals each time it posts a completion to r,
// read through Go's netpoller, or nil where the kernel refuses one. A reaper that sleeps in
// io_uring_enter blocks its OS thread, and the runtime hands its processor to another thread
// and back at each wake-up; one waiting in the netpoller is a parked goroutine, woken by the same
// epoll_wait that wakes the NBD connections' readers (bench cache --parts hits: context switches
// and CPU a request).
func completionEvents(r *Ring) *os.File {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil
	}
	if err := r.RegisterEventfd(fd); err != nil {
		_ = unix.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), "io_uring completions")
}

// wait returns when completions wait to be reaped. The eventfd may hold the count of completions
// already reaped: reading it then returns at once, and the loop looks again.
func (f *File) wait() error {
	if f.events == nil {
		return f.ring.WaitCQ(1)
	}
	var b [8]byte
	for f.ring.Ready() == 0 {
		if _, err := f.events.Read(b[:]); err != nil {
			return fmt.Errorf("io_uring completions eventfd: %w", err)
		}
	}
	return nil
}

// wake hands the kernel's result for slot to its request.
func (f *File) wake(slot uint32, res int32) {
	if f.isAsync[slot].Load() {
		f.completeAsync(slot, res)
		return
	}
	f.wakes[slot] <- res
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
		if f.events != nil {
			_ = f.events.Close()
		}
		err = f.ring.Close()
	})
	return err
}
