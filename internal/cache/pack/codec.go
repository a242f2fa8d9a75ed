package pack

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/klauspost/compress/s2"
)

// compressedMax is the largest a compressed unit may be: one larger is stored as it is.
const compressedMax = blockSize * 7 / 8

// ScratchSize is the size of the scratch buffer Encode needs.
func ScratchSize() int { return s2.MaxEncodedLen(blockSize) }

// Encode returns the unit of block src (a whole block) and its codec: src compressed with S2 into
// scratch (ScratchSize bytes), or src itself, stored as it is, when S2 does not bring it under 7/8
// of its size or a sample of its bytes looks random (Incompressible, which spares the failed
// compression). A unit stored as it is is read back without decoding.
func Encode(scratch, src []byte) (unit []byte, codec int) {
	if Incompressible(src) {
		return src, Raw
	}
	if enc := s2.Encode(scratch, src); len(enc) <= compressedMax {
		return enc, S2
	}
	return src, Raw
}

// Decode writes the block unit l holds into dst (a whole block).
func Decode(dst, unit []byte, l uint64) error {
	if Codec(l) == Raw {
		copy(dst, unit)
		return nil
	}
	n, err := s2.DecodedLen(unit)
	if err == nil && n != len(dst) {
		err = fmt.Errorf("%d bytes, want %d", n, len(dst))
	}
	if err == nil {
		_, err = s2.Decode(dst, unit)
	}
	if err != nil {
		return fmt.Errorf("SSD tier: a compressed block at %d does not decode: %w", Off(l), err)
	}
	return nil
}

// Incompressible reports whether block b looks like random bytes, which S2 would fail to compress:
// sampled 16 bytes in every 256, it has more distinct byte values than data that compresses ever
// shows. Text and code have far fewer; a failed compression costs several times the sampling. The
// samples keep away from the starts of sectors, where file systems put headers and fio its
// offsets (which would make random data look ordered). The cache's TestIncompressible checks both
// ways; bench cache --parts reduction's physical bytes show what it gives up on real files.
func Incompressible(b []byte) bool {
	var m0, m1 [4]uint64 // two sets, for two independent chains of updates
	for off := 100; off+16 <= len(b); off += 256 {
		x, y := binary.LittleEndian.Uint64(b[off:]), binary.LittleEndian.Uint64(b[off+8:])
		for k := 0; k < 64; k += 8 {
			c, d := byte(x>>k), byte(y>>k)
			m0[c>>6] |= 1 << (c & 63)
			m1[d>>6] |= 1 << (d & 63)
		}
	}
	n := 0
	for i := range m0 {
		n += bits.OnesCount64(m0[i] | m1[i])
	}
	return n > incompressibleDistinct
}

// incompressibleDistinct is the most distinct byte values among the 256 bytes Incompressible
// samples of a block that still gets compressed. Random bytes show far more (the cache's
// TestIncompressible).
const incompressibleDistinct = 120
