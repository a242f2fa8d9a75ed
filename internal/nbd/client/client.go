// Package client is a pipelined client of the Network Block Device protocol (the wire format is
// internal/nbd/proto), for remote exports used as tierblk backends (pkg/backend/nbd). Dial
// negotiates an export (handshake.go), each connection has one reader goroutine that matches
// replies to requests by cookie and reconnects when the connection drops (conn.go), and the
// methods of Client split calls into wire requests and map errors. Handshake also negotiates
// sockets that the kernel's NBD client takes over (internal/nbd/kernel). With Config.TLS each
// connection starts TLS before any other option, and a server that does not offer it is refused,
// never spoken to in plain.
//
// The client never answers a read from anything but the server's reply, and never reports a write
// as done before the server acknowledged it. It cannot know whether a server that crashed and came
// back kept the writes it had acknowledged but not yet flushed (a volatile cache, by the
// protocol's contract); it logs a warning when a connection drops with such writes outstanding.
// A request waits for its reply as long as the connection lives: a dead peer is found by TCP
// keepalive or by the socket closing, not by a request timeout.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Config says where an export is and how to talk to it.
type Config struct {
	Network, Address string // "unix" and a socket path, or "tcp" and host:port
	Export           string // export name ("" = the server's default export)
	// Connections is how many connections to open (0 = 1). More than one is opened only if the
	// server sets CAN_MULTI_CONN, which promises that a flush on one connection covers writes
	// completed on every connection.
	Connections int
	DialTimeout time.Duration // per connection attempt, handshake included (0 = 10 s)
	// MaxReconnectWait bounds how long a request waits for a dropped connection to come back
	// before it fails (0 = 1 min).
	MaxReconnectWait time.Duration
	Logger           *slog.Logger // nil = slog.Default()
	// TLS, if set, makes every connection start TLS with it (NBD_OPT_STARTTLS) before anything
	// else, or fail: a client asked for TLS never goes on without it.
	TLS *tls.Config
}

// Defaults for zero Config fields, and the reconnect backoff.
const (
	defaultDialTimeout      = 10 * time.Second
	defaultMaxReconnectWait = time.Minute
	backoffMin              = 50 * time.Millisecond
	backoffMax              = 5 * time.Second
	// maxChunk caps one request's length even when the server allows more: 32 MiB is the
	// largest payload every server must accept, and longer requests gain nothing from pipelining.
	maxChunk = 32 << 20
	// Block sizes to assume when the server does not advertise them (the protocol's defaults).
	defaultMinBlock       = 1
	defaultPreferredBlock = 4096
	defaultMaxBlock       = 32 << 20
)

// Errors from Dial (and from requests that waited for a reconnect that kept failing).
var (
	ErrNotNBDServer   = errors.New("nbd: peer is not an NBD server")
	ErrExportNotFound = errors.New("nbd: export not found on the server")
	ErrServerRefused  = errors.New("nbd: server refused the connection")
	ErrProtocol       = errors.New("nbd: protocol violation by the server")
)

// Client is a connection (or several) to one NBD export. Its methods are safe for concurrent use
// and pipelined: concurrent calls are in flight together, and a large call is split into
// several requests sent without waiting for each other.
type Client struct {
	cfg    Config
	log    *slog.Logger
	export Export // as negotiated by the first connection; reconnects must match it
	chunk  int64  // the longest request sent: a multiple of the minimum block size
	conns  []*conn
	// structured is whether the first connection negotiated structured replies (Structured).
	structured bool

	next       atomic.Uint64 // round-robin position over conns
	cookie     atomic.Uint64 // source of request cookies, unique for the client's lifetime
	reconnects atomic.Int64
	// Writes acknowledged, and how many of them the last successful flush covered: a connection
	// lost with writes not yet flushed may have lost them with a server that crashed. losses counts
	// such connections; reported, those a failed Flush has owned up to.
	writesDone, writesFlushed atomic.Uint64
	losses, reported          atomic.Uint64
	calls                     atomic.Uint64 // calls sent (Waits)

	ctx       context.Context // cancelled by Close: stops reconnects and dials
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup // readers and reconnect loops
}

// Export is what a handshake learns about an export.
type Export struct {
	Size                          int64
	Flags                         uint16 // transmission flags (proto.Flag*); 0 without proto.FlagHasFlags
	MinBlock, PrefBlock, MaxBlock uint32 // the protocol's defaults when the server sent none
}

