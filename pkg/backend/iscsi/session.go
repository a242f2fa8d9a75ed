package iscsi

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// A session in full feature phase (RFC 7143 sections 4.2 and 11): any number of goroutines run
// commands on it at once; one reader goroutine receives every PDU the target sends and hands it to
// the task its Initiator Task Tag names. A command's own goroutine sends its PDUs (the command,
// unsolicited data, the data each R2T asks for), so the reader never waits on the connection's
// sending side, and a buffer is touched only while its command is in flight.

// readBuffer is the size of the session's read buffer.
const readBuffer = 64 << 10

// maxInFlight bounds the commands a session has outstanding, whatever the target's window allows:
// each holds its caller's buffer, and the NBD server above does not queue deeper.
const maxInFlight = 128

// timing is how a session watches its connection. Tests shorten it.
type timing struct {
	tick      time.Duration // how often the keepalive looks
	pingAfter time.Duration // idle time after which we ping the target (a NOP-Out)
	deadAfter time.Duration // silence after which the connection is given up
	logout    time.Duration // how long Close waits for the Logout Response
	// command bounds how long a SCSI command may go unanswered while the target still talks:
	// past it the session is given up, and the commands run again on a new one (link.go), as a
	// target that lost one has lost its state (Linux's SCSI layer aborts at 30 s, then resets).
	command time.Duration
}

var defaultTiming = timing{tick: time.Second, pingAfter: 5 * time.Second, deadAfter: 30 * time.Second, logout: 2 * time.Second, command: time.Minute}

// taskKind says which PDUs may answer a task.
type taskKind int

const (
	kindSCSI   taskKind = iota // SCSI Data-In, R2T, SCSI Response
	kindPing                   // NOP-In
	kindLogout                 // Logout Response
)

// task is one command, ping or logout waiting for the target. The reader goroutine fills in the
// results and closes done; nothing else writes a task once it is registered.
type task struct {
	kind   taskKind
	itt    uint32
	sent   time.Time // when it was registered
	cdb    []byte    // a SCSI command's, for messages
	read   []byte    // where Data-In goes
	write  []byte    // where Data-Out comes from
	got    int       // Data-In bytes received so far
	dataSN uint32    // the next Data-In's DataSN
	r2tSN  uint32    // the next R2T's R2TSN
	r2ts   chan r2t
	done   chan struct{} // closed when the task ends, unless it has cb
	// cb, for a command started with session.start, is called on the reader goroutine when the task
	// ends, instead of closing done; it must not block.
	cb func(*task)

	status   byte   // SCSI status
	sense    []byte // the sense data of a CHECK CONDITION
	digest   error  // a Data-In's data digest failed
	response byte   // iSCSI response of a SCSI Response or Logout Response
	err      error  // the task failed: rejected, or the session ended
}

// good reports whether t ended with GOOD status and all its data.
func (t *task) good() bool {
	return t.err == nil && t.response == 0 && t.digest == nil && t.status == statusGood && t.got == len(t.read)
}

// r2t is what one Ready To Transfer asks for.
type r2t struct {
	ttt      uint32
	off, len int
}

// nopReply is a NOP-Out answering a ping of the target, with the ping's data.
type nopReply struct {
	h    bhs
	data []byte
}

// session is one logged-in session over one connection.
type session struct {
	conn   net.Conn
	p      params
	lun    uint64 // the LUN field of our PDUs
	name   string // "TARGET at HOST:PORT", for messages
	log    *slog.Logger
	timing timing
	rd     *pduReader

	wmu sync.Mutex // one PDU at a time on the connection, and commands in CmdSN order
	wr  *pduWriter

	mu       sync.Mutex
	window   *sync.Cond // broadcast when MaxCmdSN grows or the session ends
	cmdSN    uint32     // the CmdSN of the next non-immediate command
	expCmdSN uint32
	maxCmdSN uint32
	tasks    map[uint32]*task
	lastITT  uint32
	err      error // why the session ended; set once

	// writesAcked counts the commands with data out (WRITE, WRITE SAME, UNMAP) that ended GOOD,
	// counted by the reader before their callers learn it; writesSynced, how many of them the last
	// successful SYNCHRONIZE CACHE covered (link.flush).
	writesAcked, writesSynced atomic.Uint64

	expStatSN  atomic.Uint32 // the StatSN we expect next; the reader's alone to advance
	lastRecv   atomic.Int64  // when the last PDU came, in Unix nanoseconds
	pinging    atomic.Bool
	slots      chan struct{} // one per command in flight
	nopReplies chan nopReply // answers to the target's pings, for nopSender

	// The reader's run (receive.go): runMu guards inRun and atEnd; running (inRun as the reader
	// last set it) and atEndSpare are the reader's.
	runMu             sync.Mutex
	inRun, running    bool
	atEnd, atEndSpare []func()

	done     chan struct{} // closed when the reader has ended and failed every task
	stop     chan struct{} // closed by close, to stop the helpers
	stopOnce sync.Once
}

