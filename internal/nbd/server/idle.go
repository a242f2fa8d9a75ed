package server

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Why a connection that waits long for its client gives up its thread.
//
// A detached socket's reader sleeps in the kernel while its client is quiet, and a writer whose
// client does not read sleeps there until the client does (sock.go says why that is the fast path).
// Each sleeper holds an OS thread: tens of KiB, and Go ends the process at 10,000 threads, so
// enough idle clients could end the daemon. The kernel is therefore kept for connections that are
// busy: at most maxKernelWaits calls sleep there at once, each for at most kernelWaitMax (the
// socket's SO_RCVTIMEO and SO_SNDTIMEO). A call that finds no room there, or whose sleep runs
// out, waits in the idle poller instead: an epoll set of the process's own, which the runtime's
// netpoller watches as it watches any socket. A connection waiting there is a parked goroutine.
// It is woken by one more hop (the poller's goroutine), which a connection pays once when its
// client comes back after a pause.
const (
	maxKernelWaits = 64
	kernelWaitMax  = time.Second
)

// kernelWaits counts the socket calls sleeping in the kernel, across every server of the process.
var kernelWaits atomic.Int32

// idlePoller wakes the sockets that wait in it: each waits for readable (a reader) or writable (a
// writer) through a one-shot registration in the epoll set, re-armed by each wait.
type idlePoller struct {
	epfd int
	// mu guards waiting and the want of each sock in it. It is taken under a sock's mu (forget)
	// and while a wait registers; nothing is taken under it (a wake's token never blocks).
	mu      sync.Mutex
	waiting map[int32]*sock // by descriptor; a sock is in it from its first wait to its close
}

var idle struct {
	once   sync.Once
	poller *idlePoller // nil where the kernel refused one: sockets then sleep in the kernel only
}

// theIdlePoller returns the process's idle poller, started at the first call.
func theIdlePoller() *idlePoller {
	idle.once.Do(func() { idle.poller = newIdlePoller() })
	return idle.poller
}

func newIdlePoller() *idlePoller {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil
	}
	// A non-blocking descriptor given to os.NewFile joins the runtime's netpoller, which reports
	// the epoll set readable when one of its sockets is ready.
	f := os.NewFile(uintptr(epfd), "nbd idle connections")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	p := &idlePoller{epfd: epfd, waiting: map[int32]*sock{}}
	go p.run(rc)
	return p
}

// run wakes the waiting sockets as the kernel reports them ready, for the life of the process.
func (p *idlePoller) run(rc syscall.RawConn) {
	events := make([]unix.EpollEvent, 128)
	for {
		// Read calls the function until it returns true, waiting in the netpoller in between.
		err := rc.Read(func(fd uintptr) bool {
			n, err := unix.EpollWait(int(fd), events, 0)
			if err != nil || n <= 0 {
				return false
			}
			p.wake(events[:n])
			return true
		})
		if err != nil {
			panic("nbd: the idle poller's epoll set failed: " + err.Error())
		}
	}
}

// Event bits that end a wait for reading or for writing: readiness, or the end of the connection.
const (
	readWake  = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR
	writeWake = unix.EPOLLOUT | unix.EPOLLHUP | unix.EPOLLERR
)

func (p *idlePoller) wake(events []unix.EpollEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range events {
		s := p.waiting[ev.Fd]
		if s == nil {
			continue // closed meanwhile
		}
		if s.want&unix.EPOLLIN != 0 && ev.Events&readWake != 0 {
			s.want &^= unix.EPOLLIN
			s.readable <- struct{}{}
		}
		if s.want&unix.EPOLLOUT != 0 && ev.Events&writeWake != 0 {
			s.want &^= unix.EPOLLOUT
			s.writable <- struct{}{}
		}
		if s.want != 0 { // the other side still waits: the one-shot registration is spent
			_ = p.arm(s, unix.EPOLL_CTL_MOD)
		}
	}
}

// wait returns once s is readable (ev EPOLLIN) or writable (EPOLLOUT), or may be: the caller tries
// again, and waits again if it must. The reader and a writer of one socket may wait at once.
func (p *idlePoller) wait(s *sock, ev uint32) syscall.Errno {
	p.mu.Lock()
	s.want |= ev
	op := unix.EPOLL_CTL_MOD
	if p.waiting[int32(s.fd)] != s {
		p.waiting[int32(s.fd)] = s
		op = unix.EPOLL_CTL_ADD
	}
	err := p.arm(s, op)
	if err != nil {
		s.want &^= ev
	}
	p.mu.Unlock()
	if err != nil {
		return errnoOf(err)
	}
	if ev == unix.EPOLLIN {
		<-s.readable
	} else {
		<-s.writable
	}
	return 0
}

// arm registers s for the events it waits for, once.
func (p *idlePoller) arm(s *sock, op int) error {
	return unix.EpollCtl(p.epfd, op, s.fd, &unix.EpollEvent{
		Events: s.want | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd:     int32(s.fd),
	})
}

// forget removes s before its descriptor is closed, so that its number, given to another socket,
// finds no stale registration.
func (p *idlePoller) forget(s *sock) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waiting[int32(s.fd)] == s {
		delete(p.waiting, int32(s.fd))
		_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, s.fd, nil)
	}
}

// block makes call (a socket call that waits, with flags) wait until it can move bytes: in the
// kernel while there is room there, at most for kernelWaitMax, else in the idle poller.
func (s *sock) block(ev uint32, flags uintptr, call func(flags uintptr) (int, syscall.Errno)) (int, syscall.Errno) {
	if s.idle == nil {
		return call(flags)
	}
	for {
		if kernelWaits.Add(1) <= maxKernelWaits {
			n, e := call(flags)
			kernelWaits.Add(-1)
			if e != syscall.EAGAIN { // EAGAIN: the sleep ran out
				return n, e
			}
		} else {
			kernelWaits.Add(-1)
		}
		if e := s.idle.wait(s, ev); e != 0 {
			return 0, e
		}
		// Ready, most likely: take what there is without waiting, or wait again.
		if n, e := call(flags | unix.MSG_DONTWAIT); e != syscall.EAGAIN {
			return n, e
		}
	}
}
