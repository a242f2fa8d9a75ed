package meta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// ErrClosed is returned by every Store method called after Close.
var ErrClosed = errors.New("meta: store is closed")

// ErrTooBig is returned by Commit for a commit that holds more ops than the store writes in one
// transaction; nothing of it was applied. CommitParts splits such a commit.
var ErrTooBig = errors.New("meta: commit is larger than one metadata transaction")

// checkOps rejects a commit that would store a record the engine must never read back: dirty bits
// for blocks that are not valid would make a restart destage garbage, and zero bits for blocks that
// are not valid would make it serve zeros for data it does not hold. In the packed layout (Loc not
// nil) a location for a block that is not valid, or that is a zero block, would make it read bytes
// the line does not hold, and a valid block that is not zero without one could not be read at all.
// A checksum for a block whose bytes are not on the SSD (not valid, or a zero block) would be
// checked against bytes the block does not have. A ghost with more data than a block holds is no
// block's older version.
func checkOps(ops []Op) error {
	for i, op := range ops {
		if g := op.Ghost; g != nil {
			if !op.Delete && len(g.Data) > MaxGhostData {
				return fmt.Errorf("meta: op %d: the ghost of line %d block %d, epoch %d, has %d bytes of data, more than a block's %d",
					i, g.Line, g.Block, g.Epoch, len(g.Data), MaxGhostData)
			}
			continue
		}
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
		if op.Rec.Loc != nil {
			if err := checkLoc(op.Rec); err != nil {
				return fmt.Errorf("meta: op %d: line %d %w", i, op.Rec.Line, err)
			}
		}
		if err := checkSum(op.Rec); err != nil {
			return fmt.Errorf("meta: op %d: line %d %w", i, op.Rec.Line, err)
		}
		if err := checkEpoch(op.Rec); err != nil {
			return fmt.Errorf("meta: op %d: line %d %w", i, op.Rec.Line, err)
		}
	}
	return nil
}

// checkEpoch checks that l.Epoch, if any, is nonzero exactly for the dirty blocks: a restart
// writes every dirty block back in its epoch's turn, and needs one for each.
func checkEpoch(l Line) error {
	if l.Epoch == nil {
		return nil
	}
	for block, ep := range l.Epoch {
		w, bit := block/64, uint64(1)<<(block%64)
		dirty := w < len(l.Dirty) && l.Dirty[w]&bit != 0
		switch {
		case dirty && ep == 0:
			return fmt.Errorf("has no epoch for block %d, which is dirty", block)
		case !dirty && ep != 0:
			return fmt.Errorf("has epoch %d for block %d, which is not dirty", ep, block)
		}
	}
	for w, d := range l.Dirty {
		if d != 0 && len(l.Epoch) < 64*w+64-bits.LeadingZeros64(d) {
			return fmt.Errorf("has %d epochs, fewer than its dirty blocks need", len(l.Epoch))
		}
	}
	return nil
}

// checkSum checks that l.Sum is 0 for every block that is not valid or is a zero block, and
// describes the first that is not. A stored block may have a checksum of 0: it says nothing
// about the others.
func checkSum(l Line) error {
	for block, sum := range l.Sum {
		if sum == 0 {
			continue
		}
		w, bit := block/64, uint64(1)<<(block%64)
		switch {
		case w >= len(l.Valid) || l.Valid[w]&bit == 0:
			return fmt.Errorf("has checksum %#x for block %d, which is not valid", sum, block)
		case w < len(l.Zero) && l.Zero[w]&bit != 0:
			return fmt.Errorf("has checksum %#x for block %d, which is a zero block", sum, block)
		}
	}
	return nil
}

// checkLoc checks that l.Loc is nonzero exactly for the blocks that are valid and not zero, a
// bitmap word at a time, and describes the first block that breaks the rule.
func checkLoc(l Line) error {
	word := func(words []uint64, w int) uint64 {
		if w < len(words) {
			return words[w]
		}
		return 0
	}
	for w := range max(len(l.Valid), (len(l.Loc)+63)/64) {
		valid := word(l.Valid, w)
		stored := valid &^ word(l.Zero, w) // the blocks whose bytes are on the SSD
		var located uint64
		for b, loc := range l.Loc[min(64*w, len(l.Loc)):min(64*w+64, len(l.Loc))] {
			if loc != 0 {
				located |= 1 << b
			}
		}
		bad := stored ^ located
		if bad == 0 {
			continue
		}
		b := bits.TrailingZeros64(bad)
		block := 64*w + b
		switch {
		case stored&(1<<b) != 0:
			return fmt.Errorf("has no location for block %d, which is valid and not a zero block (%d location words)", block, len(l.Loc))
		case valid&(1<<b) != 0:
			return fmt.Errorf("has location %#x for block %d, which is a zero block", l.Loc[block], block)
		default:
			return fmt.Errorf("has location %#x for block %d, which is not valid", l.Loc[block], block)
		}
	}
	return nil
}

