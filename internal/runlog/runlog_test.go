package runlog

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/internal/meta"
)

var id = Identity{Tier: "0123456789abcdef", Epoch: 7}

// sums is the checksum count of the logs of lines of one bitmap word: one a block, of 16 blocks.
const sums = 16

func put(line uint64, slot uint32, valid, dirty uint64) meta.Op {
	op := meta.Op{Rec: meta.Line{Line: line, Slot: slot, Valid: []uint64{valid}}}
	if dirty != 0 {
		op.Rec.Dirty = []uint64{dirty}
	}
	return op
}

func del(line uint64) meta.Op { return meta.Op{Delete: true, Rec: meta.Line{Line: line}} }

func replayAll(t *testing.T, path string, id Identity) ([]meta.Op, error) {
	t.Helper()
	var got []meta.Op
	found, err := Replay(path, id, Shape{Words: 1, Locs: 0, Sums: sums}, func(op meta.Op) error { got = append(got, op); return nil })
	require.True(t, found)
	return got, err
}

// Records come back in order after the watermark, across the ring's wrap, and what the log does
// not hold (a committed record, one never written) never does.
func TestReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	found, err := Replay(path, id, Shape{Words: 1, Locs: 0, Sums: sums}, nil)
	require.NoError(t, err)
	require.False(t, found, "no file: nothing to replay, and no error")

	l, err := Create(path, id, Shape{Words: 1, Locs: 0, Sums: sums}, headerSize+20*int64(RecordSize(Shape{Words: 1, Locs: 0, Sums: sums})))
	require.NoError(t, err)
	defer l.Close()
	var want []meta.Op
	for i := range 15 {
		op := put(uint64(i), uint32(i), 0xf, uint64(i%2))
		if i%3 == 0 {
			op.Rec.Zero = []uint64{0x6}
		}
		if i%5 == 4 {
			op = del(uint64(i - 1))
		}
		l.Append(op)
		want = append(want, op)
	}
	got, err := replayAll(t, path, id)
	require.NoError(t, err)
	require.Equal(t, want, got)

	l.Committed(10)
	for i := range 12 { // wraps the ring of 20
		op := put(100+uint64(i), uint32(i), 1, 1)
		l.Append(op)
		want = append(want, op)
	}
	got, err = replayAll(t, path, id)
	require.NoError(t, err)
	require.Equal(t, want[10:], got)
}

// writeOldLog writes at path the log that an earlier tierblk, of format version v (1: Valid and
// Dirty; 2: Zero too; 3: locs location words too, 0 before version 3; no checksums), left at a
// kill after it appended ops.
func writeOldLog(t *testing.T, path string, v uint32, locs int, ops []meta.Op) {
	t.Helper()
	const words, n = 1, 16
	maps := bitmaps(v)
	rs := recordSize(Shape{Words: words, Locs: locs}, maps)
	b := make([]byte, headerSize+n*rs)
	le := binary.LittleEndian
	copy(b[hMagic:], magic)
	le.PutUint32(b[hVersion:], v)
	le.PutUint32(b[hRecSize:], uint32(rs))
	le.PutUint64(b[hCap:], n)
	le.PutUint64(b[hEpoch:], id.Epoch)
	le.PutUint32(b[hWords:], words)
	le.PutUint32(b[hTierLen:], uint32(len(id.Tier)))
	copy(b[hTier:], id.Tier)
	copy(b[hBoot:], bootID())
	crc := crc32c.Checksum(b[:hCRC]) // the header CRC of versions 1 and 2
	if v == 3 {
		le.PutUint32(b[hLocs:], uint32(locs))
		crc = crc32c.Update(crc, b[hLocs:hLocs+4])
	}
	le.PutUint32(b[hCRC:], crc)
	for i, op := range ops {
		seq := uint64(i + 1)
		r := b[headerSize+int(seq%n)*rs:][:rs]
		le.PutUint64(r[rSeq:], seq)
		le.PutUint64(r[rLine:], op.Rec.Line)
		le.PutUint32(r[rSlot:], op.Rec.Slot)
		if op.Delete {
			le.PutUint32(r[rFlags:], flagDelete)
		} else {
			for m, bits := range [][]uint64{op.Rec.Valid, op.Rec.Dirty, op.Rec.Zero}[:maps] {
				if bits != nil {
					le.PutUint64(r[rBits+8*m:], bits[0])
				}
			}
			for k, loc := range op.Rec.Loc {
				le.PutUint64(r[rBits+8*(maps+k):], loc)
			}
		}
		end := rBits + 8*(maps+locs)
		le.PutUint32(r[end:], crc32c.Checksum(r[:end]))
	}
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

// A log that an earlier tierblk (format version 1: no zero bitmap) left at a kill replays as it
// did, its records without checksums whatever checksum count the tier's lines need.
func TestReplayVersion1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	ops := []meta.Op{put(3, 1, 0xff, 0x0f), del(4), put(5, 2, 0x1, 0)}
	writeOldLog(t, path, 1, 0, ops)
	got, err := replayAll(t, path, id)
	require.NoError(t, err)
	require.Equal(t, ops, got)
	requireReplays(t, path, 1, 0, 0, ops)
}

