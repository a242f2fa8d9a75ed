package trace

import "errors"

// arcParser reads the ARC paper's traces (Megiddo and Modha, FAST'03): one request a line,
// "start count ignored reqno", touching the count 512-byte pages start .. start+count-1.
// ID is start (one key per request); Time is reqno.
type arcParser struct{}

func (arcParser) parseLine(line []byte, r *Request) (bool, error) {
	if isBlank(line) {
		return false, nil
	}
	f, rest := wsField(line)
	start, err := parseUint(f, "start page")
	if err != nil {
		return false, err
	}
	f, rest = wsField(rest)
	count, err := parseUint(f, "page count")
	if err != nil {
		return false, err
	}
	f, rest = wsField(rest)
	if _, err := parseUint(f, "third field"); err != nil {
		return false, err
	}
	f, rest = wsField(rest)
	reqno, err := parseInt63(f, "request number")
	if err != nil {
		return false, err
	}
	if f, _ = wsField(rest); len(f) != 0 {
		return false, errors.New("more than 4 fields (want: start count ignored reqno)")
	}
	off, length, err := sectorRange(start, count, 512, "pages")
	if err != nil {
		return false, err
	}
	*r = Request{Time: reqno, ID: start, Offset: off, Length: length, Op: OpRead}
	return true, nil
}
