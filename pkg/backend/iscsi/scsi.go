package iscsi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The SCSI commands the backend sends (SPC-4, SBC-3) and what their answers mean.

// Operation codes.
const (
	scsiTestUnitReady = 0x00
	scsiInquiry       = 0x12
	scsiModeSense6    = 0x1a
	scsiSyncCache10   = 0x35
	scsiUnmap         = 0x42
	scsiRead16        = 0x88
	scsiWrite16       = 0x8a
	scsiSyncCache16   = 0x91
	scsiWriteSame16   = 0x93
	scsiServiceIn16   = 0x9e // READ CAPACITY(16) is its service action 0x10
	scsiReportLUNs    = 0xa0
)

var scsiNames = map[byte]string{
	scsiTestUnitReady: "TEST UNIT READY", scsiInquiry: "INQUIRY", scsiModeSense6: "MODE SENSE(6)",
	scsiSyncCache10: "SYNCHRONIZE CACHE(10)", scsiUnmap: "UNMAP", scsiRead16: "READ(16)",
	scsiWrite16: "WRITE(16)", scsiSyncCache16: "SYNCHRONIZE CACHE(16)", scsiWriteSame16: "WRITE SAME(16)",
	scsiServiceIn16: "READ CAPACITY(16)", scsiReportLUNs: "REPORT LUNS",
}

// CDB bits.
const (
	cdbFUA       = 0x08 // byte 1 of READ/WRITE(16)
	cdbUnmapBit  = 0x08 // byte 1 of WRITE SAME(16)
	cdbEVPD      = 0x01 // byte 1 of INQUIRY
	cdbDBD       = 0x08 // byte 1 of MODE SENSE: no block descriptors
	readCapacity = 0x10 // service action of SERVICE ACTION IN(16)
)

// VPD pages.
const (
	vpdSupported    = 0x00
	vpdBlockLimits  = 0xb0
	vpdProvisioning = 0xb2
)

// maxRetries bounds how often exec repeats a command the target asked to be tried again.
const maxRetries = 8

// cdbName names a CDB's command for messages, with its block range where it has one.
func cdbName(cdb []byte) string {
	n := scsiNames[cdb[0]]
	if n == "" {
		n = fmt.Sprintf("SCSI command %#02x", cdb[0])
	}
	switch cdb[0] {
	case scsiRead16, scsiWrite16, scsiWriteSame16:
		return fmt.Sprintf("%s of %d blocks at LBA %d", n, binary.BigEndian.Uint32(cdb[10:]), binary.BigEndian.Uint64(cdb[2:]))
	case scsiInquiry:
		if cdb[1]&cdbEVPD != 0 {
			return fmt.Sprintf("%s of VPD page %#02x", n, cdb[2])
		}
	}
	return n
}

