package nbd

// The client half of the package: a pipelined NBD client for remote exports used as tierblk
// backends. Dial negotiates an export (client_handshake.go), each connection has one reader
// goroutine that matches replies to requests by cookie and reconnects when the connection drops
// (client_conn.go), and the methods here split calls into wire requests and map errors.
//
// The client never answers a read from anything but the server's reply, and never reports a write
// as done before the server acknowledged it. It cannot know whether a server that crashed and came
// back kept the writes it had acknowledged but not yet flushed (a volatile cache, by the
// protocol's contract); it logs a warning when a connection drops with such writes outstanding.
// A request waits for its reply as long as the connection lives: a dead peer is found by TCP
// keepalive or by the socket closing, not by a request timeout.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// ClientConfig says where an export is and how to talk to it.
type ClientConfig struct {
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
}

// Defaults for zero ClientConfig fields, and the reconnect backoff.
const (
	defaultDialTimeout      = 10 * time.Second
	defaultMaxReconnectWait = time.Minute
	clientBackoffMin        = 50 * time.Millisecond
	clientBackoffMax        = 5 * time.Second
	// clientMaxChunk caps one request's length even when the server allows more: 32 MiB is the
	// largest payload every server must accept, and longer requests gain nothing from pipelining.
	clientMaxChunk = 32 << 20
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
	cfg    ClientConfig
	log    *slog.Logger
	export clientExport // as negotiated by the first connection; reconnects must match it
	chunk  int64        // the longest request sent: a multiple of the minimum block size
	conns  []*clientConn

	next       atomic.Uint64 // round-robin position over conns
	cookie     atomic.Uint64 // source of request cookies, unique for the client's lifetime
	reconnects atomic.Int64
	// Writes acknowledged, and how many of them the last successful flush covered: a reconnect
	// with writes not yet flushed is worth a warning, as a server that crashed may have lost them.
	writesDone, writesFlushed atomic.Uint64
	calls                     atomic.Uint64 // calls sent (Waits)

	ctx       context.Context // cancelled by Close: stops reconnects and dials
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup // readers and reconnect loops
}

// clientExport is what the handshake learns about the export.
type clientExport struct {
	size                          int64
	flags                         uint16
	minBlock, prefBlock, maxBlock uint32
}

// Dial connects to the export, negotiates it and starts the connections' readers. The context
// bounds only the dial and handshake.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
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
	c.export = first.export
	c.chunk = int64(min(c.export.maxBlock, clientMaxChunk))
	c.chunk -= c.chunk % int64(c.export.minBlock)

	n := cfg.Connections
	if n > 1 && c.export.flags&tflagCanMultiConn == 0 {
		c.log.Info("nbd: server does not offer multi-conn; using one connection", "asked", n)
		n = 1
	}
	sessions := []*clientSession{first}
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
		cn := newClientConn(c, i)
		c.conns = append(c.conns, cn)
		cn.install(s)
	}
	c.log.Info("nbd: connected", "size", c.export.size, "flags", fmt.Sprintf("%#x", c.export.flags),
		"connections", n, "structured_replies", first.structured,
		"block_min", c.export.minBlock, "block_max", c.export.maxBlock)
	return c, nil
}

// sameExport checks that a later connection reached the export the first one negotiated: a
// server restarted with another disk behind the same address must not be written to.
func (c *Client) sameExport(e clientExport) error {
	want := c.export
	if e.size != want.size || e.flags&tflagReadOnly != want.flags&tflagReadOnly ||
		e.minBlock != want.minBlock || int64(e.maxBlock) < c.chunk {
		return fmt.Errorf("%w: export changed since the first connection (size %d, read-only %t, block sizes %d-%d; was %d, %t, %d-%d)",
			ErrServerRefused, e.size, e.flags&tflagReadOnly != 0, e.minBlock, e.maxBlock,
			want.size, want.flags&tflagReadOnly != 0, want.minBlock, want.maxBlock)
	}
	return nil
}

// Size is the export's size in bytes.
func (c *Client) Size() int64 { return c.export.size }

// Flags are the transmission flags the server sent (NBD_FLAG_*).
func (c *Client) Flags() uint16 { return c.export.flags }

// BlockSizes are the server's size constraints, or the protocol's defaults when it sent none.
func (c *Client) BlockSizes() (minimum, preferred, maximum uint32) {
	return c.export.minBlock, c.export.prefBlock, c.export.maxBlock
}

// ReadOnly reports whether the server exports the device read-only.
func (c *Client) ReadOnly() bool { return c.export.flags&tflagReadOnly != 0 }

// Waits counts the calls sent to the server: each waits on the network (backend.Waiter).
func (c *Client) Waits() uint64 { return c.calls.Load() }

func (c *Client) has(flag uint16) bool { return c.export.flags&flag != 0 }

// ReadAt reads len(p) bytes at off. On error, n counts the bytes at the start of p that were read.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.run(cmdRead, 0, off, int64(len(p)), p)
	return int(n), err
}

// WriteAt writes p at off; the data may be in the server's volatile cache until Flush.
func (c *Client) WriteAt(p []byte, off int64) (int, error) {
	if err := c.writable("write"); err != nil {
		return 0, err
	}
	n, err := c.run(cmdWrite, 0, off, int64(len(p)), p)
	return int(n), err
}

