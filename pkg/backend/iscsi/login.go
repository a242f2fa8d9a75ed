package iscsi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// The login phase (RFC 7143 sections 6.3, 11.12 and 11.13): a security stage (AuthMethod None or
// CHAP), an operational stage that negotiates the session's parameters, then full feature phase.

// Login stages, as CSG and NSG carry them.
const (
	stageSecurity    = 0
	stageOperational = 1
	stageFullFeature = 3
)

// maxLoginRounds bounds the request/response pairs of one stage: a target that never lets us move
// on is broken, and the login must end.
const maxLoginRounds = 16

// ErrAuthFailed is wrapped by the error of a login that the target refused for its credentials,
// or whose target failed mutual CHAP. Retrying cannot help.
var ErrAuthFailed = errors.New("iscsi: authentication failed")

// redirectError is a login the target sent elsewhere (status class 1).
type redirectError struct{ addr string }

func (r *redirectError) Error() string { return "iscsi: login redirected to " + r.addr }

// loginResult is what a session starts from.
type loginResult struct {
	params params
	// The sequence numbers: the next CmdSN to use, the target's window, the next StatSN expected.
	cmdSN, expCmdSN, maxCmdSN, expStatSN uint32
}

// loginConn is one login's exchange of PDUs.
type loginConn struct {
	rd        *pduReader
	wr        *pduWriter
	cfg       *config
	addr      string // where we are, for messages
	initiator string
	isid      [6]byte
	tsih      uint16
	itt       uint32
	res       loginResult
}

// login logs in to cfg.target over rw (connected to addr) as initiator, with session identifier
// isid.
func login(rw io.ReadWriter, cfg *config, addr, initiator string, isid [6]byte) (*loginResult, error) {
	l := &loginConn{
		rd: newPDUReader(rw, loginMaxData), wr: &pduWriter{w: rw},
		cfg: cfg, addr: addr, initiator: initiator, isid: isid,
		res: loginResult{cmdSN: 1},
	}
	first := []pair{{"InitiatorName", initiator}, {"SessionType", "Normal"}, {"TargetName", cfg.target}}
	if cfg.target == "" {
		first = []pair{{"InitiatorName", initiator}, {"SessionType", "Discovery"}}
	}
	var err error
	if cfg.chap == nil {
		err = l.securityNone(first)
	} else {
		err = l.securityCHAP(first)
	}
	if err != nil {
		return nil, err
	}
	n := newNegotiation(cfg.headerDigest, cfg.dataDigest)
	if err := l.untilTransit(stageOperational, stageFullFeature, n.offers, n.apply); err != nil {
		return nil, err
	}
	if l.res.params, err = n.params(); err != nil {
		return nil, fmt.Errorf("login to %s: %w", l.peer(), err)
	}
	return &l.res, nil
}

// securityNone asks for no authentication.
func (l *loginConn) securityNone(first []pair) error {
	return l.untilTransit(stageSecurity, stageOperational, append(first, pair{"AuthMethod", "None"}),
		func(ps []pair) ([]pair, error) {
			if m := lookup(ps, "AuthMethod"); m != "" && m != "None" {
				return nil, l.needCredentials(m)
			}
			return l.securityReplies(ps), nil
		})
}

// peer names whom we log in to, for messages: a target, or a portal for discovery.
func (l *loginConn) peer() string {
	if l.cfg.target == "" {
		return "discovery portal " + l.addr
	}
	return "target " + l.cfg.target + " at " + l.addr
}

func (l *loginConn) needCredentials(method string) error {
	return fmt.Errorf("%w: %s asks for authentication (AuthMethod=%s); set %s and %s",
		ErrAuthFailed, l.peer(), truncate([]byte(method)), EnvUser, EnvPassword)
}

