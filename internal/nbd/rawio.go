package nbd

import (
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Why the server reads and writes its sockets with raw system calls.
//
// Go's net package enters every read and write through the runtime's system-call path, which
// wakes the runtime's monitor thread (sysmon) when every processor has been idle. In the
// request-reply pattern of NBD that is every batch of requests: the monitor then wakes every
// 20 µs until the connection goes quiet again, and each wakeup is a context switch on the core
// the client needs. Measured under fio with 4K random writes at queue depth 32: 6% of the
// server's CPU in the monitor's sleeps and 5% in futex wakeups, gone with raw calls.
//
// The sockets are non-blocking (the net package makes them so), so a raw read or write never
// blocks: it does what the socket allows at once, or returns EAGAIN, and then the net package's
// poller waits for the socket as it would for conn.Read. Deadlines and Close work as on the
// net.Conn.

// rawIO returns a reader and a writer for nc that use raw system calls, and pending, which
// reports whether the socket has bytes to read now; or nc itself and nil when nc is not a socket
// (net.Pipe in tests).
func rawIO(nc net.Conn) (io.Reader, io.Writer, *pendingInput) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nc, nc, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nc, nc, nil
	}
	r := rawReader{newRawCall(rc.Read, syscall.SYS_READ, false)}
	w := rawWriter{newRawCall(rc.Write, syscall.SYS_WRITE, true)}
	p := &pendingInput{rc: rc}
	p.fn = p.ask
	return r, w, p
}

// pendingInput asks the kernel how many bytes wait in a socket's receive queue (SIOCINQ, which
// unix and TCP sockets answer), without waiting. Only the reader calls it.
type pendingInput struct {
	rc syscall.RawConn
	fn func(fd uintptr)
	n  int32
}

// any reports whether bytes wait; false also when the question fails (the next read tells why).
func (p *pendingInput) any() bool {
	if p == nil {
		return false
	}
	p.n = 0
	if err := p.rc.Control(p.fn); err != nil {
		return false
	}
	return p.n > 0
}

func (p *pendingInput) ask(fd uintptr) {
	if _, _, e := syscall.RawSyscall(syscall.SYS_IOCTL, fd, unix.SIOCINQ, uintptr(unsafe.Pointer(&p.n))); e != 0 {
		p.n = 0
	}
}

// rawCall makes one kind of system call on a socket: reads (SYS_READ, done after one that moves
// bytes) or writes (SYS_WRITE, done when all of p is written, as a net.Conn writes). One goroutine
// at a time uses each. The callback is made once, and the call's arguments and results live in the
// struct, so that a call allocates nothing.
type rawCall struct {
	// wait is the RawConn's Read or Write: it runs fn, waiting for the socket while fn says false.
	wait  func(fn func(fd uintptr) bool) error
	sysno uintptr
	all   bool // go on until p is done
	fn    func(fd uintptr) bool
	p     []byte
	n     int
	errno syscall.Errno
}

func newRawCall(wait func(func(uintptr) bool) error, sysno uintptr, all bool) *rawCall {
	c := &rawCall{wait: wait, sysno: sysno, all: all}
	c.fn = c.call
	return c
}

// do runs the system call on p and returns how many bytes it moved.
func (c *rawCall) do(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.p, c.n, c.errno = p, 0, 0
	err := c.wait(c.fn)
	c.p = nil
	switch {
	case err != nil:
		return c.n, err
	case c.errno != 0:
		return c.n, c.errno
	}
	return c.n, nil
}

// call makes system calls on the rest of p until the call is done; false asks the poller to wait
// until the socket is ready again.
func (c *rawCall) call(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(c.sysno, fd, uintptr(unsafe.Pointer(&c.p[c.n])), uintptr(len(c.p)-c.n))
		switch e {
		case 0:
			c.n += int(n)
			if !c.all || n == 0 || c.n == len(c.p) {
				return true
			}
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.errno = e
			return true
		}
	}
}

type rawReader struct{ *rawCall }

func (r rawReader) Read(p []byte) (int, error) {
	n, err := r.do(p)
	if n == 0 && err == nil && len(p) > 0 {
		return 0, io.EOF
	}
	return n, err
}

type rawWriter struct{ *rawCall }

func (w rawWriter) Write(p []byte) (int, error) {
	n, err := w.do(p)
	if n < len(p) && err == nil {
		err = io.ErrShortWrite
	}
	return n, err
}
