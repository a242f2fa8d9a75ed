package meta

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// lineEncodings are records and their exact encodings. Those without checksums are what every
// tierblk since location words wrote, those without location words too what every tierblk since
// zero blocks wrote, and those without zero blocks too what the first one did: a store written by
// any of them must load unchanged, and records without checksums must still be written so that
// they can load it.
var lineEncodings = []struct {
	name string
	rec  Line
	hex  string // spaces between fields, for the reader
}{
	{"empty", Line{Line: 7}, "00000000 00 00"},
	{"valid", Line{Line: 7, Slot: 0x01020304, Valid: []uint64{0xff}},
		"01020304 01 00 00000000000000ff"},
	{"valid and dirty", Line{Line: 7, Slot: 9, Valid: []uint64{0xff, 1 << 63}, Dirty: []uint64{0x0f}},
		"00000009 02 01 00000000000000ff 8000000000000000 000000000000000f"},
	{"zero blocks", Line{Line: 7, Slot: 9, Valid: []uint64{0xff}, Zero: []uint64{0xf0}},
		"00000009 01 00 00000000000000ff 01 00000000000000f0"},
	{"locations", Line{Line: 7, Valid: []uint64{0x3}, Loc: []uint64{0x11, 0x2200000000000000}},
		"00000000 01 00 0000000000000003 00 02 0000000000000011 2200000000000000"},
	{"zero blocks and locations", Line{Line: 7, Valid: []uint64{0x7}, Dirty: []uint64{0x1}, Zero: []uint64{0x4}, Loc: []uint64{5, 6, 0}},
		"00000000 01 01 0000000000000007 0000000000000001 01 0000000000000004 03 0000000000000005 0000000000000006 0000000000000000"},
	{"checksums", Line{Line: 7, Slot: 9, Valid: []uint64{0x3}, Sum: []uint32{0xdeadbeef, 1}},
		"00000009 01 00 0000000000000003 00 00 02 deadbeef 00000001"},
	{"checksums, all 0", Line{Line: 7, Slot: 9, Valid: []uint64{0x1}, Sum: []uint32{0}},
		"00000009 01 00 0000000000000001 00 00 01 00000000"},
	{"zero blocks and checksums", Line{Line: 7, Slot: 9, Valid: []uint64{0x7}, Zero: []uint64{0x4}, Sum: []uint32{5, 6, 0}},
		"00000009 01 00 0000000000000007 01 0000000000000004 00 03 00000005 00000006 00000000"},
	{"locations and checksums", Line{Line: 7, Valid: []uint64{0x3}, Loc: []uint64{0x11, 0x22}, Sum: []uint32{0xa, 0xb0000000}},
		"00000000 01 00 0000000000000003 00 02 0000000000000011 0000000000000022 02 0000000a b0000000"},
	{"zero blocks, locations and checksums", Line{Line: 7, Valid: []uint64{0x7}, Dirty: []uint64{0x1}, Zero: []uint64{0x4}, Loc: []uint64{5, 6, 0}, Sum: []uint32{7, 8}},
		"00000000 01 01 0000000000000007 0000000000000001 01 0000000000000004 03 0000000000000005 0000000000000006 0000000000000000 02 00000007 00000008"},
	{"epochs, slot layout", Line{Line: 7, Valid: []uint64{0x7}, Dirty: []uint64{0x5}, Epoch: []uint64{3, 0, 300}},
		"00000000 01 01 0000000000000007 0000000000000005 00 00 00 03 03 00 ac02"},
	{"epochs with checksums", Line{Line: 7, Valid: []uint64{0x3}, Dirty: []uint64{0x2}, Sum: []uint32{7, 8}, Epoch: []uint64{0, 9}},
		"00000000 01 01 0000000000000003 0000000000000002 00 00 02 00000007 00000008 02 00 09"},
}

func TestLineEncoding(t *testing.T) {
	for _, tt := range lineEncodings {
		t.Run(tt.name, func(t *testing.T) {
			want, err := hex.DecodeString(strings.ReplaceAll(tt.hex, " ", ""))
			require.NoError(t, err)
			require.Equal(t, want, encodeLine(tt.rec), "encoding")
			got, err := decodeLine(lineKey(tt.rec.Line), want)
			require.NoError(t, err)
			require.Equal(t, tt.rec, got, "decoding")
			if tt.rec.Sum == nil {
				tt.rec.Sum = []uint32{}
				require.Equal(t, want, encodeLine(tt.rec), "empty checksums encode as none")
			}
		})
	}
}

// The encodings of a 1 MiB line, which encodeLine's comment states.
func TestLineEncodingSize(t *testing.T) {
	require.Len(t, encodeLine(Line{Valid: make([]uint64, 4)}), 38)
	require.Len(t, encodeLine(packedLine(1, 256, 1<<63, 0, 0)), 2089)
	require.Len(t, encodeLine(withSums(packedLine(1, 256, 1<<63, 0, 0))), 3115)
	require.Len(t, encodeLine(Line{Valid: []uint64{1, 0, 0, 0}, Sum: make([]uint32, 256)}), 1066)
}

// FuzzDecodeLine: no value makes decodeLine panic, and whatever it accepts encodes to a value
// that decodes to the same record.
func FuzzDecodeLine(f *testing.F) {
	for _, tt := range lineEncodings {
		v, _ := hex.DecodeString(strings.ReplaceAll(tt.hex, " ", ""))
		f.Add(v)
	}
	f.Add(encodeLine(packedLine(3, 256, 0xffff, 0xff, 0xf00)))
	f.Add(encodeLine(withSums(packedLine(3, 256, 0xffff, 0xff, 0xf00))))
	f.Add(encodeLine(Line{Valid: []uint64{0xffff}, Sum: []uint32{1, 2, 3}}))
	f.Add(encodeLine(Line{Valid: []uint64{0xffff}, Dirty: []uint64{0x3}, Epoch: []uint64{1, 1 << 40}}))
	f.Fuzz(func(t *testing.T, val []byte) {
		l, err := decodeLine(lineKey(7), val)
		if err != nil {
			return
		}
		again, err := decodeLine(lineKey(7), encodeLine(l))
		require.NoError(t, err, "%+v", l)
		require.Equal(t, l, again)
	})
}