// WriteAtFUA writes p at off and returns once it is durable: with the FUA flag when the server
// supports it, otherwise as a write followed by a flush.
func (c *Client) WriteAtFUA(p []byte, off int64) (int, error) {
	if !c.has(tflagSendFUA) {
		n, err := c.WriteAt(p, off)
		if err != nil {
			return n, err
		}
		return n, c.Flush()
	}
	if err := c.writable("write"); err != nil {
		return 0, err
	}
	n, err := c.run(cmdWrite, cmdFlagFUA, off, int64(len(p)), p)
	return int(n), err
}

// Flush makes every write that completed before the call durable. A server that does not offer
// flush has no volatile cache, so there is nothing to do.
func (c *Client) Flush() error {
	if !c.has(tflagSendFlush) {
		return nil
	}
	covered := c.writesDone.Load()
	_, err := c.run(cmdFlush, 0, 0, 0, nil)
	if err == nil {
		for {
			old := c.writesFlushed.Load()
			if old >= covered || c.writesFlushed.CompareAndSwap(old, covered) {
				break
			}
		}
	}
	return err
}

// Trim discards a range. It fails with backend.ErrNotSupported if the server cannot trim.
func (c *Client) Trim(off, length int64) error {
	if err := c.capable("trim", tflagSendTrim); err != nil {
		return err
	}
	_, err := c.run(cmdTrim, 0, off, length, nil)
	return err
}

// WriteZeroes writes zeroes over a range without sending them; with mayUnmap the server may punch
// a hole. It fails with backend.ErrNotSupported if the server cannot, so callers write zeroes.
func (c *Client) WriteZeroes(off, length int64, mayUnmap bool) error {
	if err := c.capable("write-zeroes", tflagSendWriteZeroes); err != nil {
		return err
	}
	var flags uint16
	if !mayUnmap {
		flags = cmdFlagNoHole
	}
	_, err := c.run(cmdWriteZeroes, flags, off, length, nil)
	return err
}

// Cache asks the server to bring a range into its cache. It fails with backend.ErrNotSupported if
// the server does not take the hint.
func (c *Client) Cache(off, length int64) error {
	if !c.has(tflagSendCache) {
		return fmt.Errorf("%w: the NBD server does not offer cache", backend.ErrNotSupported)
	}
	_, err := c.run(cmdCache, 0, off, length, nil)
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
		return 0, fmt.Errorf("nbd: %s: %w", clientCmdName(cmd), backend.ErrClosed)
	}
	c.calls.Add(1)
	if cmd != cmdFlush {
		if err := backend.CheckRange(off, length, c.export.size); err != nil {
			return 0, err
		}
		if length == 0 {
			return 0, nil
		}
		if mb := int64(c.export.minBlock); off%mb != 0 || length%mb != 0 {
			return 0, fmt.Errorf("%w: %s at offset %d length %d is not aligned to the export's minimum block size %d",
				backend.ErrNotSupported, clientCmdName(cmd), off, length, mb)
		}
	}
	count := max(1, (length+c.chunk-1)/c.chunk)
	reqs := make([]clientRequest, count)
	var wg sync.WaitGroup
	wg.Add(len(reqs))
	for i := range reqs {
		r := &reqs[i]
		start := int64(i) * c.chunk
		n := min(c.chunk, length-start)
		*r = clientRequest{request: request{typ: cmd, flags: flags, offset: uint64(off + start), length: uint32(n)}, wg: &wg}
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
		done += int64(reqs[i].length)
	}
	return done, nil
}

// pick spreads requests over the connections, skipping ones that are reconnecting while another
// is up.
func (c *Client) pick() *clientConn {
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

// clientRemoteError maps an NBD error value for a request on an export of size bytes.
func clientRemoteError(cmd uint16, off, length, size int64, errno uint32, msg string) *RemoteError {
	e := &RemoteError{Op: clientCmdName(cmd), Offset: off, Length: length, Errno: syscall.Errno(errno), Message: msg}
	switch errno {
	case errPerm:
		e.kind = backend.ErrReadOnly
	case errNotSup:
		e.kind = backend.ErrNotSupported
	case errNoSpc, errInval:
		if backend.CheckRange(off, length, size) != nil {
			e.kind = backend.ErrOutOfRange
		}
	case errIO, errNoMem, errOverflow, errShutdown:
	default:
		e.Errno = syscall.EINVAL
		e.Message = fmt.Sprintf("unknown NBD error %d", errno) + clientPrefixed(msg)
	}
	return e
}

func clientPrefixed(msg string) string {
	if msg == "" {
		return ""
	}
	return ": " + msg
}

func clientCmdName(cmd uint16) string {
	switch cmd {
	case cmdRead:
		return "read"
	case cmdWrite:
		return "write"
	case cmdDisc:
		return "disconnect"
	case cmdFlush:
		return "flush"
	case cmdTrim:
		return "trim"
	case cmdCache:
		return "cache"
	case cmdWriteZeroes:
		return "write-zeroes"
	case cmdBlockStatus:
		return "block-status"
	}
	return fmt.Sprintf("command %d", cmd)
}
