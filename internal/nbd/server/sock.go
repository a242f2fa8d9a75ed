package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Why the server takes each connection's socket away from the runtime's poller.
//
// The runtime watches every socket of the net package with an edge-triggered epoll, and while
// nothing else is runnable one of its threads sleeps in epoll_wait. Each arrival of data on a
// watched socket wakes that thread, even while the reader is busy and will find the data itself:
// in the 64K sequential write row, the thread woke, took the core from the reader, found nothing to
// run and slept again, thousands of times a second. And a reader that does wait in the poller
// parks its goroutine, which another thread picks up later.
//
// So after the handshake the server detaches the socket: it duplicates the descriptor, closes the
// net.Conn (the runtime takes the socket out of its epoll set) and serves the duplicate in
// blocking mode, as nbdkit's threads do. A read first tries the socket without waiting, in a raw
// system call; finding nothing, it runs beforeWait (the reader sends the replies held back for a
// batch), looks again a few times (spinTries, answering the asynchronous reads that end meanwhile:
// conn.looking), then sleeps in the kernel through the runtime's
// system-call path, which lets the runtime give the thread's P to other goroutines. One thread a
// connection sleeps there, and the kernel wakes it, and only it, when the client sends; a
// connection that stays idle moves to a poller of its own and gives the thread back (idle.go). A large
// payload is read with MSG_WAITALL: one call, whatever pieces it arrives in. Replies are written
// the same way: without waiting first, then, if the socket is full, waiting in the kernel (bench
// writeback's rows, in paired runs against the runtime's poller).
//
// Raw calls, where they cannot block, also keep the runtime's monitor (sysmon) asleep: every
// call through the system-call path wakes it when every P has been idle (see Server.watchdog).
//
// Deadlines no longer reach a detached socket. Stopping the reader is shutdown(SHUT_RD), which
// wakes a read sleeping in the kernel or in the idle poller; hanging up is shutdown(SHUT_RDWR). The descriptor itself is
// closed only once the connection's goroutines are done with it, so that its number cannot be
// given to another file under them.
type sock struct {
	fd int
	// beforeWait, if set, runs each time a read finds the socket empty, before it waits; looking,
	// if set, before each time it looks again (true) and before it sleeps in the kernel (false).
	// Set before the socket is read; only the reader reads.
	beforeWait func()
	looking    func(bool)
	stopped    atomic.Bool // reads fail: the server is shutting down, or the connection hung up
	mu         sync.Mutex  // guards closed: orders shutdowns against close
	closed     bool
	// The reader's recvmsg arguments, kept here so that a read allocates nothing.
	msg unix.Msghdr
	iov [2]unix.Iovec
	// idle is where calls wait once they may not sleep in the kernel (idle.go); nil: the kernel
	// only. want, the events waited for there, is the poller's, under its lock; each wait ends
	// with a token on readable or writable.
	idle               *idlePoller
	want               uint32
	readable, writable chan struct{}
}

// spinTries is how many more times a read that found the socket empty looks again, yielding to
// other goroutines in between (a few tens of microseconds in all), before it sleeps in the kernel.
// A server faster than its client otherwise sleeps after nearly every request and is woken by the
// next, one context switch each, and its replies reach the client one at a time, which costs the
// client more too: 4K random reads from the RAM tier ran slower than through the runtime's poller
// (whose idle threads look for work a while before they sleep, which batched the requests). The
// number of tries is set by bench cache's warm 4K random read row and bench writeback's write
// rows in paired runs.
const spinTries = 32

// errReadStopped is what reads return once reading was stopped.
var errReadStopped = errors.New("nbd: reading stopped")