// requireReplays checks that the log at path replays want for lines of words bitmap words, locs
// location words and sums checksums.
func requireReplays(t *testing.T, path string, words, locs, sums int, want []meta.Op) {
	t.Helper()
	var got []meta.Op
	found, err := Replay(path, id, Shape{Words: words, Locs: locs, Sums: sums}, func(op meta.Op) error { got = append(got, op); return nil })
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, want, got)
}

// A log of format version 2 (zero bitmaps, no location words) replays as it did for a tier of
// the slot layout, and is refused for one of the packed layout, whose records it cannot hold.
func TestReplayVersion2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	zeros := put(6, 3, 0xff, 0x01)
	zeros.Rec.Zero = []uint64{0xf0}
	ops := []meta.Op{put(3, 1, 0xff, 0x0f), del(4), zeros, put(5, 2, 0x1, 0)}
	writeOldLog(t, path, 2, 0, ops)
	got, err := replayAll(t, path, id)
	require.NoError(t, err)
	require.Equal(t, ops, got)
	requireReplays(t, path, 1, 0, 0, ops)

	_, err = Replay(path, id, Shape{Words: 1, Locs: 16, Sums: sums}, func(meta.Op) error { t.Fatal("a refused log replayed a record"); return nil })
	require.ErrorIs(t, err, ErrUnusable)
	require.ErrorContains(t, err, "records of 0 location words, this tier's lines need 16")
}

// A log of format version 3 (location words, no checksums) replays as it did, its records without
// checksums whatever checksum count the tier's lines need.
func TestReplayVersion3(t *testing.T) {
	for _, locs := range []int{0, 16} {
		path := filepath.Join(t.TempDir(), "log")
		ops := []meta.Op{put(3, 1, 0xff, 0x0f), del(4), put(5, 2, 0x1, 0)}
		if locs > 0 {
			ops = []meta.Op{packed(3, 0xff, 0x0f, 0x30), del(4), packed(5, 0x1, 0, 0)}
		}
		writeOldLog(t, path, 3, locs, ops)
		requireReplays(t, path, 1, locs, sums, ops)
		requireReplays(t, path, 1, locs, 0, ops)
		requireReplays(t, path, 1, locs, 256, ops)
	}
}

// packed is the record of a change to a line of the packed layout, of 16 blocks (one bitmap word),
// with a location for each block that is valid and not zero.
func packed(line uint64, valid, dirty, zero uint64) meta.Op {
	op := put(line, 0, valid, dirty)
	if zero != 0 {
		op.Rec.Zero = []uint64{zero}
	}
	op.Rec.Loc = make([]uint64, 16)
	for i := range op.Rec.Loc {
		if (valid&^zero)>>i&1 != 0 {
			op.Rec.Loc[i] = line<<32 | uint64(i)<<8 | 1
		}
	}
	return op
}

// Records of the packed layout carry their location words through the log, across the ring's
// wrap; a record with none set (no blocks stored, or a delete) replays without them, and one that
// the caller gave fewer words than the log holds replays with the rest 0.
func TestReplayLocations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	const locs = 16
	l, err := Create(path, id, Shape{Words: 1, Locs: locs, Sums: sums}, headerSize+20*int64(RecordSize(Shape{Words: 1, Locs: locs, Sums: sums})))
	require.NoError(t, err)
	defer l.Close()
	replay := func() []meta.Op {
		var got []meta.Op
		found, err := Replay(path, id, Shape{Words: 1, Locs: locs, Sums: sums}, func(op meta.Op) error { got = append(got, op); return nil })
		require.NoError(t, err)
		require.True(t, found)
		return got
	}

	short := packed(9, 0x3, 0, 0)
	short.Rec.Loc = short.Rec.Loc[:2]
	wantShort := packed(9, 0x3, 0, 0)
	noLocs := packed(10, 0xf, 0x1, 0xf) // all zero blocks: nothing stored
	var want []meta.Op
	for i := range 12 {
		op := packed(uint64(i), 0xffff>>i, 0x3>>(i%3), 0x100>>i)
		want = append(want, op)
		l.Append(op)
	}
	for _, op := range []meta.Op{short, noLocs, del(11)} {
		l.Append(op)
	}
	noLocs.Rec.Loc = nil
	want = append(want, wantShort, noLocs, del(11))
	require.Equal(t, want, replay())

	l.Committed(10)
	for i := range 12 { // wraps the ring of 20
		op := packed(100+uint64(i), 0xff00|uint64(i), 0, 0)
		want = append(want, op)
		l.Append(op)
	}
	require.Equal(t, want[10:], replay())
}

