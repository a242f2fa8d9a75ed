package iscsi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/tierblk/tierblk/internal/crc32c"
)

// PDU opcodes (RFC 7143 section 11.1.1). The target's have 0x20 set.
const (
	opNOPOut       = 0x00
	opSCSICmd      = 0x01
	opTaskMgmt     = 0x02
	opLoginReq     = 0x03
	opTextReq      = 0x04
	opDataOut      = 0x05
	opLogoutReq    = 0x06
	opSNACK        = 0x10
	opNOPIn        = 0x20
	opSCSIResp     = 0x21
	opTaskMgmtResp = 0x22
	opLoginResp    = 0x23
	opTextResp     = 0x24
	opDataIn       = 0x25
	opLogoutResp   = 0x26
	opR2T          = 0x31
	opAsync        = 0x32
	opReject       = 0x3f
)

// opNames names the opcodes in messages about PDUs that should not have come.
var opNames = map[byte]string{
	opNOPOut: "NOP-Out", opSCSICmd: "SCSI Command", opTaskMgmt: "Task Management Request",
	opLoginReq: "Login Request", opTextReq: "Text Request", opDataOut: "SCSI Data-Out",
	opLogoutReq: "Logout Request", opSNACK: "SNACK Request", opNOPIn: "NOP-In",
	opSCSIResp: "SCSI Response", opTaskMgmtResp: "Task Management Response",
	opLoginResp: "Login Response", opTextResp: "Text Response", opDataIn: "SCSI Data-In",
	opLogoutResp: "Logout Response", opR2T: "Ready To Transfer (R2T)", opAsync: "Asynchronous Message",
	opReject: "Reject",
}

func opName(op byte) string {
	if n, ok := opNames[op]; ok {
		return n
	}
	return fmt.Sprintf("unknown opcode %#02x", op)
}

const (
	bhsLen = 48 // the Basic Header Segment
	// maxDataLen is what the 24-bit DataSegmentLength can say; no negotiation may exceed it.
	maxDataLen = 1<<24 - 1
	// reservedTag is the Initiator or Target Task Tag that means none (0xffffffff).
	reservedTag = 0xffffffff
	// digestLen is a CRC32C digest's size on the wire.
	digestLen = 4
)

// Flags in byte 1 of the BHS.
const (
	flagFinal    = 0x80 // F: last PDU of a sequence
	flagContinue = 0x40 // C: text (login, text) continues in the next PDU
	flagRead     = 0x40 // R of a SCSI Command
	flagWrite    = 0x20 // W of a SCSI Command
	flagStatus   = 0x01 // S of a Data-In: it carries the status
	flagTransit  = 0x80 // T of a Login: go to the next stage
	attrSimple   = 0x01 // task attribute Simple of a SCSI Command
	bitImmediate = 0x40 // I in byte 0: deliver now, outside the CmdSN order
)

// bhs is a Basic Header Segment. Fields are read and written by offset, the same for every
// opcode that has them, so one type serves every PDU.
type bhs [bhsLen]byte

func (h *bhs) opcode() byte              { return h[0] & 0x3f }
func (h *bhs) flags() byte               { return h[1] }
func (h *bhs) dataLen() int              { return int(h[5])<<16 | int(h[6])<<8 | int(h[7]) }
func (h *bhs) u32(off int) uint32        { return binary.BigEndian.Uint32(h[off:]) }
func (h *bhs) setU32(off int, v uint32)  { binary.BigEndian.PutUint32(h[off:], v) }
func (h *bhs) itt() uint32               { return h.u32(16) }
func (h *bhs) ttt() uint32               { return h.u32(20) }
func (h *bhs) statSN() uint32            { return h.u32(24) }
func (h *bhs) expCmdSN() uint32          { return h.u32(28) }
func (h *bhs) maxCmdSN() uint32          { return h.u32(32) }
func (h *bhs) dataSN() uint32            { return h.u32(36) } // DataSN of a Data-In, R2TSN of an R2T
func (h *bhs) bufferOffset() uint32      { return h.u32(40) }
func (h *bhs) desiredLength() uint32     { return h.u32(44) } // of an R2T
func (h *bhs) lun() uint64               { return binary.BigEndian.Uint64(h[8:]) }
func (h *bhs) setLUN(l uint64)           { binary.BigEndian.PutUint64(h[8:], l) }
func (h *bhs) setITT(v uint32)           { h.setU32(16, v) }
func (h *bhs) setTTT(v uint32)           { h.setU32(20, v) }
func (h *bhs) setCmdSN(v uint32)         { h.setU32(24, v) }
func (h *bhs) setExpStatSN(v uint32)     { h.setU32(28, v) }
func (h *bhs) setOpcode(op byte, i bool) { h[0] = op; h.setImmediate(i) }
func (h *bhs) setImmediate(i bool) {
	if i {
		h[0] |= bitImmediate
	}
}