// Dial connects to the export, negotiates it and starts the connections' readers. The context
// bounds only the dial and handshake.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	switch cfg.Network {
	case "unix", "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("nbd: network %q: use \"unix\" with a socket path or \"tcp\" with host:port", cfg.Network)
	}
	if cfg.Address == "" {
		return nil, errors.New("nbd: no server address")
	}
	if cfg.Connections <= 0 {
		cfg.Connections = 1
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = defaultDialTimeout
	}
	if cfg.MaxReconnectWait <= 0 {
		cfg.MaxReconnectWait = defaultMaxReconnectWait
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Client{
		cfg: cfg,
		log: log.With("nbd_server", cfg.Network+":"+cfg.Address, "export", cfg.Export),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())

	first, err := c.connect(ctx)
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.export, c.structured = first.export, first.structured
	c.chunk = int64(min(c.export.MaxBlock, maxChunk))
	c.chunk -= c.chunk % int64(c.export.MinBlock)

	n := cfg.Connections
	if n > 1 && c.export.Flags&proto.FlagCanMultiConn == 0 {
		c.log.Info("nbd: server does not offer multi-conn; using one connection", "asked", n)
		n = 1
	}
	sessions := []*session{first}
	for len(sessions) < n {
		s, err := c.connect(ctx)
		if err == nil {
			err = c.sameExport(s.export)
			if err != nil {
				s.nc.Close()
			}
		}
		if err != nil {
			for _, s := range sessions {
				s.nc.Close()
			}
			c.cancel()
			return nil, fmt.Errorf("nbd: connection %d of %d: %w", len(sessions)+1, n, err)
		}
		sessions = append(sessions, s)
	}
	for i, s := range sessions {
		cn := newConn(c, i)
		c.conns = append(c.conns, cn)
		cn.install(s)
	}
	c.log.Info("nbd: connected", "size", c.export.Size, "flags", fmt.Sprintf("%#x", c.export.Flags),
		"connections", n, "structured_replies", first.structured,
		"block_min", c.export.MinBlock, "block_max", c.export.MaxBlock)
	return c, nil
}

// sameExport checks that a later connection reached the export the first one negotiated: a
// server restarted with another disk behind the same address must not be written to.
func (c *Client) sameExport(e Export) error {
	want := c.export
	if e.Size != want.Size || e.Flags&proto.FlagReadOnly != want.Flags&proto.FlagReadOnly ||
		e.MinBlock != want.MinBlock || int64(e.MaxBlock) < c.chunk {
		return fmt.Errorf("%w: export changed since the first connection (size %d, read-only %t, block sizes %d-%d; was %d, %t, %d-%d)",
			ErrServerRefused, e.Size, e.Flags&proto.FlagReadOnly != 0, e.MinBlock, e.MaxBlock,
			want.Size, want.Flags&proto.FlagReadOnly != 0, want.MinBlock, want.MaxBlock)
	}
	return nil
}

// Size is the export's size in bytes.
func (c *Client) Size() int64 { return c.export.Size }

// Flags are the transmission flags the server sent (NBD_FLAG_*).
func (c *Client) Flags() uint16 { return c.export.Flags }

// BlockSizes are the server's size constraints, or the protocol's defaults when it sent none.
func (c *Client) BlockSizes() (minimum, preferred, maximum uint32) {
	return c.export.MinBlock, c.export.PrefBlock, c.export.MaxBlock
}

// ReadOnly reports whether the server exports the device read-only.
func (c *Client) ReadOnly() bool { return c.export.Flags&proto.FlagReadOnly != 0 }

// Waits counts the calls sent to the server: each waits on the network (backend.Waiter).
func (c *Client) Waits() uint64 { return c.calls.Load() }

// Structured reports whether the first connection negotiated structured replies, in which the
// server can explain an error and send a read in chunks.
func (c *Client) Structured() bool { return c.structured }

// Connections is how many connections the client keeps: as many as it was asked for, or one when
// the server does not offer multi-conn.
func (c *Client) Connections() int { return len(c.conns) }

// Reconnects counts the sessions re-established after a connection dropped.
func (c *Client) Reconnects() int64 { return c.reconnects.Load() }

// Pending counts the requests that have no reply yet: in flight, or waiting for a reconnect.
func (c *Client) Pending() int {
	n := 0
	for _, cn := range c.conns {
		cn.mu.Lock()
		n += len(cn.pending)
		cn.mu.Unlock()
	}
	return n
}

func (c *Client) has(flag uint16) bool { return c.export.Flags&flag != 0 }

// ReadAt reads len(p) bytes at off. On error, n counts the bytes at the start of p that were read.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.run(proto.CmdRead, 0, off, int64(len(p)), p)
	return int(n), err
}