// withSums gives op a checksum for each block that has a location word.
func withSums(op meta.Op) meta.Op {
	op.Rec.Sum = make([]uint32, len(op.Rec.Loc))
	for i, loc := range op.Rec.Loc {
		if loc != 0 {
			op.Rec.Sum[i] = uint32(loc>>8) | 0xc5<<24
		}
	}
	return op
}

// Records carry their checksums through the log, in either layout, across the ring's wrap; a
// record with none set (no blocks stored, a record without checksums, or a delete) replays
// without them, one that the caller gave fewer than the log holds replays with the rest 0, and one
// given more replays with those the log holds.
func TestReplaySums(t *testing.T) {
	for _, locs := range []int{0, 16} {
		t.Run(fmt.Sprintf("locs=%d", locs), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			l, err := Create(path, id, Shape{Words: 1, Locs: locs, Sums: sums}, headerSize+20*int64(RecordSize(Shape{Words: 1, Locs: locs, Sums: sums})))
			require.NoError(t, err)
			defer l.Close()
			// rec is the record of a change, and what it replays as: with location words in
			// the packed layout only.
			rec := func(op meta.Op) (meta.Op, meta.Op) {
				if locs == 0 {
					op.Rec.Loc = nil
				}
				return op, op
			}
			var want []meta.Op
			appendOp := func(op, replayed meta.Op) {
				l.Append(op)
				want = append(want, replayed)
			}
			for i := range 12 {
				appendOp(rec(withSums(packed(uint64(i), 0xffff>>i, 0x3>>(i%3), 0x100>>i))))
			}
			short, wantShort := rec(withSums(packed(20, 0x7, 0, 0)))
			short.Rec.Sum = short.Rec.Sum[:2]
			wantShort.Rec.Sum = append(short.Rec.Sum[:2:2], make([]uint32, sums-2)...)
			appendOp(short, wantShort)
			long, wantLong := rec(withSums(packed(21, 0x1, 0, 0)))
			long.Rec.Sum = append(long.Rec.Sum, 0xabc)
			appendOp(long, wantLong)
			none, wantNone := rec(withSums(packed(22, 0xf, 0x1, 0xf))) // all zero blocks: nothing stored
			wantNone.Rec.Sum = nil
			if locs > 0 {
				wantNone.Rec.Loc = nil
			}
			appendOp(none, wantNone)
			appendOp(rec(packed(23, 0x3, 0, 0))) // no checksums
			appendOp(del(11), del(11))
			requireReplays(t, path, 1, locs, sums, want)

			l.Committed(10)
			for i := range 12 { // wraps the ring of 20
				appendOp(rec(withSums(packed(100+uint64(i), 0xff00|uint64(i), 0, 0))))
			}
			requireReplays(t, path, 1, locs, sums, want[10:])
		})
	}
}

// A log's records hold as many location words and checksums as the lines it was created for: a
// tier whose lines need another number is refused, and a damaged count fails the header's CRC.
func TestRefusedCounts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		locs   int // the log's
		header int // the header's field of the count
		with   func(n int) (locs, sums int)
		want   string
	}{
		{"location words", 16, hLocs, func(n int) (int, int) { return n, sums }, "records of 16 location words, this tier's lines need %d"},
		{"checksums", 0, hSums, func(n int) (int, int) { return 0, n }, "records of 16 checksums, this tier's lines need %d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			l, err := Create(path, id, Shape{Words: 1, Locs: tc.locs, Sums: sums}, 0)
			require.NoError(t, err)
			l.Append(packed(1, 1, 1, 0))
			require.NoError(t, l.Close())
			for _, n := range []int{0, 64} {
				locs, s := tc.with(n)
				_, err := Replay(path, id, Shape{Words: 1, Locs: locs, Sums: s}, func(meta.Op) error { t.Fatal("a refused log replayed a record"); return nil })
				require.ErrorIs(t, err, ErrUnusable)
				require.ErrorContains(t, err, fmt.Sprintf(tc.want, n))
			}
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			b[tc.header] = 64
			require.NoError(t, os.WriteFile(path, b, 0o600))
			locs, s := tc.with(64)
			_, err = Replay(path, id, Shape{Words: 1, Locs: locs, Sums: s}, func(meta.Op) error { return nil })
			require.ErrorIs(t, err, ErrUnusable)
			require.ErrorContains(t, err, "its header is damaged")
		})
	}
}

