package iscsi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// SendTargets discovery (RFC 7143 section 6.9 and appendix D): a session of type Discovery, one
// Text Request SendTargets=All, the answer gathered over as many Text Responses as the target
// splits it into, then a logout.

// Target is one target a portal reports, with the portals (HOST:PORT,TPGT as the target wrote
// them) it can be reached at.
type Target struct {
	Name    string
	Portals []string
}

// Discover asks the portal of a URL in DiscoveryUsage's form (from ParseURL) for its targets,
// logging in with the CHAP credentials of the URL or getenv as Open does, or without them where
// the portal refuses them for discovery. A mistake in the URL is marked backend.ErrBadURL.
func Discover(u *url.URL, getenv func(string) string) ([]Target, error) {
	cfg, err := parseDiscoveryConfig(u, getenv)
	if err != nil {
		return nil, backend.BadURL(err)
	}
	targets, err := discoverAt(cfg)
	if errors.Is(err, ErrAuthFailed) && cfg.chap != nil {
		// Many targets (tgtd, most NAS) ask no authentication for discovery and refuse CHAP there,
		// having no account for it: the credentials are the targets'. What discovery tells
		// without them is only names and addresses; the targets' logins keep to CHAP.
		noAuth := cfg
		noAuth.chap, noAuth.targetCHAP = nil, nil
		if t, err := discoverAt(noAuth); err == nil {
			return t, nil
		}
	}
	return targets, err
}