func newSession(conn net.Conn, res *loginResult, lun uint64, name string, log *slog.Logger, tm timing) *session {
	s := &session{
		conn: conn, p: res.params, lun: encodeLUN(lun), name: name, log: log, timing: tm,
		// Buffered: a small PDU (a status, an R2T) costs no read of its own, and data longer
		// than the buffer still goes straight to the caller's buffer.
		rd:       newPDUReader(bufio.NewReaderSize(conn, readBuffer), res.params.maxRecvData),
		wr:       &pduWriter{w: conn},
		cmdSN:    res.cmdSN,
		expCmdSN: res.expCmdSN, maxCmdSN: res.maxCmdSN,
		tasks:      map[uint32]*task{},
		slots:      make(chan struct{}, maxInFlight),
		nopReplies: make(chan nopReply, 4),
		done:       make(chan struct{}),
		stop:       make(chan struct{}),
	}
	s.rd.headerDigest, s.rd.dataDigest = res.params.headerDigest, res.params.dataDigest
	s.wr.headerDigest, s.wr.dataDigest = res.params.headerDigest, res.params.dataDigest
	s.window = sync.NewCond(&s.mu)
	s.expStatSN.Store(res.expStatSN)
	s.lastRecv.Store(time.Now().UnixNano())
	go s.receive()
	go s.keepalive()
	go s.nopSender()
	return s
}

// encodeLUN puts a LUN in SAM's 8-byte form: peripheral addressing below 256, flat space above.
func encodeLUN(lun uint64) uint64 {
	if lun < 256 {
		return lun << 48
	}
	return (0x4000 | lun) << 48
}

// serialLess compares sequence numbers in RFC 1982's serial arithmetic, as RFC 7143 does.
func serialLess(a, b uint32) bool { return a != b && int32(b-a) > 0 }

// fail ends the session with err (the first error wins) and closes the connection, which ends the
// reader, which fails every task.
func (s *session) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.window.Broadcast()
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
	_ = s.conn.Close()
}

// endedError is the error of a command that the session's end cut short: it may have run or not,
// and can be run again on another session (link.exec).
type endedError struct{ err error }

func (e *endedError) Error() string { return e.err.Error() }
func (e *endedError) Unwrap() error { return e.err }

// ended returns why the session ended, nil while it runs.
func (s *session) ended() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// register gives t an Initiator Task Tag and makes the reader route PDUs to it.
func (s *session) register(t *task) error {
	if t.cb == nil {
		t.done = make(chan struct{})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	for {
		s.lastITT++
		if _, used := s.tasks[s.lastITT]; !used && s.lastITT != reservedTag {
			break
		}
	}
	t.itt = s.lastITT
	t.sent = time.Now()
	s.tasks[t.itt] = t
	return nil
}

// complete ends t with err; only the reader calls it.
func (s *session) complete(t *task, err error) {
	s.mu.Lock()
	delete(s.tasks, t.itt)
	s.mu.Unlock()
	if err == nil && len(t.write) > 0 && t.response == 0 && t.status == statusGood && t.digest == nil {
		s.writesAcked.Add(1)
	}
	t.err = err
	s.finish(t)
}

// finish tells whoever waits for t that it has ended.
func (s *session) finish(t *task) {
	if t.cb == nil {
		close(t.done)
		return
	}
	<-s.slots
	t.cb(t)
}

// unregister takes back a task that was never sent; it reports false if the session's end took
// it first (and so ends it).
func (s *session) unregister(t *task) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tasks[t.itt] != t {
		return false
	}
	delete(s.tasks, t.itt)
	return true
}