// ReadAtAsync implements backend.AsyncReader for a read that one request carries: it sends the
// request and returns, and done is called with ReadAt's outcome on the goroutine that ends it (the
// connection's reader, or whatever fails it: a close, a reconnect that waited too long), so that
// no goroutine waits for each read (bench cold's nas-read row). A request lost with its
// connection goes out again after the reconnect, as ReadAt's do. A read that ReadAt would refuse,
// or split into several requests, is not started.
func (c *Client) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	n := int64(len(p))
	mb := int64(c.export.MinBlock)
	if c.ctx.Err() != nil || n == 0 || n > c.chunk || off%mb != 0 || n%mb != 0 || backend.CheckRange(off, n, c.export.Size) != nil {
		return false
	}
	r := &request{Request: proto.Request{Type: proto.CmdRead, Offset: uint64(off), Length: uint32(n)}, buf: p, done: done}
	c.pick().submit(r)
	return true
}

// WriteAt writes p at off; the data may be in the server's volatile cache until Flush.
func (c *Client) WriteAt(p []byte, off int64) (int, error) {
	if err := c.writable("write"); err != nil {
		return 0, err
	}
	n, err := c.run(proto.CmdWrite, 0, off, int64(len(p)), p)
	return int(n), err
}

// WriteAtFUA writes p at off and returns once it is durable: with the FUA flag when the server
// supports it, otherwise as a write followed by a flush.
func (c *Client) WriteAtFUA(p []byte, off int64) (int, error) {
	if !c.has(proto.FlagSendFUA) {
		n, err := c.WriteAt(p, off)
		if err != nil {
			return n, err
		}
		return n, c.Flush()
	}
	if err := c.writable("write"); err != nil {
		return 0, err
	}
	n, err := c.run(proto.CmdWrite, proto.CmdFlagFUA, off, int64(len(p)), p)
	return int(n), err
}

// Flush makes every write that completed before the call durable. A server that does not offer
// flush has no volatile cache, so there is nothing to do. It fails, once, where a connection was
// lost with acknowledged writes no flush had covered (before or while it ran): the server may have
// restarted and lost them, and cannot say so, so the caller must write them again (the
// write-back destager keeps such lines dirty).
func (c *Client) Flush() error {
	if !c.has(proto.FlagSendFlush) {
		return nil
	}
	covered := c.writesDone.Load()
	if _, err := c.run(proto.CmdFlush, 0, 0, 0, nil); err != nil {
		return err
	}
	for {
		old := c.writesFlushed.Load()
		if old >= covered || c.writesFlushed.CompareAndSwap(old, covered) {
			break
		}
	}
	losses := c.losses.Load()
	if n := losses - c.reported.Swap(losses); n > 0 {
		return fmt.Errorf("nbd: %d connection(s) to %s %s were lost with acknowledged writes not yet flushed; a server that restarted may have lost them, so they must be written again",
			n, c.cfg.Network, c.cfg.Address)
	}
	return nil
}

// Trim discards a range. It fails with backend.ErrNotSupported if the server cannot trim.
func (c *Client) Trim(off, length int64) error {
	if err := c.capable("trim", proto.FlagSendTrim); err != nil {
		return err
	}
	_, err := c.run(proto.CmdTrim, 0, off, length, nil)
	return err
}

// WriteZeroes writes zeroes over a range without sending them; with mayUnmap the server may punch
// a hole. It fails with backend.ErrNotSupported if the server cannot, so callers write zeroes.
func (c *Client) WriteZeroes(off, length int64, mayUnmap bool) error {
	if err := c.capable("write-zeroes", proto.FlagSendWriteZeroes); err != nil {
		return err
	}
	var flags uint16
	if !mayUnmap {
		flags = proto.CmdFlagNoHole
	}
	_, err := c.run(proto.CmdWriteZeroes, flags, off, length, nil)
	return err
}

// Cache asks the server to bring a range into its cache. It fails with backend.ErrNotSupported if
// the server does not take the hint.
func (c *Client) Cache(off, length int64) error {
	if !c.has(proto.FlagSendCache) {
		return fmt.Errorf("%w: the NBD server does not offer cache", backend.ErrNotSupported)
	}
	_, err := c.run(proto.CmdCache, 0, off, length, nil)
	return err
}

// Close disconnects politely (NBD_CMD_DISC) and releases everything; calls still in flight fail
// with an error wrapping backend.ErrClosed. It does not flush.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		for _, cn := range c.conns {
			cn.close()
		}
		c.wg.Wait()
		c.log.Debug("nbd: closed")
	})
	return nil
}

func (c *Client) writable(op string) error {
	if c.ReadOnly() {
		return fmt.Errorf("%w: %s on a read-only NBD export", backend.ErrReadOnly, op)
	}
	return nil
}

func (c *Client) capable(op string, flag uint16) error {
	if err := c.writable(op); err != nil {
		return err
	}
	if !c.has(flag) {
		return fmt.Errorf("%w: the NBD server does not offer %s", backend.ErrNotSupported, op)
	}
	return nil
}