// The record sizes DefaultSize's comment states, and how many records the default log holds; every
// record size is a multiple of 8.
func TestRecordSize(t *testing.T) {
	for _, tt := range []struct {
		name                    string
		words, locs, sums, size int
		records                 int64
	}{
		{"64 KiB lines", 1, 0, 16, 120, 139_776},
		{"64 KiB lines, packed", 1, 16, 16, 248, 67_633},
		{"1 MiB lines", 4, 0, 256, 1152, 14_560},
		{"1 MiB lines, packed", 4, 256, 256, 3200, 5_241},
		{"odd checksum count", 1, 0, 3, 64, 262_080},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rs := RecordSize(Shape{Words: tt.words, Locs: tt.locs, Sums: tt.sums})
			require.Equal(t, tt.size, rs)
			require.Zero(t, rs%8)
			require.Equal(t, tt.records, (DefaultSize-headerSize)/int64(rs))
		})
	}
}

// A record torn by a kill in the middle of its copy ends the replay: it and what follows are
// ignored, what precedes it is replayed.
func TestTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Create(path, id, Shape{Words: 1, Locs: 0, Sums: sums}, 0)
	require.NoError(t, err)
	for i := range 5 {
		op := put(uint64(i), uint32(i), 1, 1)
		op.Rec.Sum = []uint32{uint32(i) + 1}
		l.Append(op)
	}
	require.NoError(t, l.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	rs := RecordSize(Shape{Words: 1, Locs: 0, Sums: sums})
	for _, off := range []int{rBits, rBits + 8, rLine, rSlot, rBits + 24, rBits + 24 + 4*sums - 1} {
		c := append([]byte(nil), b...)
		c[headerSize+4*rs+off] ^= 0x40 // record 4: a byte the kill left half written
		require.NoError(t, os.WriteFile(path, c, 0o600))
		got, err := replayAll(t, path, id)
		require.NoError(t, err)
		require.Len(t, got, 3, "records 1 to 3")
	}
}

// A log written for another SSD tier, another run of this one or before the last boot, or one whose
// ring overflowed since the last checkpoint, is refused before anything is replayed.
func TestRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Create(path, id, Shape{Words: 1, Locs: 0, Sums: sums}, headerSize+16*int64(RecordSize(Shape{Words: 1, Locs: 0, Sums: sums})))
	require.NoError(t, err)
	defer l.Close()
	l.Append(put(1, 1, 1, 1))
	for _, other := range []Identity{{Tier: "another", Epoch: id.Epoch}, {Tier: id.Tier, Epoch: id.Epoch + 1}} {
		_, err := replayAll(t, path, other)
		require.ErrorIs(t, err, ErrUnusable, "%+v", other)
	}
	_, err = Replay(path, id, Shape{Words: 2, Locs: 0, Sums: sums}, func(meta.Op) error { return nil })
	require.ErrorIs(t, err, ErrUnusable, "other line size")

	for i := range 20 {
		l.Append(put(uint64(i), 1, 1, 1))
	}
	_, err = replayAll(t, path, id)
	require.ErrorIs(t, err, ErrUnusable, "a full ring lost records")
	l.Committed(l.Last())
	got, err := replayAll(t, path, id)
	require.NoError(t, err, "a checkpoint past the lost records makes the log usable again")
	require.Empty(t, got)
	l.Append(put(9, 9, 1, 0))
	got, err = replayAll(t, path, id)
	require.NoError(t, err)
	require.Equal(t, []meta.Op{put(9, 9, 1, 0)}, got)

	b, _ := os.ReadFile(path)
	b[hBoot] ^= 1 // another boot's
	crc := headerCRC(b, version)
	binary.LittleEndian.PutUint32(b[hCRC:], crc)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	_, err = replayAll(t, path, id)
	require.ErrorIs(t, err, ErrUnusable, "another boot")
	require.ErrorContains(t, err, "before the machine last booted")

	b[hTier] ^= 1
	require.NoError(t, os.WriteFile(path, b, 0o600))
	_, err = replayAll(t, path, id)
	require.ErrorIs(t, err, ErrUnusable, "damaged header")
}

