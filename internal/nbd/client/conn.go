package client

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/pkg/backend"
)

// request is one request on the wire. The caller owns it until it hands it to submit, and
// again once finished (wg.Done, or done called); in between, the connection it is on owns it.
type request struct {
	proto.Request                 // the header; Cookie is set by submit
	buf           []byte          // read destination or write payload
	wg            *sync.WaitGroup // a caller waiting for it (run), or nil
	done          func(error)     // else called with the outcome (ReadAtAsync)
	err           error           // the outcome, set before wg.Done

	waitSince time.Time // when it first had to wait for a reconnect (guarded by conn.mu)
	// Reply state, written by the reader of the connection the request was last sent on.
	covered uint32 // bytes of a read that content chunks filled
	errno   uint32 // the first error chunk's value
	msg     string
}

func (r *request) finish(err error) {
	if r.done != nil {
		r.done(err)
		return
	}
	r.err = err
	r.wg.Done()
}

// within reports where [off, off+n) starts in the request's buffer, and whether it lies inside.
func (r *request) within(off uint64, n uint32) (uint32, bool) {
	if off < r.Offset || n > r.Length || off-r.Offset > uint64(r.Length-n) {
		return 0, false
	}
	return uint32(off - r.Offset), true
}

// conn is one of the client's connections. It outlives the sessions it carries: when one
// drops, the connection reconnects and sends the requests that were pending on it again, which is
// safe because block reads and writes are idempotent.
type conn struct {
	c       *Client
	log     *slog.Logger
	up      atomic.Bool // a session is installed and takes requests; pick looks at this
	healthy atomic.Bool // a request succeeded on the current session
	kick    chan struct{}
	wmu     sync.Mutex // one request on the wire at a time

	mu       sync.Mutex
	s        *session // nil while reconnecting
	draining bool     // a soft disconnect began on s: send nothing more on it
	closed   bool
	pending  map[uint64]*request // every request not yet finished, sent or waiting
	backoff  time.Duration
}

func newConn(c *Client, id int) *conn {
	return &conn{
		c:       c,
		log:     c.log.With("conn", id),
		kick:    make(chan struct{}, 1),
		pending: map[uint64]*request{},
	}
}

// install makes s the connection's session, starts its reader and sends it every request that
// was waiting. It reports false if the client was closed meanwhile.
func (cn *conn) install(s *session) bool {
	cn.mu.Lock()
	if cn.closed {
		cn.mu.Unlock()
		s.nc.Close()
		return false
	}
	cn.s, cn.draining = s, false
	resend := make([]*request, 0, len(cn.pending))
	for _, r := range cn.pending {
		r.covered, r.errno, r.msg = 0, 0, ""
		resend = append(resend, r)
	}
	cn.healthy.Store(false)
	cn.up.Store(true)
	cn.mu.Unlock()

	cn.c.wg.Add(1)
	go cn.readLoop(s)
	for _, r := range resend {
		cn.send(s, r)
	}
	return true
}

// submit sends r, or queues it for the next session if the connection is down.
func (cn *conn) submit(r *request) {
	cn.mu.Lock()
	if cn.closed {
		cn.mu.Unlock()
		r.finish(closedError(r))
		return
	}
	r.Cookie = cn.c.cookie.Add(1)
	cn.pending[r.Cookie] = r
	s := cn.s
	if s == nil || cn.draining {
		r.waitSince = time.Now()
		cn.mu.Unlock()
		select { // let the reconnect loop see the new deadline
		case cn.kick <- struct{}{}:
		default:
		}
		return
	}
	cn.mu.Unlock()
	cn.send(s, r)
}

// send writes r on s. A failed write closes s, so its reader ends and the connection reconnects;
// r is still pending and goes out again on the new session.
func (cn *conn) send(s *session, r *request) {
	var h [proto.RequestSize]byte
	proto.PutRequest(h[:], r.Request)
	cn.wmu.Lock()
	var err error
	if r.Type == proto.CmdWrite {
		bufs := net.Buffers{h[:], r.buf}
		_, err = bufs.WriteTo(s.nc)
	} else {
		_, err = s.nc.Write(h[:])
	}
	cn.wmu.Unlock()
	if err != nil {
		cn.log.Debug("nbd: send failed", "err", err)
		s.nc.Close()
	}
}

