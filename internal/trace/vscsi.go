package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// vscsi traces (VMware's vscsiStats, as the CloudPhysics traces and libCacheSim ship them) are
// little-endian fixed-size records in one of two layouts, told apart by a version byte:
//
//	v1, 32 bytes: u32 sn, u32 len, u32 nSG, u16 cmd, u16 ver, u64 lbn, u64 ts
//	v2, 40 bytes: u16 cmd, u16 ver, u32 sn, u32 len, u32 nSG, u64 lbn, u64 ts, u64 rt
//
// where the version is ver>>8, cmd is the SCSI opcode, len the length in bytes, lbn the first
// 512-byte sector and ts a time in microseconds.
const (
	vscsiV1Size = 32
	vscsiV2Size = 40
)

// vscsiVersion returns the version a record claims at the layout of version v (0 if b is short).
func vscsiVersion(b []byte, v int) int {
	switch {
	case v == 1 && len(b) >= vscsiV1Size:
		return int(binary.LittleEndian.Uint16(b[14:]) >> 8)
	case v == 2 && len(b) >= vscsiV2Size:
		return int(binary.LittleEndian.Uint16(b[2:]) >> 8)
	}
	return 0
}

// vscsiLayout returns the version whose layout the first records of b consistently claim (up to
// max records, at least min), checking the fields that a foreign file would get wrong: the
// command is a one-byte SCSI opcode and the start sector leaves room for the byte offset.
func vscsiLayout(b []byte, min, max int) int {
	for _, v := range []int{2, 1} {
		size := vscsiV1Size
		if v == 2 {
			size = vscsiV2Size
		}
		n := 0
		for n < max && len(b) >= (n+1)*size {
			rec := b[n*size : (n+1)*size]
			if vscsiVersion(rec, v) != v {
				break
			}
			if f := decodeVscsi(rec, v); f.cmd > 0xff || f.lbn >= maxSector {
				break
			}
			n++
		}
		if n >= min && (n == max || len(b) < (n+1)*size) {
			return v
		}
	}
	return 0
}

// looksVscsi is auto-detection's test: like libCacheSim, two records at least must agree.
func looksVscsi(head []byte) bool { return vscsiLayout(head, 2, 16) != 0 }

type vscsiFields struct {
	cmd     uint16
	length  uint32
	lbn, ts uint64
}

func decodeVscsi(b []byte, v int) vscsiFields {
	le := binary.LittleEndian
	if v == 1 {
		return vscsiFields{cmd: le.Uint16(b[12:]), length: le.Uint32(b[4:]), lbn: le.Uint64(b[16:]), ts: le.Uint64(b[24:])}
	}
	return vscsiFields{cmd: le.Uint16(b[0:]), length: le.Uint32(b[8:]), lbn: le.Uint64(b[16:]), ts: le.Uint64(b[24:])}
}

type vscsiReader struct {
	in      *input
	version int
	size    int
	n       int64
}

func newVscsiReader(in *input) (Reader, error) {
	head, err := in.br.Peek(vscsiV2Size)
	if err != nil && err != io.EOF {
		return nil, &Error{File: in.name, Format: "vscsi", Err: err}
	}
	v := vscsiLayout(head, 1, 1) // later records are checked one by one, with their number
	if v == 0 {
		if len(head) == 0 {
			return nil, &Error{File: in.name, Format: "vscsi", Err: errors.New("empty file")}
		}
		return nil, &Error{File: in.name, Format: "vscsi", Record: 1,
			Err: errors.New("no vscsi v1 or v2 version byte (ver>>8 must be 1 or 2) in the first records")}
	}
	size := vscsiV1Size
	if v == 2 {
		size = vscsiV2Size
	}
	return &vscsiReader{in: in, version: v, size: size}, nil
}

// Next decodes one record. Time is ts in microseconds, ID the lbn (libCacheSim's key), the
// byte range lbn*512 plus len.
func (r *vscsiReader) Next() (Request, error) {
	b, err := readRecord(r.in.br, r.size)
	if err != nil {
		if err == io.EOF {
			return Request{}, err
		}
		return Request{}, r.fail(r.n+1, err)
	}
	r.n++
	if got := vscsiVersion(b, r.version); got != r.version {
		return Request{}, r.fail(r.n, fmt.Errorf("version %d in a v%d trace (corrupt or not vscsi)", got, r.version))
	}
	f := decodeVscsi(b, r.version)
	if f.lbn >= maxSector {
		return Request{}, r.fail(r.n, fmt.Errorf("lbn %d is out of range", f.lbn))
	}
	return Request{
		Time:   int64(f.ts & (1<<63 - 1)),
		ID:     f.lbn,
		Offset: int64(f.lbn) * 512,
		Length: int64(f.length),
		Op:     scsiOp(uint64(f.cmd)),
	}, nil
}

func (r *vscsiReader) fail(rec int64, err error) error {
	return &Error{File: r.in.name, Format: "vscsi", Record: rec, Err: err}
}

func (r *vscsiReader) Close() error { return r.in.Close() }
