package server

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"syscall"
	"unicode/utf8"

	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/volume"
)

// replyFailed answers a request the device failed. The client gets the errno and a fixed message:
// the device's error names files and devices of this machine, which are the log's to tell.
func (c *conn) replyFailed(r proto.Request, err error) {
	c.beginReply()
	c.putFailed(r, err)
	c.endReply()
}

// putFailed is replyFailed with the writer held.
func (c *conn) putFailed(r proto.Request, err error) {
	errno := errnoFor(err, r.Type)
	level := slog.LevelDebug
	if errno == proto.ErrnoIO {
		level = slog.LevelWarn
	}
	c.log.Log(context.Background(), level, "nbd: device error", "cmd", r.Type, "offset", r.Offset, "length", r.Length, "err", err)
	c.putErrno(r, errno, deviceErrorMessages[errno])
}

// deviceErrorMessages are what a client is told of a device's error, by errno (errnoFor's).
var deviceErrorMessages = map[uint32]string{
	proto.ErrnoIO:     "input/output error on the export (the server's log has the details)",
	proto.ErrnoNoSpc:  "no space left on the export's storage",
	proto.ErrnoPerm:   "the export is read-only",
	proto.ErrnoNotSup: "the export does not support this",
	proto.ErrnoInval:  "invalid request for the export",
}

// ended is a read or write the device started asynchronously and ended: its request, its buffer and
// the device's error.
type ended struct {
	req proto.Request
	buf *[]byte
	err error
}

// readAsync starts a READ on the device and reports true, or false where the device leaves it to
// ReadAt, returning then the buffer it took, for serve to read into. The reader goes on with the
// next request at once; the read's end is answered by the reader or a replier goroutine
// (requestEnded), never by the device's own goroutine, whose other completions must not wait for a
// client that is slow to take its replies.
func (c *conn) readAsync(r proto.Request) (*[]byte, bool) {
	buf := c.readerBuf(int(r.Length))
	c.workers.Add(1)
	if c.async.ReadAtAsync(*buf, int64(r.Offset), func(err error) { c.requestEnded(ended{r, buf, err}) }) {
		return nil, true
	}
	c.workers.Done()
	return buf, false
}

// writeAsync starts a WRITE on the device and reports true, or false where the device leaves it
// to WriteAt. Its end is answered as an asynchronous read's is.
func (c *conn) writeAsync(j job) bool {
	c.workers.Add(1)
	fua := j.req.Flags&proto.CmdFlagFUA != 0
	if c.asyncW.WriteAtAsync(*j.buf, int64(j.req.Offset), fua, func(err error) {
		c.order.finish(j.seq)
		c.requestEnded(ended{j.req, j.buf, err})
	}) {
		return true
	}
	c.workers.Done()
	return false
}

// requestEnded queues an ended read or write. The reader answers it if it is looking for work at an empty
// socket; else a replier goroutine does, started if none runs. Each start of a replier wakes a
// thread, and one that finds nothing more to do goes back to sleep: while the reader waits for a
// client whose requests are all in flight, answering on it saves both (bench cache --parts hits).
func (c *conn) requestEnded(e ended) {
	c.endedMu.Lock()
	c.ended = append(c.ended, e)
	start := !c.replying && !c.readerLooking
	c.replying = c.replying || start
	c.endedMu.Unlock()
	if start && (c.runEnd == nil || !c.runEnd.AtRunEnd(c.replyAtRunEnd)) {
		go c.replyEnded()
	}
}

// replyEnded answers the ended reads, those queued meanwhile too, sends what a run's end left
// unsent (replyAtRunEnd), then leaves.
func (c *conn) replyEnded() {
	var batch []ended
	for {
		c.endedMu.Lock()
		batch, c.ended = c.ended, batch[:0]
		if len(batch) == 0 {
			c.endedMu.Unlock()
			c.sendLeft()
			c.endedMu.Lock()
			if len(c.ended) == 0 {
				c.replying = false
				c.endedMu.Unlock()
				return
			}
			c.endedMu.Unlock()
			continue
		}
		c.endedMu.Unlock()
		c.answerEnded(batch)
	}
}

