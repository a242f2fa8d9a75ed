package server

import (
	"io"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/volume"
)

// job is one checked request handed to a worker.
type job struct {
	req proto.Request
	buf *[]byte // a WRITE's payload, or a READ's buffer once readAsync took one; from the buffer pool
	// seq is a write-type request's ticket in c.order; for a FLUSH, the ticket of the first
	// write-type request received after it.
	seq uint64
	gen uint64 // the generation of c.plan its latency counts in
}

// transmit reads requests until the client disconnects, breaks the protocol or the server shuts
// down, then waits for the requests in flight to be answered.
func (c *conn) transmit() error {
	if err := c.detach(); err != nil {
		return err
	}
	c.order.cond.L = &c.order.mu
	c.jobs = make(chan job)
	c.slots = make(chan struct{}, c.s.maxInFlight)
	c.budget = newBudget(min(payloadBudget, connShare(c.s.payloads.max)))
	c.readDone = make(chan error, 1)
	c.s.watch()

	err, handedOver := c.readRequests()
	if handedOver {
		err = <-c.readDone
	}
	// No reader will flush for the replies still to come: let each flush itself.
	c.moreInput.Store(false)
	c.flushReplies()
	close(c.jobs)
	c.workers.Wait()
	return err
}

// Replies wait in the buffer while the client has sent more requests: each flush wakes the client,
// and on a busy machine a wakeup costs more than the reply. They go when the reader finds the
// socket empty (beforeWait), and at least every maxUnflushed requests, so that a client streaming
// requests still gets its answers.
const maxUnflushed = 32

// beforeWait runs on the reader when its next read finds nothing to read, before it waits for the
// client: it sends the replies held back for a batch.
func (c *conn) beforeWait() {
	c.unplug()
	c.moreInput.Store(false)
	c.flushReplies()
	c.unflushed = 0
}

// readRequests is the reader: one goroutine at a time runs it. It returns when reading ends
// (with the connection's error, nil after NBD_CMD_DISC), or with handedOver when a slow request
// served inline made another goroutine take over the reading.
func (c *conn) readRequests() (err error, handedOver bool) {
	defer func() {
		if !handedOver { // the next reader owns the plug (there is none: serving inline unplugged)
			c.unplug()
		}
	}()
	var hdr [proto.RequestSize]byte
	for {
		if c.br.Buffered() < proto.RequestSize && (c.unflushed >= maxUnflushed || c.sock == nil) {
			// The batch is long enough, or (not a socket) there is no telling whether the next
			// read will wait: send the replies held back first.
			c.beforeWait()
		}
		c.unflushed++
		// The slot comes before the request's payload: a reader waiting for one then holds no
		// payload bytes, so that the server's shared budget is only ever held by requests being
		// served, which give it back without waiting for it (see budget.go).
		select {
		case c.slots <- struct{}{}:
		default:
			// MaxInFlight requests are served: the reader stops, and what it holds must go.
			c.unplug()
			c.slots <- struct{}{}
		}
		pre, preN, err := c.readHeader(hdr[:])
		if err != nil {
			<-c.slots
			return c.readErr(err), false
		}
		req, ok := proto.ParseRequest(hdr[:])
		if !ok || req.Type == proto.CmdDisc {
			<-c.slots
			if pre != nil {
				c.putPrefetched(pre)
			}
			if !ok {
				return protocolErrorf("bad request magic %#x", hdr[:4]), false
			}
			return nil, false
		}
		j, ok, err := c.dispatch(req, pre, preN)
		if err != nil || !ok {
			<-c.slots
			if err != nil {
				return err, false
			}
			continue
		}
		more := c.br.Buffered() >= proto.RequestSize
		c.moreInput.Store(more)
		if async := req.Type == proto.CmdRead && c.async != nil || req.Type == proto.CmdWrite && c.asyncW != nil && j.buf != nil; async {
			c.plugFor(more)
			var started bool
			if req.Type == proto.CmdRead {
				j.buf, started = c.readAsync(req)
			} else {
				started = c.writeAsync(j)
			}
			if !more || c.pluggedN >= maxUnflushed {
				// The batch ends, or is long enough: a client that streams requests still gets
				// its commands sent.
				c.unplug()
			}
			if started {
				continue
			}
		}
		c.unplug()
		inline, probe, gen := c.plan.next()
		j.gen = gen
		if !inline {
			c.submit(j)
			continue
		}
		seq := c.inline.Add(1) // odd: serving inline
		c.plan.observe(c.serve(j), gen, probe)
		if !c.inline.CompareAndSwap(seq, seq+1) {
			return nil, true // the watchdog gave the reading to takeOver
		}
	}
}

