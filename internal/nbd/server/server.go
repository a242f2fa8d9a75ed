// Package server serves volume.Devices over the Network Block Device protocol (doc/proto.md of
// NetworkBlockDevice/nbd; the wire format is internal/nbd/proto): the fixed-newstyle handshake,
// then the transmission phase with simple and structured replies, each connection's requests
// served concurrently and answered out of order. Connections come from listeners (Serve) or one at
// a time from whoever made them (ServeConn; ServeLocalConn for the sockets handed to the kernel's
// NBD client, internal/nbd/kernel).
//
// TLS (NBD_OPT_STARTTLS, handshake.go) is offered, or required, as Config.TLS says; a connection
// over TLS is served through its *tls.Conn, whose records go through the detached socket as a
// plain connection's bytes do (wire.go).
//
// The server must never let one connection's bad input harm another connection or write anything
// a client did not ask for: malformed requests get an error reply or a closed connection. With TLS
// required it must never tell a client that has not started TLS anything about its exports.
//
// # Locks
//
// Each mutex says in its comment what it guards. No lock is held across a call of the device
// (volume.Device), nor while a request waits for a slot or a payload buffer. Where a goroutine
// holds two at once it took them in one of these orders:
//
//   - Server.mu, then a connection's stopMu (Shutdown stops or hangs up every connection), then
//     its sock's mu (a shutdown of the socket), then the idle poller's mu (a close forgets the
//     socket there).
//   - A connection's wmu (the reply writer), then its endedMu (replyAtRunEnd, which only tries
//     wmu), or, over TLS, wire.mu (conn.batch), or the TLS session's own lock and then wire.mu.
//     A write that must wait for the socket takes the idle poller's mu for a moment.
//
// The payload budgets' mutexes, writeOrder.mu and refusalLimiter.mu are leaves: nothing is taken
// under them. A request takes its slot, then the connection's payload budget, then the server's.
package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/volume"
)

// Export is one device the server offers under a name.
type Export struct {
	Name, Description string
	Device            volume.Device
}

// Config configures a Server.
type Config struct {
	Exports     []Export     // the first one is also the default export (name "")
	Logger      *slog.Logger // nil = slog.Default()
	MaxInFlight int          // requests served at once per connection; 0 = 64
	// MaxConnections bounds the connections served at once; more are closed as they arrive.
	// Each holds its buffers (2 x connBufSize) while it is served; the requests' payloads of all
	// of them together are bounded by PayloadBytes. 0 = 1024.
	MaxConnections int
	// MaxConnectionsPerPeer bounds the TCP connections from one IP address, so that one host
	// cannot take all of MaxConnections; unix-socket clients are this machine's own. 0 = 128.
	MaxConnectionsPerPeer int
	// Allow lists the networks whose TCP clients may connect; a client from anywhere else is
	// closed as it arrives, before the handshake. Empty: any. Unix-socket clients are this
	// machine's own, which the socket file's mode governs.
	Allow []netip.Prefix
	// TLS is how connections from Serve and ServeConn are offered TLS; the zero value offers none.
	TLS TLS
	// PayloadBytes bounds the request payloads (WRITE data read, READ replies not yet written)
	// that all connections hold at once; a request waits for room. One request larger than it
	// goes alone. A connection holds at most three quarters of it, so that a client that does
	// not take its replies stalls only itself (unless it sends requests larger than that). The
	// readers' read-ahead of sequential WRITEs takes up to a quarter more. 0 =
	// DefaultPayloadBytes.
	PayloadBytes int64
}

// TLS is how the server offers TLS.
type TLS struct {
	Mode tlsconf.Mode // Off, On (each client chooses) or Require
	// Config returns the configuration of a new TLS session. It is called at each
	// NBD_OPT_STARTTLS, so that certificates loaded again meanwhile serve the next session
	// (tlsconf.Reloadable's Config). Needed unless Mode is Off.
	Config func() *tls.Config
}

const (
	defaultMaxInFlight    = 64
	defaultMaxConnections = 1024
	defaultMaxPerPeer     = 128
	// defaultHandshakeTimeout bounds the whole handshake, so that a silent or dawdling client
	// cannot hold a goroutine forever. Idle connections in transmission are legitimate and have no
	// deadline.
	defaultHandshakeTimeout = 30 * time.Second
	// maxPayload is the hard cap on a request's payload, whatever the device advertises: a
	// WRITE declaring more is not trusted to be followed by its data, and the connection is
	// closed; the advertised maximum block size is clamped to it.
	maxPayload = 64 << 20
	// connBufSize sizes the buffered reader and writer of each connection: large enough to batch
	// many small replies into one system call; large payloads bypass the buffers.
	connBufSize = 64 << 10
	// sendBufSize is the socket send buffer a connection asks for with its first large reply (the
	// kernel caps it at net.core.wmem_max). With the default 208 KiB, a 1 MiB READ reply takes
	// five writes, each ending in EAGAIN and a wait while the client drains the socket (bench
	// cache's 1M sequential read row measures it). Connections that never send one keep the
	// default.
	sendBufSize = 4 << 20
)

