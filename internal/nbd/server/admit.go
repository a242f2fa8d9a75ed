package server

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Refusal is why a connection was closed as it arrived, before the server sent it a byte.
type Refusal int

// The refusals, which /metrics counts by their String.
const (
	NotAllowed      Refusal = iota // a TCP client from an address in none of Config.Allow
	TooMany                        // MaxConnections were served already
	TooManyFromHost                // MaxConnectionsPerPeer from the client's host were
	numRefusals
)

// String is the refusal's reason label in /metrics.
func (r Refusal) String() string {
	return [...]string{"not allowed", "too many connections", "too many from one host"}[r]
}

// RefusedConnections returns how many connections were refused since New, by reason (Refusal's
// String); every reason is there, with 0 until its first refusal, so that a metric made of it
// exists from the start.
func (s *Server) RefusedConnections() map[string]uint64 {
	m := make(map[string]uint64, numRefusals)
	for r := range numRefusals {
		m[r.String()] = s.refused[r].Load()
	}
	return m
}

// refuse counts a refusal, closes nc without a word to its client and logs why at warning level:
// a refused client is either misconfigured or unwelcome, and either way an operator may act. A
// client that keeps trying (a scanner, a retry loop) must not flood the log: each reason logs
// at most once per refusalLogEvery, saying how many it left out meanwhile; /metrics counts all.
func (s *Server) refuse(nc net.Conn, log *slog.Logger, why Refusal, msg string, args ...any) {
	// Counted before the close, so that a client that sees its connection end finds it counted.
	s.refused[why].Add(1)
	nc.Close()
	if left, ok := s.refusalLogs.allow(why, time.Now()); ok {
		if left > 0 {
			args = append(args, "not_logged_since_last", left)
		}
		log.Warn(msg, args...)
	}
}

// refusalLogEvery is the least time between two warnings of one reason of refusal.
const refusalLogEvery = time.Second

// refusalLimiter rate-limits the warnings of refusals, by reason.
type refusalLimiter struct {
	mu      sync.Mutex // guards last and skipped; nothing is taken under it
	last    [numRefusals]time.Time
	skipped [numRefusals]uint64
}

// allow reports whether a refusal for why at now is logged, and how many were not since the last.
func (l *refusalLimiter) allow(why Refusal, now time.Time) (skipped uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last[why].IsZero() && now.Sub(l.last[why]) < refusalLogEvery {
		l.skipped[why]++
		return 0, false
	}
	skipped, l.skipped[why] = l.skipped[why], 0
	l.last[why] = now
	return skipped, true
}

// allowed reports whether a client at a may connect: a TCP client must come from one of the
// networks in allow, unless allow is empty; any other client (a unix socket, a socket pair handed
// to the kernel) is this machine's own, which the socket file's mode governs.
func allowed(allow []netip.Prefix, a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	if !ok || len(allow) == 0 {
		return true
	}
	// A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d, which no IPv4 network contains
	// as such; and a prefix never contains an address with a zone (fe80::1%eth0).
	ip := ta.AddrPort().Addr().Unmap().WithZone("")
	for _, p := range allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