// discoverAt connects to cfg's portal and runs a discovery session.
func discoverAt(cfg config) ([]Target, error) {
	conn, err := net.DialTimeout("tcp", cfg.addr, dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("iscsi: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(loginTimeout))
	return discover(conn, &cfg, cfg.addr, defaultInitiator(), newISID())
}

// discover runs a discovery session over rw (connected to addr). cfg names no target.
func discover(rw io.ReadWriter, cfg *config, addr, initiator string, isid [6]byte) ([]Target, error) {
	res, err := login(rw, cfg, addr, initiator, isid)
	if err != nil {
		return nil, err
	}
	// Digests are never asked for here, so plain reader and writer do.
	rd, wr := newPDUReader(rw, res.params.maxRecvData), &pduWriter{w: rw}
	const itt = 1
	ttt := uint32(reservedTag)
	data := appendText(nil, pair{"SendTargets", "All"})
	var text []byte
	for {
		var h bhs
		h.setOpcode(opTextReq, false)
		h[1] = flagFinal
		h.setITT(itt)
		h.setTTT(ttt)
		h.setCmdSN(res.cmdSN)
		h.setExpStatSN(res.expStatSN)
		if err := wr.write(&h, data); err != nil {
			return nil, fmt.Errorf("iscsi: discovery at %s: %w", addr, err)
		}
		res.cmdSN++
		r, err := rd.next()
		if err != nil {
			return nil, fmt.Errorf("iscsi: discovery at %s: %w", addr, err)
		}
		resp := *r
		d, err := rd.readData()
		if err != nil {
			return nil, fmt.Errorf("iscsi: discovery at %s: %w", addr, err)
		}
		switch {
		case resp.opcode() == opReject:
			return nil, fmt.Errorf("%w: discovery portal %s rejected SendTargets (reason %#02x)", ErrProtocol, addr, resp[2])
		case resp.opcode() != opTextResp:
			return nil, fmt.Errorf("%w: %s in answer to SendTargets from %s", ErrProtocol, &resp, addr)
		case resp.itt() != itt:
			return nil, fmt.Errorf("%w: text response for ITT %#x, sent %#x", ErrProtocol, resp.itt(), itt)
		}
		res.expStatSN = resp.statSN() + 1
		if len(text)+len(d) > maxTextLen {
			return nil, fmt.Errorf("%w: SendTargets answer from %s over %d bytes", ErrProtocol, addr, maxTextLen)
		}
		text = append(text, d...)
		final := resp.flags()&flagFinal != 0
		if final != (resp.flags()&flagContinue == 0) || final != (resp.ttt() == reservedTag) {
			// A final response must complete the text and close the exchange; any other must
			// give a tag to continue with (RFC 7143 section 11.11).
			return nil, fmt.Errorf("%w: text response from %s with flags %#02x and TTT %#x", ErrProtocol, addr, resp.flags(), resp.ttt())
		}
		if final {
			break
		}
		// Ask for the rest: an empty request with the target's tag.
		data, ttt = nil, resp.ttt()
	}
	targets, err := parseSendTargets(text)
	if err != nil {
		return nil, fmt.Errorf("discovery at %s: %w", addr, err)
	}
	var h bhs
	h.setOpcode(opLogoutReq, true)
	h[1] = flagFinal // reason 0: close the session
	h.setITT(itt + 1)
	h.setCmdSN(res.cmdSN)
	h.setExpStatSN(res.expStatSN)
	// The answer is what matters: a target that does not take the logout well loses nothing, as
	// the connection closes anyway.
	if wr.write(&h, nil) == nil {
		if r, err := rd.next(); err == nil && r.opcode() == opLogoutResp {
			_ = rd.skip()
		}
	}
	return targets, nil
}

// parseSendTargets reads TargetName= and TargetAddress= keys: each TargetName begins a target,
// the TargetAddress keys after it are its portals. Keys repeat here, unlike in other text.
func parseSendTargets(text []byte) ([]Target, error) {
	var targets []Target
	for len(text) > 0 {
		var kv []byte
		var ok bool
		if kv, text, ok = bytes.Cut(text, []byte{0}); !ok {
			return nil, fmt.Errorf("%w: SendTargets text %q does not end with a NUL", ErrProtocol, truncate(kv))
		}
		if len(kv) == 0 {
			continue // padding
		}
		ps, err := parseText(append(kv, 0))
		if err != nil {
			return nil, err
		}
		switch p := ps[0]; p.key {
		case "TargetName":
			if err := checkName(p.value); err != nil {
				return nil, fmt.Errorf("%w: TargetName %q: %v", ErrProtocol, truncate([]byte(p.value)), err)
			}
			targets = append(targets, Target{Name: p.value})
		case "TargetAddress":
			if len(targets) == 0 {
				return nil, fmt.Errorf("%w: TargetAddress=%s before any TargetName", ErrProtocol, truncate([]byte(p.value)))
			}
			if _, err := parseTargetAddress(p.value); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
			}
			t := &targets[len(targets)-1]
			t.Portals = append(t.Portals, p.value)
		}
	}
	return targets, nil
}

// LUN is one disk of a target.
type LUN struct {
	Number    uint64
	Size      int64 // in bytes
	BlockSize int64
}

// LUNs logs in to target at the portal of u (credentials as for Discover) and lists its disks with
// their sizes: REPORT LUNS, then what each LUN says about itself, as Open asks it. LUNs that are
// not disks, such as tgtd's controller at LUN 0, are left out.
func LUNs(u *url.URL, target string, getenv func(string) string) ([]LUN, error) {
	cfg, err := parseDiscoveryConfig(u, getenv)
	if err != nil {
		return nil, backend.BadURL(err)
	}
	if err := checkName(target); err != nil {
		return nil, fmt.Errorf("iscsi: target name %q: %w", target, err)
	}
	cfg.target = target
	s, _, err := connect(cfg, newISID(), slog.Default(), defaultTiming)
	if err != nil {
		return nil, err
	}
	defer s.close()
	numbers, err := s.reportLUNs()
	if err != nil {
		return nil, err
	}
	var luns []LUN
	for _, n := range numbers {
		// The session's commands run one at a time here, so its LUN can change between them.
		s.lun = encodeLUN(n)
		li, err := s.probe(n)
		if errors.Is(err, errNotDisk) {
			continue
		}
		if err != nil {
			return nil, err
		}
		luns = append(luns, LUN{Number: n, Size: int64(li.blocks) * li.blockSize, BlockSize: li.blockSize})
	}
	return luns, nil
}