// looking is the reader's hook (sock.looking): while it looks again at an empty socket it answers
// the reads that ended, unless a replier runs; when it stops looking, to sleep in the kernel, what
// ends after is the replier's again.
func (c *conn) looking(on bool) {
	c.endedMu.Lock()
	c.readerLooking = on
	if c.replying || len(c.ended) == 0 {
		c.endedMu.Unlock()
		return
	}
	batch := c.ended
	c.ended = c.spare[:0]
	c.endedMu.Unlock()
	c.answerEnded(batch)
	c.spare = batch[:0]
}

// answerEnded answers a batch of ended reads. Their replies are written together and flushed
// together, as endReply flushes those of workers that finish together.
func (c *conn) answerEnded(batch []ended) {
	c.beginReply()
	c.putEnded(batch)
	c.endReply()
	c.releaseEnded(batch)
}

// putEnded writes the replies of a batch of ended requests, with the writer held, and gives back
// their buffers.
func (c *conn) putEnded(batch []ended) {
	for _, e := range batch {
		switch {
		case e.err != nil:
			c.putFailed(e.req, e.err)
		case e.req.Type == proto.CmdRead:
			c.putData(e.req, *e.buf)
		default:
			c.putErrno(e.req, 0, "")
		}
		c.putBuf(e.buf)
	}
}

// releaseEnded frees the slots of a batch of answered requests.
func (c *conn) releaseEnded(batch []ended) {
	for i := range batch {
		batch[i] = ended{}
		<-c.slots
		c.workers.Done()
	}
}

// errnoFor maps a device error onto the NBD error for a command.
func errnoFor(err error, typ uint16) uint32 {
	switch {
	case errors.Is(err, volume.ErrOutOfRange):
		if typ == proto.CmdWrite || typ == proto.CmdWriteZeroes {
			return proto.ErrnoNoSpc
		}
		return proto.ErrnoInval
	case errors.Is(err, volume.ErrReadOnly):
		return proto.ErrnoPerm
	case errors.Is(err, volume.ErrNotSupported):
		return proto.ErrnoNotSup
	case errors.Is(err, volume.ErrInvalid):
		return proto.ErrnoInval
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return proto.ErrnoNoSpc
	default:
		return proto.ErrnoIO
	}
}

// maxErrorMessage is the protocol's limit on strings.
const maxErrorMessage = proto.MaxExportNameLen

// replyData answers a successful READ: a simple reply, or one OFFSET_DATA chunk marked done (the
// data is all read before the reply starts, so no error can follow; one chunk also honours DF).
func (c *conn) replyData(r proto.Request, data []byte) {
	c.beginReply()
	c.putData(r, data)
	c.endReply()
}

// putData is replyData with the writer held.
func (c *conn) putData(r proto.Request, data []byte) {
	var hdr []byte
	switch {
	case !c.structured:
		proto.PutSimpleReply(c.scratch[:], 0, r.Cookie)
		hdr = c.scratch[:proto.SimpleReplySize]
	case len(data) == 0:
		proto.PutChunkHeader(c.scratch[:], proto.ChunkHeader{Flags: proto.ReplyFlagDone, Type: proto.ReplyTypeNone, Cookie: r.Cookie})
		hdr = c.scratch[:proto.StructReplySize]
	default:
		proto.PutChunkHeader(c.scratch[:], proto.ChunkHeader{Flags: proto.ReplyFlagDone, Type: proto.ReplyTypeOffsetData, Cookie: r.Cookie, Length: uint32(8 + len(data))})
		binary.BigEndian.PutUint64(c.scratch[proto.StructReplySize:], r.Offset)
		hdr = c.scratch[:proto.StructReplySize+8]
	}
	if len(data) < connBufSize || c.werr != nil {
		c.write(hdr)
		c.write(data)
	} else {
		c.writeLarge(hdr, data)
	}
}

