package uring

import (
	"io"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ops runs file reads and writes on a ring that one goroutine owns, prepares, submits and reaps
// (a ublk queue's loop), so that a request served from a file is the owner's own work: no other
// goroutine or OS thread wakes for it, and its completion is reaped with the owner's others, by
// the same io_uring_enter that submits them (bench kernel's ublk row: the CPU a request). Every
// method, and every done, runs on the owner's goroutine.
//
// An entry of an op carries OpsTag in its user data, so the owner tells them apart from its own;
// the owner hands each such completion to Complete.
type Ops struct {
	r    *Ring
	ops  []fileOp
	free []uint32
}

// OpsTag marks the user data of an Ops entry; the owner's own user data must stay below it.
const OpsTag = 1 << 48

// fileOp is an op in flight: what is left of it and whom to tell.
type fileOp struct {
	op    uint8
	fd    int32
	flags uint32 // rw_flags: RWF_DSYNC for a write that must be durable
	buf   []byte
	off   int64
	n     int
	done  func(n int, err error)
}

// NewOps runs at most n ops at once on r. The owner sizes r for its own entries and n more, in
// the submission queue (ops are queued between two submits) and in the completion queue.
func NewOps(r *Ring, n int) *Ops {
	o := &Ops{r: r, ops: make([]fileOp, n), free: make([]uint32, n)}
	for i := range o.free {
		o.free[i] = uint32(n - 1 - i)
	}
	return o
}

// ReadFile starts reading len(p) bytes of fd at off; done gets what os.File.ReadAt would return
// (io.EOF at the file's end; an errno otherwise). It reports false, having started nothing, when
// every op is in flight or the submission queue is full: the caller serves the request its own
// way. fd must stay open, and p the kernel's, until done.
func (o *Ops) ReadFile(fd int, p []byte, off int64, done func(n int, err error)) bool {
	return o.start(fileOp{op: OpRead, fd: int32(fd), buf: p, off: off, done: done})
}

// WriteFile writes p at off, as ReadFile reads; with dsync the data is durable when done reports
// success (RWF_DSYNC).
func (o *Ops) WriteFile(fd int, p []byte, off int64, dsync bool, done func(n int, err error)) bool {
	var flags uint32
	if dsync {
		flags = unix.RWF_DSYNC
	}
	return o.start(fileOp{op: OpWrite, fd: int32(fd), flags: flags, buf: p, off: off, done: done})
}

// InFlight is the number of ops started and not yet done: an owner leaving its loop reaps until
// it is 0, as the callers' done must be called (they release locks).
func (o *Ops) InFlight() int { return len(o.ops) - len(o.free) }

func (o *Ops) start(f fileOp) bool {
	if len(o.free) == 0 {
		return false
	}
	i := o.free[len(o.free)-1]
	if !o.queue(i, &f) {
		return false
	}
	o.free = o.free[:len(o.free)-1]
	o.ops[i] = f
	return true
}

// queue fills the submission entry of what is left of f, op i.
func (o *Ops) queue(i uint32, f *fileOp) bool {
	s, _, err := o.r.Get()
	if err != nil {
		return false
	}
	rest := f.buf[f.n:]
	s.Opcode = f.op
	s.FD = f.fd
	s.Off = uint64(f.off + int64(f.n))
	s.Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(rest))))
	s.Len = uint32(len(rest))
	s.OpFlags = f.flags
	s.UserData = OpsTag | uint64(i)
	return true
}

// Complete goes on with the op whose completion c is, if it is one (false: c is the owner's): it
// asks for the rest of a short transfer, or ends the op and calls its done.
func (o *Ops) Complete(c CQE) bool {
	if c.UserData&OpsTag == 0 {
		return false
	}
	i := uint32(c.UserData &^ OpsTag)
	f := &o.ops[i]
	n, more, err := progress(f.op, c.Res, f.n, len(f.buf))
	f.n = n
	if more && o.queue(i, f) {
		return true
	}
	if more { // no room to ask again (the owner's own entries fill the queue): the rest here
		n, err = f.rest()
	}
	done := f.done
	*f = fileOp{}
	o.free = append(o.free, i)
	done(n, err)
	return true
}

// rest does what is left of f with plain system calls, retrying as progress does.
func (f *fileOp) rest() (int, error) {
	for {
		var res int
		var err error
		if f.op == OpRead {
			res, err = unix.Pread(int(f.fd), f.buf[f.n:], f.off+int64(f.n))
		} else {
			res, err = unix.Pwritev2(int(f.fd), [][]byte{f.buf[f.n:]}, f.off+int64(f.n), int(f.flags))
		}
		r := int32(res)
		if errno, ok := err.(unix.Errno); ok {
			r = -int32(errno)
		}
		n, more, err := progress(f.op, r, f.n, len(f.buf))
		if f.n = n; !more {
			return n, err
		}
	}
}

// progress interprets the kernel's answer res to a request of total bytes of which n were done
// before it: more is set when the rest is to be asked for again (a short transfer, an EINTR), as
// os.File's ReadAt and WriteAt do. Its errors are bare: an errno, io.EOF, io.ErrShortWrite.
func progress(op uint8, res int32, n, total int) (int, bool, error) {
	switch {
	case res == -int32(unix.EINTR) || res == -int32(unix.EAGAIN):
		return n, true, nil
	case res < 0:
		return n, false, unix.Errno(-res)
	case res == 0 && op == OpRead:
		return n, false, io.EOF
	case res == 0:
		return n, false, io.ErrShortWrite
	}
	n += int(res)
	return n, n < total, nil
}