// cloneLine copies l's bitmaps, location words and checksums so that a store never shares memory
// with its callers; empty ones become nil, as they read back from disk.
func cloneLine(l Line) Line {
	l.Valid = cloneWords(l.Valid)
	l.Dirty = cloneWords(l.Dirty)
	l.Zero = cloneWords(l.Zero)
	l.Loc = cloneWords(l.Loc)
	l.Sum = cloneWords(l.Sum)
	l.Epoch = cloneWords(l.Epoch)
	return l
}

func cloneWords[T uint32 | uint64](w []T) []T {
	if len(w) == 0 {
		return nil
	}
	return append([]T(nil), w...)
}

// cloneGhost copies g's data so that a store never shares memory with its callers; empty data
// becomes nil, as it reads back from disk.
func cloneGhost(g Ghost) Ghost {
	g.Data = cloneData(g.Data)
	return g
}

func cloneData(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// Keys are a prefix byte and, for lines, the big-endian line number, so that badger's key order is
// line order; for ghosts, the big-endian epoch, line number and block index, so that it is
// (Epoch, Line, Block) order. Each kind has a prefix of its own, so that an iteration over one
// never meets the others.
const (
	linePrefix       = 'L'
	superblockPrefix = 'S'
	ghostPrefix      = 'G'
	lineKeyLen       = 9
	ghostKeyLen      = 21
)

var superblockKey = []byte{superblockPrefix}

func lineKey(line uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{linePrefix}, line)
}

func ghostKey(g *Ghost) []byte {
	k := make([]byte, 1, ghostKeyLen)
	k[0] = ghostPrefix
	k = binary.BigEndian.AppendUint64(k, g.Epoch)
	k = binary.BigEndian.AppendUint64(k, g.Line)
	return binary.BigEndian.AppendUint32(k, g.Block)
}

// encodeGhost encodes a ghost's value: its checksum (4 bytes, big-endian), then its data, none
// for a zero block. A 4 KiB block's ghost takes 4,100 bytes, and its key 21.
func encodeGhost(g *Ghost) []byte {
	v := make([]byte, 0, 4+len(g.Data))
	v = binary.BigEndian.AppendUint32(v, g.Sum)
	return append(v, g.Data...)
}

// decodeGhost decodes the ghost stored under key; it copies what it keeps, so key and val may be
// reused by the caller.
func decodeGhost(key, val []byte) (Ghost, error) {
	if len(key) != ghostKeyLen || key[0] != ghostPrefix {
		return Ghost{}, fmt.Errorf("meta: corrupt ghost, key %x: key is %d bytes, want %d starting with %q", key, len(key), ghostKeyLen, ghostPrefix)
	}
	switch {
	case len(val) < 4:
		return Ghost{}, fmt.Errorf("meta: corrupt ghost, key %x: value is %d bytes, shorter than a checksum", key, len(val))
	case len(val)-4 > MaxGhostData:
		return Ghost{}, fmt.Errorf("meta: corrupt ghost, key %x: %d bytes of data, more than a block's %d", key, len(val)-4, MaxGhostData)
	}
	return Ghost{
		Epoch: binary.BigEndian.Uint64(key[1:]),
		Line:  binary.BigEndian.Uint64(key[9:]),
		Block: binary.BigEndian.Uint32(key[17:]),
		Sum:   binary.BigEndian.Uint32(val),
		Data:  cloneData(val[4:]),
	}, nil
}

