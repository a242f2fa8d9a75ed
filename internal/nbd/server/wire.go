package server

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// wire is the connection under a TLS session: raw during the handshake, through the runtime's
// poller, then the detached socket once the transmission phase starts, so that a client over TLS
// is served as a plain one is (sock.go): the reader looks again before it sleeps, sends the
// replies held back when the socket is empty (through the session, which encrypts them), and
// sleeps in the kernel or the idle poller. bench nbd --parts tls measures it against nbdkit.
type wire struct {
	net.Conn
	// sock is set by the connection's goroutine before the transmission phase, before any other
	// goroutine reads or writes the session.
	sock *sock
	// closing is set when the connection ends: the session's last words (close_notify) are sent
	// only if the socket takes them at once, as a client that does not read would hold them.
	closing atomic.Bool
	// While a reply writer holds the wire, what the session writes waits in out, and goes in one
	// system call at release (conn.batch). mu guards held and out, and orders those writes and
	// any the session makes on its own meanwhile (an alert, a key update); it is taken under the
	// session's lock, and a write that waits for the socket takes the idle poller's mu under it.
	mu   sync.Mutex
	held bool
	out  []byte
}

// maxHeld bounds what a held wire keeps: past it, the bytes go out at once.
const maxHeld = 256 << 10

func (w *wire) hold() {
	w.mu.Lock()
	w.held = true
	w.mu.Unlock()
}

// release sends what was written while the wire was held.
func (w *wire) release() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held = false
	return w.send()
}

// send writes out; w.mu is held.
func (w *wire) send() error {
	if len(w.out) == 0 {
		return nil
	}
	_, err := w.sock.Write(w.out)
	w.out = w.out[:0]
	return err
}

func (w *wire) Read(p []byte) (int, error) {
	if w.sock != nil {
		return w.sock.Read(p)
	}
	return w.Conn.Read(p)
}

func (w *wire) Write(p []byte) (int, error) {
	switch {
	case w.sock == nil:
		return w.Conn.Write(p)
	case w.closing.Load():
		return w.sock.tryWrite(p)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.held {
		if err := w.send(); err != nil {
			return 0, err
		}
		return w.sock.Write(p)
	}
	w.out = append(w.out, p...)
	if len(w.out) >= maxHeld {
		if err := w.send(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Deadlines do not reach a detached socket (sock.go): the session's are let pass.

func (w *wire) SetDeadline(t time.Time) error {
	if w.sock != nil {
		return nil
	}
	return w.Conn.SetDeadline(t)
}

func (w *wire) SetReadDeadline(t time.Time) error {
	if w.sock != nil {
		return nil
	}
	return w.Conn.SetReadDeadline(t)
}

func (w *wire) SetWriteDeadline(t time.Time) error {
	if w.sock != nil {
		return nil
	}
	return w.Conn.SetWriteDeadline(t)
}