// setDataLen sets the 24-bit DataSegmentLength; callers keep n within maxDataLen.
func (h *bhs) setDataLen(n int) { h[5], h[6], h[7] = byte(n>>16), byte(n>>8), byte(n) }

// String shows the fields that locate a PDU, for messages about a wrong one.
func (h *bhs) String() string {
	return fmt.Sprintf("%s (ITT %#x, DataSegmentLength %d)", opName(h.opcode()), h.itt(), h.dataLen())
}

// digestCRC is an iSCSI digest, a CRC32C. RFC 7143 sends it least significant byte first (its appendix B.4:
// 32 zero bytes give aa 36 91 8a).
func digestCRC(parts ...[]byte) uint32 {
	var c uint32
	for _, p := range parts {
		c = crc32c.Update(c, p)
	}
	return c
}

func pad4(n int) int { return (4 - n%4) % 4 }

// Errors of the PDU layer. A header digest error or a malformed header leaves the byte stream
// unusable; a data digest error does not (the PDU's length was known), so a session may fail only
// the command it belongs to.
var (
	ErrProtocol       = errors.New("iscsi: protocol error")
	errDataDigest     = errors.New("iscsi: data digest mismatch")
	errHeaderDigest   = fmt.Errorf("%w: header digest mismatch", ErrProtocol)
	errDataLenTooLong = fmt.Errorf("%w: DataSegmentLength over the negotiated MaxRecvDataSegmentLength", ErrProtocol)
)

// pduReader reads PDUs from a stream: a header with next, then its data segment with one of
// readInto, readData or skip, exactly once. It never allocates from a length it read: data goes
// into the caller's buffer or a scratch buffer of maxData bytes, and maxData bounds every segment.
type pduReader struct {
	r                        io.Reader
	headerDigest, dataDigest bool
	maxData                  int // the MaxRecvDataSegmentLength we declared
	hdr                      bhs
	ahs                      [255 * 4]byte // TotalAHSLength counts 4-byte words, at most 255
	scratch                  []byte
	tail                     [3 + digestLen]byte // padding and data digest
}

func newPDUReader(r io.Reader, maxData int) *pduReader {
	return &pduReader{r: r, maxData: maxData}
}

// buffered is how many bytes the reader holds read ahead of the socket, where it reads through a
// buffer (the session's does).
func (p *pduReader) buffered() int {
	if b, ok := p.r.(interface{ Buffered() int }); ok {
		return b.Buffered()
	}
	return 0
}

// next reads the next header (with any additional header segments, which no PDU we handle needs,
// and its digest) and checks its data segment's length against maxData.
func (p *pduReader) next() (*bhs, error) {
	if _, err := io.ReadFull(p.r, p.hdr[:]); err != nil {
		return nil, err
	}
	ahs := p.ahs[:int(p.hdr[4])*4]
	if _, err := io.ReadFull(p.r, ahs); err != nil {
		return nil, fmt.Errorf("%w: %s cut short in its additional header: %v", ErrProtocol, &p.hdr, err)
	}
	if p.headerDigest {
		var d [digestLen]byte
		if _, err := io.ReadFull(p.r, d[:]); err != nil {
			return nil, fmt.Errorf("%w: %s cut short in its header digest: %v", ErrProtocol, &p.hdr, err)
		}
		if got, want := binary.LittleEndian.Uint32(d[:]), digestCRC(p.hdr[:], ahs); got != want {
			return nil, fmt.Errorf("%w: %s: got %#08x, computed %#08x", errHeaderDigest, &p.hdr, got, want)
		}
	}
	if n := p.hdr.dataLen(); n > p.maxData {
		return nil, fmt.Errorf("%w: %s: %d bytes, limit %d", errDataLenTooLong, &p.hdr, n, p.maxData)
	}
	return &p.hdr, nil
}

