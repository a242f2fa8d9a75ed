package pack

import (
	"bytes"
	"testing"
)

// TestLocRoundTrip: a location word gives back what it was made of, and Mutable changes nothing
// else.
func TestLocRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		off   int64
		n     int
		codec int
	}{{0, 1, S2}, {4096, blockSize, Raw}, {1 << 40, 1234, S2}} {
		l := Loc(tc.off, tc.n, tc.codec)
		for _, l := range []uint64{l, l | Mutable} {
			if Off(l) != tc.off || Len(l) != tc.n || Codec(l) != tc.codec {
				t.Errorf("%#x: off %d len %d codec %d, want %d %d %d", l, Off(l), Len(l), Codec(l), tc.off, tc.n, tc.codec)
			}
		}
		if IsMutable(l) || !IsMutable(l|Mutable) {
			t.Errorf("%#x: IsMutable wrong", l)
		}
	}
}

// TestEncodeDecode: a block that compresses is stored with S2 and one that does not as it is, and
// either decodes to the block.
func TestEncodeDecode(t *testing.T) {
	text := bytes.Repeat([]byte("the packed layout of the SSD tier "), blockSize)[:blockSize]
	random := make([]byte, blockSize)
	x := uint64(1)
	for i := range random {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		random[i] = byte(x)
	}
	scratch := make([]byte, ScratchSize())
	for _, tc := range []struct {
		name  string
		b     []byte
		codec int
	}{{"text", text, S2}, {"random", random, Raw}} {
		unit, codec := Encode(scratch, tc.b)
		if codec != tc.codec {
			t.Fatalf("%s: codec %d, want %d", tc.name, codec, tc.codec)
		}
		dst := make([]byte, blockSize)
		if err := Decode(dst, unit, Loc(0, len(unit), codec)); err != nil || !bytes.Equal(dst, tc.b) {
			t.Fatalf("%s: does not decode to the block (%v)", tc.name, err)
		}
	}
	if err := Decode(make([]byte, blockSize), []byte{1, 2, 3}, Loc(0, 3, S2)); err == nil {
		t.Fatal("a damaged unit decodes")
	}
}

// TestDedupeTable: the table forgets a unit that dies, follows one that moves, keeps the older unit
// of a hash, and holds no more than its bound.
func TestDedupeTable(t *testing.T) {
	d := NewDedupe(2)
	d.Remember(1, 10)
	d.Remember(1, 11)
	if d.Lookup(1) != 10 {
		t.Fatal("a second unit with a hash replaced the first")
	}
	d.Moved(10, 12)
	if d.Lookup(1) != 12 {
		t.Fatal("the table does not follow a moved unit")
	}
	d.Forget(12)
	if d.Lookup(1) != 0 {
		t.Fatal("the table names a dead unit")
	}
	for h := uint64(1); h <= 3; h++ {
		d.Remember(h, 20+h)
	}
	if len(d.byHash) != 2 || len(d.byUnit) != 2 {
		t.Fatalf("%d entries, %d units: want 2", len(d.byHash), len(d.byUnit))
	}
}
