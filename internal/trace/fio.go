package trace

import (
	"bytes"
	"errors"
	"fmt"
)

// fio iolog headers: the first line of a version 2 or 3 log.
const (
	fioV2Header = "fio version 2 iolog"
	fioV3Header = "fio version 3 iolog"
)

// fioParser reads fio's iolog (fio's HOWTO, "Trace file format"): after the header line, either
// "FILENAME ACTION" (add, open, close: no request) or "FILENAME ACTION OFFSET LENGTH" (read,
// write, trim, sync, datasync; v2 also wait, which is no request either), each prefixed in
// version 3 with a timestamp (the time since the start of the run, which fio writes in
// microseconds). Time is that timestamp (0 in v2), ID the offset in bytes, Volume numbers the
// file names in order of appearance; trim, sync and datasync are OpOther.
type fioParser struct {
	version int
	vols    *volumes
}

func newFioParser() *fioParser { return &fioParser{vols: newVolumes(nil)} }

func (p *fioParser) parseLine(line []byte, r *Request) (bool, error) {
	if p.version == 0 {
		switch {
		case bytes.HasPrefix(line, []byte(fioV2Header)):
			p.version = 2
		case bytes.HasPrefix(line, []byte(fioV3Header)):
			p.version = 3
		default:
			return false, fmt.Errorf("first line %q is not %q or %q", clip(line), fioV2Header, fioV3Header)
		}
		return false, nil
	}
	if isBlank(line) {
		return false, nil
	}
	var f, rest []byte
	rest = line
	var ts int64
	if p.version == 3 {
		f, rest = wsField(rest)
		var err error
		if ts, err = parseInt63(f, "timestamp"); err != nil {
			return false, err
		}
	}
	name, rest := wsField(rest)
	act, rest := wsField(rest)
	if len(act) == 0 {
		return false, errors.New("want FILENAME ACTION [OFFSET LENGTH]")
	}
	offField, rest := wsField(rest)
	lenField, rest := wsField(rest)
	if extra, _ := wsField(rest); len(extra) != 0 {
		return false, fmt.Errorf("unexpected field %q after the length", clip(extra))
	}
	var op Op
	switch string(act) {
	case "add", "open", "close":
		if len(offField) != 0 {
			return false, fmt.Errorf("file action %s takes no offset", act)
		}
		p.vols.id(name)
		return false, nil
	case "wait":
		if p.version == 3 {
			return false, errors.New("wait is not allowed in a version 3 iolog")
		}
		return false, nil
	case "read":
		op = OpRead
	case "write":
		op = OpWrite
	case "trim", "sync", "datasync":
		op = OpOther
	default:
		return false, fmt.Errorf("unknown action %q (want add, open, close, read, write, trim, sync, datasync)", clip(act))
	}
	off, err := parseInt63(offField, "offset")
	if err != nil {
		return false, err
	}
	length, err := parseInt63(lenField, "length")
	if err != nil {
		return false, err
	}
	*r = Request{Time: ts, ID: uint64(off), Offset: off, Length: length, Op: op, Volume: p.vols.id(name)}
	return true, nil
}
