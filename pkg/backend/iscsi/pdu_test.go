package iscsi

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// RFC 7143 appendix B.4 (from RFC 3720): the CRC32C of 32 zero bytes goes on the wire as
// aa 36 91 8a.
func TestCRC32CVector(t *testing.T) {
	var d [4]byte
	binary.LittleEndian.PutUint32(d[:], digestCRC(make([]byte, 32)))
	require.Equal(t, []byte{0xaa, 0x36, 0x91, 0x8a}, d[:])
	ones := bytes.Repeat([]byte{0xff}, 32)
	binary.LittleEndian.PutUint32(d[:], digestCRC(ones[:10], ones[10:]))
	require.Equal(t, []byte{0x43, 0xab, 0xa8, 0x62}, d[:], "32 bytes of 0xff, in two parts")
}

// encode is a PDU as a pduWriter sends it.
func encode(t testing.TB, h bhs, data []byte, hd, dd bool) []byte {
	var buf bytes.Buffer
	w := &pduWriter{w: &buf, headerDigest: hd, dataDigest: dd}
	require.NoError(t, w.write(&h, data))
	return buf.Bytes()
}

func TestPDURoundTrip(t *testing.T) {
	for _, c := range []struct {
		name   string
		data   []byte
		hd, dd bool
	}{
		{"no data", nil, false, false},
		{"padded", []byte("abcde"), false, false},
		{"aligned", []byte("abcdefgh"), false, false},
		{"digests, no data", nil, true, true},
		{"digests, padded", []byte("abcdefg"), true, true},
		{"header digest only", []byte("xy"), true, false},
		{"data digest only", []byte("xyz"), false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h bhs
			h.setOpcode(opSCSICmd, false)
			h.setITT(7)
			wire := encode(t, h, c.data, c.hd, c.dd)
			want := bhsLen + len(c.data) + pad4(len(c.data))
			if c.hd {
				want += digestLen
			}
			if c.dd && len(c.data) > 0 {
				want += digestLen
			}
			require.Len(t, wire, want)
			// Two PDUs back to back: the reader must stop exactly at the end of the first.
			r := newPDUReader(bytes.NewReader(append(wire, wire...)), 64)
			r.headerDigest, r.dataDigest = c.hd, c.dd
			for range 2 {
				got, err := r.next()
				require.NoError(t, err)
				require.Equal(t, uint32(7), got.itt())
				require.Equal(t, len(c.data), got.dataLen())
				d, err := r.readData()
				require.NoError(t, err)
				require.Equal(t, string(c.data), string(d))
			}
			_, err := r.next()
			require.ErrorIs(t, err, io.EOF)
		})
	}
}

// Every malformed PDU gets an error that says what is wrong, and no allocation follows a length
// the peer sent.
func TestPDUReaderErrors(t *testing.T) {
	var h bhs
	h.setOpcode(opDataIn, false)
	h.setITT(3)
	good := encode(t, h, []byte("hello"), true, true)
	flip := func(i int) []byte { b := bytes.Clone(good); b[i] ^= 1; return b }
	withAHS := func(words byte, n int) []byte {
		var g bhs
		g[4] = words
		return append(g[:], make([]byte, n)...)
	}
	long := func(n int) []byte { var g bhs; g.setDataLen(n); return g[:] }
	for _, c := range []struct {
		name  string
		wire  []byte
		isEOF bool
		err   error
		msg   string
	}{
		{name: "empty", wire: nil, isEOF: true},
		{name: "short header", wire: good[:20], err: io.ErrUnexpectedEOF},
		{name: "AHS cut short", wire: withAHS(2, 4), err: ErrProtocol, msg: "cut short in its additional header"},
		{name: "header digest missing", wire: good[:bhsLen+2], err: ErrProtocol, msg: "cut short in its header digest"},
		{name: "header digest wrong", wire: flip(10), err: errHeaderDigest, msg: "SCSI Data-In (ITT 0x3"},
		{name: "data segment over the limit", wire: long(65), err: errDataLenTooLong, msg: "65 bytes, limit 64"},
		{name: "largest data segment", wire: long(maxDataLen), err: errDataLenTooLong},
		{name: "data cut short", wire: good[:bhsLen+4+3], err: ErrProtocol, msg: "cut short in its data"},
		{name: "padding cut short", wire: good[:bhsLen+4+6], err: ErrProtocol, msg: "cut short after its data"},
		{name: "data digest wrong", wire: flip(bhsLen + 4 + 1), err: errDataDigest},
	} {
		t.Run(c.name, func(t *testing.T) {
			hdOnly := c.name == "data segment over the limit" || c.name == "largest data segment" || c.name == "AHS cut short"
			r := newPDUReader(bytes.NewReader(c.wire), 64)
			r.headerDigest, r.dataDigest = !hdOnly, true
			_, err := r.next()
			if err == nil {
				_, err = r.readData()
			}
			if c.isEOF {
				require.ErrorIs(t, err, io.EOF)
				return
			}
			require.ErrorIs(t, err, c.err)
			require.ErrorContains(t, err, c.msg)
			require.LessOrEqual(t, cap(r.scratch), 64)
		})
	}
}

