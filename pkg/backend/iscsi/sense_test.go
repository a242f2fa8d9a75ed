package iscsi

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
)

func TestParseSense(t *testing.T) {
	fixed := func(code, key, asc, ascq byte) []byte {
		b := make([]byte, 18)
		b[0], b[2], b[7], b[12], b[13] = code, key, 10, asc, ascq
		return b
	}
	for _, c := range []struct {
		name string
		in   []byte
		want Sense
		str  string
		err  string
	}{
		{name: "fixed", in: fixed(0x70, 0x05, 0x21, 0x00), want: Sense{Key: 5, ASC: 0x21},
			str: "ILLEGAL REQUEST: logical block address out of range (ASC 0x21 ASCQ 0x00)"},
		{name: "fixed, valid bit", in: fixed(0xf0, 0x06, 0x29, 0x01), want: Sense{Key: 6, ASC: 0x29, ASCQ: 1},
			str: "UNIT ATTENTION: power on occurred (ASC 0x29 ASCQ 0x01)"},
		{name: "fixed deferred", in: fixed(0x71, 0x03, 0x0c, 0x00), want: Sense{Key: 3, ASC: 0x0c, Deferred: true},
			str: "deferred MEDIUM ERROR: write error (ASC 0x0c ASCQ 0x00)"},
		{name: "descriptor", in: []byte{0x72, 0x07, 0x27, 0x07, 0, 0, 0, 0}, want: Sense{Key: 7, ASC: 0x27, ASCQ: 7},
			str: "DATA PROTECT: space allocation failed write protect (ASC 0x27 ASCQ 0x07)"},
		{name: "fixed, cut before the ASC", in: fixed(0x70, 0x02, 0x04, 0x01)[:8], want: Sense{Key: 2},
			str: "NOT READY: no additional sense information (ASC 0x00 ASCQ 0x00)"},
		{name: "unnamed code", in: []byte{0x72, 0x0b, 0x47, 0x7f}, want: Sense{Key: 0xb, ASC: 0x47, ASCQ: 0x7f},
			str: "ABORTED COMMAND: additional sense (ASC 0x47 ASCQ 0x7f)"},
		{name: "empty", in: nil, err: "no sense data"},
		{name: "fixed too short", in: []byte{0x70, 0}, err: "fixed-format sense data of 2 bytes"},
		{name: "descriptor too short", in: []byte{0x72, 0, 0}, err: "descriptor-format sense data of 3 bytes"},
		{name: "unknown format", in: []byte{0x7f, 0, 0, 0}, err: "unknown response code 0x7f"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseSense(c.in)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
			require.Equal(t, c.str, got.String())
		})
	}
}

// A SCSI error says which command failed and why, and wraps the backend error a caller acts on.
func TestSCSIError(t *testing.T) {
	for _, c := range []struct {
		sense *Sense
		is    error
	}{
		{&Sense{Key: keyDataProtect, ASC: 0x27}, backend.ErrReadOnly},
		{&Sense{Key: keyDataProtect, ASC: 0x27, ASCQ: 0x07}, syscall.ENOSPC},
		{&Sense{Key: keyIllegalRequest, ASC: 0x20}, backend.ErrNotSupported},
		{&Sense{Key: keyIllegalRequest, ASC: 0x24}, backend.ErrNotSupported},
		{&Sense{Key: keyIllegalRequest, ASC: 0x21}, backend.ErrOutOfRange},
		{&Sense{Key: 0x3, ASC: 0x11}, nil},
		{nil, nil},
	} {
		err := &SCSIError{Command: "WRITE(16) of 8 blocks at LBA 0", Status: statusCheckCondition, Sense: c.sense}
		if c.is != nil {
			require.ErrorIs(t, err, c.is, "%v", c.sense)
		} else {
			require.Nil(t, err.Unwrap())
			require.True(t, backend.IsRetryable(err))
		}
	}
	err := &SCSIError{Command: "READ(16) of 8 blocks at LBA 16", Status: statusCheckCondition, Sense: &Sense{Key: 3, ASC: 0x11}}
	require.EqualError(t, err, "iscsi: READ(16) of 8 blocks at LBA 16: CHECK CONDITION, MEDIUM ERROR: unrecovered read error (ASC 0x11 ASCQ 0x00)")
	require.EqualError(t, &SCSIError{Command: "INQUIRY", Status: 0x18}, "iscsi: INQUIRY: RESERVATION CONFLICT")
	require.EqualError(t, &SCSIError{Command: "INQUIRY", Status: 0x77}, "iscsi: INQUIRY: status 0x77")
}