// sendDisc asks the server to end the session (NBD_CMD_DISC).
func (cn *conn) sendDisc(s *session) {
	var h [proto.RequestSize]byte
	proto.PutRequest(h[:], proto.Request{Type: proto.CmdDisc, Cookie: cn.c.cookie.Add(1)})
	cn.wmu.Lock()
	_, err := s.nc.Write(h[:])
	cn.wmu.Unlock()
	if err != nil {
		s.nc.Close()
	}
}

// complete removes r from the pending set and hands it back to its caller.
func (cn *conn) complete(r *request, err error) {
	cn.mu.Lock()
	delete(cn.pending, r.Cookie)
	cn.mu.Unlock()
	r.finish(err)
}

// blame fails r for a reply that breaks the protocol, and returns the error so the reader drops
// the session (the protocol asks for a hard disconnect); r is not sent again.
func (cn *conn) blame(r *request, format string, args ...any) error {
	err := fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
	cn.complete(r, err)
	return err
}

func (cn *conn) readLoop(s *session) {
	defer cn.c.wg.Done()
	cn.lost(s, cn.readReplies(s))
}

// readReplies dispatches replies to the pending requests until the session fails.
func (cn *conn) readReplies(s *session) error {
	var h [proto.StructReplySize]byte
	for {
		if _, err := io.ReadFull(s.br, h[:4]); err != nil {
			return err
		}
		switch magic := binary.BigEndian.Uint32(h[:4]); magic {
		case proto.MagicSimpleReply:
			if _, err := io.ReadFull(s.br, h[4:proto.SimpleReplySize]); err != nil {
				return err
			}
			errno, cookie, _ := proto.ParseSimpleReply(h[:])
			r, err := cn.lookup(cookie)
			if err != nil {
				return err
			}
			if errno == 0 && r.Type == proto.CmdRead {
				if _, err := io.ReadFull(s.br, r.buf); err != nil {
					return err
				}
			}
			cn.finishReply(s, r, errno, "")
		case proto.MagicStructReply:
			if !s.structured {
				return fmt.Errorf("%w: structured reply that was not negotiated", ErrProtocol)
			}
			if _, err := io.ReadFull(s.br, h[4:proto.StructReplySize]); err != nil {
				return err
			}
			ch, _ := proto.ParseChunkHeader(h[:])
			r, err := cn.lookup(ch.Cookie)
			if err != nil {
				return err
			}
			if err := cn.readChunk(s, r, ch.Type, ch.Length); err != nil {
				return err
			}
			if ch.Flags&proto.ReplyFlagDone == 0 {
				continue
			}
			if r.errno == 0 && r.Type == proto.CmdRead && r.covered != r.Length {
				return cn.blame(r, "read reply covered %d of %d bytes", r.covered, r.Length)
			}
			cn.finishReply(s, r, r.errno, r.msg)
		default:
			return fmt.Errorf("%w: reply magic %#x", ErrProtocol, magic)
		}
	}
}

func (cn *conn) lookup(cookie uint64) (*request, error) {
	cn.mu.Lock()
	r := cn.pending[cookie]
	cn.mu.Unlock()
	if r == nil {
		return nil, fmt.Errorf("%w: reply for unknown cookie %#x", ErrProtocol, cookie)
	}
	return r, nil
}

// maxErrorChunk bounds an error chunk: a 4096-byte message plus the fixed fields, with room for
// error types a newer server may define.
const maxErrorChunk = 64 << 10

