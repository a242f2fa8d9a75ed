package meta

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// lineEncodings are records and their exact encodings. Those without location words are what
// every tierblk since zero blocks wrote, and those without zero blocks too what the first one did:
// a store written by any of them must load unchanged, and records of the slot layout must still be
// written so that they can load it.
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
		})
	}
}

// The encoding of a 1 MiB line of the packed layout, which encodeLine's comment states.
func TestLineEncodingSize(t *testing.T) {
	require.Len(t, encodeLine(Line{Valid: make([]uint64, 4)}), 38)
	require.Len(t, encodeLine(packedLine(1, 256, 1<<63, 0, 0)), 2089)
}

// FuzzDecodeLine: no value makes decodeLine panic, and whatever it accepts encodes to a value
// that decodes to the same record.
func FuzzDecodeLine(f *testing.F) {
	for _, tt := range lineEncodings {
		v, _ := hex.DecodeString(strings.ReplaceAll(tt.hex, " ", ""))
		f.Add(v)
	}
	f.Add(encodeLine(packedLine(3, 256, 0xffff, 0xff, 0xf00)))
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