// Server serves exports over the NBD protocol (fixed newstyle handshake), one goroutine reading
// each connection and up to MaxInFlight requests served concurrently and answered out of order.
// While a device answers in microseconds, the reading goroutine serves requests itself, which is
// cheaper than a handoff; a watchdog moves the reading to a fresh goroutine when one is slow.
type Server struct {
	exports     []Export
	byName      map[string]*Export // includes "" for the default export
	log         *slog.Logger
	maxInFlight int
	maxConns    int
	maxPerPeer  int
	allow       []netip.Prefix
	refused     [numRefusals]atomic.Uint64 // connections refused as they arrived, by Refusal
	refusalLogs refusalLimiter
	tls         TLS
	payloads    *budget // the payload bytes all connections hold (getBuf)
	prefetch    *budget // the bytes readers hold read ahead of a WRITE's header (readHeader)
	// handshakeTimeout is defaultHandshakeTimeout; tests shorten it.
	handshakeTimeout time.Duration

	// mu guards closing, listeners, conns, peers and watching. Shutdown stops the connections
	// under it (their stopMu), and the watchdog looks at them under it.
	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	peers     map[string]int // TCP connections by remote IP address
	connWG    sync.WaitGroup
	watching  bool // the watchdog runs
}

// New checks cfg and returns a server ready to Serve.
func New(cfg Config) (*Server, error) {
	if len(cfg.Exports) == 0 {
		return nil, errors.New("nbd: no exports")
	}
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("nbd: MaxInFlight %d is negative (0 means %d)", cfg.MaxInFlight, defaultMaxInFlight)
	}
	if cfg.MaxConnections < 0 {
		return nil, fmt.Errorf("nbd: MaxConnections %d is negative (0 means %d)", cfg.MaxConnections, defaultMaxConnections)
	}
	if cfg.MaxConnectionsPerPeer < 0 {
		return nil, fmt.Errorf("nbd: MaxConnectionsPerPeer %d is negative (0 means %d)", cfg.MaxConnectionsPerPeer, defaultMaxPerPeer)
	}
	if cfg.PayloadBytes < 0 {
		return nil, fmt.Errorf("nbd: PayloadBytes %d is negative (0 means %d)", cfg.PayloadBytes, DefaultPayloadBytes)
	}
	if cfg.PayloadBytes == 0 {
		cfg.PayloadBytes = DefaultPayloadBytes
	}
	if cfg.TLS.Mode != tlsconf.Off && cfg.TLS.Config == nil {
		return nil, fmt.Errorf("nbd: TLS mode %s without a TLS configuration", cfg.TLS.Mode)
	}
	s := &Server{
		exports:     append([]Export(nil), cfg.Exports...),
		byName:      map[string]*Export{},
		log:         cfg.Logger,
		maxInFlight: cfg.MaxInFlight,
		maxConns:    cfg.MaxConnections,
		maxPerPeer:  cfg.MaxConnectionsPerPeer,
		allow:       append([]netip.Prefix(nil), cfg.Allow...),
		tls:         cfg.TLS,
		payloads:    newBudget(cfg.PayloadBytes),
		prefetch:    newBudget(max(cfg.PayloadBytes/4, 1)),

		handshakeTimeout: defaultHandshakeTimeout,
		listeners:        map[net.Listener]struct{}{},
		conns:            map[*conn]struct{}{},
		peers:            map[string]int{},
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.maxInFlight == 0 {
		s.maxInFlight = defaultMaxInFlight
	}
	if s.maxConns == 0 {
		s.maxConns = defaultMaxConnections
	}
	if s.maxPerPeer == 0 {
		s.maxPerPeer = defaultMaxPerPeer
	}
	for i := range s.exports {
		e := &s.exports[i]
		switch {
		case e.Device == nil:
			return nil, fmt.Errorf("nbd: export %q has no device", e.Name)
		case len(e.Name) > proto.MaxExportNameLen:
			return nil, fmt.Errorf("nbd: export name %.20q... is longer than %d bytes", e.Name, proto.MaxExportNameLen)
		case e.Name == "" && i > 0:
			return nil, errors.New("nbd: only the first export may have the empty name (it is the default export)")
		}
		if _, dup := s.byName[e.Name]; dup {
			return nil, fmt.Errorf("nbd: export name %q is used twice", e.Name)
		}
		s.byName[e.Name] = e
	}
	s.byName[""] = &s.exports[0]
	return s, nil
}

