package iscsi

import (
	"fmt"
	"strconv"
	"strings"
)

// Negotiation of the operational keys (RFC 7143 sections 6.2 and 13). We offer every key we care
// about; the target answers each, and may offer keys of its own, which we answer in the next PDU.

// What we offer. The data segment and burst lengths are what one command of ours can use whole;
// larger values would only cost memory.
const (
	ourMaxRecvData = 256 << 10 // the largest data segment the target may send us
	ourMaxBurst    = 1 << 20
	ourFirstBurst  = 256 << 10
	// loginMaxData is the MaxRecvDataSegmentLength both sides assume during login.
	loginMaxData = 8192
)

type keyKind int

const (
	kindList    keyKind = iota // the target picks the first of our values it supports
	kindMin                    // numeric, the smaller wins
	kindMax                    // numeric, the larger wins
	kindOr                     // Yes if either says Yes
	kindAnd                    // Yes only if both say Yes
	kindDeclare                // each side states its own; no answer
)

// keySpec is how one key is negotiated, its RFC 7143 default and the range of a numeric one.
type keySpec struct {
	kind   keyKind
	def    string
	lo, hi uint64
}

var keySpecs = map[string]keySpec{
	"HeaderDigest":             {kind: kindList, def: "None"},
	"DataDigest":               {kind: kindList, def: "None"},
	"MaxConnections":           {kind: kindMin, def: "1", lo: 1, hi: 65535},
	"InitialR2T":               {kind: kindOr, def: "Yes"},
	"ImmediateData":            {kind: kindAnd, def: "Yes"},
	"MaxRecvDataSegmentLength": {kind: kindDeclare, def: "8192", lo: 512, hi: maxDataLen},
	"MaxBurstLength":           {kind: kindMin, def: "262144", lo: 512, hi: maxDataLen},
	"FirstBurstLength":         {kind: kindMin, def: "65536", lo: 512, hi: maxDataLen},
	"DefaultTime2Wait":         {kind: kindMax, def: "2", lo: 0, hi: 3600},
	"DefaultTime2Retain":       {kind: kindMin, def: "20", lo: 0, hi: 3600},
	"MaxOutstandingR2T":        {kind: kindMin, def: "1", lo: 1, hi: 65535},
	"DataPDUInOrder":           {kind: kindOr, def: "Yes"},
	"DataSequenceInOrder":      {kind: kindOr, def: "Yes"},
	"ErrorRecoveryLevel":       {kind: kindMin, def: "0", lo: 0, hi: 2},
	// What the target says about itself.
	"TargetAlias":          {kind: kindDeclare},
	"TargetPortalGroupTag": {kind: kindDeclare},
	"TargetAddress":        {kind: kindDeclare},
}

// params are a session's operational parameters once negotiated.
type params struct {
	headerDigest, dataDigest bool
	maxRecvData              int // the largest data segment the target may send us
	maxSendData              int // the largest we may send (the target's MaxRecvDataSegmentLength)
	maxBurst                 int // the most data one R2T may ask for (and our cap on a command)
	firstBurst               int // the most unsolicited data per command
	initialR2T               bool
	immediateData            bool
	maxOutstandingR2T        int
}

// negotiation is the state of the operational stage.
type negotiation struct {
	offers  []pair            // what we send first, in order
	ours    map[string]string // our value of each key
	results map[string]string // the outcome, key by key
}

func newNegotiation(headerDigest, dataDigest bool) *negotiation {
	digest := func(on bool) string {
		if on {
			return "CRC32C" // asked for, so not "CRC32C,None": a silent None would defeat the ask
		}
		return "None"
	}
	offers := []pair{
		{"HeaderDigest", digest(headerDigest)},
		{"DataDigest", digest(dataDigest)},
		{"MaxConnections", "1"},
		{"InitialR2T", "No"},
		{"ImmediateData", "Yes"},
		{"MaxRecvDataSegmentLength", strconv.Itoa(ourMaxRecvData)},
		{"MaxBurstLength", strconv.Itoa(ourMaxBurst)},
		{"FirstBurstLength", strconv.Itoa(ourFirstBurst)},
		{"DefaultTime2Wait", "2"},
		{"DefaultTime2Retain", "0"}, // error recovery level 0 keeps no task for a new connection
		{"MaxOutstandingR2T", "1"},
		{"DataPDUInOrder", "Yes"},
		{"DataSequenceInOrder", "Yes"},
		{"ErrorRecoveryLevel", "0"},
	}
	n := &negotiation{offers: offers, ours: map[string]string{}, results: map[string]string{}}
	for _, p := range offers {
		n.ours[p.key] = p.value
	}
	return n
}

// isSpecial reports the answers that say a key was not negotiated.
func isSpecial(v string) bool {
	return v == "Reject" || v == "Irrelevant" || v == "NotUnderstood"
}

