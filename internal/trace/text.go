package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
)

// lineParser turns one line of a text trace into a request. It reports false for lines that
// carry no request (headers, file actions, other blktrace events). The line is only valid during
// the call: parsers must not keep it.
type lineParser interface {
	parseLine(line []byte, r *Request) (bool, error)
}

// textReader drives a lineParser over a stream, one line at a time, without allocating per line:
// lines are slices of the bufio.Reader's buffer.
type textReader struct {
	in     *input
	format string
	p      lineParser
	line   int64
	req    Request
}

func (t *textReader) Next() (Request, error) {
	for {
		line, err := t.in.br.ReadSlice('\n')
		switch {
		case err == nil:
		case errors.Is(err, bufio.ErrBufferFull):
			return Request{}, t.fail(t.line+1, fmt.Errorf("line longer than %d bytes", t.in.br.Size()))
		case err == io.EOF && len(line) > 0:
			// The last line has no newline: still a line.
		case err == io.EOF:
			return Request{}, io.EOF
		default:
			return Request{}, t.fail(t.line+1, err)
		}
		t.line++
		line = trimEOL(line)
		// t.req, not a local: a pointer passed through the interface would escape to the heap.
		ok, err := t.p.parseLine(line, &t.req)
		if err != nil {
			return Request{}, t.fail(t.line, err)
		}
		if ok {
			return t.req, nil
		}
	}
}

func (t *textReader) fail(line int64, err error) error {
	return &Error{File: t.in.name, Format: t.format, Record: line, Line: true, Err: err}
}

func (t *textReader) Close() error { return t.in.Close() }

// volumeTextReader is a textReader whose parser numbers volumes; it exposes their names.
type volumeTextReader struct {
	*textReader
	vols *volumes
}

func (v volumeTextReader) VolumeName(id uint32) string { return v.vols.name(id) }

func trimEOL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func isBlank(b []byte) bool { return len(bytes.TrimSpace(b)) == 0 }

func isSpace(c byte) bool { return c == ' ' || c == '\t' }

// wsField splits off the first whitespace-separated field of b.
func wsField(b []byte) (field, rest []byte) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isSpace(b[j]) {
		j++
	}
	return b[i:j], b[j:]
}

// sepField splits off the first sep-separated field of b, trimmed of spaces; more is false when
// b held no separator (the field was the last one).
func sepField(b []byte, sep byte) (field, rest []byte, more bool) {
	i := bytes.IndexByte(b, sep)
	if i < 0 {
		return trimSpace(b), nil, false
	}
	return trimSpace(b[:i]), b[i+1:], true
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// parseUint parses a decimal number without allocating; the error quotes the field.
func parseUint(b []byte, what string) (uint64, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("missing %s", what)
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%s %q is not a decimal number", what, clip(b))
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, fmt.Errorf("%s %q is too large", what, clip(b))
		}
		n = n*10 + d
	}
	return n, nil
}

// parseInt63 parses a non-negative decimal number that fits an int64.
func parseInt63(b []byte, what string) (int64, error) {
	n, err := parseUint(b, what)
	if err != nil {
		return 0, err
	}
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("%s %q is too large", what, clip(b))
	}
	return int64(n), nil
}

// parseInt parses a decimal number with an optional sign.
func parseInt(b []byte, what string) (int64, error) {
	neg := len(b) > 0 && b[0] == '-'
	if neg || len(b) > 0 && b[0] == '+' {
		b = b[1:]
	}
	n, err := parseUint(b, what)
	if err != nil {
		return 0, err
	}
	if neg {
		if n > 1<<63 {
			return 0, fmt.Errorf("%s -%q is too small", what, clip(b))
		}
		return -int64(n), nil
	}
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("%s %q is too large", what, clip(b))
	}
	return int64(n), nil
}

// maxSector is the largest sector (or page) number whose byte offset fits an int64 with room for
// a request after it; a larger one is garbage, not a disk.
const maxSector = 1 << 54

// sectorRange converts a range in units of unit bytes to a byte range, refusing ranges whose
// byte offsets would not fit an int64.
func sectorRange(start, count uint64, unit int64, what string) (off, length int64, err error) {
	limit := uint64(math.MaxInt64 / unit / 2)
	if start > limit || count > limit {
		return 0, 0, fmt.Errorf("%s %d + %d is out of range", what, start, count)
	}
	return int64(start) * unit, int64(count) * unit, nil
}

// clip shortens a field quoted in an error message, so a binary line does not flood the terminal.
func clip(b []byte) string {
	const max = 40
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}

// foldEq reports whether b equals the lower-case ASCII word w, ignoring case.
func foldEq(b []byte, w string) bool {
	if len(b) != len(w) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != w[i] {
			return false
		}
	}
	return true
}
