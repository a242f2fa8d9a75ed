package iscsi

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/tierblk/tierblk/pkg/backend"
)

// SCSI status codes (SAM-5) that the backend acts on.
const (
	statusGood           = 0x00
	statusCheckCondition = 0x02
	statusBusy           = 0x08
	statusTaskSetFull    = 0x28
)

var statusNames = map[byte]string{
	0x00: "GOOD", 0x02: "CHECK CONDITION", 0x04: "CONDITION MET", 0x08: "BUSY",
	0x18: "RESERVATION CONFLICT", 0x28: "TASK SET FULL", 0x30: "ACA ACTIVE", 0x40: "TASK ABORTED",
}

// Sense keys (SPC-4 section 4.5.6).
const (
	keyNotReady       = 0x2
	keyIllegalRequest = 0x5
	keyUnitAttention  = 0x6
	keyDataProtect    = 0x7
)

var keyNames = [16]string{
	"NO SENSE", "RECOVERED ERROR", "NOT READY", "MEDIUM ERROR", "HARDWARE ERROR", "ILLEGAL REQUEST",
	"UNIT ATTENTION", "DATA PROTECT", "BLANK CHECK", "VENDOR SPECIFIC", "COPY ABORTED",
	"ABORTED COMMAND", "RESERVED (0xC)", "VOLUME OVERFLOW", "MISCOMPARE", "COMPLETED",
}

// ascNames names the additional sense codes a block device commonly reports (SPC-4 annex D), by
// ASC<<8|ASCQ.
var ascNames = map[uint16]string{
	0x0000: "no additional sense information",
	0x0400: "logical unit not ready, cause not reportable",
	0x0401: "logical unit is in process of becoming ready",
	0x0402: "logical unit not ready, initializing command required",
	0x0403: "logical unit not ready, manual intervention required",
	0x0C00: "write error",
	0x1100: "unrecovered read error",
	0x1A00: "parameter list length error",
	0x2000: "invalid command operation code",
	0x2100: "logical block address out of range",
	0x2400: "invalid field in CDB",
	0x2500: "logical unit not supported",
	0x2600: "invalid field in parameter list",
	0x2700: "write protected",
	0x2707: "space allocation failed write protect",
	0x2800: "not ready to ready change, medium may have changed",
	0x2900: "power on, reset, or bus device reset occurred",
	0x2901: "power on occurred",
	0x2A01: "mode parameters changed",
	0x2A09: "capacity data has changed",
	0x2C00: "command sequence error",
	0x3A00: "medium not present",
	0x3807: "thin provisioning soft threshold reached",
	0x3F0E: "reported luns data has changed",
	0x4400: "internal target failure",
	0x4700: "SCSI parity error",
	0x5503: "insufficient resources",
}

// Sense is decoded sense data: what a CHECK CONDITION says went wrong.
type Sense struct {
	Key, ASC, ASCQ byte
	Deferred       bool // about an earlier command, not this one
}

// parseSense decodes fixed (0x70, 0x71) and descriptor (0x72, 0x73) format sense data.
func parseSense(b []byte) (Sense, error) {
	if len(b) < 1 {
		return Sense{}, errors.New("no sense data")
	}
	var s Sense
	switch code := b[0] & 0x7f; code {
	case 0x70, 0x71:
		if len(b) < 3 {
			return Sense{}, fmt.Errorf("fixed-format sense data of %d bytes", len(b))
		}
		s.Key = b[2] & 0x0f
		if len(b) >= 14 { // the additional sense code may be cut off by a short length
			s.ASC, s.ASCQ = b[12], b[13]
		}
		s.Deferred = code == 0x71
	case 0x72, 0x73:
		if len(b) < 4 {
			return Sense{}, fmt.Errorf("descriptor-format sense data of %d bytes", len(b))
		}
		s.Key, s.ASC, s.ASCQ = b[1]&0x0f, b[2], b[3]
		s.Deferred = code == 0x73
	default:
		return Sense{}, fmt.Errorf("sense data of unknown response code %#02x", code)
	}
	return s, nil
}

// String names the key and the additional sense code.
func (s Sense) String() string {
	asc := ascNames[uint16(s.ASC)<<8|uint16(s.ASCQ)]
	if asc == "" {
		asc = "additional sense"
	}
	d := ""
	if s.Deferred {
		d = "deferred "
	}
	return fmt.Sprintf("%s%s: %s (ASC %#02x ASCQ %#02x)", d, keyNames[s.Key], asc, s.ASC, s.ASCQ)
}

// SCSIError is a command that ended with a status other than GOOD. It wraps backend.ErrReadOnly
// for a write-protected LUN, syscall.ENOSPC for a thin LUN out of space (which the NBD server
// passes on as such), backend.ErrNotSupported for a command or field the LUN does not know, and
// backend.ErrOutOfRange for an address beyond it, so that callers need no SCSI.
type SCSIError struct {
	Command string
	Status  byte
	Sense   *Sense // nil without sense data
}

func (e *SCSIError) Error() string {
	st := statusNames[e.Status]
	if st == "" {
		st = fmt.Sprintf("status %#02x", e.Status)
	}
	if e.Sense == nil {
		return fmt.Sprintf("iscsi: %s: %s", e.Command, st)
	}
	return fmt.Sprintf("iscsi: %s: %s, %s", e.Command, st, e.Sense)
}

func (e *SCSIError) Unwrap() error {
	if e.Sense == nil {
		return nil
	}
	switch {
	case e.Sense.Key == keyDataProtect && e.Sense.ASC == 0x27 && e.Sense.ASCQ == 0x07:
		return syscall.ENOSPC
	case e.Sense.Key == keyDataProtect:
		return backend.ErrReadOnly
	case e.Sense.Key == keyIllegalRequest && (e.Sense.ASC == 0x20 || e.Sense.ASC == 0x24):
		return backend.ErrNotSupported
	case e.Sense.Key == keyIllegalRequest && e.Sense.ASC == 0x21:
		return backend.ErrOutOfRange
	}
	return nil
}
