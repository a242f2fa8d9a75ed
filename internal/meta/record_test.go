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

// ghostEncodings are ghosts and their exact keys and values.
var ghostEncodings = []struct {
	name     string
	g        Ghost
	key, val string // hex, spaces between fields, for the reader
}{
	{"data", Ghost{Epoch: 1, Line: 2, Block: 3, Sum: 0xdeadbeef, Data: []byte{1, 2, 3}},
		"47 0000000000000001 0000000000000002 00000003", "deadbeef 010203"},
	{"zero block", Ghost{Epoch: 300, Line: 1 << 40, Block: 255},
		"47 000000000000012c 0000010000000000 000000ff", "00000000"},
	{"extreme values", Ghost{Epoch: 1<<64 - 1, Line: 1<<64 - 1, Block: 1<<32 - 1, Sum: 1<<32 - 1, Data: []byte{0}},
		"47 ffffffffffffffff ffffffffffffffff ffffffff", "ffffffff 00"},
}

func TestGhostEncoding(t *testing.T) {
	for _, tt := range ghostEncodings {
		t.Run(tt.name, func(t *testing.T) {
			key, err := hex.DecodeString(strings.ReplaceAll(tt.key, " ", ""))
			require.NoError(t, err)
			val, err := hex.DecodeString(strings.ReplaceAll(tt.val, " ", ""))
			require.NoError(t, err)
			require.Equal(t, key, ghostKey(&tt.g), "key")
			require.Equal(t, val, encodeGhost(&tt.g), "value")
			got, err := decodeGhost(key, val)
			require.NoError(t, err)
			require.Equal(t, tt.g, got, "decoding")
			if tt.g.Data == nil {
				tt.g.Data = []byte{}
				require.Equal(t, val, encodeGhost(&tt.g), "empty data encodes as none")
			}
		})
	}

	full := Ghost{Epoch: 1, Data: make([]byte, MaxGhostData)}
	require.Len(t, encodeGhost(&full), 4100, "encodeGhost's comment")
}

func TestDecodeGhostRejects(t *testing.T) {
	g := Ghost{Epoch: 1, Line: 2, Block: 3, Sum: 4, Data: []byte{5}}
	key, val := ghostKey(&g), encodeGhost(&g)
	lineKeyed := append(lineKey(2), make([]byte, ghostKeyLen-lineKeyLen)...)
	tests := []struct {
		name     string
		key, val []byte
		want     string
	}{
		{"empty key", nil, val, "meta: corrupt ghost, key : key is 0 bytes, want 21 starting with 'G'"},
		{"short key", key[:20], val, "key is 20 bytes, want 21"},
		{"long key", append(append([]byte(nil), key...), 0), val, "key is 22 bytes, want 21"},
		{"a line's prefix", lineKeyed, val, "key 4c" + strings.Repeat("0", 14) + "02" + strings.Repeat("0", 24) + ": key is 21 bytes, want 21 starting with 'G'"},
		{"empty value", key, nil, "value is 0 bytes, shorter than a checksum"},
		{"short value", key, val[:3], "value is 3 bytes, shorter than a checksum"},
		{"too much data", key, make([]byte, 4+MaxGhostData+1), "4097 bytes of data, more than a block's 4096"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeGhost(tt.key, tt.val)
			require.ErrorContains(t, err, "meta: corrupt ghost, key ")
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// FuzzDecodeGhost: no key or value makes decodeGhost panic, and whatever it accepts has that one
// key and value as its encoding.
func FuzzDecodeGhost(f *testing.F) {
	for _, tt := range ghostEncodings {
		key, _ := hex.DecodeString(strings.ReplaceAll(tt.key, " ", ""))
		val, _ := hex.DecodeString(strings.ReplaceAll(tt.val, " ", ""))
		f.Add(key, val)
	}
	f.Add(lineKey(7), []byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, key, val []byte) {
		g, err := decodeGhost(key, val)
		if err != nil {
			return
		}
		require.Equal(t, key, ghostKey(&g))
		require.Equal(t, val, encodeGhost(&g))
		require.True(t, g.Data == nil || len(g.Data) > 0, "a zero block decodes as nil data")
	})
}
