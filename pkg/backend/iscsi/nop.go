package iscsi

import (
	"fmt"
	"time"
)

// NOP-Out and NOP-In (RFC 7143 sections 11.18 and 11.19): the target's pings are answered, and an
// idle target is pinged so that a connection that went silent is found out.

// keepalive pings an idle target and gives up a connection that has gone silent.
func (s *session) keepalive() {
	tick := time.NewTicker(s.timing.tick)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		idle := time.Since(time.Unix(0, s.lastRecv.Load()))
		switch {
		case idle > s.timing.deadAfter:
			s.fail(fmt.Errorf("iscsi: %s sent nothing for %v, not even an answer to a ping", s.name, idle.Round(time.Second)))
			return
		case idle > s.timing.pingAfter && !s.pinging.Swap(true):
			go s.ping()
		}
		if t := s.overdue(); t != nil {
			s.fail(fmt.Errorf("iscsi: %s did not answer %s in %v", s.name, cdbName(t.cdb), s.timing.command))
			return
		}
	}
}

// overdue returns a SCSI command that has waited for its answer longer than timing.command.
func (s *session) overdue() *task {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tasks {
		if t.kind == kindSCSI && time.Since(t.sent) > s.timing.command {
			return t
		}
	}
	return nil
}

// ping sends a NOP-Out that the target must answer, so that a silent connection is found out.
func (s *session) ping() {
	defer s.pinging.Store(false)
	t := &task{kind: kindPing}
	if s.register(t) != nil {
		return
	}
	var h bhs
	h.setOpcode(opNOPOut, true)
	h[1] = flagFinal
	h.setITT(t.itt)
	h.setTTT(reservedTag)
	s.wmu.Lock()
	h.setCmdSN(s.nextCmdSN())
	_ = s.send(&h, nil) // a failure ends the session, and so the task
	s.wmu.Unlock()
	<-t.done
}

// nopSender answers the target's pings, off the reader goroutine.
func (s *session) nopSender() {
	for {
		select {
		case <-s.stop:
			return
		case r := <-s.nopReplies:
			s.wmu.Lock()
			r.h.setCmdSN(s.nextCmdSN())
			err := s.send(&r.h, r.data)
			s.wmu.Unlock()
			if err != nil {
				return
			}
		}
	}
}
