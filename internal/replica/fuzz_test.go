package replica

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

const (
	fuzzID  = 0x1234_5678_9abc_def0
	fuzzVol = 1 << 20
)

// fuzzDevice makes the device FuzzReader reads. withSuper: a valid superblock whose tail is at
// tailSector of the record area, and data laid from the tail on, wrapping at the area's end; else
// data from offset 0, superblocks included, on a device of the least size a log has. resign
// recomputes the checksums of whatever looks like a record header in data, at each sector, so
// that the fuzzer gets past them to the fields they guard.
func fuzzDevice(data []byte, withSuper, resign bool, tailSector uint16) *mem.Mem {
	dev := mem.New(minDev)
	if !withSuper {
		_, _ = dev.WriteAt(data[:min(len(data), minDev)], 0)
		return dev
	}
	tail := areaStart + int64(tailSector)%(minArea/sector)*sector
	s := super{gen: 1, id: fuzzID, volumeSize: fuzzVol, deviceSize: minDev, tail: Position{Seq: 1, Pos: tail}}
	_, _ = dev.WriteAt(s.encode(), 0)
	data = data[:min(len(data), minArea)]
	if resign {
		data = bytes.Clone(data)
		for i := 0; i+hdrSize <= len(data); i += sector {
			h := data[i : i+hdrSize]
			if binary.LittleEndian.Uint32(h[rMagic:]) != recMagic {
				continue
			}
			if n := binary.LittleEndian.Uint64(h[rDataLen:]); n <= uint64(len(data)-i-hdrSize) {
				binary.LittleEndian.PutUint32(h[rDataCRC:], crc32c.Checksum(data[i+hdrSize:i+hdrSize+int(n)]))
			}
			binary.LittleEndian.PutUint32(h[rHdrCRC:], crc32c.Checksum(h[:rHdrCRC]))
		}
	}
	first := min(int64(len(data)), minDev-tail)
	_, _ = dev.WriteAt(data[:first], tail)
	_, _ = dev.WriteAt(data[first:], areaStart)
	return dev
}

// fuzzRecords encodes ops as consecutive records of the fuzz log from seq 1.
func fuzzRecords(ops []op) []byte {
	var out []byte
	for i, o := range ops {
		buf := make([]byte, recordSize(int64(len(o.data))))
		encodeRecord(buf, fuzzID, uint64(i+1), o.kind, o.off, o.len, o.data)
		out = append(out, buf...)
	}
	return out
}

var fuzzOps = []op{
	{kind: KindWrite, off: 10, len: 5, data: []byte("hello")},
	{kind: KindTrim, off: 0, len: 4096},
	{kind: KindZero, off: 512, len: 512},
	{kind: KindFlush},
	{kind: KindWrite, off: fuzzVol - 600, len: 600, data: make([]byte, 600)},
}

// TestFuzzSeedsRead checks that the fuzz harness's seeds mean what they should: the records laid
// from the tail read back, across the area's end too.
func TestFuzzSeedsRead(t *testing.T) {
	recs := fuzzRecords(fuzzOps)
	for _, tail := range []uint16{0, 100, minArea/sector - 2} {
		dev := fuzzDevice(recs, true, false, tail)
		got := readAll(t, dev)
		require.Len(t, got, len(fuzzOps), "tail sector %d", tail)
		for i, o := range fuzzOps {
			assert.Equal(t, normalize([]Record{o.record(uint64(i + 1))}), normalize(got[i:i+1]))
		}
	}
}

// FuzzReader reads arbitrary bytes as a log device: Open and Next must neither panic nor run on
// forever, and whatever Next returns must be consistent.
func FuzzReader(f *testing.F) {
	recs := fuzzRecords(fuzzOps)
	f.Add(recs, true, false, uint16(0))
	f.Add(recs, true, true, uint16(0))
	f.Add(recs, true, false, uint16(minArea/sector-2)) // the third record wraps to the start
	f.Add(recs[:len(recs)-100], true, false, uint16(7))
	f.Add([]byte{}, true, false, uint16(3))
	f.Add([]byte{}, false, false, uint16(0))
	f.Add([]byte(sbMagic), false, false, uint16(0))

	// A whole image as Create and Write leave it: superblocks and records.
	dev := mem.New(minDev)
	l, err := Create(dev, fuzzVol)
	require.NoError(f, err)
	for _, o := range fuzzOps {
		tk, err := l.Reserve(f.Context(), o.kind, o.off, o.len, len(o.data))
		require.NoError(f, err)
		require.NoError(f, l.Write(tk, o.data))
	}
	img := make([]byte, areaStart+len(recs))
	_, err = dev.ReadAt(img, 0)
	require.NoError(f, err)
	f.Add(img, false, false, uint16(0))

	f.Fuzz(func(t *testing.T, data []byte, withSuper, resign bool, tailSector uint16) {
		dev := fuzzDevice(data, withSuper, resign, tailSector)
		r, err := Open(dev)
		if err != nil {
			return
		}
		// Each record takes a sector at least and has its own seq, so a log cannot hold more
		// records than the area has sectors.
		limit := minArea / sector
		prev := r.End()
		for i := 0; ; i++ {
			if i > limit {
				t.Fatalf("Next returned more than %d records", limit)
			}
			rec, err := r.Next()
			if err != nil {
				return // io.EOF, or a damaged log: either ends the read
			}
			if rec.Seq != prev.Seq || r.End().Seq != rec.Seq+1 || !rec.Kind.valid() ||
				rec.Off < 0 || rec.Len < 0 || rec.Off+rec.Len > r.VolumeSize() {
				t.Fatalf("inconsistent record %+v after %+v", rec, prev)
			}
			wantData := int64(0)
			if rec.Kind == KindWrite {
				wantData = rec.Len
			}
			if int64(len(rec.Data)) != wantData {
				t.Fatalf("%s record of %d bytes with %d of data", rec.Kind, rec.Len, len(rec.Data))
			}
			prev = r.End()
		}
	})
}
