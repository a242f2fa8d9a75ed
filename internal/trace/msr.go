package trace

import (
	"errors"
	"fmt"
	"strings"
)

// msrParser reads the MSR Cambridge traces (SNIA IOTTA): CSV lines
// "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime" with a Windows filetime
// timestamp (100 ns units), Type Read or Write, Offset and Size in bytes. Each (Hostname,
// DiskNumber) pair is a volume, named "host_disk" as the trace files are (wdev_0, src1_2).
type msrParser struct {
	vols *volumes
	key  []byte // reused: "host,disk"
}

func newMSRParser() *msrParser {
	return &msrParser{vols: newVolumes(func(k string) string { return strings.Replace(k, ",", "_", 1) })}
}

func (p *msrParser) parseLine(line []byte, r *Request) (bool, error) {
	if isBlank(line) {
		return false, nil
	}
	var fields [7][]byte
	rest := line
	n := 0
	for more := true; more; n++ {
		if n == len(fields) {
			return false, errors.New("more than 7 fields (want Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime)")
		}
		fields[n], rest, more = sepField(rest, ',')
	}
	if n != len(fields) {
		return false, fmt.Errorf("%d fields, want 7 (Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime)", n)
	}
	ts, err := parseInt63(fields[0], "timestamp")
	if err != nil {
		return false, err
	}
	if len(fields[1]) == 0 {
		return false, errors.New("empty hostname")
	}
	if _, err := parseUint(fields[2], "disk number"); err != nil {
		return false, err
	}
	var op Op
	switch {
	case foldEq(fields[3], "read"):
		op = OpRead
	case foldEq(fields[3], "write"):
		op = OpWrite
	default:
		return false, fmt.Errorf("type %q is neither Read nor Write", clip(fields[3]))
	}
	off, err := parseInt63(fields[4], "offset")
	if err != nil {
		return false, err
	}
	size, err := parseInt63(fields[5], "size")
	if err != nil {
		return false, err
	}
	if _, err := parseUint(fields[6], "response time"); err != nil {
		return false, err
	}
	p.key = append(append(append(p.key[:0], fields[1]...), ','), fields[2]...)
	*r = Request{Time: ts, ID: uint64(off), Offset: off, Length: size, Op: op, Volume: p.vols.id(p.key)}
	return true, nil
}