// lockForCommand takes the write lock with a CmdSN in the target's window, waiting for the window
// to open without holding the lock (the answers to the target's pings need it meanwhile). The
// caller sends its command and unlocks wmu.
func (s *session) lockForCommand() (uint32, error) {
	for {
		sn, ok, err := s.tryLockForCommand()
		if ok || err != nil {
			return sn, err
		}
		s.mu.Lock()
		if s.err == nil && serialLess(s.maxCmdSN, s.cmdSN) {
			s.window.Wait()
		}
		s.mu.Unlock()
	}
}

// tryLockForCommand is lockForCommand where the window is open; ok is false, with wmu not held,
// where it is shut or the session has ended (err).
func (s *session) tryLockForCommand() (sn uint32, ok bool, err error) {
	s.wmu.Lock()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.err != nil:
		s.wmu.Unlock()
		return 0, false, s.err
	case serialLess(s.maxCmdSN, s.cmdSN):
		s.wmu.Unlock()
		return 0, false, nil
	}
	sn = s.cmdSN
	s.cmdSN++
	return sn, true, nil
}

// nextCmdSN is the CmdSN an immediate PDU carries (it does not advance it).
func (s *session) nextCmdSN() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmdSN
}

// send writes one PDU; the caller holds wmu. A failed write ends the session.
func (s *session) send(h *bhs, data []byte) error {
	h.setExpStatSN(s.expStatSN.Load())
	if err := s.wr.write(h, data); err != nil {
		return s.sendFailed(err)
	}
	return nil
}

// sendFailed ends the session after a write to its connection failed with err.
func (s *session) sendFailed(err error) error {
	err = fmt.Errorf("iscsi: sending to %s: %w", s.name, err)
	s.fail(err)
	return err
}

// command runs one SCSI command with cdb, reading into read or writing write (at most one of them
// non-empty), and returns when the target has answered. The task's results are then the caller's.
func (s *session) command(cdb []byte, read, write []byte) (*task, error) {
	select {
	case s.slots <- struct{}{}:
	case <-s.done:
		return nil, &endedError{s.ended()}
	}
	defer func() { <-s.slots }()
	t := &task{kind: kindSCSI, cdb: cdb, read: read, write: write}
	if len(write) > 0 {
		t.r2ts = make(chan r2t, s.p.maxOutstandingR2T)
	}
	if err := s.register(t); err != nil {
		return nil, &endedError{err}
	}
	h, immediate, unsolicited := s.header(t)
	sn, err := s.lockForCommand()
	if err == nil {
		h.setCmdSN(sn)
		err = s.send(&h, write[:immediate])
		if err == nil && unsolicited > immediate {
			err = s.sendData(t, reservedTag, immediate, unsolicited-immediate)
		}
		s.wmu.Unlock()
	}
wait:
	for err == nil {
		select {
		case r := <-t.r2ts:
			s.wmu.Lock()
			err = s.sendData(t, r.ttt, r.off, r.len)
			s.wmu.Unlock()
		case <-t.done:
			break wait
		}
	}
	// Every path waits for the reader to let go of the task: until then Data-In may land in read.
	<-t.done
	if t.err != nil || err == nil {
		err = t.err // the reader's account of why, where it has one
	}
	if err != nil && s.ended() != nil {
		return t, &endedError{err}
	}
	return t, err
}