// After a data digest error the stream is still in step: the next PDU reads.
func TestPDUDataDigestErrorKeepsStep(t *testing.T) {
	var h bhs
	h.setOpcode(opDataIn, false)
	first := encode(t, h, []byte("abcdef"), false, true)
	first[bhsLen] ^= 0xff
	h.setITT(9)
	r := newPDUReader(bytes.NewReader(append(first, encode(t, h, []byte("xyz"), false, true)...)), 64)
	r.dataDigest = true
	_, err := r.next()
	require.NoError(t, err)
	dst := make([]byte, 6)
	require.ErrorIs(t, r.readInto(dst), errDataDigest)
	next, err := r.next()
	require.NoError(t, err)
	require.Equal(t, uint32(9), next.itt())
	d, err := r.readData()
	require.NoError(t, err)
	require.Equal(t, "xyz", string(d))
}

// FuzzPDU reads any byte stream as PDUs, with any combination of digests: it must never panic
// nor allocate past the limit, and what it accepts must encode back to the same bytes. The data
// segments also go through the text and sense parsers, which must not panic either.
func FuzzPDU(f *testing.F) {
	var h bhs
	h.setOpcode(opLoginResp, false)
	h.setITT(1)
	f.Add(encode(f, h, appendText(nil, pair{"TargetPortalGroupTag", "1"}, pair{"AuthMethod", "None"}), false, false), byte(0))
	h.setOpcode(opSCSIResp, false)
	f.Add(encode(f, h, []byte{0, 18, 0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0}, true, true), byte(3))
	h.setOpcode(opDataIn, false)
	h[1] = flagFinal | flagStatus
	f.Add(append(encode(f, h, []byte("data"), false, true), encode(f, h, nil, false, true)...), byte(2))
	h.setOpcode(opReject, false)
	f.Add(encode(f, h, make([]byte, bhsLen), true, false), byte(1))
	f.Add([]byte{}, byte(0))

	f.Fuzz(func(t *testing.T, wire []byte, digests byte) {
		const limit = 1024
		hd, dd := digests&1 != 0, digests&2 != 0
		r := newPDUReader(bytes.NewReader(wire), limit)
		r.headerDigest, r.dataDigest = hd, dd
		consumed := 0
		for {
			got, err := r.next()
			if err != nil {
				return
			}
			h := *got
			ahs := bytes.Clone(r.ahs[:int(h[4])*4])
			d, err := r.readData()
			if cap(r.scratch) > limit {
				t.Fatalf("scratch grew to %d", cap(r.scratch))
			}
			if err != nil {
				return
			}
			_, _ = parseText(d)
			_, _ = parseSense(d)
			if len(ahs) > 0 {
				return // the writer sends no additional header segments: nothing to compare
			}
			// The same header and data encode to as many bytes; the padding (and so a data digest
			// over it) may differ, since a peer may pad with anything.
			re := encode(t, h, d, hd, dd)
			n := bhsLen + len(d)
			if hd {
				n += digestLen
			}
			if got := wire[consumed : consumed+len(re)]; !bytes.Equal(re[:n], got[:n]) {
				t.Fatalf("re-encoding differs:\n got %x\nwire %x", re, got)
			}
			consumed += len(re)
		}
	})
}

func TestParseText(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []pair
		err  string
	}{
		{in: "", want: nil},
		{in: "A=1\x00", want: []pair{{"A", "1"}}},
		{in: "A=1\x00B=\x00\x00\x00", want: []pair{{"A", "1"}, {"B", ""}}},
		{in: "A=x=y\x00", want: []pair{{"A", "x=y"}}},
		{in: "A=1", err: "does not end with a NUL"},
		{in: "A\x00", err: "is not key=value"},
		{in: "=1\x00", err: "is not key=value"},
		{in: "A=1\x00A=2\x00", err: "text key A given twice"},
	} {
		got, err := parseText([]byte(c.in))
		if c.err != "" {
			require.ErrorIs(t, err, ErrProtocol, "%q", c.in)
			require.ErrorContains(t, err, c.err, "%q", c.in)
			continue
		}
		require.NoError(t, err, "%q", c.in)
		require.Equal(t, c.want, got, "%q", c.in)
	}
	require.Equal(t, "A=1\x00B=\x00", string(appendText(nil, pair{"A", "1"}, pair{"B", ""})))
}