// plugFor plugs the device, if it holds requests to send them together (backend.Plugger), when
// more requests are in the reader's buffer: the batch a client pipelined goes to the device as
// one. The reader unplugs before anything that can wait (the client, a slot, a buffer, a
// request served on another path) and at the batch's end.
func (c *conn) plugFor(more bool) {
	if more && !c.plugged && c.plug != nil {
		c.plug.Plug()
		c.plugged = true
		c.pluggedN = 0
	}
	c.pluggedN++
}

// unplug sends what the device holds for the reader; only the reader calls it.
func (c *conn) unplug() {
	if c.plugged {
		c.plugged = false
		c.plug.Unplug()
	}
}

// takeOver becomes the reader while the previous one is stuck serving a slow request. The
// watchdog counted it in c.workers.
func (c *conn) takeOver() {
	defer c.workers.Done()
	c.plan.rescued(watchdogTick)
	if err, handedOver := c.readRequests(); !handedOver {
		c.readDone <- err
	}
}

// A WRITE's payload of at least directRead bytes is read from the socket straight into its
// buffer rather than through br, which would copy it a second time (a 64 KiB memmove per request
// costs more than the system call it saves). After such a payload the next header is read
// directly too, so that br does not prefetch, and then copy, the next large payload.
const directRead = 16 << 10

// readHeader reads the next request's header into hdr. After a large WRITE whose payload was read
// directly, the next request is expected to be another of the same length (a sequential writer):
// one system call then reads its header into hdr and as much of its payload as has arrived into
// pre, a buffer of that length, of which preN bytes were filled, where two calls read them
// before. dispatch gives those bytes back to br when the request is not such a WRITE: one system
// call a request fewer in bench writeback's 64K sequential write row.
func (c *conn) readHeader(hdr []byte) (pre *[]byte, preN int, err error) {
	if !c.direct() || c.plain == nil || !c.s.prefetch.tryPrefetch(bufpool.Size(c.bigLen)) {
		return nil, 0, c.readFull(hdr)
	}
	pre = bufpool.Get(c.bigLen)
	n, err := c.plain.recv2(hdr, *pre)
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err == nil && n < len(hdr) {
		if err = c.plain.readFull(hdr[n:]); err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
	}
	if err != nil {
		c.putPrefetched(pre)
		return nil, 0, err
	}
	return pre, max(0, n-len(hdr)), nil
}

// direct reports whether the reader's next bytes come from the socket itself: after a large
// payload, while neither br nor src holds bytes read ahead.
func (c *conn) direct() bool {
	return c.bigWrites && c.br.Buffered() == 0 && len(c.src.unread) == 0
}

// readFull fills p: from the socket itself when direct (in one system call on a detached socket),
// else through br.
func (c *conn) readFull(p []byte) error {
	if !c.direct() {
		_, err := io.ReadFull(c.br, p)
		return err
	}
	if c.plain != nil {
		return c.plain.readFull(p)
	}
	_, err := io.ReadFull(c.src, p)
	return err
}

// readPayload reads a WRITE's payload into p: what br holds of it, then the rest directly when it
// is large.
func (c *conn) readPayload(p []byte) error {
	n, _ := c.br.Read(p[:min(len(p), c.br.Buffered())])
	c.bigWrites, c.bigLen = len(p)-n >= directRead, len(p)
	return c.readFull(p[n:])
}