// header is the SCSI Command PDU of t (but its CmdSN), with how many bytes of a write go in it
// (immediate) and how many go before the target asks for more (unsolicited).
func (s *session) header(t *task) (h bhs, immediate, unsolicited int) {
	h.setOpcode(opSCSICmd, false)
	h[1] = attrSimple
	h.setLUN(s.lun)
	h.setITT(t.itt)
	copy(h[32:], t.cdb)
	switch {
	case len(t.read) > 0:
		h[1] |= flagRead
		h.setU32(20, uint32(len(t.read)))
	case len(t.write) > 0:
		h[1] |= flagWrite
		h.setU32(20, uint32(len(t.write)))
		if s.p.immediateData {
			immediate = min(len(t.write), s.p.firstBurst, s.p.maxSendData)
		}
		unsolicited = immediate
		if !s.p.initialR2T {
			unsolicited = min(len(t.write), s.p.firstBurst)
		}
	}
	if unsolicited == immediate {
		h[1] |= flagFinal // no unsolicited Data-Out follows
	}
	return h, immediate, unsolicited
}

// start sends a command that reads into read, or writes write whole in its own PDU (immediate
// data), and returns: the reader calls cb when the target has answered, or the session has ended.
// It reports false, having sent nothing, where the write needs more PDUs, or the session has no
// free slot or CmdSN for it at once, or has ended. While plugs is above zero the command is held,
// to go out with the next one sent or at unplug.
func (s *session) start(cdb, read, write []byte, plugs *atomic.Int32, cb func(*task)) bool {
	if len(write) > 0 && (!s.p.immediateData || len(write) > min(s.p.firstBurst, s.p.maxSendData)) {
		return false
	}
	select {
	case s.slots <- struct{}{}:
	default:
		return false
	}
	t := &task{kind: kindSCSI, cdb: cdb, read: read, write: write, cb: cb}
	if s.register(t) != nil {
		<-s.slots
		return false
	}
	h, _, _ := s.header(t)
	sn, ok, err := s.tryLockForCommand()
	if !ok {
		if err == nil && s.unregister(t) {
			<-s.slots
			return false
		}
		return true // the session has ended: its reader ends t
	}
	h.setCmdSN(sn)
	// A failure ends the session, and its reader t.
	if plugs.Load() > 0 {
		h.setExpStatSN(s.expStatSN.Load())
		if err := s.wr.hold(&h, write); err != nil {
			s.sendFailed(err)
		}
	} else {
		_ = s.send(&h, write)
	}
	s.wmu.Unlock()
	return true
}

// unplug sends the commands start held, unless plugs is above zero again: another caller holds
// on, and will send them.
func (s *session) unplug(plugs *atomic.Int32) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if plugs.Load() > 0 {
		return
	}
	if err := s.wr.flush(); err != nil {
		s.sendFailed(err)
	}
}

// sendData sends t.write[off:off+n] in Data-Out PDUs of at most the target's
// MaxRecvDataSegmentLength, for the R2T with ttt (reservedTag: unsolicited data). The caller holds
// wmu.
func (s *session) sendData(t *task, ttt uint32, off, n int) error {
	end := off + n
	for sn := uint32(0); off < end; sn++ {
		m := min(end-off, s.p.maxSendData)
		var h bhs
		h.setOpcode(opDataOut, false)
		if off+m == end {
			h[1] = flagFinal
		}
		h.setLUN(s.lun)
		h.setITT(t.itt)
		h.setTTT(ttt)
		h.setU32(36, sn)
		h.setU32(40, uint32(off))
		if err := s.send(&h, t.write[off:off+m]); err != nil {
			return err
		}
		off += m
	}
	return nil
}

// close logs out (briefly: a target that does not answer is dropped) and ends the session; every
// call after it fails with backend.ErrClosed.
func (s *session) close() {
	if s.ended() == nil {
		s.logout()
	}
	s.fail(fmt.Errorf("%w: iscsi session with %s", backend.ErrClosed, s.name))
	<-s.done
}

func (s *session) logout() {
	t := &task{kind: kindLogout}
	if s.register(t) != nil {
		return
	}
	var h bhs
	h.setOpcode(opLogoutReq, true)
	h[1] = flagFinal // reason 0: close the session
	h.setITT(t.itt)
	s.wmu.Lock()
	h.setCmdSN(s.nextCmdSN())
	err := s.send(&h, nil)
	s.wmu.Unlock()
	if err != nil {
		return
	}
	select {
	case <-t.done:
	case <-time.After(s.timing.logout):
		s.log.Warn("iscsi: no answer to our logout", "target", s.name)
	}
}