// apply takes the target's keys of one Login Response and returns what we must answer: its offers
// of keys we did not offer, and NotUnderstood for keys we do not know.
func (n *negotiation) apply(ps []pair) ([]pair, error) {
	var replies []pair
	for _, p := range ps {
		spec, known := keySpecs[p.key]
		if !known {
			if !isSpecial(p.value) {
				replies = append(replies, pair{p.key, "NotUnderstood"})
			}
			continue
		}
		ours, offered := n.ours[p.key]
		if isSpecial(p.value) {
			if offered {
				n.results[p.key] = spec.def
			}
			continue
		}
		if spec.kind == kindDeclare {
			if spec.hi > 0 {
				if err := checkNumber(spec, p); err != nil {
					return nil, err
				}
			}
			n.results[p.key] = p.value
			continue
		}
		if !offered {
			ours = spec.def // the target offers a key we left at its default
		}
		v, err := combine(spec, p, ours, offered)
		if err != nil {
			return nil, err
		}
		n.results[p.key] = v
		if !offered {
			replies = append(replies, pair{p.key, v})
		}
	}
	return replies, nil
}

// combine computes a key's outcome from our value and the target's. With offered, the target's
// value is its answer, which must be a possible outcome.
func combine(spec keySpec, p pair, ours string, offered bool) (string, error) {
	switch spec.kind {
	case kindList:
		theirs := strings.Split(p.value, ",")
		for _, o := range strings.Split(ours, ",") {
			for _, t := range theirs {
				if strings.EqualFold(o, t) {
					return o, nil
				}
			}
		}
		if offered {
			return "", fmt.Errorf("%w: the target answered %s=%s to our %s", ErrProtocol, p.key, truncate([]byte(p.value)), ours)
		}
		return "Reject", nil
	case kindOr, kindAnd:
		if p.value != "Yes" && p.value != "No" {
			return "", fmt.Errorf("%w: %s=%s is neither Yes nor No", ErrProtocol, p.key, truncate([]byte(p.value)))
		}
		yes := ours == "Yes" || p.value == "Yes"
		if spec.kind == kindAnd {
			yes = ours == "Yes" && p.value == "Yes"
		}
		if yes {
			return "Yes", nil
		}
		return "No", nil
	}
	if err := checkNumber(spec, p); err != nil {
		return "", err
	}
	a, _ := strconv.ParseUint(ours, 10, 32)
	b, _ := parseNumber(p.value)
	if spec.kind == kindMin {
		return strconv.FormatUint(min(a, b), 10), nil
	}
	return strconv.FormatUint(max(a, b), 10), nil
}

// parseNumber reads a numerical value: decimal, or hex after 0x.
func parseNumber(v string) (uint64, error) {
	if h, ok := strings.CutPrefix(strings.ToLower(v), "0x"); ok {
		return strconv.ParseUint(h, 16, 32)
	}
	return strconv.ParseUint(v, 10, 32)
}

func checkNumber(spec keySpec, p pair) error {
	n, err := parseNumber(p.value)
	if err != nil || n < spec.lo || n > spec.hi {
		return fmt.Errorf("%w: %s=%s is not a number from %d to %d", ErrProtocol, p.key, truncate([]byte(p.value)), spec.lo, spec.hi)
	}
	return nil
}

// params turns the outcome into a session's parameters, with RFC 7143's default for each key the
// target did not answer, and checks what we asked for.
func (n *negotiation) params() (params, error) {
	get := func(k string) string {
		if v, ok := n.results[k]; ok {
			return v
		}
		return keySpecs[k].def
	}
	num := func(k string) int { v, _ := parseNumber(get(k)); return int(v) } // checked by apply
	p := params{
		headerDigest:      get("HeaderDigest") == "CRC32C",
		dataDigest:        get("DataDigest") == "CRC32C",
		maxRecvData:       ourMaxRecvData,
		maxSendData:       num("MaxRecvDataSegmentLength"),
		maxBurst:          num("MaxBurstLength"),
		firstBurst:        num("FirstBurstLength"),
		initialR2T:        get("InitialR2T") == "Yes",
		immediateData:     get("ImmediateData") == "Yes",
		maxOutstandingR2T: num("MaxOutstandingR2T"),
	}
	for _, d := range []struct {
		key       string
		asked, on bool
	}{{"HeaderDigest", n.ours["HeaderDigest"] == "CRC32C", p.headerDigest}, {"DataDigest", n.ours["DataDigest"] == "CRC32C", p.dataDigest}} {
		if d.asked != d.on {
			return params{}, fmt.Errorf("%w: the target did not agree to %s=%s (the outcome is %s)", ErrProtocol, d.key, n.ours[d.key], get(d.key))
		}
	}
	if e := get("ErrorRecoveryLevel"); e != "0" {
		return params{}, fmt.Errorf("%w: ErrorRecoveryLevel=%s, we offered 0", ErrProtocol, e)
	}
	if p.firstBurst > p.maxBurst {
		return params{}, fmt.Errorf("%w: FirstBurstLength %d exceeds MaxBurstLength %d", ErrProtocol, p.firstBurst, p.maxBurst)
	}
	return p, nil
}