// detach takes nc's socket from the runtime's poller, or returns nil when nc is no socket (a
// net.Pipe in tests), which is then served through the net.Conn. On an error nc is closed.
func detach(nc net.Conn) (*sock, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		nc.Close()
		return nil, err
	}
	// The original descriptor goes, and with it the poller's interest; the duplicate keeps the
	// socket open.
	nc.Close()
	if derr != nil {
		return nil, fmt.Errorf("socket: %w", derr)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("socket: %w", err)
	}
	s := &sock{fd: fd}
	if p := theIdlePoller(); p != nil {
		// A sleep in the kernel ends after kernelWaitMax (EAGAIN), and the call waits on in the
		// idle poller: a socket that refuses the timeouts sleeps there from the start.
		tv := unix.NsecToTimeval(int64(kernelWaitMax))
		if unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv) == nil &&
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv) == nil {
			s.idle = p
			s.readable, s.writable = make(chan struct{}, 1), make(chan struct{}, 1)
		}
	}
	return s, nil
}

// call makes one system call on p and returns how many bytes it moved.
func (s *sock) call(trap uintptr, p []byte, flags uintptr) (int, syscall.Errno) {
	return s.syscall(trap, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), flags, flags)
}

// syscall makes the system call trap(fd, a1, a2, a3), again after EINTR: raw when flags (the
// call's) hold MSG_DONTWAIT, for then it cannot block, else through the runtime's system-call path.
func (s *sock) syscall(trap, a1, a2, a3, flags uintptr) (int, syscall.Errno) {
	for {
		var n uintptr
		var e syscall.Errno
		if flags&unix.MSG_DONTWAIT != 0 {
			n, _, e = syscall.RawSyscall6(trap, uintptr(s.fd), a1, a2, a3, 0, 0)
		} else {
			n, _, e = syscall.Syscall6(trap, uintptr(s.fd), a1, a2, a3, 0, 0)
		}
		switch e {
		case 0:
			return int(n), 0
		case syscall.EINTR:
		default:
			return 0, e
		}
	}
}

// recv reads into p what the socket has, waiting for at least a byte (all of p with
// MSG_WAITALL in wait, unless a signal cuts it short). 0 bytes and no error is the end.
func (s *sock) recv(p []byte, wait uintptr) (int, error) {
	return s.receive(wait, func(flags uintptr) (int, syscall.Errno) {
		return s.call(unix.SYS_RECVFROM, p, flags)
	})
}

// recv2 reads into a, then b, what the socket has, waiting for at least a byte: in one system
// call, the next request's header and as much of the payload it is expected to carry.
func (s *sock) recv2(a, b []byte) (int, error) {
	s.iov[0] = unix.Iovec{Base: &a[0]}
	s.iov[0].SetLen(len(a))
	s.iov[1] = unix.Iovec{Base: &b[0]}
	s.iov[1].SetLen(len(b))
	s.msg = unix.Msghdr{Iov: &s.iov[0]}
	s.msg.SetIovlen(len(s.iov))
	return s.receive(0, func(flags uintptr) (int, syscall.Errno) {
		return s.syscall(unix.SYS_RECVMSG, uintptr(unsafe.Pointer(&s.msg)), flags, 0, flags)
	})
}

// receive makes a receiving call: at once if the socket has data; when it has none, after
// beforeWait, looking again spinTries times, then waiting in the kernel with the wait flags.
func (s *sock) receive(wait uintptr, call func(flags uintptr) (int, syscall.Errno)) (int, error) {
	if s.stopped.Load() {
		return 0, errReadStopped
	}
	n, e := call(unix.MSG_DONTWAIT)
	if e == syscall.EAGAIN {
		if s.beforeWait != nil {
			s.beforeWait()
		}
		for i := 0; i < spinTries && e == syscall.EAGAIN; i++ {
			runtime.Gosched()
			if s.looking != nil {
				s.looking(true)
			}
			n, e = call(unix.MSG_DONTWAIT)
		}
		if s.looking != nil {
			s.looking(false)
		}
		if e == syscall.EAGAIN {
			n, e = s.block(unix.EPOLLIN, wait, call)
		}
	}
	if e != 0 {
		return 0, e
	}
	if n == 0 && s.stopped.Load() {
		return 0, errReadStopped // the end a shutdown makes, not the client's
	}
	return n, nil
}