// Serve accepts connections on l until Shutdown is called, then returns nil; it returns the
// listener's error if l fails for another reason. Serve may run for several listeners at once.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.ShuttingDown() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Running out of file descriptors or a connection aborted before accept: keep
			// serving the connections there are, and try again a little later.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("nbd: accept failed, retrying", "addr", l.Addr().String(), "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		go s.ServeConn(nc, remoteName(nc))
	}
}

// ShuttingDown reports whether Shutdown has been called, after which the server ends every
// connection itself.
func (s *Server) ShuttingDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Shutdown stops every listener, lets the requests in flight finish and be answered, then closes
// the connections. Connections still in the handshake are closed at once. When ctx ends first,
// every connection is closed by force and ctx's error is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.stop()
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.hangUp()
		}
		s.mu.Unlock()
		return ctx.Err()
	}
}

// ServeConn serves one connection to its end, as Serve does each it accepts, TLS included: for a
// connection the server did not accept itself. remote names the peer in the logs. It closes nc.
func (s *Server) ServeConn(nc net.Conn, remote string) { s.serveConn(nc, remote, s.tls.Mode) }

// ServeLocalConn is ServeConn for a connection this process made to itself: one end of a
// socketpair whose other end goes to the kernel's NBD client (internal/nbd/kernel), which cannot
// speak TLS and needs none, as nothing it sends crosses a network. Config.TLS does not apply.
func (s *Server) ServeLocalConn(nc net.Conn, remote string) { s.serveConn(nc, remote, tlsconf.Off) }

func (s *Server) serveConn(nc net.Conn, remote string, tlsMode tlsconf.Mode) {
	log := s.log.With("remote", remote)
	if !allowed(s.allow, nc.RemoteAddr()) {
		s.refuse(nc, log, NotAllowed, "nbd: connection refused: its address is in none of the allowed networks")
		return
	}
	c := &conn{s: s, raw: nc, nc: nc, tlsMode: tlsMode, log: log}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.conns) >= s.maxConns {
		s.mu.Unlock()
		s.refuse(nc, log, TooMany, "nbd: connection refused: the server serves its maximum of connections already", "max", s.maxConns)
		return
	}
	peer := peerOf(nc)
	if peer != "" && s.peers[peer] >= s.maxPerPeer {
		s.mu.Unlock()
		s.refuse(nc, log, TooManyFromHost, "nbd: connection refused: its host has the most connections one host may have", "max", s.maxPerPeer)
		return
	}
	s.conns[c] = struct{}{}
	if peer != "" {
		s.peers[peer]++
	}
	s.connWG.Add(1)
	s.mu.Unlock()
	// The buffers only for a connection admitted: refusing a flood costs no memory.
	c.src = &source{r: nc}
	c.br, c.bw = bufio.NewReaderSize(c.src, connBufSize), bufio.NewWriterSize(nc, connBufSize)
	defer func() {
		if c.wire != nil {
			c.wire.closing.Store(true)
		}
		c.nc.Close() // over TLS, after a close_notify alert, which the protocol asks of a server
		if c.sock != nil {
			c.sock.close()
		}
		s.mu.Lock()
		delete(s.conns, c)
		if peer != "" {
			if s.peers[peer]--; s.peers[peer] == 0 {
				delete(s.peers, peer)
			}
		}
		s.mu.Unlock()
		s.connWG.Done()
	}()

	c.log.Debug("nbd: connection open")
	err := c.run()
	switch {
	case err == nil:
		c.log.Debug("nbd: connection closed")
	case isProtocolError(err) || errors.As(err, new(*tlsError)):
		c.log.Warn("nbd: closing connection", "err", err)
	default:
		// The client went away or the server is shutting down: nothing anyone must act on.
		c.log.Debug("nbd: connection closed", "err", err)
	}
}

func remoteName(nc net.Conn) string {
	if a := nc.RemoteAddr(); a != nil && a.String() != "" {
		return a.String()
	}
	return "unix"
}

// protocolError is a client breaking the protocol in a way that ends the connection.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return "protocol violation: " + e.msg }

func protocolErrorf(format string, args ...any) error {
	return &protocolError{msg: fmt.Sprintf(format, args...)}
}

func isProtocolError(err error) bool {
	var pe *protocolError
	return errors.As(err, &pe)
}

// tlsError ends a connection for TLS: a handshake that failed, or a client that asked for an
// export without the TLS the server requires. It breaks no rule of the protocol, but someone has a
// certificate or a client's settings to fix, so it is logged as a warning too.
type tlsError struct{ msg string }

func (e *tlsError) Error() string { return e.msg }

var errShuttingDown = errors.New("nbd: server shutting down")

// peerOf is the IP address a TCP connection comes from, which MaxConnectionsPerPeer counts by, or
// "" for any other connection.
func peerOf(nc net.Conn) string {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ""
}

// PayloadBytes reports the request payload bytes the server's connections hold now and the most
// they may hold (Config.PayloadBytes).
func (s *Server) PayloadBytes() (held, max int64) { return s.payloads.used.Load(), s.payloads.max }