// writeLarge sends a large reply with one writev of its header and data, after what is buffered:
// through the buffered writer it would take two system calls and a copy of the buffer's size.
// Over TLS the session encrypts it, in records that go out together (flush).
func (c *conn) writeLarge(hdr, data []byte) {
	if c.sock != nil && !c.bigSendBuf {
		c.bigSendBuf = true
		c.sock.setSendBuffer(sendBufSize)
	}
	var err error
	if c.plain != nil {
		if err = c.bw.Flush(); err == nil {
			err = c.out.flushLeft()
		}
		if err == nil {
			err = c.plain.writev(hdr, data)
		}
	} else {
		err = c.batch(func() error {
			if err := c.bw.Flush(); err != nil {
				return err
			}
			bufs := net.Buffers{hdr, data}
			_, err := bufs.WriteTo(c.nc)
			return err
		})
	}
	if err != nil {
		c.writeFailed(err)
	}
}

// flush sends the buffered replies.
func (c *conn) flush() error { return c.batch(c.bw.Flush) }

// batch runs write, which writes to the session, so that over TLS on the detached socket the
// records it makes go out in as few system calls as a plain connection's bytes would: the session
// writes each record of up to 16 KiB in a call of its own (wire.hold).
func (c *conn) batch(write func() error) error {
	if c.wire == nil || c.wire.sock == nil {
		return write()
	}
	c.wire.hold()
	err := write()
	if rerr := c.wire.release(); err == nil {
		err = rerr
	}
	return err
}

// replyErrno answers a request without data: success as a simple reply; an error as a simple
// reply, or as an ERROR chunk carrying msg when structured replies are on.
func (c *conn) replyErrno(r proto.Request, errno uint32, msg string) {
	c.beginReply()
	c.putErrno(r, errno, msg)
	c.endReply()
}

// putErrno is replyErrno with the writer held.
func (c *conn) putErrno(r proto.Request, errno uint32, msg string) {
	if errno != 0 && c.structured {
		msg = truncateUTF8(msg, maxErrorMessage)
		proto.PutChunkHeader(c.scratch[:], proto.ChunkHeader{Flags: proto.ReplyFlagDone, Type: proto.ReplyTypeError, Cookie: r.Cookie, Length: uint32(6 + len(msg))})
		binary.BigEndian.PutUint32(c.scratch[proto.StructReplySize:], errno)
		binary.BigEndian.PutUint16(c.scratch[proto.StructReplySize+4:], uint16(len(msg)))
		c.write(c.scratch[:proto.StructReplySize+6])
		c.writeString(msg)
	} else {
		proto.PutSimpleReply(c.scratch[:], errno, r.Cookie)
		c.write(c.scratch[:proto.SimpleReplySize])
	}
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// beginReply takes the writer; every reply is written whole between beginReply and endReply.
func (c *conn) beginReply() {
	c.queued.Add(1)
	c.wmu.Lock()
}

// endReply releases the writer, flushing the buffer when no other reply is waiting to be
// written: replies finished together leave in one system call.
func (c *conn) endReply() {
	c.flushIfLast()
	c.wmu.Unlock()
}

// flushIfLast ends a reply with the writer held. The last reply of a burst flushes, unless the
// reader has more requests buffered: it flushes before it next waits for the client, so replies
// to pipelined requests share system calls.
func (c *conn) flushIfLast() {
	if c.queued.Add(-1) == 0 && c.werr == nil && !c.moreInput.Load() {
		if err := c.flush(); err != nil {
			c.writeFailed(err)
		}
	}
}

// flushReplies sends what replies are buffered.
func (c *conn) flushReplies() {
	c.wmu.Lock()
	if c.werr == nil && (c.bw.Buffered() > 0 || len(c.out.left) > 0) {
		err := c.flush()
		if err == nil {
			err = c.out.flushLeft()
		}
		if err != nil {
			c.writeFailed(err)
		}
	}
	c.wmu.Unlock()
}

func (c *conn) write(p []byte) {
	if c.werr != nil {
		return
	}
	if _, err := c.bw.Write(p); err != nil {
		c.writeFailed(err)
	}
}

func (c *conn) writeString(s string) {
	if c.werr != nil {
		return
	}
	if _, err := c.bw.WriteString(s); err != nil {
		c.writeFailed(err)
	}
}

// writeFailed gives up on the connection: the client cannot be answered, so the reader is
// stopped by hanging up, and later replies are dropped.
func (c *conn) writeFailed(err error) {
	c.werr = err
	c.log.Debug("nbd: writing a reply failed, closing", "err", err)
	c.hangUp()
}
