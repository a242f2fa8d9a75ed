package iscsi

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The session's reader goroutine: every PDU the target sends is checked against what was
// negotiated and asked for, then handed to the task its Initiator Task Tag names. Anything that
// breaks the protocol ends the session with an error naming the PDU.

// receive is the reader goroutine.
func (s *session) receive() {
	err := s.receiveLoop()
	s.fail(err)
	s.mu.Lock()
	err, tasks := s.err, s.tasks
	s.tasks = nil
	s.mu.Unlock()
	s.beginRun()
	for _, t := range tasks {
		t.err = err
		s.finish(t)
	}
	s.endRun()
	close(s.done)
}

func (s *session) receiveLoop() error {
	defer s.endRun()
	for {
		if s.rd.buffered() < bhsLen {
			// The next header needs a read of the socket, which may wait: the run of
			// completions from what was read ends here.
			s.endRun()
		}
		h, err := s.rd.next()
		s.beginRun()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("iscsi: connection to %s closed", s.name)
			}
			if errors.Is(err, ErrProtocol) {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			return fmt.Errorf("iscsi: connection to %s: %w", s.name, err)
		}
		s.lastRecv.Store(time.Now().UnixNano())
		s.updateWindow(h)
		switch h.opcode() {
		case opDataIn:
			err = s.dataIn(h)
		case opSCSIResp:
			err = s.scsiResponse(h)
		case opR2T:
			err = s.r2t(h)
		case opNOPIn:
			err = s.nopIn(h)
		case opLogoutResp:
			err = s.endTask(h, kindLogout)
		case opReject:
			err = s.reject(h)
		case opAsync:
			err = s.async(h)
		default:
			err = fmt.Errorf("%w: unexpected %s", ErrProtocol, h)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
}

// updateWindow takes ExpCmdSN and MaxCmdSN from any PDU of the target; every one carries them.
func (s *session) updateWindow(h *bhs) {
	exp, maxSN := h.expCmdSN(), h.maxCmdSN()
	if serialLess(maxSN, exp-1) {
		return // RFC 7143 section 4.2.2.1: such a pair is to be ignored
	}
	s.mu.Lock()
	if serialLess(s.expCmdSN, exp) {
		s.expCmdSN = exp
	}
	if serialLess(s.maxCmdSN, maxSN) {
		s.maxCmdSN = maxSN
		s.window.Broadcast()
	}
	s.mu.Unlock()
}

// status checks the StatSN of a PDU that carries a status and advances ours: with error recovery
// level 0, a gap means a status was lost, and the session cannot go on.
func (s *session) status(h *bhs) error {
	want := s.expStatSN.Load()
	if got := h.statSN(); got != want {
		return fmt.Errorf("%w: %s has StatSN %d, expected %d", ErrProtocol, h, got, want)
	}
	s.expStatSN.Store(want + 1)
	return nil
}

// answer finds the task of kind that a PDU with a status answers, and checks its StatSN.
func (s *session) answer(h *bhs, kind taskKind) (*task, error) {
	t, err := s.taskFor(h, kind)
	if err != nil {
		return nil, err
	}
	return t, s.status(h)
}

// endTask ends the task of a NOP-In or Logout Response, whose data is of no use: the response
// byte is the whole answer.
func (s *session) endTask(h *bhs, kind taskKind) error {
	t, err := s.answer(h, kind)
	if err != nil {
		return err
	}
	if err := s.rd.skip(); err != nil {
		return err
	}
	t.response = h[2]
	s.complete(t, nil)
	return nil
}

// taskFor finds the task a PDU answers; one for no task of ours, or of another kind, is an error.
func (s *session) taskFor(h *bhs, kind taskKind) (*task, error) {
	s.mu.Lock()
	t := s.tasks[h.itt()]
	s.mu.Unlock()
	if t == nil || t.kind != kind {
		return nil, fmt.Errorf("%w: %s for no such task of ours", ErrProtocol, h)
	}
	return t, nil
}

func (s *session) dataIn(h *bhs) error {
	t, err := s.taskFor(h, kindSCSI)
	if err != nil {
		return err
	}
	n, off := h.dataLen(), int64(h.bufferOffset())
	switch {
	case h.dataSN() != t.dataSN:
		return fmt.Errorf("%w: %s has DataSN %d, expected %d", ErrProtocol, h, h.dataSN(), t.dataSN)
	case off != int64(t.got):
		return fmt.Errorf("%w: %s at buffer offset %d, expected %d (data in order was negotiated)", ErrProtocol, h, off, t.got)
	case n > len(t.read)-t.got:
		return fmt.Errorf("%w: %s brings %d bytes at offset %d, beyond the %d asked for", ErrProtocol, h, n, off, len(t.read))
	}
	t.dataSN++
	if err := s.rd.readInto(t.read[t.got : t.got+n]); errors.Is(err, errDataDigest) {
		t.digest = err // the stream is still in step: fail this command only
	} else if err != nil {
		return err
	}
	t.got += n
	if h.flags()&flagStatus == 0 {
		return nil
	}
	if h.flags()&flagFinal == 0 {
		return fmt.Errorf("%w: %s carries a status without the final bit", ErrProtocol, h)
	}
	if err := s.status(h); err != nil {
		return err
	}
	t.status = h[3]
	s.complete(t, nil)
	return nil
}

func (s *session) scsiResponse(h *bhs) error {
	t, err := s.answer(h, kindSCSI)
	if err != nil {
		return err
	}
	data, err := s.rd.readData()
	if err != nil && !errors.Is(err, errDataDigest) {
		return err
	}
	t.response, t.status = h[2], h[3]
	if err != nil {
		t.digest = err
	} else if len(data) >= 2 {
		n := int(data[0])<<8 | int(data[1])
		if n > len(data)-2 {
			return fmt.Errorf("%w: %s: SenseLength %d in a data segment of %d bytes", ErrProtocol, h, n, len(data))
		}
		t.sense = append([]byte(nil), data[2:2+n]...)
	}
	s.complete(t, nil)
	return nil
}

func (s *session) r2t(h *bhs) error {
	t, err := s.taskFor(h, kindSCSI)
	if err != nil {
		return err
	}
	if err := s.rd.skip(); err != nil {
		return err
	}
	off, n := int64(h.bufferOffset()), int64(h.desiredLength())
	switch {
	case len(t.write) == 0:
		return fmt.Errorf("%w: %s for a command that writes nothing", ErrProtocol, h)
	case h.dataSN() != t.r2tSN:
		return fmt.Errorf("%w: %s has R2TSN %d, expected %d", ErrProtocol, h, h.dataSN(), t.r2tSN)
	case h.ttt() == reservedTag:
		return fmt.Errorf("%w: %s without a Target Transfer Tag", ErrProtocol, h)
	case n == 0 || n > int64(s.p.maxBurst) || off+n > int64(len(t.write)):
		return fmt.Errorf("%w: %s asks for %d bytes at offset %d of a %d-byte write (MaxBurstLength %d)",
			ErrProtocol, h, n, off, len(t.write), s.p.maxBurst)
	}
	t.r2tSN++
	select {
	case t.r2ts <- r2t{ttt: h.ttt(), off: int(off), len: int(n)}:
		return nil
	default:
		return fmt.Errorf("%w: %s beyond MaxOutstandingR2T=%d", ErrProtocol, h, s.p.maxOutstandingR2T)
	}
}

func (s *session) nopIn(h *bhs) error {
	if h.itt() == reservedTag {
		// The target's own: a ping to answer if it has a Target Transfer Tag, else only news of
		// the window. Its StatSN does not advance.
		data, err := s.rd.readData()
		if err != nil {
			return err
		}
		if h.ttt() == reservedTag {
			return nil
		}
		var out bhs
		out.setOpcode(opNOPOut, true)
		out[1] = flagFinal
		copy(out[8:16], h[8:16])
		out.setITT(reservedTag)
		out.setTTT(h.ttt())
		echo := append([]byte(nil), data[:min(len(data), s.p.maxSendData)]...)
		select {
		case s.nopReplies <- nopReply{out, echo}:
		default:
			s.log.Warn("iscsi: the target pings faster than we can answer; dropping a ping", "target", s.name)
		}
		return nil
	}
	return s.endTask(h, kindPing)
}

// rejectReasons names the reasons of a Reject (RFC 7143 section 11.17.1).
var rejectReasons = map[byte]string{
	0x02: "data digest error", 0x03: "SNACK reject", 0x04: "protocol error",
	0x05: "command not supported", 0x06: "immediate command reject", 0x07: "task in progress",
	0x08: "invalid data ack", 0x09: "invalid PDU field", 0x0a: "long operation reject",
	0x0c: "waiting for logout",
}

func (s *session) reject(h *bhs) error {
	if err := s.status(h); err != nil {
		return err
	}
	data, err := s.rd.readData()
	if err != nil {
		return err
	}
	if len(data) < bhsLen {
		return fmt.Errorf("%w: Reject without the rejected header (%d bytes)", ErrProtocol, len(data))
	}
	var rejected bhs
	copy(rejected[:], data)
	why := rejectReasons[h[2]]
	if why == "" {
		why = "unknown reason"
	}
	rerr := fmt.Errorf("iscsi: %s rejected our %s: %s (reason %#02x)", s.name, opName(rejected.opcode()), why, h[2])
	s.mu.Lock()
	t := s.tasks[rejected.itt()]
	s.mu.Unlock()
	if t == nil || rejected.itt() == reservedTag {
		s.log.Warn(rerr.Error())
		return nil
	}
	s.complete(t, rerr)
	return nil
}

func (s *session) async(h *bhs) error {
	if err := s.status(h); err != nil {
		return err
	}
	data, err := s.rd.readData()
	if err != nil {
		return err
	}
	switch event := h[36]; event {
	case 0: // a SCSI asynchronous event, with sense data
		msg := "no sense data"
		if len(data) >= 2 {
			if sn, err := parseSense(data[2:min(len(data), 2+(int(data[0])<<8|int(data[1])))]); err == nil {
				msg = sn.String()
			}
		}
		s.log.Warn("iscsi: asynchronous SCSI event", "target", s.name, "sense", msg)
	case 1, 2, 3:
		// End the session now, with a clear reason, rather than wait for the target to drop us:
		// the backend logs in again (link.go), where the target will have us.
		return fmt.Errorf("iscsi: the target asks us to log out or is dropping the connection (asynchronous event %d)", event)
	default:
		s.log.Warn("iscsi: ignored asynchronous message", "target", s.name, "event", event, "code", h[37])
	}
	return nil
}

// A run is what the reader does with the bytes one read of the socket brought: the completions
// it calls, one after the other, with no wait between them. Functions given to atRunEnd during a
// run are called at its end, before the reader reads again: an NBD server answers a run's
// completions there, in one write, rather than wake another goroutine for them
// (backend.RunDeferrer).

// beginRun marks the reader in a run.
func (s *session) beginRun() {
	if s.running {
		return
	}
	s.running = true
	s.runMu.Lock()
	s.inRun = true
	s.runMu.Unlock()
}

// endRun ends the run, if one is under way, calling what was deferred to its end.
func (s *session) endRun() {
	if !s.running {
		return
	}
	s.running = false
	s.runMu.Lock()
	s.inRun = false
	fs := s.atEnd
	s.atEnd = s.atEndSpare[:0]
	s.runMu.Unlock()
	for i, f := range fs {
		f()
		fs[i] = nil
	}
	s.runMu.Lock()
	s.atEndSpare = fs[:0]
	s.runMu.Unlock()
}

// atRunEnd has the reader call f at the end of its run, and reports true; false, having done
// nothing, where it is not in one.
func (s *session) atRunEnd(f func()) bool {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if !s.inRun {
		return false
	}
	s.atEnd = append(s.atEnd, f)
	return true
}