// securityCHAP authenticates with CHAP, and the target too where mutual CHAP is configured. CHAP
// only is offered: offering None as well would let anyone between us and the target skip it.
func (l *loginConn) securityCHAP(first []pair) error {
	target := l.cfg.target
	ps, transit, err := l.exchange(stageSecurity, stageOperational, false, append(first, pair{"AuthMethod", "CHAP"}))
	if err != nil {
		return err
	}
	if m := lookup(ps, "AuthMethod"); m != "CHAP" || transit {
		return fmt.Errorf("%w: %s answered AuthMethod=%s to CHAP", ErrAuthFailed, l.peer(), truncate([]byte(m)))
	}
	if ps, _, err = l.exchange(stageSecurity, stageOperational, false, []pair{{"CHAP_A", chapMD5}}); err != nil {
		return err
	}
	if a := lookup(ps, "CHAP_A"); a != chapMD5 {
		return fmt.Errorf("%w: %s answered CHAP_A=%s to CHAP_A=5 (MD5, the only algorithm offered)", ErrAuthFailed, l.peer(), truncate([]byte(a)))
	}
	answer, want, err := chapAnswer(toMap(ps), l.cfg.chap, l.cfg.targetCHAP)
	if err != nil {
		return err
	}
	verified := l.cfg.targetCHAP == nil
	err = l.untilTransit(stageSecurity, stageOperational, answer, func(ps []pair) ([]pair, error) {
		if !verified && lookup(ps, "CHAP_R") != "" {
			if err := checkTargetAnswer(toMap(ps), l.cfg.targetCHAP, want, target); err != nil {
				return nil, err
			}
			verified = true
		}
		return l.securityReplies(ps), nil
	})
	if err != nil {
		return err
	}
	if !verified {
		return fmt.Errorf("%w: %s ended the security stage without answering our mutual CHAP challenge", ErrAuthFailed, l.peer())
	}
	return nil
}

// securityReplies answers keys the target sends in the security stage: what it says about itself
// needs no answer, anything else is not understood.
func (l *loginConn) securityReplies(ps []pair) []pair {
	var replies []pair
	for _, p := range ps {
		switch {
		case isSpecial(p.value), strings.HasPrefix(p.key, "CHAP_"), p.key == "AuthMethod":
		case keySpecs[p.key].kind == kindDeclare && p.key != "MaxRecvDataSegmentLength":
		default:
			replies = append(replies, pair{p.key, "NotUnderstood"})
		}
	}
	return replies
}

// untilTransit sends keys with the transit bit and, while the target does not move on, what
// handle answers to each response; handle also sees the response that moves on.
func (l *loginConn) untilTransit(csg, nsg byte, keys []pair, handle func([]pair) ([]pair, error)) error {
	for range maxLoginRounds {
		ps, transit, err := l.exchange(csg, nsg, true, keys)
		if err != nil {
			return err
		}
		if keys, err = handle(ps); err != nil {
			return fmt.Errorf("login to %s: %w", l.peer(), err)
		}
		if transit {
			return nil
		}
	}
	return fmt.Errorf("%w: %s did not leave login stage %d after %d requests", ErrProtocol, l.peer(), csg, maxLoginRounds)
}

// exchange sends one Login Request with keys, and returns the target's keys (gathered from as many
// responses as it continues over) and whether it moved to stage nsg.
func (l *loginConn) exchange(csg, nsg byte, transit bool, keys []pair) ([]pair, bool, error) {
	data := appendText(nil, keys...)
	if len(data) > loginMaxData {
		return nil, false, fmt.Errorf("iscsi: login keys of %d bytes exceed %d", len(data), loginMaxData)
	}
	var text []byte
	for {
		var h bhs
		h.setOpcode(opLoginReq, true)
		h[1] = csg<<2 | nsg
		if transit {
			h[1] |= flagTransit
		}
		copy(h[8:14], l.isid[:])
		binary.BigEndian.PutUint16(h[14:], l.tsih)
		l.itt++
		h.setITT(l.itt)
		h.setCmdSN(l.res.cmdSN)
		h.setExpStatSN(l.res.expStatSN)
		if err := l.wr.write(&h, data); err != nil {
			return nil, false, fmt.Errorf("iscsi: login to %s: %w", l.addr, err)
		}
		r, err := l.rd.next()
		if err != nil {
			return nil, false, fmt.Errorf("iscsi: login to %s: %w", l.addr, err)
		}
		resp := *r
		d, err := l.rd.readData()
		if err != nil {
			return nil, false, fmt.Errorf("iscsi: login to %s: %w", l.addr, err)
		}
		switch {
		case resp.opcode() == opReject && len(d) > 0:
			return nil, false, fmt.Errorf("%w: %s rejected our login request (reason %#02x)", ErrProtocol, l.peer(), resp[2])
		case resp.opcode() != opLoginResp:
			return nil, false, fmt.Errorf("%w: %s during login to %s", ErrProtocol, &resp, l.addr)
		case resp[36] != 0:
			return nil, false, l.statusError(resp[36], resp[37], d)
		case resp.itt() != l.itt:
			return nil, false, fmt.Errorf("%w: login response for ITT %#x, sent %#x", ErrProtocol, resp.itt(), l.itt)
		case resp[3] != 0:
			return nil, false, fmt.Errorf("%w: target %s speaks iSCSI version %d, not 0", ErrProtocol, l.addr, resp[3])
		case resp[1]>>2&3 != csg:
			return nil, false, fmt.Errorf("%w: login response in stage %d to a request in stage %d", ErrProtocol, resp[1]>>2&3, csg)
		}
		l.res.expStatSN = resp.statSN() + 1
		l.res.expCmdSN, l.res.maxCmdSN = resp.expCmdSN(), resp.maxCmdSN()
		if len(text)+len(d) > maxTextLen {
			return nil, false, fmt.Errorf("%w: login text over %d bytes", ErrProtocol, maxTextLen)
		}
		text = append(text, d...)
		if resp.flags()&flagContinue != 0 {
			data, transit = nil, false // ask for the rest
			continue
		}
		ps, err := parseText(text)
		if err != nil {
			return nil, false, err
		}
		moved := resp.flags()&flagTransit != 0
		if moved && resp[1]&3 != nsg {
			return nil, false, fmt.Errorf("%w: target moved to login stage %d, we asked for %d", ErrProtocol, resp[1]&3, nsg)
		}
		if moved {
			l.tsih = binary.BigEndian.Uint16(resp[14:])
		}
		return ps, moved, nil
	}
}

