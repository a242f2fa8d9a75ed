package runlog

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/meta"
)

var id = Identity{Tier: "0123456789abcdef", Epoch: 7}

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
	found, err := Replay(path, id, 1, func(op meta.Op) error { got = append(got, op); return nil })
	require.True(t, found)
	return got, err
}

// Records come back in order after the watermark, across the ring's wrap, and what the log does
// not hold (a committed record, one never written) never does.
func TestReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	found, err := Replay(path, id, 1, nil)
	require.NoError(t, err)
	require.False(t, found, "no file: nothing to replay, and no error")

	l, err := Create(path, id, 1, headerSize+20*int64(RecordSize(1)))
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

// A log that an earlier tierblk (format version 1: no zero bitmap) left at a kill replays as it
// did.
func TestReplayVersion1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	ops := []meta.Op{put(3, 1, 0xff, 0x0f), del(4), put(5, 2, 0x1, 0)}
	const words, n = 1, 16
	rs := recordSize(words, 2)
	b := make([]byte, headerSize+n*rs)
	le := binary.LittleEndian
	copy(b[hMagic:], magic)
	le.PutUint32(b[hVersion:], 1)
	le.PutUint32(b[hRecSize:], uint32(rs))
	le.PutUint64(b[hCap:], n)
	le.PutUint64(b[hEpoch:], id.Epoch)
	le.PutUint32(b[hWords:], words)
	le.PutUint32(b[hTierLen:], uint32(len(id.Tier)))
	copy(b[hTier:], id.Tier)
	copy(b[hBoot:], bootID())
	le.PutUint32(b[hCRC:], crc32.Checksum(b[:hCRC], castagnoli))
	for i, op := range ops {
		seq := uint64(i + 1)
		r := b[headerSize+int(seq%n)*rs:][:rs]
		le.PutUint64(r[rSeq:], seq)
		le.PutUint64(r[rLine:], op.Rec.Line)
		le.PutUint32(r[rSlot:], op.Rec.Slot)
		if op.Delete {
			le.PutUint32(r[rFlags:], flagDelete)
		} else {
			le.PutUint64(r[rBits:], op.Rec.Valid[0])
			if op.Rec.Dirty != nil {
				le.PutUint64(r[rBits+8:], op.Rec.Dirty[0])
			}
		}
		le.PutUint32(r[rBits+16:], crc32.Checksum(r[:rBits+16], castagnoli))
	}
	require.NoError(t, os.WriteFile(path, b, 0o600))
	got, err := replayAll(t, path, id)
	require.NoError(t, err)
	require.Equal(t, ops, got)
}

// A record torn by a kill in the middle of its copy ends the replay: it and what follows are
// ignored, what precedes it is replayed.
func TestTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Create(path, id, 1, 0)
	require.NoError(t, err)
	for i := range 5 {
		l.Append(put(uint64(i), uint32(i), 1, 1))
	}
	require.NoError(t, l.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	rs := RecordSize(1)
	for _, off := range []int{rBits, rBits + 8, rLine, rSlot} {
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
	l, err := Create(path, id, 1, headerSize+16*int64(RecordSize(1)))
	require.NoError(t, err)
	defer l.Close()
	l.Append(put(1, 1, 1, 1))
	for _, other := range []Identity{{Tier: "another", Epoch: id.Epoch}, {Tier: id.Tier, Epoch: id.Epoch + 1}} {
		_, err := replayAll(t, path, other)
		require.ErrorIs(t, err, ErrUnusable, "%+v", other)
	}
	_, err = Replay(path, id, 2, func(meta.Op) error { return nil })
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
	crc := crc32.Checksum(b[:hCRC], castagnoli)
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
		l, err := Create(filepath.Join(dir, "mmap"), id, 1, 0)
		require.NoError(b, err)
		defer l.Close()
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
		rec := make([]byte, RecordSize(1))
		var off int64
		for b.Loop() {
			if _, err := f.WriteAt(rec, off); err != nil {
				b.Fatal(err)
			}
			off = (off + int64(len(rec))) % DefaultSize
		}
	})
}
