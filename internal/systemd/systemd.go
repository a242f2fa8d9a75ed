// Package systemd speaks the small protocols by which systemd runs a service, written from their
// documentation rather than taken from a library: readiness and status notifications
// (sd_notify(3): datagrams to $NOTIFY_SOCKET), socket activation (sd_listen_fds(3): listening
// sockets passed from fd 3, counted by $LISTEN_FDS, for the process $LISTEN_PID) and the
// watchdog's interval (sd_watchdog_enabled(3): $WATCHDOG_USEC, $WATCHDOG_PID).
//
// Without those variables everything here is a no-op, so a daemon run by hand behaves as before.
// It must never change the environment (libsystemd's unset_environment: a variable that
// vanishes behind a caller's back is harder to reason about than one that stays), never take file
// descriptors meant for another process (a LISTEN_PID that is not ours), and never accept a passed
// descriptor it cannot use as a listening stream socket: it says which and why instead.
package systemd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Notify sends state (newline-separated KEY=VALUE assignments: "READY=1", "STATUS=...",
// "STOPPING=1", "WATCHDOG=1") to the service manager. It does nothing and returns nil when
// NOTIFY_SOCKET is unset, as when the daemon is not run by systemd.
func Notify(state string) error {
	return notifyTo(os.Getenv("NOTIFY_SOCKET"), state)
}

func notifyTo(socket, state string) error {
	if socket == "" {
		return nil
	}
	// An abstract socket is written with a leading '@', which Go's net package turns into the
	// NUL byte that names one on Linux, as sd_notify does.
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		return fmt.Errorf("NOTIFY_SOCKET=%q: want an absolute path or an abstract socket's @name", socket)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("NOTIFY_SOCKET: %w", err)
	}
	defer c.Close()
	// One datagram per call: the manager reads each as one set of assignments.
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("NOTIFY_SOCKET: %w", err)
	}
	return nil
}

// listenFDsStart is SD_LISTEN_FDS_START: passed descriptors begin at 3, after stdin, stdout and
// stderr.
const listenFDsStart = 3

// maxListenFDs bounds LISTEN_FDS: far more sockets than a unit lists, so a value above it is
// garbage, not a configuration.
const maxListenFDs = 1024

// Listener is one socket that socket activation passed, with the name the unit gave it
// (FileDescriptorName=, from LISTEN_FDNAMES; "" when none was given).
type Listener struct {
	net.Listener
	Name string
}

// Listeners returns the listening sockets systemd (or systemd-socket-activate) passed to this
// process, in the order of the unit's listen lines, or none when it was not socket-activated:
// LISTEN_PID unset or naming another process (the sockets were meant for a parent), or LISTEN_FDS
// unset or 0. Each descriptor gets close-on-exec, so that no program this one starts inherits it,
// and becomes a net.Listener of its own (the descriptor itself is then closed). Unix and TCP
// stream sockets are taken; anything else is an error naming the descriptor and the fix.
func Listeners() ([]Listener, error) {
	return listeners(os.Getenv, os.Getpid(), listenFDsStart)
}

// listeners is Listeners with the environment, the process ID and the first descriptor given,
// so that tests can pass sockets at descriptors the test process does not already use.
func listeners(getenv func(string) string, pid, start int) ([]Listener, error) {
	pidText, fdsText := getenv("LISTEN_PID"), getenv("LISTEN_FDS")
	if pidText == "" {
		return nil, nil
	}
	p, err := strconv.Atoi(pidText)
	if err != nil || p <= 0 {
		return nil, fmt.Errorf("LISTEN_PID=%q is not a process ID", pidText)
	}
	if p != pid {
		return nil, nil
	}
	if fdsText == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(fdsText)
	if err != nil || n < 0 || n > maxListenFDs {
		return nil, fmt.Errorf("LISTEN_FDS=%q is not a count of passed sockets (0 to %d)", fdsText, maxListenFDs)
	}
	var names []string
	if s := getenv("LISTEN_FDNAMES"); s != "" {
		names = strings.Split(s, ":")
		if len(names) != n {
			return nil, fmt.Errorf("LISTEN_FDNAMES=%q names %d sockets and LISTEN_FDS=%d passes %d", s, len(names), n, n)
		}
	}
	ls := make([]Listener, 0, n)
	for i := range n {
		fd := start + i
		l, err := fileListener(fd)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, fmt.Errorf("LISTEN_FDS=%d: fd %d: %w", n, fd, err)
		}
		name := ""
		if names != nil {
			name = names[i]
		}
		ls = append(ls, Listener{Listener: l, Name: name})
	}
	return ls, nil
}

// fileListener checks that fd is a listening stream socket (unix or TCP) and makes a
// net.Listener of it, closing fd.
func fileListener(fd int) (net.Listener, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("not an open descriptor (%v); LISTEN_FDS counts more sockets than were passed", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		// Go's runtime may hold a descriptor of its own (epoll, a pipe) at a number nobody passed.
		return nil, errors.New("not a socket: LISTEN_FDS counts more sockets than were passed, or something else was passed; tierblk takes listening stream sockets (ListenStream= in the .socket unit)")
	}
	unix.CloseOnExec(fd)
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return nil, err
	}
	if typ != unix.SOCK_STREAM {
		return nil, fmt.Errorf("a socket of type %d, not a stream socket; NBD runs over ListenStream= sockets only", typ)
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return nil, err
	}
	if domain != unix.AF_UNIX && domain != unix.AF_INET && domain != unix.AF_INET6 {
		return nil, fmt.Errorf("a socket of address family %d; NBD is served on unix and TCP sockets only", domain)
	}
	if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil {
		return nil, err
	} else if acc == 0 {
		return nil, errors.New("a socket that is not listening; with Accept=yes systemd passes one connection per process, which tierblk does not take: use Accept=no")
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("LISTEN_FDS[%d]", fd))
	defer f.Close() // FileListener holds a duplicate of its own
	l, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	// A unix listener made from a file leaves its socket file alone when closed: the file is
	// the service manager's, kept for the next start.
	return l, nil
}

// WatchdogInterval returns how often the service manager expects WATCHDOG=1 (WatchdogSec=, from
// WATCHDOG_USEC), or 0 when it expects none: the variable unset, or WATCHDOG_PID naming another
// process.
func WatchdogInterval() (time.Duration, error) {
	return watchdogInterval(os.Getenv, os.Getpid())
}

func watchdogInterval(getenv func(string) string, pid int) (time.Duration, error) {
	usecText := getenv("WATCHDOG_USEC")
	if usecText == "" {
		return 0, nil
	}
	if s := getenv("WATCHDOG_PID"); s != "" {
		p, err := strconv.Atoi(s)
		if err != nil || p <= 0 {
			return 0, fmt.Errorf("WATCHDOG_PID=%q is not a process ID", s)
		}
		if p != pid {
			return 0, nil
		}
	}
	usec, err := strconv.ParseUint(usecText, 10, 63)
	if err != nil || usec == 0 || usec > uint64(1<<63-1)/1000 {
		return 0, fmt.Errorf("WATCHDOG_USEC=%q is not a positive number of microseconds", usecText)
	}
	return time.Duration(usec) * time.Microsecond, nil
}