// exec runs one command and turns its status into an error, retrying what the target asks to be
// tried again: a UNIT ATTENTION (the LUN reports a change, such as a reset, and did not run the
// command), BUSY, TASK SET FULL and a LUN becoming ready. It returns the bytes read.
func (s *session) exec(cdb []byte, read, write []byte) (int, error) {
	backoff := time.Millisecond
	for attempt := 0; ; attempt++ {
		t, err := s.command(cdb, read, write)
		if err != nil {
			return 0, err
		}
		switch {
		case t.response != 0:
			return 0, fmt.Errorf("iscsi: %s: %s failed it (iSCSI response %#02x)", cdbName(cdb), s.name, t.response)
		case t.digest != nil:
			return 0, fmt.Errorf("iscsi: %s: %w", cdbName(cdb), t.digest)
		case t.status == statusGood:
			return t.got, nil
		}
		serr := &SCSIError{Command: cdbName(cdb), Status: t.status}
		retry := t.status == statusBusy || t.status == statusTaskSetFull
		if t.status == statusCheckCondition {
			if sense, err := parseSense(t.sense); err == nil {
				serr.Sense = &sense
				retry = sense.Key == keyUnitAttention ||
					sense.Key == keyNotReady && sense.ASC == 0x04 && sense.ASCQ == 0x01
			}
		}
		if !retry || attempt == maxRetries {
			return 0, serr
		}
		s.log.Debug("iscsi: retrying", "target", s.name, "why", serr.Error())
		time.Sleep(backoff)
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// readFull runs a command that must fill read.
func (s *session) readFull(cdb []byte, read []byte) error {
	n, err := s.exec(cdb, read, nil)
	if err == nil && n != len(read) {
		err = fmt.Errorf("iscsi: %s: %s sent %d of %d bytes", cdbName(cdb), s.name, n, len(read))
	}
	return err
}

func cdbInquiry(page byte, evpd bool, alloc uint16) []byte {
	cdb := make([]byte, 6)
	cdb[0] = scsiInquiry
	if evpd {
		cdb[1] = cdbEVPD
	}
	cdb[2] = page
	binary.BigEndian.PutUint16(cdb[3:], alloc)
	return cdb
}

func cdbReadCapacity16(alloc uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0], cdb[1] = scsiServiceIn16, readCapacity
	binary.BigEndian.PutUint32(cdb[10:], alloc)
	return cdb
}

// cdbBlocks is a 16-byte CDB that addresses blocks: READ(16), WRITE(16), WRITE SAME(16),
// SYNCHRONIZE CACHE(16).
func cdbBlocks(op, flags byte, lba uint64, blocks uint32) []byte {
	cdb := make([]byte, 16)
	cdb[0], cdb[1] = op, flags
	binary.BigEndian.PutUint64(cdb[2:], lba)
	binary.BigEndian.PutUint32(cdb[10:], blocks)
	return cdb
}

func cdbModeSense6(page byte, alloc byte) []byte {
	return []byte{scsiModeSense6, cdbDBD, page, 0, alloc, 0}
}

// cdbUnmap is UNMAP with a parameter list of n bytes.
func cdbUnmap(n int) []byte {
	cdb := make([]byte, 10)
	cdb[0] = scsiUnmap
	binary.BigEndian.PutUint16(cdb[7:], uint16(n))
	return cdb
}

// unmapList is UNMAP's parameter list for extents of (lba, blocks).
func unmapList(extents [][2]uint64) []byte {
	b := make([]byte, 8+16*len(extents))
	binary.BigEndian.PutUint16(b[0:], uint16(len(b)-2))
	binary.BigEndian.PutUint16(b[2:], uint16(16*len(extents)))
	for i, e := range extents {
		d := b[8+16*i:]
		binary.BigEndian.PutUint64(d, e[0])
		binary.BigEndian.PutUint32(d[8:], uint32(e[1]))
	}
	return b
}

// lunInfo is what the LUN says about itself.
type lunInfo struct {
	blockSize int64
	blocks    uint64
	vendor    string
	product   string
	// maxTransfer is the most blocks one READ or WRITE may move; 0 for no limit.
	maxTransfer uint32
	// maxUnmapBlocks and maxUnmapDescs bound one UNMAP; maxWriteSame, one WRITE SAME (0: no limit).
	maxUnmapBlocks uint32
	maxUnmapDescs  uint32
	maxWriteSame   uint64
	// Logical block provisioning: UNMAP (lbpu), WRITE SAME(16) with UNMAP (lbpws), unmapped blocks
	// read as zeroes (lbprz).
	lbpu, lbpws, lbprz bool
	writeProtect       bool
	fua                bool // the FUA bit is honoured (DPOFUA)
}

// errNotDisk is wrapped by the error of opening a LUN that is not a direct-access block device.
var errNotDisk = errors.New("not a disk")

// probe asks the LUN what it is: it must be a disk; then its size, limits and abilities.
func (s *session) probe(lun uint64) (lunInfo, error) {
	var li lunInfo
	// INQUIRY first: it answers even for a LUN that does not exist, and reports no UNIT ATTENTION.
	inq := make([]byte, 96)
	n, err := s.exec(cdbInquiry(0, false, uint16(len(inq))), inq, nil)
	if err != nil {
		return li, err
	}
	if n < 36 {
		return li, fmt.Errorf("iscsi: INQUIRY: %s sent %d bytes, want at least 36", s.name, n)
	}
	if q, dt := inq[0]>>5, inq[0]&0x1f; q != 0 || dt != 0 {
		if q == 3 {
			return li, fmt.Errorf("iscsi: %s has no LUN %d", s.name, lun)
		}
		return li, fmt.Errorf("iscsi: LUN %d of %s is %w (peripheral qualifier %d, device type %#02x)", lun, s.name, errNotDisk, q, dt)
	}
	li.vendor, li.product = trimASCII(inq[8:16]), trimASCII(inq[16:32])
	// TEST UNIT READY takes the UNIT ATTENTION a new session usually starts with, through exec's
	// retries, before anything whose answer matters.
	if _, err := s.exec([]byte{scsiTestUnitReady, 0, 0, 0, 0, 0}, nil, nil); err != nil {
		return li, err
	}

	rc := make([]byte, 32)
	if err := s.readFull(cdbReadCapacity16(uint32(len(rc))), rc); err != nil {
		return li, err
	}
	if err := li.parseCapacity(rc); err != nil {
		return li, fmt.Errorf("iscsi: LUN %d of %s: %w", lun, s.name, err)
	}
	pages := make([]byte, 255)
	if n, err := s.exec(cdbInquiry(vpdSupported, true, uint16(len(pages))), pages, nil); err == nil && n >= 4 {
		for _, p := range pages[4:min(n, 4+int(pages[3]))] {
			page := make([]byte, 64)
			switch p {
			case vpdBlockLimits:
				if n, err := s.exec(cdbInquiry(p, true, uint16(len(page))), page, nil); err == nil {
					li.parseBlockLimits(page[:n])
				}
			case vpdProvisioning:
				if n, err := s.exec(cdbInquiry(p, true, uint16(len(page))), page, nil); err == nil {
					li.parseProvisioning(page[:n])
				}
			}
		}
	}
	// The mode parameter header says whether the LUN is write-protected and honours FUA; a LUN
	// that has no MODE SENSE is taken as writable, and FUA writes then flush.
	mode := make([]byte, 4)
	if n, err := s.exec(cdbModeSense6(0x3f, byte(len(mode))), mode, nil); err == nil && n >= 3 {
		li.writeProtect, li.fua = mode[2]&0x80 != 0, mode[2]&0x10 != 0
	}
	return li, nil
}

func trimASCII(b []byte) string {
	end := len(b)
	for end > 0 && (b[end-1] == ' ' || b[end-1] == 0) {
		end--
	}
	return string(b[:end])
}

// parseCapacity reads READ CAPACITY(16)'s answer.
func (li *lunInfo) parseCapacity(rc []byte) error {
	last, bs := binary.BigEndian.Uint64(rc[0:]), binary.BigEndian.Uint32(rc[8:])
	if bs < 512 || bs > 1<<16 || bs&(bs-1) != 0 {
		return fmt.Errorf("logical block size %d is not a power of two from 512 to 65536", bs)
	}
	if last >= (1<<63-1)/uint64(bs) {
		return fmt.Errorf("%d blocks of %d bytes do not fit in a 63-bit size", last, bs)
	}
	li.blockSize, li.blocks = int64(bs), last+1
	li.lbprz = rc[14]&0x40 != 0 // may be told again by the provisioning VPD page
	return nil
}

// parseBlockLimits reads the Block Limits VPD page; fields past a short page stay 0 (no limit).
func (li *lunInfo) parseBlockLimits(p []byte) {
	if len(p) >= 12 {
		li.maxTransfer = binary.BigEndian.Uint32(p[8:])
	}
	if len(p) >= 28 {
		li.maxUnmapBlocks, li.maxUnmapDescs = binary.BigEndian.Uint32(p[20:]), binary.BigEndian.Uint32(p[24:])
	}
	if len(p) >= 44 {
		li.maxWriteSame = binary.BigEndian.Uint64(p[36:])
	}
}

// parseProvisioning reads the Logical Block Provisioning VPD page.
func (li *lunInfo) parseProvisioning(p []byte) {
	if len(p) < 6 {
		return
	}
	li.lbpu, li.lbpws = p[5]&0x80 != 0, p[5]&0x40 != 0
	li.lbprz = li.lbprz || p[5]>>2&7 == 1 // SBC-4's three-bit LBPRZ: 1 means zeroes
}

// maxReportedLUNs bounds the LUNs reportLUNs lists: a NAS has a handful, and the answer's buffer
// is ours to size.
const maxReportedLUNs = 256

// reportLUNs lists the target's LUNs (REPORT LUNS): those in the two addressing methods we encode,
// the first maxReportedLUNs of them.
func (s *session) reportLUNs() ([]uint64, error) {
	buf := make([]byte, 8+8*maxReportedLUNs)
	cdb := make([]byte, 12)
	cdb[0] = scsiReportLUNs
	binary.BigEndian.PutUint32(cdb[6:], uint32(len(buf)))
	n, err := s.exec(cdb, buf, nil)
	if err != nil {
		return nil, err
	}
	if n < 8 {
		return nil, fmt.Errorf("iscsi: REPORT LUNS: %s sent %d bytes, want at least 8", s.name, n)
	}
	return parseReportLUNs(buf[:n]), nil
}

// parseReportLUNs reads REPORT LUNS parameter data: a list length, then 8-byte LUNs, of which
// those in peripheral addressing on bus 0 or in flat space are kept (the methods encodeLUN writes).
func parseReportLUNs(data []byte) []uint64 {
	list := data[8:]
	if n := binary.BigEndian.Uint32(data); uint64(n) < uint64(len(list)) {
		list = list[:n]
	}
	var luns []uint64
	for ; len(list) >= 8; list = list[8:] {
		switch list[0] >> 6 {
		case 0: // peripheral device addressing, bus 0
			if list[0] == 0 {
				luns = append(luns, uint64(list[1]))
			}
		case 1: // flat space
			luns = append(luns, uint64(list[0]&0x3f)<<8|uint64(list[1]))
		}
	}
	return luns
}