// The cost of logging a change: an append to the mapping, and for comparison a pwrite of the same
// record to a file on tmpfs.
func BenchmarkAppend(b *testing.B) {
	dir := b.TempDir()
	if _, err := os.Stat("/dev/shm"); err == nil {
		dir, _ = os.MkdirTemp("/dev/shm", "runlog")
		defer os.RemoveAll(dir)
	}
	op := put(12345, 678, 0xffff, 0xff)
	b.Run("mmap", func(b *testing.B) {
		l, err := Create(filepath.Join(dir, "mmap"), id, Shape{Words: 1, Sums: sums}, 0)
		require.NoError(b, err)
		defer l.Close()
		for b.Loop() {
			if l.Append(op) {
				l.Committed(l.Last())
			}
		}
	})
	// The largest record: a 1 MiB line of the packed layout, 4 words of bits, 256 locations and
	// 256 checksums.
	b.Run("mmap-packed-1MiB", func(b *testing.B) {
		l, err := Create(filepath.Join(dir, "packed"), id, Shape{Words: 4, Locs: 256, Sums: 256}, 0)
		require.NoError(b, err)
		defer l.Close()
		all := ^uint64(0)
		op := meta.Op{Rec: meta.Line{Line: 12345, Valid: []uint64{all, all, all, all}, Loc: make([]uint64, 256), Sum: make([]uint32, 256)}}
		for i := range op.Rec.Loc {
			op.Rec.Loc[i] = uint64(i + 1)
			op.Rec.Sum[i] = uint32(i + 1)
		}
		for b.Loop() {
			if l.Append(op) {
				l.Committed(l.Last())
			}
		}
	})
	b.Run("pwrite", func(b *testing.B) {
		f, err := os.Create(filepath.Join(dir, "pwrite"))
		require.NoError(b, err)
		defer f.Close()
		rec := make([]byte, RecordSize(Shape{Words: 1, Locs: 0, Sums: sums}))
		var off int64
		for b.Loop() {
			if _, err := f.WriteAt(rec, off); err != nil {
				b.Fatal(err)
			}
			off = (off + int64(len(rec))) % DefaultSize
		}
	})
}

// Records of write-back in FLUSH order carry their dirty blocks' epochs through the log, across the
// ring's wrap; a record without dirty blocks replays without them. A log written without epochs
// (address order) replays its records without them whatever the reader's shape asks, and one
// with them replays them to a reader that asks for none.
func TestReplayEpochs(t *testing.T) {
	const blocks = 16
	withEpochs := Shape{Words: 1, Sums: sums, Epochs: blocks}
	rec := func(line uint64, dirty uint64, epoch uint64) meta.Op {
		op := meta.Op{Rec: meta.Line{Line: line, Slot: uint32(line), Valid: []uint64{0xffff}}}
		if dirty != 0 {
			op.Rec.Dirty = []uint64{dirty}
			op.Rec.Epoch = make([]uint64, blocks)
			for b := range blocks {
				if dirty&(1<<b) != 0 {
					op.Rec.Epoch[b] = epoch + uint64(b%2) // two epochs in a line
				}
			}
		}
		return op
	}
	replay := func(path string, s Shape) []meta.Op {
		var got []meta.Op
		found, err := Replay(path, id, s, func(op meta.Op) error { got = append(got, op); return nil })
		require.NoError(t, err)
		require.True(t, found)
		return got
	}

	path := filepath.Join(t.TempDir(), "log")
	l, err := Create(path, id, withEpochs, headerSize+20*int64(RecordSize(withEpochs)))
	require.NoError(t, err)
	defer l.Close()
	var want []meta.Op
	for i := range 30 { // wraps the ring of 20
		op := rec(uint64(i), 0xffff>>(i%17), 1<<40+uint64(i))
		want = append(want, op)
		l.Append(op)
		if i == 15 {
			l.Committed(12)
		}
	}
	require.Equal(t, want[12:], replay(path, withEpochs))
	noEpochs := replay(path, Shape{Words: 1, Sums: sums})
	require.Len(t, noEpochs, 18)
	require.Equal(t, want[12].Rec.Epoch, noEpochs[0].Rec.Epoch, "a reader that asks for none still gets them")

	plain := filepath.Join(t.TempDir(), "plain")
	l2, err := Create(plain, id, Shape{Words: 1, Sums: sums}, 0)
	require.NoError(t, err)
	defer l2.Close()
	l2.Append(rec(3, 0x5, 9))
	got := replay(plain, withEpochs)
	require.Len(t, got, 1)
	require.Nil(t, got[0].Rec.Epoch, "a log without epochs replays records without them")
	require.Equal(t, []uint64{0x5}, got[0].Rec.Dirty)
}
