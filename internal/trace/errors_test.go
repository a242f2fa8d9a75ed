package trace

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func vscsiV1(n int) []byte {
	var b []byte
	for i := range n {
		rec := make([]byte, vscsiV1Size)
		binary.LittleEndian.PutUint32(rec[4:], 4096)
		binary.LittleEndian.PutUint16(rec[12:], 0x28)
		binary.LittleEndian.PutUint16(rec[14:], 0x0100)
		binary.LittleEndian.PutUint64(rec[16:], uint64(i))
		b = append(b, rec...)
	}
	return b
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// Every bad input gets an error naming the file, where it went wrong and the format.
func TestBadInput(t *testing.T) {
	badVersion := vscsiV1(3)
	badVersion[2*vscsiV1Size+15] = 7
	cases := []struct {
		name, format string
		data         []byte
		want         string // the whole message after "trace NAME: "
		truncated    bool
	}{
		{"vscsi truncated", "vscsi", vscsiV1(3)[:2*vscsiV1Size+17], "record 3: vscsi: truncated record (17 of 32 bytes)", true},
		{"vscsi foreign", "vscsi", []byte("hello, world, this is not a vscsi trace at all....."), "record 1: vscsi: no vscsi v1 or v2 version byte (ver>>8 must be 1 or 2) in the first records", false},
		{"vscsi version changes", "vscsi", badVersion, "record 3: vscsi: version 7 in a v1 trace (corrupt or not vscsi)", false},
		{"vscsi empty", "vscsi", nil, "vscsi: empty file", false},
		{"oraclegeneral truncated", "oraclegeneral", make([]byte, 24+5), "record 2: oraclegeneral: truncated record (5 of 24 bytes)", true},
		{"arc letters", "arc", []byte("1 1 0 0\n2 x 0 1\n"), `line 2: arc: page count "x" is not a decimal number`, false},
		{"arc five fields", "arc", []byte("1 1 0 0 9\n"), "line 1: arc: more than 4 fields (want: start count ignored reqno)", false},
		{"arc short", "arc", []byte("1 1\n"), "line 1: arc: missing third field", false},
		{"arc huge page", "arc", []byte("99999999999999999999 1 0 0\n"), `line 1: arc: start page "99999999999999999999" is too large`, false},
		{"arc out of range", "arc", []byte("18014398509481984 1 0 0\n"), "line 1: arc: pages 18014398509481984 + 1 is out of range", false},
		{"msr six fields", "msr", []byte("1,h,0,Read,0,512\n"), "line 1: msr: 6 fields, want 7 (Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime)", false},
		{"msr bad type", "msr", []byte("1,h,0,Read,0,512,1\n1,h,0,Trim,0,512,1\n"), `line 2: msr: type "Trim" is neither Read nor Write`, false},
		{"msr negative offset", "msr", []byte("1,h,0,Read,-5,512,1\n"), `line 1: msr: offset "-5" is not a decimal number`, false},
		{"blkparse junk", "blkparse", []byte("  8,0 3 1 0.000000000 697 Q WS 8 + 8 [x]\nhello world\n"), "line 2: blkparse: not a blkparse event line (want: dev cpu sequence time pid action RWBS ...)", false},
		{"blkparse bad time", "blkparse", []byte("8,0 3 1 0.0000000001 697 Q WS 8 + 8 [x]\n"), `line 1: blkparse: time "0.0000000001" is not seconds.nanoseconds`, false},
		{"blkparse no plus", "blkparse", []byte("8,0 3 1 1.0 697 Q WS 8 8 [x]\n"), `line 1: blkparse: want "+ sectors" after sector 8`, false},
		{"blkparse bad action", "blkparse:Z", []byte(""), `blkparse: action "Z": want one of the letters QGIDCMFABX (blkparse:D keeps the events issued to the device)`, false},
		{"fio no header", "fio", []byte("/dev/sda read 0 4096\n"), `line 1: fio: first line "/dev/sda read 0 4096" is not "fio version 2 iolog" or "fio version 3 iolog"`, false},
		{"fio unknown action", "fio", []byte("fio version 2 iolog\n/dev/sda readx 0 4096\n"), `line 2: fio: unknown action "readx" (want add, open, close, read, write, trim, sync, datasync)`, false},
		{"fio v3 wait", "fio", []byte("fio version 3 iolog\n5 /dev/sda wait 0 0\n"), "line 2: fio: wait is not allowed in a version 3 iolog", false},
		{"fio v3 no timestamp", "fio", []byte("fio version 3 iolog\n/dev/sda read 0 4096\n"), `line 2: fio: timestamp "/dev/sda" is not a decimal number`, false},
		{"fio missing length", "fio", []byte("fio version 2 iolog\n/dev/sda read 0\n"), "line 2: fio: missing length", false},
		{"fio extra field", "fio", []byte("fio version 2 iolog\n/dev/sda read 0 1 2\n"), `line 2: fio: unexpected field "2" after the length`, false},
		{"csv few fields", "csv:lbn=3", []byte("1,2,3\n1,2\n"), "line 2: csv: 2 fields; the spec needs column 3", false},
		{"csv bad op", "csv:op=1,offset=2", []byte("read,0\nzap,0\n"), `line 2: csv: op "zap": want r, read, w, write, trim, flush, sync or a SCSI opcode in hex`, false},
		{"csv bad spec", "csv:offset=0", []byte(""), `csv: offset="0": want a column number from 1`, false},
		{"csv no offset", "csv:time=1", []byte(""), "csv: give exactly one of offset=N and lbn=N", false},
		{"csv shared column", "csv:offset=1,size=1", []byte(""), "csv: column 1 given to both offset and size", false},
		{"unknown format", "tar", []byte("x"), `unknown format "tar"; formats: auto, vscsi, oraclegeneral, arc, msr, blkparse, fio, csv:SPEC`, false},
		{"argument to vscsi", "vscsi:1", []byte("x"), `format "vscsi:1" takes no argument; formats: auto, vscsi, oraclegeneral, arc, msr, blkparse, fio, csv:SPEC`, false},
		{"auto foreign text", "auto", []byte("hello world\n"), "cannot tell the format from the content; give one of: vscsi, oraclegeneral, arc, msr, blkparse, fio, csv:SPEC", false},
		{"auto empty", "auto", nil, "empty file: cannot tell its format", false},
		{"gzip corrupt", "arc", append(gzipped([]byte("1 1 0 0\n2 1 0 1\n"))[:12], make([]byte, 20)...), "", false},
		{"line too long", "arc", bytes.Repeat([]byte("1"), bufSize+10), "line 1: arc: line longer than 262144 bytes", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const file = "bad.trace"
			r, err := NewReader(bytes.NewReader(c.data), file, c.format)
			if err == nil {
				for err == nil {
					_, err = r.Next()
				}
				require.NoError(t, r.Close())
			}
			require.Error(t, err)
			require.False(t, errors.Is(err, io.EOF), "got a clean end of trace")
			var terr *Error
			require.ErrorAs(t, err, &terr)
			require.Equal(t, file, terr.File)
			if c.want != "" {
				// Some messages go on with a help text on the next lines.
				require.Equal(t, "trace "+file+": "+c.want, strings.SplitN(err.Error(), "\n", 2)[0])
			}
			require.Equal(t, c.truncated, errors.Is(err, ErrTruncated))
		})
	}
}

func TestFormatsAccepted(t *testing.T) {
	for _, f := range Formats() {
		if f == "csv:SPEC" {
			f = "csv:offset=1"
		}
		r, err := NewReader(bytes.NewReader(nil), "empty", f)
		if f == "auto" || f == "vscsi" {
			require.Error(t, err, f) // nothing to detect, no version byte
			continue
		}
		require.NoError(t, err, f)
		_, err = r.Next()
		require.ErrorIs(t, err, io.EOF, f)
	}
}