// encodeLine encodes a record's value: slot (4 bytes, big-endian), the word counts of Valid and
// Dirty (uvarints), then the words (8 bytes each, big-endian). A 1 MiB line with a clean record
// takes 38 bytes. Four optional sections may follow, each a count (a uvarint) and its values:
// Zero, then Loc (8-byte words, big-endian), then Sum (4-byte checksums, big-endian), then Epoch
// (uvarints).
//
// A record without zero blocks, locations or checksums ends after Dirty, as records did before
// any of them existed, so that a store written by an earlier tierblk loads as it was (and an
// earlier tierblk refuses a record with zero blocks as corrupt rather than read the blocks from
// the slot). A record with Loc or Sum writes the Zero section even when it has no words (count
// 0), so that the section after Dirty is always Zero, and a record with Sum writes the Loc
// section even when it has no words (count 0, the slot layout), so that the section after Zero
// is always Loc, and a record with Epoch the Sum section likewise. An empty Zero section is
// written only before a Loc section, an empty Loc section only before a Sum section, an empty Sum
// section only before an Epoch section, and an Epoch section is never empty, so each record has
// one encoding. A tierblk from before Epoch refuses a record with Epoch as corrupt (its Sum
// section is empty, or not the end). A tierblk from before Loc refuses a record with Loc or Sum as corrupt (its Zero
// section is not the end), and one from before Sum refuses a record with Sum (its Loc section is
// empty, or not the end). A 1 MiB line takes 2,089 bytes in the packed layout, its 256 location
// words most of them, and with checksums 3,115 (1,066 in the slot layout).
func encodeLine(l Line) []byte {
	v := make([]byte, 0, 4+5*binary.MaxVarintLen16+8*(len(l.Valid)+len(l.Dirty)+len(l.Zero)+len(l.Loc))+4*len(l.Sum))
	v = binary.BigEndian.AppendUint32(v, l.Slot)
	v = binary.AppendUvarint(v, uint64(len(l.Valid)))
	v = binary.AppendUvarint(v, uint64(len(l.Dirty)))
	v = appendWords(v, l.Valid)
	v = appendWords(v, l.Dirty)
	if len(l.Zero) > 0 || len(l.Loc) > 0 || len(l.Sum) > 0 || len(l.Epoch) > 0 {
		v = binary.AppendUvarint(v, uint64(len(l.Zero)))
		v = appendWords(v, l.Zero)
	}
	if len(l.Loc) > 0 || len(l.Sum) > 0 || len(l.Epoch) > 0 {
		v = binary.AppendUvarint(v, uint64(len(l.Loc)))
		v = appendWords(v, l.Loc)
	}
	if len(l.Sum) > 0 || len(l.Epoch) > 0 {
		v = binary.AppendUvarint(v, uint64(len(l.Sum)))
		for _, sum := range l.Sum {
			v = binary.BigEndian.AppendUint32(v, sum)
		}
	}
	if len(l.Epoch) > 0 {
		v = binary.AppendUvarint(v, uint64(len(l.Epoch)))
		for _, ep := range l.Epoch {
			v = binary.AppendUvarint(v, ep)
		}
	}
	return v
}

func appendWords(v []byte, words []uint64) []byte {
	for _, w := range words {
		v = binary.BigEndian.AppendUint64(v, w)
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
	// The optional sections: Zero, then Loc, then Sum, each a count and its values. An empty
	// Zero section is only ever written before a Loc section, an empty Loc section only before a
	// Sum section, and a Sum section is never empty.
	tail := func() error {
		return fmt.Errorf("%d bytes after the valid and dirty bitmaps are no zero bitmap, with or without location words, checksums and epochs", len(rest))
	}
	n, size := binary.Uvarint(rest)
	if size <= 0 || n > uint64(len(rest)-size)/8 {
		return Line{}, tail()
	}
	var locs []byte
	l.Zero, locs = decodeWords(rest[size:], n)
	if len(locs) == 0 {
		if n == 0 {
			return Line{}, tail()
		}
		return l, nil
	}
	n, size = binary.Uvarint(locs)
	if size <= 0 || n > uint64(len(locs)-size)/8 {
		return Line{}, tail()
	}
	var sums []byte
	l.Loc, sums = decodeWords(locs[size:], n)
	if len(sums) == 0 {
		if n == 0 {
			return Line{}, tail()
		}
		return l, nil
	}
	n, size = binary.Uvarint(sums)
	if size <= 0 || n > uint64(len(sums)-size)/4 {
		return Line{}, tail()
	}
	if n > 0 {
		l.Sum = make([]uint32, n)
		for i := range l.Sum {
			l.Sum[i] = binary.BigEndian.Uint32(sums[size+4*i:])
		}
	}
	epochs := sums[size+4*int(n):]
	if len(epochs) == 0 {
		if n == 0 {
			return Line{}, tail()
		}
		return l, nil
	}
	eps, ok := decodeEpochs(epochs)
	if !ok {
		return Line{}, tail()
	}
	l.Epoch = eps
	return l, nil
}

// decodeEpochs decodes an Epoch section, which must end the value.
func decodeEpochs(b []byte) ([]uint64, bool) {
	n, size := binary.Uvarint(b)
	// Each epoch takes at least a byte.
	if size <= 0 || n == 0 || n > uint64(len(b)-size) {
		return nil, false
	}
	b = b[size:]
	eps := make([]uint64, n)
	for i := range eps {
		ep, size := binary.Uvarint(b)
		if size <= 0 {
			return nil, false
		}
		eps[i], b = ep, b[size:]
	}
	return eps, len(b) == 0
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