// statusError explains a Login Response's failure (RFC 7143 section 11.13.5).
func (l *loginConn) statusError(class, detail byte, data []byte) error {
	target, addr := l.cfg.target, l.addr
	if class == 1 {
		ps, _ := parseText(data)
		if a := lookup(ps, "TargetAddress"); a != "" {
			if to, err := parseTargetAddress(a); err == nil {
				return &redirectError{to}
			}
		}
		return fmt.Errorf("%w: %s redirects the login without a usable TargetAddress", ErrProtocol, l.peer())
	}
	code := uint16(class)<<8 | uint16(detail)
	switch code {
	case 0x0201:
		if l.cfg.chap == nil {
			return l.needCredentials("CHAP")
		}
		return fmt.Errorf("%w: %s refused CHAP user %q: wrong secret, or not an account of this target", ErrAuthFailed, l.peer(), l.cfg.chap.user)
	case 0x0202:
		return fmt.Errorf("%w: %s does not let initiator %s in (authorization failure: check its ACL)", ErrAuthFailed, l.peer(), l.initiator)
	case 0x0203:
		return fmt.Errorf("iscsi: login to %s: target %s not found (check the IQN in the URL)", addr, target)
	}
	why, ok := map[uint16]string{
		0x0200: "initiator error", 0x0204: "target removed", 0x0205: "unsupported iSCSI version",
		0x0206: "too many connections", 0x0207: "missing parameter", 0x0208: "cannot include in session",
		0x0209: "session type not supported", 0x020a: "session does not exist", 0x020b: "invalid request during login",
		0x0300: "target error", 0x0301: "service unavailable", 0x0302: "out of resources",
	}[code]
	if !ok {
		why = "unknown status"
	}
	return fmt.Errorf("iscsi: login to %s failed: %s (status class %d, detail %#02x)", l.peer(), why, class, detail)
}

// parseTargetAddress turns a TargetAddress value (HOST[:PORT][,TPGT], an IPv6 host in brackets)
// into HOST:PORT.
func parseTargetAddress(v string) (string, error) {
	if i := strings.LastIndexByte(v, ','); i > strings.LastIndexByte(v, ']') {
		v = v[:i]
	}
	if strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") || !strings.Contains(v, ":") {
		v = net.JoinHostPort(strings.Trim(v, "[]"), strconv.Itoa(DefaultPort))
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" {
		return "", fmt.Errorf("TargetAddress %q is not HOST[:PORT]", v)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("TargetAddress %q has no valid port", v)
	}
	return net.JoinHostPort(host, port), nil
}

func lookup(ps []pair, key string) string {
	for _, p := range ps {
		if p.key == key {
			return p.value
		}
	}
	return ""
}

func toMap(ps []pair) map[string]string {
	m := make(map[string]string, len(ps))
	for _, p := range ps {
		m[p.key] = p.value
	}
	return m
}
