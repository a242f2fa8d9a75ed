package nbd

import (
	"io"
	"net"
	"runtime"
	"syscall"
	"time"
	"unsafe"
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

// rawIO returns a reader (a *rawReader) and a writer for nc that use raw system calls; or nc
// itself when nc is not a socket (net.Pipe in tests).
func rawIO(nc net.Conn) (io.Reader, io.Writer) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nc, nc
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nc, nc
	}
	r := &rawReader{newRawCall(rc.Read, syscall.SYS_READ, false)}
	w := rawWriter{newRawCall(rc.Write, syscall.SYS_WRITE, true)}
	return r, w
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
	// beforeWait, if set, runs each time the call finds the socket not ready, before the poller
	// waits: the server's reader sends the replies it held back for a batch there. Learning that
	// the client has sent nothing more from the read itself saves asking the kernel first (an
	// ioctl per request, a costly system call in a virtual machine).
	beforeWait func()
	p          []byte
	n          int
	errno      syscall.Errno
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
			if c.beforeWait != nil {
				c.beforeWait()
			}
			return false
		default:
			c.errno = e
			return true
		}
	}
}

type rawReader struct{ *rawCall }

func (r *rawReader) Read(p []byte) (int, error) {
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

// setSendBuffer asks for a socket send buffer of n bytes where nc is a socket; the kernel may give
// less (net.core.wmem_max), and a refusal only leaves the default.
func setSendBuffer(nc net.Conn, n int) {
	if s, ok := nc.(interface{ SetWriteBuffer(int) error }); ok {
		_ = s.SetWriteBuffer(n)
	}
}

// rawSleep sleeps for d in a raw system call: the goroutine keeps its P and the runtime counts it
// as running (see Server.watchdog for why). It then yields, so that a stop of the world waits for
// it no longer than the signal that interrupts the sleep (ppoll is never restarted after one).
func rawSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.RawSyscall6(syscall.SYS_PPOLL, 0, 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	runtime.Gosched()
}
