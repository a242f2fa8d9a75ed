package server

import (
	"bufio"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
)

// conn is one client connection: the handshake, then the transmission phase.
type conn struct {
	s *Server
	// raw is the connection as it came; its deadlines and its closing reach the client whatever
	// runs over it.
	raw net.Conn
	// nc is what the protocol runs over: raw, or the TLS session on it after NBD_OPT_STARTTLS
	// (set under stopMu, before the transmission phase).
	nc net.Conn
	br *bufio.Reader // read only by the connection's own goroutine
	// src is what br reads: nc during the handshake, then plain, or still nc over TLS. It is read
	// directly only while br has nothing buffered.
	src *source
	// sock is the socket detached from the runtime's poller for the transmission phase (see
	// sock.go); nil while raw is no socket, which then serves the transmission itself. Set by the
	// connection's goroutine under stopMu before any other goroutine uses it. plain is sock when
	// the protocol runs on it directly, nil over TLS: only plain may be read or written past nc.
	sock, plain *sock
	// wire, over TLS, is what the TLS session reads and writes: raw, then sock (see wire).
	wire *wire
	log  *slog.Logger

	// stopMu guards stopping and orders it against the setting of nc and sock and of raw's
	// deadlines. Taken under Server.mu (Shutdown); sock.mu is taken under it.
	stopMu   sync.Mutex
	stopping bool // Shutdown was called: no new deadline may be set, no socket detached

	// Negotiated in the handshake, read-only afterwards.
	tlsMode    tlsconf.Mode // the server's, or Off for a local connection or a client that cannot
	tlsOn      bool         // the handshake went on over TLS
	tlsWanted  bool         // an option was refused for want of TLS (logged once)
	noZeroes   bool
	structured bool
	export     *Export
	waiter     backend.Waiter      // the device's count of requests that waited, if it keeps one
	async      backend.AsyncReader // the device, if it starts reads that end on their own
	asyncW     backend.AsyncWriter // and writes
	plug       backend.Plugger     // the device, if it can hold what it starts to send it together
	runEnd     backend.RunDeferrer // the device, if its completions come in runs (runend.go)
	info       volume.Info
	tflags     uint16
	minBlock   uint32
	maxBlock   uint32

	// Transmission phase.
	bigWrites bool // the last WRITE's payload was read past br (see readPayload)
	bigLen    int  // that payload's length, which the next request is expected to carry too
	unflushed int  // requests read since the reader last flushed the replies
	plugged   bool // the reader holds the device's plug (plugFor)
	pluggedN  int  // requests started since it took it
	jobs      chan job
	slots     chan struct{}  // one per request being served: at most MaxInFlight
	budget    *budget        // the payload bytes held (getBuf)
	nworkers  int            // workers started; only the reader touches it
	workers   sync.WaitGroup // workers, and readers started by the watchdog
	readDone  chan error     // the error reading ended with, when a reader started by the watchdog read last
	inline    atomic.Uint64  // odd while the reader serves a request itself
	plan      servePlan      // whether the reader serves a request itself
	seen      uint64         // inline at the watchdog's previous tick; only the watchdog touches it
	order     writeOrder
	// Reads the device started asynchronously wait in ended until a replier goroutine, or the
	// device's own at the end of its run (runend.go), one at a time (replying), answers them, or
	// the reader does while it looks for work (readerLooking). endedMu guards ended, replying,
	// readerLooking and runSpare; it is taken alone or under wmu, and nothing is taken under it.
	endedMu       sync.Mutex
	ended         []ended
	replying      bool
	readerLooking bool
	spare         []ended // the reader's batch, kept between its turns
	runSpare      []ended // the batch of a run's end, kept between runs

	// Replies. Whole replies are written under wmu, which guards bw, out, werr, bigSendBuf and
	// scratch; queued counts the writers holding or waiting for it, so that the last of a burst
	// flushes the buffer (replies are batched). Under it: endedMu, and the writes (over TLS, the
	// session's lock and wire.mu).
	wmu    sync.Mutex
	queued atomic.Int32
	// moreInput is set while the reader has another request buffered; it then flushes the replies
	// before it blocks on the socket, and writers leave the flushing to it.
	moreInput atomic.Bool
	bw        *bufio.Writer
	out       replyOut // what bw writes to on a plain connection
	werr      error    // first write error; nothing more is written after it
	// bigSendBuf is set once the socket's send buffer was enlarged for large replies.
	bigSendBuf bool
	scratch    [proto.StructReplySize + 8 + 6]byte
}

// run performs the handshake and, when the client picks an export, the transmission phase.
func (c *conn) run() error {
	ok, err := c.handshake()
	if err != nil || !ok {
		return err
	}
	return c.transmit()
}

// setDeadline sets the read and write deadline unless the server is shutting down, whose
// immediate read deadline must not be overwritten.
func (c *conn) setDeadline(t time.Time) error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if c.stopping {
		return errShuttingDown
	}
	return c.raw.SetDeadline(t)
}

// stop makes the connection's next read of the socket fail, so that its reader stops taking
// requests; requests in flight still complete and are answered.
func (c *conn) stop() {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	c.stopping = true
	if c.sock != nil {
		c.sock.stopReading()
	} else {
		c.raw.SetReadDeadline(time.Now())
	}
}

// hangUp closes the connection for both sides at once: the reader stops, replies are dropped.
func (c *conn) hangUp() {
	c.stopMu.Lock()
	sk := c.sock
	c.stopMu.Unlock()
	if sk != nil {
		sk.hangUp()
	} else {
		c.raw.Close()
	}
}

// detach moves the transmission phase onto the socket taken from the runtime's poller (see
// sock.go), unless the server is shutting down. br keeps what it has read ahead.
func (c *conn) detach() error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if c.stopping {
		return errShuttingDown
	}
	if err := c.nc.SetDeadline(time.Time{}); err != nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	raw := c.nc
	if c.wire != nil {
		raw = c.wire.Conn
	}
	sk, err := detach(raw)
	if err != nil || sk == nil {
		return err
	}
	sk.beforeWait, sk.looking = c.beforeWait, c.looking
	c.sock = sk
	if c.wire != nil {
		c.wire.sock = sk // the TLS records go through the socket, the requests stay behind nc
		return nil
	}
	c.plain, c.src.r = sk, sk
	c.out.s = sk
	c.bw.Reset(&c.out)
	return nil
}

// readErr turns a failed read of the socket into the error the connection ends with.
func (c *conn) readErr(err error) error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if c.stopping {
		return errShuttingDown
	}
	return err
}
