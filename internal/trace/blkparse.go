package trace

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// blkparseParser reads blkparse's default text output, one event a line:
//
//	8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kworker/u8:2]
//	dev   cpu  sequence   seconds       pid act RWBS sector + sectors [process]
//
// A request appears several times (Q queued, G get request, I inserted, D issued to the device,
// C completed, M/F merged ...); the reader keeps one action, Q by default, because every bio
// is queued exactly once, before merging and splitting, so the trace keeps the workload's own
// requests in the order the application issued them. Time is in nanoseconds; the op comes from
// the RWBS field (D discard -> OpOther, else W write, R read; a flush with no sector range ->
// OpOther, length 0); the byte range is sector*512 plus sectors*512; Volume numbers the devices
// (major,minor) in order of appearance. The per-CPU summary blkparse prints at the end
// ("CPU0 (8,0):" ...) ends the events.
type blkparseParser struct {
	action  string
	vols    *volumes
	summary bool
}

// blkparseActions are the actions whose events carry a sector range.
const blkparseActions = "QGIDCMFABX"

func newBlkparseParser(action string) (*blkparseParser, error) {
	if action == "" {
		action = "Q"
	}
	if len(action) != 1 || !strings.Contains(blkparseActions, action) {
		return nil, fmt.Errorf("action %q: want one of the letters %s (blkparse:D keeps the events issued to the device)", action, blkparseActions)
	}
	return &blkparseParser{action: action, vols: newVolumes(nil)}, nil
}

// mustBlkparse is the default parser, for detection.
func mustBlkparse() *blkparseParser {
	p, _ := newBlkparseParser("")
	return p
}

var errNotBlkparse = errors.New("not a blkparse event line (want: dev cpu sequence time pid action RWBS ...)")

func (p *blkparseParser) parseLine(line []byte, r *Request) (bool, error) {
	if p.summary || isBlank(line) {
		return false, nil
	}
	dev, rest := wsField(line)
	if bytes.HasPrefix(dev, []byte("CPU")) || bytes.Equal(dev, []byte("Total")) {
		p.summary = true
		return false, nil
	}
	major, minor, ok := bytes.Cut(dev, []byte{','})
	if !ok || !isDigits(major) || !isDigits(minor) {
		return false, errNotBlkparse
	}
	var f []byte
	for range 2 { // cpu, sequence
		if f, rest = wsField(rest); !isDigits(f) {
			return false, errNotBlkparse
		}
	}
	timeField, rest := wsField(rest)
	if f, rest = wsField(rest); !isDigits(f) {
		return false, errNotBlkparse
	}
	act, rest := wsField(rest)
	rwbs, rest := wsField(rest)
	if !isLetters(act) || !isLetters(rwbs) {
		return false, errNotBlkparse
	}
	if string(act) != p.action {
		return false, nil // its time is not parsed: most lines are other actions
	}
	ns, err := parseSeconds(timeField)
	if err != nil {
		return false, err
	}
	op := OpOther
	switch {
	case bytes.IndexByte(rwbs, 'D') >= 0:
	case bytes.IndexByte(rwbs, 'W') >= 0:
		op = OpWrite
	case bytes.IndexByte(rwbs, 'R') >= 0:
		op = OpRead
	}
	*r = Request{Time: ns, Op: op, Volume: p.vols.id(dev)}
	f, rest = wsField(rest)
	if !isDigits(f) { // no range: a flush, or a message
		r.Op = OpOther
		return true, nil
	}
	sector, err := parseUint(f, "sector")
	if err != nil {
		return false, err
	}
	if f, rest = wsField(rest); string(f) != "+" {
		return false, fmt.Errorf("want \"+ sectors\" after sector %d", sector)
	}
	f, _ = wsField(rest)
	count, err := parseUint(f, "sector count")
	if err != nil {
		return false, err
	}
	if r.Offset, r.Length, err = sectorRange(sector, count, 512, "sectors"); err != nil {
		return false, err
	}
	r.ID = uint64(r.Offset)
	return true, nil
}

// parseSeconds parses blkparse's "seconds.nanoseconds" time into nanoseconds.
func parseSeconds(b []byte) (int64, error) {
	sec, frac, _ := bytes.Cut(b, []byte{'.'})
	if len(frac) > 9 || !isDigits(sec) || len(frac) > 0 && !isDigits(frac) {
		return 0, fmt.Errorf("time %q is not seconds.nanoseconds", clip(b))
	}
	s, err := parseInt63(sec, "seconds")
	if err != nil || s > (1<<62)/1_000_000_000 {
		return 0, fmt.Errorf("time %q is out of range", clip(b))
	}
	var ns int64
	for i := range 9 {
		ns *= 10
		if i < len(frac) {
			ns += int64(frac[i] - '0')
		}
	}
	return s*1e9 + ns, nil
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

func isLetters(b []byte) bool {
	for _, c := range b {
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return len(b) > 0
}
