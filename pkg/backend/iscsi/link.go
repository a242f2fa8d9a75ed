package iscsi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// The backend's hold on its target across sessions. At error recovery level 0 (RFC 7143) a
// session that loses its connection is over, and with it every command in flight: link
// logs in again, with the same ISID so that the target reinstates the session and drops what the
// old one left, and runs the commands again on the new session. Block reads and writes are
// idempotent, so running one twice is harmless. A NAS that reboots stalls its callers until it is
// back, up to the URL's reconnect-wait, instead of failing them.
//
// What reissuing cannot restore is a write the target acknowledged and then lost with its volatile
// cache: a target that rebooted has done that, and cannot say so. So when a session ends with
// acknowledged writes that no SYNCHRONIZE CACHE has covered, the next Flush fails even if its own
// command succeeds on the new session, and the caller (the cache's destage, an NBD client's fsync)
// writes them again rather than count them durable.

// Reconnection timing: the first attempt at once, then doubling waits up to reconnectMax.
const (
	reconnectMin = 100 * time.Millisecond
	reconnectMax = 5 * time.Second
	// DefaultReconnectWait is how long a command waits for a lost target to come back before it
	// fails, unless the URL's reconnect-wait says otherwise: long enough for a NAS to reboot.
	DefaultReconnectWait = 3 * time.Minute
)

// errTargetGone wraps the error of a command that waited for the target longer than it may.
var errTargetGone = errors.New("target unreachable")

type link struct {
	name    string // "TARGET at HOST:PORT" of the first session, for messages
	log     *slog.Logger
	maxWait time.Duration
	// dial logs in a new session and checks that its LUN is the one opened (size and block size).
	dial func() (*session, error)
	stop chan struct{} // closed by close: ends the reconnect loop's waits

	mu      sync.Mutex
	s       *session      // nil while reconnecting
	up      chan struct{} // closed when the next session is in; replaced when one is lost
	lostErr error         // why the last session ended, or why the last attempt to replace it failed
	closed  bool
	// losses counts the sessions that ended with acknowledged writes no flush had covered; reported,
	// those a failed Flush has owned up to.
	losses, reported uint64

	reconnects atomic.Uint64
}

func newLink(s *session, maxWait time.Duration, log *slog.Logger, dial func() (*session, error)) *link {
	return &link{name: s.name, log: log, maxWait: maxWait, dial: dial, s: s, up: make(chan struct{}), stop: make(chan struct{})}
}

// current returns the current session, nil while the target is away.
func (l *link) current() *session {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s
}

// session returns the current session, waiting for one while the target is away; since is when
// the caller's command first found it away (zero: not yet).
func (l *link) session(since time.Time) (*session, error) {
	for {
		l.mu.Lock()
		s, up, closed, why := l.s, l.up, l.closed, l.lostErr
		l.mu.Unlock()
		switch {
		case closed:
			return nil, fmt.Errorf("%w: iscsi %s", backend.ErrClosed, l.name)
		case s != nil:
			return s, nil
		case since.IsZero():
			since = time.Now()
		}
		left := time.Until(since.Add(l.maxWait))
		if left <= 0 {
			return nil, fmt.Errorf("iscsi: %s: %w for %v (reconnect-wait): %v", l.name, errTargetGone, l.maxWait, why)
		}
		t := time.NewTimer(left)
		select {
		case <-up:
		case <-t.C:
		}
		t.Stop()
	}
}

// exec runs a command on the current session, and again on the next one each time the session
// ends under it.
func (l *link) exec(cdb []byte, read, write []byte) (int, error) {
	var since time.Time
	for {
		s, err := l.session(since)
		if err != nil {
			return 0, err
		}
		n, err := s.exec(cdb, read, write)
		var ended *endedError
		if !errors.As(err, &ended) {
			return n, err
		}
		if since.IsZero() {
			since = time.Now()
		}
		l.lost(s)
	}
}

// readFull runs a command that must fill read.
func (l *link) readFull(cdb []byte, read []byte) error {
	n, err := l.exec(cdb, read, nil)
	if err == nil && n != len(read) {
		err = fmt.Errorf("iscsi: %s: %s sent %d of %d bytes", cdbName(cdb), l.name, n, len(read))
	}
	return err
}

// sync runs a SYNCHRONIZE CACHE command. It fails if a session ended with acknowledged writes that
// no flush had covered, since losses was read (by the caller, before the writes a FUA write makes
// durable), or for a whole flush (all), since the last whole flush that said so.
func (l *link) sync(cdb []byte, all bool, losses uint64) error {
	s, err := l.session(time.Time{})
	if err != nil {
		return err
	}
	acked := s.writesAcked.Load() // the writes this command covers: those acknowledged before it
	if _, err := l.exec(cdb, nil, nil); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if all {
		if l.s == s {
			s.writesSynced.Store(max(s.writesSynced.Load(), acked))
		}
		losses = l.reported
		l.reported = l.losses
	}
	if n := l.losses - losses; n > 0 {
		return fmt.Errorf("iscsi: %s: %d session(s) ended with acknowledged writes not yet flushed; a target that restarted may have lost them, so they must be written again", l.name, n)
	}
	return nil
}

// lossCount is how many sessions have ended with acknowledged writes not yet flushed.
func (l *link) lossCount() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.losses
}

// lost takes note that s has ended and, if it is still the current session, starts logging in
// again.
func (l *link) lost(s *session) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.s != s || l.closed {
		return
	}
	why := s.ended()
	l.s, l.lostErr = nil, why
	unsynced := s.writesAcked.Load() - s.writesSynced.Load()
	if unsynced > 0 {
		l.losses++
	}
	l.log.Warn("iscsi: session lost; logging in again", "target", l.name, "err", why, "unflushed_writes", unsynced)
	go l.reconnect()
}

// reconnect logs in until a session is in or the link is closed.
func (l *link) reconnect() {
	wait := reconnectMin
	for attempt := 1; ; attempt++ {
		s, err := l.dial()
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			if s != nil {
				s.close()
			}
			return
		}
		if err == nil {
			l.s = s
			close(l.up)
			l.up = make(chan struct{})
			l.mu.Unlock()
			l.reconnects.Add(1)
			l.log.Info("iscsi: logged in again", "target", l.name, "attempts", attempt)
			return
		}
		l.lostErr = err
		l.mu.Unlock()
		level := slog.LevelDebug
		if attempt == 1 {
			level = slog.LevelWarn
		}
		l.log.Log(context.Background(), level, "iscsi: logging in again failed; retrying", "target", l.name, "err", err, "retry_in", wait)
		select {
		case <-l.stop:
		case <-time.After(wait):
		}
		wait = min(2*wait, reconnectMax)
	}
}

// close logs out of the current session; commands waiting for one fail with backend.ErrClosed.
func (l *link) close() {
	l.mu.Lock()
	s := l.s
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed, l.s = true, nil
	close(l.up)
	close(l.stop)
	l.mu.Unlock()
	if s != nil {
		s.close()
	}
}