// dispatch checks a request and reads its payload, of which readHeader may have read preN bytes
// into pre already. It returns the job to serve, or ok false when the request was answered with
// an error at once.
func (c *conn) dispatch(req proto.Request, pre *[]byte, preN int) (j job, ok bool, err error) {
	errno, msg := c.check(req)
	if pre != nil && (req.Type != proto.CmdWrite || errno != 0 || int(req.Length) != len(*pre)) {
		// Not the WRITE expected: what was read of the socket belongs to what follows.
		c.src.giveBack((*pre)[:preN])
		c.bigWrites = false
		c.putPrefetched(pre)
		pre = nil
	}
	var buf *[]byte
	if req.Type == proto.CmdWrite {
		if req.Length > maxPayload {
			return job{}, false, protocolErrorf("WRITE of %d bytes, more than the %d the server accepts", req.Length, maxPayload)
		}
		switch {
		case errno != 0:
			// The payload is on the wire anyway: skip it to stay in step with the client.
			if _, err := c.br.Discard(int(req.Length)); err != nil {
				return job{}, false, c.readErr(err)
			}
		case pre != nil:
			buf = c.payloadOf(pre)
			if err := c.readFull((*buf)[preN:]); err != nil {
				c.putBuf(buf)
				return job{}, false, c.readErr(err)
			}
		default:
			buf = c.readerBuf(int(req.Length))
			if err := c.readPayload(*buf); err != nil {
				c.putBuf(buf)
				return job{}, false, c.readErr(err)
			}
		}
	}
	if errno != 0 {
		c.log.Debug("nbd: request refused", "cmd", req.Type, "flags", req.Flags, "offset", req.Offset, "length", req.Length, "reason", msg)
		c.replyErrno(req, errno, msg)
		return job{}, false, nil
	}
	j = job{req: req, buf: buf}
	switch req.Type {
	case proto.CmdWrite, proto.CmdTrim, proto.CmdWriteZeroes:
		j.seq = c.order.start()
	case proto.CmdFlush:
		j.seq = c.order.barrier()
	}
	return j, true, nil
}

// check validates a request against the negotiated parameters. It returns 0 or the NBD error to
// answer with and a message for the client.
func (c *conn) check(r proto.Request) (errno uint32, msg string) {
	var allowed uint16
	if c.tflags&proto.FlagSendFUA != 0 {
		// Valid on every command once negotiated; it matters only to those that write.
		allowed |= proto.CmdFlagFUA
	}
	switch r.Type {
	case proto.CmdRead:
		if c.structured {
			allowed |= proto.CmdFlagDF
		}
	case proto.CmdWrite, proto.CmdFlush, proto.CmdTrim, proto.CmdCache:
	case proto.CmdWriteZeroes:
		allowed |= proto.CmdFlagNoHole
		if c.tflags&proto.FlagSendFastZero != 0 {
			allowed |= proto.CmdFlagFastZero
		}
	case proto.CmdBlockStatus:
		return proto.ErrnoInval, "NBD_CMD_BLOCK_STATUS needs a metadata context, and none was negotiated"
	default:
		return proto.ErrnoInval, "unknown command"
	}
	if r.Flags&^allowed != 0 {
		return proto.ErrnoInval, "command flags not valid for this command"
	}
	if isWriteType(r.Type) && c.info.ReadOnly {
		return proto.ErrnoPerm, "the export is read-only"
	}
	switch r.Type {
	case proto.CmdFlush:
		return 0, "" // offset and length are reserved
	case proto.CmdRead, proto.CmdWrite, proto.CmdCache:
		// A CACHE of the whole disk would be read into the cache as one request.
		if r.Length > c.maxBlock {
			return proto.ErrnoOverflow, "length over the maximum block size"
		}
	case proto.CmdTrim:
		if c.tflags&proto.FlagSendTrim == 0 {
			return proto.ErrnoInval, "the export does not support trim"
		}
	case proto.CmdWriteZeroes:
		if c.tflags&proto.FlagSendWriteZeroes == 0 {
			return proto.ErrnoInval, "the export does not support write zeroes"
		}
	}
	size := uint64(c.info.Size)
	if r.Offset > size || uint64(r.Length) > size-r.Offset {
		if r.Type == proto.CmdWrite || r.Type == proto.CmdWriteZeroes {
			return proto.ErrnoNoSpc, "request beyond the end of the export"
		}
		return proto.ErrnoInval, "request beyond the end of the export"
	}
	if m := uint64(c.minBlock); m > 1 && (r.Offset%m != 0 || uint64(r.Length)%m != 0) {
		return proto.ErrnoInval, "request not aligned to the minimum block size"
	}
	return 0, ""
}

func isWriteType(typ uint16) bool {
	return typ == proto.CmdWrite || typ == proto.CmdTrim || typ == proto.CmdWriteZeroes
}