// run sends one call as requests of at most c.chunk bytes each, all in flight together, and
// waits for them. buf is the read destination or the write payload. It returns how many bytes at
// the start of the range completed before the first failed request.
func (c *Client) run(cmd, flags uint16, off, length int64, buf []byte) (int64, error) {
	if c.ctx.Err() != nil {
		return 0, fmt.Errorf("nbd: %s: %w", cmdName(cmd), backend.ErrClosed)
	}
	c.calls.Add(1)
	if cmd != proto.CmdFlush {
		if err := backend.CheckRange(off, length, c.export.Size); err != nil {
			return 0, err
		}
		if length == 0 {
			return 0, nil
		}
		if mb := int64(c.export.MinBlock); off%mb != 0 || length%mb != 0 {
			return 0, fmt.Errorf("%w: %s at offset %d length %d is not aligned to the export's minimum block size %d",
				backend.ErrNotSupported, cmdName(cmd), off, length, mb)
		}
	}
	count := max(1, (length+c.chunk-1)/c.chunk)
	reqs := make([]request, count)
	var wg sync.WaitGroup
	wg.Add(len(reqs))
	for i := range reqs {
		r := &reqs[i]
		start := int64(i) * c.chunk
		n := min(c.chunk, length-start)
		*r = request{Request: proto.Request{Type: cmd, Flags: flags, Offset: uint64(off + start), Length: uint32(n)}, wg: &wg}
		if buf != nil {
			r.buf = buf[start : start+n]
		}
		c.pick().submit(r)
	}
	wg.Wait()
	var done int64
	for i := range reqs {
		if reqs[i].err != nil {
			return done, reqs[i].err
		}
		done += int64(reqs[i].Length)
	}
	return done, nil
}

// pick spreads requests over the connections, skipping ones that are reconnecting while another
// is up.
func (c *Client) pick() *conn {
	n := uint64(len(c.conns))
	if n == 1 {
		return c.conns[0]
	}
	start := c.next.Add(1)
	for i := range n {
		if cn := c.conns[(start+i)%n]; cn.up.Load() {
			return cn
		}
	}
	return c.conns[start%n]
}

// RemoteError is an error reply from the server. It unwraps to the syscall.Errno the server sent
// and, where one applies, to the backend error it means: backend.ErrReadOnly for EPERM,
// backend.ErrNotSupported for ENOTSUP, backend.ErrOutOfRange for ENOSPC or EINVAL on a range that
// reaches past the end. Anything else (EIO above all) may succeed when retried.
type RemoteError struct {
	Op      string // read, write, flush, trim, cache, write-zeroes
	Offset  int64
	Length  int64
	Errno   syscall.Errno // unknown values are reported as EINVAL, as the protocol asks
	Message string        // the server's explanation, if it sent one
	kind    error
}

func (e *RemoteError) Error() string {
	s := fmt.Sprintf("nbd: server failed %s at offset %d length %d: %v", e.Op, e.Offset, e.Length, e.Errno)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap returns the errno and, if there is one, the backend error it maps to.
func (e *RemoteError) Unwrap() []error {
	if e.kind != nil {
		return []error{e.kind, e.Errno}
	}
	return []error{e.Errno}
}

// remoteError maps an NBD error value for a request on an export of size bytes.
func remoteError(cmd uint16, off, length, size int64, errno uint32, msg string) *RemoteError {
	e := &RemoteError{Op: cmdName(cmd), Offset: off, Length: length, Errno: syscall.Errno(errno), Message: msg}
	switch errno {
	case proto.ErrnoPerm:
		e.kind = backend.ErrReadOnly
	case proto.ErrnoNotSup:
		e.kind = backend.ErrNotSupported
	case proto.ErrnoNoSpc, proto.ErrnoInval:
		if backend.CheckRange(off, length, size) != nil {
			e.kind = backend.ErrOutOfRange
		}
	case proto.ErrnoIO, proto.ErrnoNoMem, proto.ErrnoOverflow, proto.ErrnoShutdown:
	default:
		e.Errno = syscall.EINVAL
		e.Message = fmt.Sprintf("unknown NBD error %d", errno) + prefixed(msg)
	}
	return e
}

func prefixed(msg string) string {
	if msg == "" {
		return ""
	}
	return ": " + msg
}

func cmdName(cmd uint16) string {
	switch cmd {
	case proto.CmdRead:
		return "read"
	case proto.CmdWrite:
		return "write"
	case proto.CmdDisc:
		return "disconnect"
	case proto.CmdFlush:
		return "flush"
	case proto.CmdTrim:
		return "trim"
	case proto.CmdCache:
		return "cache"
	case proto.CmdWriteZeroes:
		return "write-zeroes"
	case proto.CmdBlockStatus:
		return "block-status"
	}
	return fmt.Sprintf("command %d", cmd)
}
