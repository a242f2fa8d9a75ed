package meta

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrClosed is returned by every Store method called after Close.
var ErrClosed = errors.New("meta: store is closed")

// ErrTooBig is returned by Commit for a commit that holds more ops than the store writes in one
// transaction; nothing of it was applied. CommitParts splits such a commit.
var ErrTooBig = errors.New("meta: commit is larger than one metadata transaction")

// checkOps rejects a commit that would store a record the engine must never read back: dirty bits
// for blocks that are not valid would make a restart destage garbage, and zero bits for blocks that
// are not valid would make it serve zeros for data it does not hold.
func checkOps(ops []Op) error {
	for i, op := range ops {
		if op.Delete {
			continue
		}
		for _, sub := range []struct {
			name  string
			words []uint64
		}{{"dirty", op.Rec.Dirty}, {"zero", op.Rec.Zero}} {
			for w, d := range sub.words {
				var v uint64
				if w < len(op.Rec.Valid) {
					v = op.Rec.Valid[w]
				}
				if d&^v != 0 {
					return fmt.Errorf("meta: op %d: line %d has %s blocks that are not valid (word %d: %s %#x, valid %#x)",
						i, op.Rec.Line, sub.name, w, sub.name, d, v)
				}
			}
		}
	}
	return nil
}

// cloneLine copies l's bitmaps so that a store never shares memory with its callers; empty bitmaps
// become nil, as they read back from disk.
func cloneLine(l Line) Line {
	l.Valid = cloneWords(l.Valid)
	l.Dirty = cloneWords(l.Dirty)
	l.Zero = cloneWords(l.Zero)
	return l
}

func cloneWords(w []uint64) []uint64 {
	if len(w) == 0 {
		return nil
	}
	return append([]uint64(nil), w...)
}

// Keys are a prefix byte and, for lines, the big-endian line number, so that badger's key order is
// line order.
const (
	linePrefix       = 'L'
	superblockPrefix = 'S'
	lineKeyLen       = 9
)

var superblockKey = []byte{superblockPrefix}

func lineKey(line uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{linePrefix}, line)
}

// encodeLine encodes a record's value: slot (4 bytes, big-endian), the word counts of Valid and
// Dirty (uvarints), then the words (8 bytes each, big-endian). A 1 MiB line with a clean record
// takes 38 bytes. A record with zero blocks ends with the word count of Zero (a uvarint) and its
// words: one without any encodes as records did before zero blocks, so that a store written by an
// earlier tierblk loads as it was (and an earlier tierblk refuses a record with zero blocks as
// corrupt rather than read the blocks from the slot).
func encodeLine(l Line) []byte {
	v := make([]byte, 0, 4+3*binary.MaxVarintLen16+8*(len(l.Valid)+len(l.Dirty)+len(l.Zero)))
	v = binary.BigEndian.AppendUint32(v, l.Slot)
	v = binary.AppendUvarint(v, uint64(len(l.Valid)))
	v = binary.AppendUvarint(v, uint64(len(l.Dirty)))
	for _, w := range l.Valid {
		v = binary.BigEndian.AppendUint64(v, w)
	}
	for _, w := range l.Dirty {
		v = binary.BigEndian.AppendUint64(v, w)
	}
	if len(l.Zero) > 0 {
		v = binary.AppendUvarint(v, uint64(len(l.Zero)))
		for _, w := range l.Zero {
			v = binary.BigEndian.AppendUint64(v, w)
		}
	}
	return v
}

// decodeLine decodes the record stored under key; it copies what it keeps, so key and val may be
// reused by the caller.
func decodeLine(key, val []byte) (Line, error) {
	l, err := decodeLineValue(key, val)
	if err != nil {
		return Line{}, fmt.Errorf("meta: corrupt line record, key %x: %w", key, err)
	}
	return l, nil
}

func decodeLineValue(key, val []byte) (Line, error) {
	if len(key) != lineKeyLen || key[0] != linePrefix {
		return Line{}, fmt.Errorf("key is %d bytes, want %d starting with %q", len(key), lineKeyLen, linePrefix)
	}
	l := Line{Line: binary.BigEndian.Uint64(key[1:])}
	if len(val) < 4 {
		return Line{}, fmt.Errorf("value is %d bytes, shorter than a slot number", len(val))
	}
	l.Slot = binary.BigEndian.Uint32(val)
	rest := val[4:]
	var counts [2]uint64
	for i := range counts {
		n, size := binary.Uvarint(rest)
		if size <= 0 {
			return Line{}, fmt.Errorf("bad bitmap word count at value byte %d", len(val)-len(rest))
		}
		counts[i], rest = n, rest[size:]
	}
	if words := uint64(len(rest) / 8); counts[0] > words || counts[1] > words-counts[0] {
		return Line{}, fmt.Errorf("%d bytes of bitmaps for %d valid and %d dirty words", len(rest), counts[0], counts[1])
	}
	l.Valid, rest = decodeWords(rest, counts[0])
	l.Dirty, rest = decodeWords(rest, counts[1])
	if len(rest) == 0 {
		return l, nil
	}
	n, size := binary.Uvarint(rest)
	if size <= 0 || n == 0 || n > uint64(len(rest))/8 || uint64(len(rest)-size) != 8*n {
		return Line{}, fmt.Errorf("%d bytes after the valid and dirty bitmaps are no zero bitmap", len(rest))
	}
	l.Zero, _ = decodeWords(rest[size:], n)
	return l, nil
}

func decodeWords(b []byte, n uint64) ([]uint64, []byte) {
	if n == 0 {
		return nil, b
	}
	w := make([]uint64, n)
	for i := range w {
		w[i] = binary.BigEndian.Uint64(b[8*i:])
	}
	return w, b[8*n:]
}