// readChunk consumes the payload of one structured reply chunk for r.
func (cn *conn) readChunk(s *session, r *request, typ uint16, length uint32) error {
	var b [12]byte
	switch typ {
	case proto.ReplyTypeNone:
		if length != 0 {
			return cn.blame(r, "NBD_REPLY_TYPE_NONE with %d bytes", length)
		}
	case proto.ReplyTypeOffsetData:
		if r.Type != proto.CmdRead || length < 9 {
			return cn.blame(r, "data chunk of %d bytes in reply to %s", length, cmdName(r.Type))
		}
		if _, err := io.ReadFull(s.br, b[:8]); err != nil {
			return err
		}
		n := length - 8
		start, ok := r.within(binary.BigEndian.Uint64(b[:]), n)
		if !ok {
			return cn.blame(r, "data chunk at %d+%d outside the read at %d+%d", binary.BigEndian.Uint64(b[:]), n, r.Offset, r.Length)
		}
		if _, err := io.ReadFull(s.br, r.buf[start:start+n]); err != nil {
			return err
		}
		r.covered += n
	case proto.ReplyTypeOffsetHole:
		if r.Type != proto.CmdRead || length != 12 {
			return cn.blame(r, "hole chunk of %d bytes in reply to %s", length, cmdName(r.Type))
		}
		if _, err := io.ReadFull(s.br, b[:12]); err != nil {
			return err
		}
		off, n := binary.BigEndian.Uint64(b[:]), binary.BigEndian.Uint32(b[8:])
		start, ok := r.within(off, n)
		if !ok || n == 0 {
			return cn.blame(r, "hole chunk at %d+%d outside the read at %d+%d", off, n, r.Offset, r.Length)
		}
		clear(r.buf[start : start+n])
		r.covered += n
	default:
		// An error chunk, or an unknown type: the protocol lets the client go on after an unknown
		// error type (bit 15 set), which starts like NBD_REPLY_TYPE_ERROR.
		if typ&0x8000 == 0 || length < 6 || length > maxErrorChunk {
			return cn.blame(r, "reply chunk type %#x of %d bytes", typ, length)
		}
		p := make([]byte, length)
		if _, err := io.ReadFull(s.br, p); err != nil {
			return err
		}
		errno, msgLen := binary.BigEndian.Uint32(p), uint32(binary.BigEndian.Uint16(p[4:]))
		if msgLen > length-6 {
			return cn.blame(r, "error message of %d bytes in a %d-byte chunk", msgLen, length)
		}
		if errno == 0 {
			errno = proto.ErrnoInval // an error chunk must carry an error; treat the odd one as the protocol says
		}
		if r.errno == 0 {
			r.errno, r.msg = errno, string(p[6:6+msgLen])
		}
	}
	return nil
}

// finishReply completes r with the server's verdict. ESHUTDOWN means the server is going away:
// the client must disconnect softly, and r goes out again after the reconnect.
func (cn *conn) finishReply(s *session, r *request, errno uint32, msg string) {
	switch errno {
	case 0:
		cn.healthy.Store(true)
		if r.Type != proto.CmdRead && r.Type != proto.CmdFlush && r.Type != proto.CmdCache && r.Flags&proto.CmdFlagFUA == 0 {
			cn.c.writesDone.Add(1)
		}
		cn.complete(r, nil)
	case proto.ErrnoShutdown:
		cn.mu.Lock()
		start := cn.s == s && !cn.draining
		cn.draining = true
		cn.up.Store(false)
		cn.mu.Unlock()
		if start {
			cn.log.Info("nbd: server is shutting down; disconnecting to reconnect")
			cn.c.wg.Add(1)
			go func() {
				defer cn.c.wg.Done()
				cn.sendDisc(s) // the server answers what is in flight, then hangs up
			}()
		}
	default:
		cn.complete(r, remoteError(r.Type, int64(r.Offset), int64(r.Length), cn.c.export.Size, errno, msg))
	}
}

// lost handles the end of session s: the pending requests wait for a reconnect, or fail if the
// client is closing.
func (cn *conn) lost(s *session, cause error) {
	s.nc.Close()
	cn.mu.Lock()
	cn.s = nil
	cn.up.Store(false)
	if cn.closed {
		cn.failAll()
		return
	}
	now := time.Now()
	for _, r := range cn.pending {
		if r.waitSince.IsZero() {
			r.waitSince = now
		}
	}
	waiting := len(cn.pending)
	// A session that never served a request does not reset the backoff, so a server that accepts
	// and drops connections is not hammered.
	if cn.healthy.Load() {
		cn.backoff = 0
	} else {
		cn.backoff = nextBackoff(cn.backoff)
	}
	wait := cn.backoff
	cn.mu.Unlock()
	c := cn.c
	flushed := c.writesFlushed.Load() // loaded first: it never passes writesDone
	if unflushed := c.writesDone.Load() - flushed; unflushed > 0 {
		c.losses.Add(1)
		cn.log.Warn("nbd: connection lost with acknowledged writes not yet flushed; if the server crashed they may be lost, and the next flush will fail",
			"unflushed_writes", unflushed)
	}
	cn.log.Warn("nbd: connection lost; reconnecting", "err", cause, "requests_to_resend", waiting)
	c.wg.Add(1)
	go cn.reconnect(wait, cause)
}