// Read reads what the socket has, waiting for at least a byte; io.EOF at the end.
func (s *sock) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := s.recv(p, 0)
	if n == 0 && err == nil {
		return 0, io.EOF
	}
	return n, err
}

// readFull reads all of p, as io.ReadFull does.
func (s *sock) readFull(p []byte) error {
	for done := 0; done < len(p); {
		n, err := s.recv(p[done:], unix.MSG_WAITALL)
		switch {
		case err != nil:
			return err
		case n == 0 && done == 0:
			return io.EOF
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		done += n
	}
	return nil
}

// Write writes all of p, waiting while the socket is full.
func (s *sock) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		send := func(flags uintptr) (int, syscall.Errno) { return s.call(unix.SYS_SENDTO, p[done:], flags) }
		n, e := send(unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL)
		if e == syscall.EAGAIN {
			n, e = s.block(unix.EPOLLOUT, unix.MSG_NOSIGNAL, send)
		}
		if e != 0 {
			return done, e
		}
		done += n
	}
	return done, nil
}

// tryWrite writes what of p the socket takes without waiting.
func (s *sock) tryWrite(p []byte) (int, error) {
	n, e := s.call(unix.SYS_SENDTO, p, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	if e != 0 {
		return 0, e
	}
	if n < len(p) {
		return n, io.ErrShortWrite
	}
	return n, nil
}

// writev writes bufs whole in as few system calls as the socket allows (a large reply: its
// header and its data).
func (s *sock) writev(bufs ...[]byte) error {
	send := func(flags uintptr) (int, syscall.Errno) {
		for {
			n, err := unix.SendmsgBuffers(s.fd, bufs, nil, nil, int(flags))
			if err == nil {
				return n, 0
			}
			if e := errnoOf(err); e != syscall.EINTR {
				return 0, e
			}
		}
	}
	for len(bufs) > 0 {
		// Waiting at once: a large reply rarely fits the socket's free space, and a try without
		// waiting would cost a system call more for the part it leaves.
		n, e := s.block(unix.EPOLLOUT, unix.MSG_NOSIGNAL, send)
		if e != 0 {
			return e
		}
		for len(bufs) > 0 && n >= len(bufs[0]) {
			n -= len(bufs[0])
			bufs = bufs[1:]
		}
		if len(bufs) > 0 {
			bufs[0] = bufs[0][n:]
		}
	}
	return nil
}

// setSendBuffer asks for a send buffer of n bytes; the kernel may give less (net.core.wmem_max),
// and a refusal only leaves the default.
func (s *sock) setSendBuffer(n int) {
	_ = unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n)
}

// stopReading makes every read from now on fail, and wakes one waiting in the kernel; replies can
// still be written.
func (s *sock) stopReading() {
	s.stopped.Store(true)
	s.shutdown(unix.SHUT_RD)
}

// hangUp ends the connection for both sides: reads end, writes fail.
func (s *sock) hangUp() {
	s.stopped.Store(true)
	s.shutdown(unix.SHUT_RDWR)
}

func (s *sock) shutdown(how int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		_ = unix.Shutdown(s.fd, how)
	}
}

// close closes the descriptor, once nothing else will use it.
func (s *sock) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		if s.idle != nil {
			s.idle.forget(s)
		}
		unix.Close(s.fd)
	}
}

// errnoOf is the error number of err, which golang.org/x/sys's calls return as a syscall.Errno.
func errnoOf(err error) syscall.Errno {
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}

// rawSleep sleeps for d in a raw system call: the goroutine keeps its P and the runtime counts it
// as running (see Server.watchdog for why). It then yields, so that a stop of the world waits for
// it no longer than the signal that interrupts the sleep (ppoll is never restarted after one).
func rawSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.RawSyscall6(syscall.SYS_PPOLL, 0, 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	runtime.Gosched()
}