// readInto reads the current PDU's data segment into dst, which must be exactly as long, then its
// padding and digest. A digest mismatch returns errDataDigest with dst overwritten and the stream
// still in step.
func (p *pduReader) readInto(dst []byte) error {
	if len(dst) != p.hdr.dataLen() {
		panic("iscsi: readInto with a buffer of the wrong length")
	}
	if _, err := io.ReadFull(p.r, dst); err != nil {
		return fmt.Errorf("%w: %s cut short in its data: %v", ErrProtocol, &p.hdr, err)
	}
	tail := p.tail[:pad4(len(dst))]
	if p.dataDigest && len(dst) > 0 {
		tail = p.tail[:len(tail)+digestLen]
	}
	if _, err := io.ReadFull(p.r, tail); err != nil {
		return fmt.Errorf("%w: %s cut short after its data: %v", ErrProtocol, &p.hdr, err)
	}
	if p.dataDigest && len(dst) > 0 {
		padding := tail[:pad4(len(dst))]
		got := binary.LittleEndian.Uint32(tail[len(padding):])
		if want := digestCRC(dst, padding); got != want {
			return fmt.Errorf("%w: %s: got %#08x, computed %#08x", errDataDigest, &p.hdr, got, want)
		}
	}
	return nil
}

// readData reads the current PDU's data segment into the reader's scratch buffer, valid until the
// next call.
func (p *pduReader) readData() ([]byte, error) {
	n := p.hdr.dataLen()
	if cap(p.scratch) < n {
		p.scratch = make([]byte, n, p.maxData) // n <= maxData: next checked it
	}
	d := p.scratch[:n]
	return d, p.readInto(d)
}

// skip reads past the current PDU's data segment (checking its digest).
func (p *pduReader) skip() error {
	_, err := p.readData()
	return err
}

// pduWriter writes PDUs with the digests negotiated. It is not safe for concurrent use: the
// session serialises writers.
type pduWriter struct {
	w                        io.Writer
	headerDigest, dataDigest bool
	hdr                      [bhsLen + digestLen]byte
	tail                     [3 + digestLen]byte
	bufs                     [4][]byte
	// held holds the PDUs that hold wrote, whole, until the next write or flush sends them.
	held []byte
}

// maxHeld bounds held: past it, hold sends what it holds.
const maxHeld = 64 << 10

// frame sets h's DataSegmentLength and returns the header and the padding and digests that go
// around data on the wire; they are the writer's until its next call.
func (p *pduWriter) frame(h *bhs, data []byte) (hdr, tail []byte) {
	if len(data) > maxDataLen {
		panic("iscsi: data segment over 16 MiB")
	}
	h.setDataLen(len(data))
	copy(p.hdr[:], h[:])
	hdr = p.hdr[:bhsLen]
	if p.headerDigest {
		binary.LittleEndian.PutUint32(p.hdr[bhsLen:], digestCRC(h[:]))
		hdr = p.hdr[:]
	}
	tail = p.tail[:pad4(len(data))]
	clear(tail)
	if p.dataDigest && len(data) > 0 {
		binary.LittleEndian.PutUint32(p.tail[len(tail):], digestCRC(data, tail))
		tail = p.tail[:len(tail)+digestLen]
	}
	return hdr, tail
}

// write sends what is held, then h with data as its data segment (setting DataSegmentLength), in
// one vectored write where the connection allows: the data is not copied.
func (p *pduWriter) write(h *bhs, data []byte) error {
	hdr, tail := p.frame(h, data)
	// Empty pieces are left out: a connection without vectored writes (net.Pipe) would otherwise
	// see a zero-length Write, which on a pipe waits for a reader.
	bufs := net.Buffers(p.bufs[:0])
	for _, b := range [][]byte{p.held, hdr, data, tail} {
		if len(b) > 0 {
			bufs = append(bufs, b)
		}
	}
	p.held = p.held[:0]
	_, err := bufs.WriteTo(p.w)
	return err
}

// hold is write, but the PDU is copied and kept to go out with the next write or flush: many
// commands started together leave in one system call, and reach the target in one read of its
// (the session's plugging, Backend.Plug).
func (p *pduWriter) hold(h *bhs, data []byte) error {
	hdr, tail := p.frame(h, data)
	p.held = append(append(append(p.held, hdr...), data...), tail...)
	if len(p.held) >= maxHeld {
		return p.flush()
	}
	return nil
}

// flush sends what is held.
func (p *pduWriter) flush() error {
	if len(p.held) == 0 {
		return nil
	}
	_, err := p.w.Write(p.held)
	p.held = p.held[:0]
	return err
}
