package server

import (
	"errors"
	"io"
	"syscall"

	"github.com/tierblk/tierblk/internal/nbd/proto"
)

// Answering on the device's goroutine. A device whose completions come in runs on a goroutine of
// its own (backend.RunDeferrer: an iSCSI session's reader, for what one read of its socket
// brought) has the requests that ended in a run answered at the run's end, on that goroutine:
// their replies leave in one write, and no replier goroutine is woken for them, which on a busy
// machine costs more than the write (bench nbd --parts iscsi's 4K rows). That goroutine serves
// every connection of the device, so it must never wait for one client: the writer is taken only
// if free, large replies are left to a replier, and what the socket does not take at once is kept
// (out.left) for a replier to send.

// replyAtRunEnd answers the ended requests at the end of the device's run; where it cannot
// without waiting, it starts a replier as requestEnded otherwise does.
func (c *conn) replyAtRunEnd() {
	if c.plain == nil || !c.wmu.TryLock() {
		go c.replyEnded()
		return
	}
	c.endedMu.Lock()
	batch := c.ended
	for _, e := range batch {
		if e.err == nil && e.req.Type == proto.CmdRead && len(*e.buf) >= connBufSize {
			// A large reply is written past the buffer, waiting for the socket.
			c.endedMu.Unlock()
			c.wmu.Unlock()
			go c.replyEnded()
			return
		}
	}
	c.ended = c.runSpare[:0]
	c.endedMu.Unlock()

	c.queued.Add(1)
	c.out.try = true
	c.putEnded(batch)
	c.flushIfLast()
	c.out.try = false
	left := len(c.out.left) > 0
	c.wmu.Unlock()
	c.releaseEnded(batch)

	c.endedMu.Lock()
	c.runSpare = batch[:0]
	more := left || len(c.ended) > 0
	c.replying = more
	c.endedMu.Unlock()
	if more {
		go c.replyEnded()
	}
}

// sendLeft sends, waiting for the socket, what a run's end left unsent.
func (c *conn) sendLeft() {
	c.wmu.Lock()
	if c.werr == nil {
		if err := c.out.flushLeft(); err != nil {
			c.writeFailed(err)
		}
	}
	c.wmu.Unlock()
}

// replyOut is what the reply buffer of a plain connection writes to: the socket, after what a
// write that could not wait left (left). Its fields are guarded by the connection's wmu.
type replyOut struct {
	s *sock
	// try makes writes take what the socket takes at once and keep the rest in left.
	try  bool
	left []byte
}

func (o *replyOut) Write(p []byte) (int, error) {
	if o.try {
		n := 0
		if len(o.left) == 0 {
			var err error
			n, err = o.s.tryWrite(p)
			if err != nil && !errors.Is(err, io.ErrShortWrite) && !errors.Is(err, syscall.EAGAIN) {
				return n, err
			}
		}
		o.left = append(o.left, p[n:]...)
		return len(p), nil
	}
	if err := o.flushLeft(); err != nil {
		return 0, err
	}
	return o.s.Write(p)
}

// flushLeft sends left, waiting for the socket.
func (o *replyOut) flushLeft() error {
	if len(o.left) == 0 {
		return nil
	}
	_, err := o.s.Write(o.left)
	o.left = o.left[:0]
	return err
}