// submit hands j to an idle worker, starting a new one while fewer than MaxInFlight exist.
func (c *conn) submit(j job) {
	select {
	case c.jobs <- j:
		return
	default:
	}
	if c.nworkers < c.s.maxInFlight {
		c.nworkers++
		c.workers.Add(1)
		go c.work()
	}
	c.jobs <- j
}

func (c *conn) work() {
	defer c.workers.Done()
	for j := range c.jobs {
		c.plan.observe(c.serve(j), j.gen, false)
	}
}

// serve performs one request on the device, answers it and frees its slot. It returns how long
// the device took, and at least waitedLatency when the device waited on a disk or the network
// meanwhile (for this request or another: either way the device is not a memory copy now).
func (c *conn) serve(j job) time.Duration {
	r := j.req
	dev := c.export.Device
	off, n := int64(r.Offset), int64(r.Length)
	fua := r.Flags&proto.CmdFlagFUA != 0
	var err error
	var waits uint64
	if c.waiter != nil {
		waits = c.waiter.Waits()
	}
	start := time.Now()
	switch r.Type {
	case proto.CmdRead:
		buf := j.buf
		if buf == nil {
			buf = c.getBuf(int(r.Length))
		}
		if err = dev.ReadAt(*buf, off); err == nil {
			c.replyData(r, *buf)
		}
		c.putBuf(buf)
	case proto.CmdWrite:
		err = dev.WriteAt(*j.buf, off, fua)
		c.putBuf(j.buf)
		c.order.finish(j.seq)
	case proto.CmdTrim:
		err = dev.Trim(off, n, fua)
		c.order.finish(j.seq)
	case proto.CmdWriteZeroes:
		err = dev.WriteZeroes(off, n, volume.ZeroFlags{
			NoHole: r.Flags&proto.CmdFlagNoHole != 0,
			Fast:   r.Flags&proto.CmdFlagFastZero != 0,
			FUA:    fua,
		})
		c.order.finish(j.seq)
	case proto.CmdFlush:
		c.order.wait(j.seq)
		err = dev.Flush()
	case proto.CmdCache:
		err = dev.Cache(off, n)
	}
	took := time.Since(start)
	if c.waiter != nil && c.waiter.Waits() != waits {
		took = max(took, waitedLatency)
	}
	switch {
	case err != nil:
		c.replyFailed(r, err)
	case r.Type != proto.CmdRead:
		c.replyErrno(r, 0, "")
	}
	<-c.slots
	return took
}

// writeOrder lets a FLUSH wait for the write-type requests (WRITE, TRIM, WRITE_ZEROES) received
// before it on the same connection, while later ones run on.
type writeOrder struct {
	mu      sync.Mutex // guards next, pending and waiting; nothing is taken under it
	cond    sync.Cond  // L is mu; signalled on completions while a flush waits
	next    uint64     // ticket of the next write-type request
	pending []uint64   // tickets of write-type requests not yet completed (at most MaxInFlight+1)
	waiting int        // flushes waiting
}

// start registers a write-type request and returns its ticket.
func (o *writeOrder) start() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.next
	o.next++
	o.pending = append(o.pending, t)
	return t
}

// barrier returns the ticket that the next write-type request will get: a flush waits for every
// ticket below it.
func (o *writeOrder) barrier() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next
}

// finish marks the request with ticket t complete.
func (o *writeOrder) finish(t uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, p := range o.pending {
		if p == t {
			last := len(o.pending) - 1
			o.pending[i] = o.pending[last]
			o.pending = o.pending[:last]
			break
		}
	}
	if o.waiting > 0 {
		o.cond.Broadcast()
	}
}

// wait returns once every write-type request with a ticket below barrier has completed.
func (o *writeOrder) wait(barrier uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.waiting++
	for o.pendingBelow(barrier) {
		o.cond.Wait()
	}
	o.waiting--
}

func (o *writeOrder) pendingBelow(barrier uint64) bool {
	for _, p := range o.pending {
		if p < barrier {
			return true
		}
	}
	return false
}

// The largest pooled buffer must hold the largest payload: this array has a negative length, and
// the package does not compile, if it does not.
var _ [bufpool.MaxPooled - maxPayload]struct{}