// failAll fails every pending request with ErrClosed. It is called with mu held and releases it.
func (cn *conn) failAll() {
	reqs := make([]*request, 0, len(cn.pending))
	for _, r := range cn.pending {
		reqs = append(reqs, r)
	}
	clear(cn.pending)
	cn.mu.Unlock()
	for _, r := range reqs {
		r.finish(closedError(r))
	}
}

func closedError(r *request) error {
	return fmt.Errorf("nbd: %s at offset %d: %w", cmdName(r.Type), r.Offset, backend.ErrClosed)
}

func nextBackoff(d time.Duration) time.Duration {
	return min(max(2*d, backoffMin), backoffMax)
}

// reconnect dials until a session is installed or the client closes, with capped exponential
// backoff, failing requests that have waited longer than MaxReconnectWait.
func (cn *conn) reconnect(wait time.Duration, cause error) {
	defer cn.c.wg.Done()
	c := cn.c
	next := time.Now().Add(wait)
	lastErr := cause
	for attempt := 1; ; {
		now := time.Now()
		deadline, closed := cn.sweep(now, lastErr)
		if closed {
			return
		}
		if !now.Before(next) {
			s, err := c.connect(c.ctx)
			if err == nil {
				if err = c.sameExport(s.export); err != nil {
					s.nc.Close()
				}
			}
			if err == nil {
				if cn.install(s) {
					c.reconnects.Add(1)
					cn.log.Info("nbd: reconnected", "attempts", attempt, "reconnects", c.reconnects.Load())
				}
				return
			}
			if c.ctx.Err() != nil {
				continue // closed: the sweep fails what is pending
			}
			lastErr = err
			level := slog.LevelDebug
			if attempt == 1 {
				level = slog.LevelWarn
			}
			cn.mu.Lock()
			cn.backoff = nextBackoff(cn.backoff)
			wait = cn.backoff
			cn.mu.Unlock()
			cn.log.Log(c.ctx, level, "nbd: reconnect failed; retrying", "err", err, "attempt", attempt, "retry_in", wait)
			attempt++
			next = time.Now().Add(wait)
			continue
		}
		wake := next
		if !deadline.IsZero() && deadline.Before(wake) {
			wake = deadline
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-t.C:
		case <-cn.kick:
		case <-c.ctx.Done():
		}
		t.Stop()
	}
}

// sweep fails the requests that have waited for a reconnect longer than MaxReconnectWait, or
// all of them if the client is closed. It returns the earliest deadline of those still waiting.
func (cn *conn) sweep(now time.Time, lastErr error) (earliest time.Time, closed bool) {
	c := cn.c
	cn.mu.Lock()
	if cn.closed || c.ctx.Err() != nil {
		cn.failAll()
		return time.Time{}, true
	}
	var expired []*request
	for cookie, r := range cn.pending {
		dl := r.waitSince.Add(c.cfg.MaxReconnectWait)
		if !now.Before(dl) {
			expired = append(expired, r)
			delete(cn.pending, cookie)
		} else if earliest.IsZero() || dl.Before(earliest) {
			earliest = dl
		}
	}
	cn.mu.Unlock()
	for _, r := range expired {
		r.finish(fmt.Errorf("nbd: %s at offset %d: connection to %s %s lost and not re-established within %v: %w",
			cmdName(r.Type), r.Offset, c.cfg.Network, c.cfg.Address, c.cfg.MaxReconnectWait, lastErr))
	}
	return earliest, false
}

// close ends the connection for good: a polite NBD_CMD_DISC, then the socket is closed, which
// makes the reader (or the reconnect loop) fail what is pending.
func (cn *conn) close() {
	cn.mu.Lock()
	cn.closed = true
	cn.up.Store(false)
	s, draining := cn.s, cn.draining
	cn.mu.Unlock()
	if s == nil {
		return
	}
	// A sender stuck on a full socket buffer would hold wmu forever; the deadline frees it.
	s.nc.SetWriteDeadline(time.Now().Add(time.Second))
	if !draining {
		cn.sendDisc(s)
	}
	s.nc.Close()
}
