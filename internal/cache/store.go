package cache

import (
	"fmt"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
)

// store is where a tier keeps its blocks: RAM (ramStore), an SSD of fixed slots (slotStore: slot s
// holds its line at s*lineSize) or the packed log (packed, pack.go: a unit for each block, in
// segments). The tier moves its blocks' bytes through it and tells it what becomes of its slots, so
// that nothing else asks which layout a tier has. What only the packed log needs is a no-op in the
// other two (unitless). Methods named ...Locked are called with the tier's mu held.
type store interface {
	// read copies line's bytes [off, off+len(p)) of slot into p; on a contiguous store it may go on
	// into the slots after slot, which hold the lines after line (readHits). cached reads through
	// the SSD's page cache where its reads bypass it (backend.CachedReader): data written a moment
	// ago, the destager's. The SSD's reads are checked (sum.go): a block that fails its sum makes a
	// *damageError.
	read(line uint64, slot uint32, p []byte, off int64, cached bool) error
	// write stores p as line's bytes from off in slot, with their sums.
	write(line uint64, slot uint32, p []byte, off int64) error
	// rawSum reads block b of line from slot, unchecked, and returns its sum.
	rawSum(line uint64, slot uint32, b int) (uint32, error)
	// probe writes w where no line's data is (slot, which nobody uses, or free room) and reads it
	// back into r (journal.heal).
	probe(slot uint32, w, r []byte) error
	// span returns where on the device line's bytes [lo, hi) of slot are, if they are there as they
	// are, in one piece: such a read goes to the device without the store (read_async.go). With try
	// it does not wait for the store's locks. When ok, the caller calls endSpan once the read is
	// done, or was not started.
	span(slot uint32, lo, hi int64, try bool) (at int64, ok bool)
	endSpan()
	// contiguous reports whether slot s holds its line's bytes as they are at s*lineSize, so that
	// adjacent slots are one run of bytes and a short last block is read as it is.
	contiguous() bool
	// mutable reports whether block b of slot is written over in place when written again, its new
	// sum recorded with the line's next record (journal.resummedLocked), and so taken as it is
	// after an unclean stop (adoptDirtyLocked): every block of a slot, a packed tier's in a
	// mutable unit.
	mutable(slot uint32, b int) bool
	// indexBytes is the most RAM the index takes per line of blocks blocks it holds
	// (Cache.MemoryPlan); workBytes what the store's background work takes besides.
	indexBytes(blocks int) int
	workBytes() uint64
	// physicalBytesLocked is how many bytes stored blocks take (valid, not zero blocks).
	physicalBytesLocked(stored int) uint64
	// addStats adds the store's own counts to s.
	addStats(s *TierStats)
	// dirtyRoomKept is how many lines of room (of line bytes) the store keeps from dirty data.
	dirtyRoomKept(line int64) int

	units
}

// units is what a store that gives each block a unit of its own needs to hear of the tier's slots
// and of its journal: the packed log's (pack.go); the other stores take no notice (unitless).
type units interface {
	// hitLocked notes a hit on slot.
	hitLocked(slot uint32)
	// dropBlocksLocked lets go of the data of slot's blocks gone, which the tier no longer stores
	// (a slot nobody pins); unpinnedLocked of what slot's last unpin leaves that it does not store,
	// kept for the I/O that pinned it; releaseSlotLocked of all of slot's, which is being released.
	dropBlocksLocked(slot uint32, gone lineBits)
	unpinnedLocked(slot uint32)
	releaseSlotLocked(slot uint32)
	// unitsOf returns the unit locations of slot's blocks keep, for its record (meta.Line.Loc);
	// locWords how many a record carries; staleUnits whether a record's, locs, finds another unit
	// than slot has for a block of claimed.
	unitsOf(slot uint32, keep lineBits) []uint64
	locWords() int
	staleUnits(slot uint32, claimed lineBits, locs []uint64) bool
	// A checkpoint's steps: hasDeadLocked reports whether units wait for one to free their room;
	// snapshotLocked takes those, for releaseUnits to free once the snapshot is committed, or
	// keepDeadLocked to keep for the next checkpoint where it was not.
	hasDeadLocked() bool
	snapshotLocked() (dead []uint64)
	keepDeadLocked(dead []uint64)
	releaseUnits(dead []uint64)
	// short reports whether room runs short; reclaim frees some, for the next checkpoint, and
	// returns how many block references it listed.
	short() bool
	reclaim() (listed int)
	// A restart's load: claimUnits takes the units of record r, live (its slot's) or replaced by
	// the run log (dead at the first checkpoint); loadedLocked ends the load, claiming the units of
	// replaced, the store's records that the run log replaced.
	claimUnits(r meta.Line, live bool) error
	loadedLocked(replaced map[uint64]meta.Op) error
}

// unitless is what the stores that keep no units (RAM, slots) share: the units hooks as no-ops, and
// the answers of a store whose slots hold their lines' bytes as they are.
type unitless struct{}

func (unitless) hitLocked(uint32)                           {}
func (unitless) dropBlocksLocked(uint32, lineBits)          {}
func (unitless) unpinnedLocked(uint32)                      {}
func (unitless) releaseSlotLocked(uint32)                   {}
func (unitless) unitsOf(uint32, lineBits) []uint64          { return nil }
func (unitless) locWords() int                              { return 0 }
func (unitless) staleUnits(uint32, lineBits, []uint64) bool { return false }
func (unitless) hasDeadLocked() bool                        { return false }
func (unitless) snapshotLocked() []uint64                   { return nil }
func (unitless) keepDeadLocked([]uint64)                    {}
func (unitless) releaseUnits([]uint64)                      {}
func (unitless) short() bool                                { return false }
func (unitless) reclaim() int                               { return 0 }
func (unitless) loadedLocked(map[uint64]meta.Op) error      { return nil }
func (unitless) contiguous() bool                           { return true }
func (unitless) mutable(uint32, int) bool                   { return true }
func (unitless) workBytes() uint64                          { return 0 }
func (unitless) physicalBytesLocked(stored int) uint64      { return uint64(stored) * blockSize }
func (unitless) addStats(*TierStats)                        {}
func (unitless) dirtyRoomKept(int64) int                    { return 0 }
func (unitless) endSpan()                                   {}

func (unitless) claimUnits(r meta.Line, _ bool) error {
	if r.Loc != nil {
		return fmt.Errorf("line %d has compressed units but this SSD tier is not packed", r.Line)
	}
	return nil
}

// probeInPlace is probe on a store of slots: it writes w to slot's first block and reads it back.
func probeInPlace(s store, slot uint32, w, r []byte) error {
	if err := s.write(0, slot, w, 0); err != nil {
		return fmt.Errorf("probe write to the SSD tier: %w", err)
	}
	if err := s.read(0, slot, r, 0, false); err != nil {
		return fmt.Errorf("probe read from the SSD tier: %w", err)
	}
	return nil
}

// ramStore is the RAM tier's store: slot s is ram[s*lineSize:], unchecked.
type ramStore struct {
	unitless
	ram      []byte
	lineSize int64
	blocks   int
}

func newRAMStore(slots int, lineSize int64) *ramStore {
	return &ramStore{ram: bufpool.Aligned(slots * int(lineSize)), lineSize: lineSize, blocks: int(lineSize / blockSize)}
}

// slot returns the bytes of slot.
func (s *ramStore) slot(slot uint32) []byte {
	return s.ram[int64(slot)*s.lineSize : int64(slot+1)*s.lineSize]
}

func (s *ramStore) read(_ uint64, slot uint32, p []byte, off int64, _ bool) error {
	copy(p, s.ram[int64(slot)*s.lineSize+off:])
	return nil
}

func (s *ramStore) write(_ uint64, slot uint32, p []byte, off int64) error {
	copy(s.ram[int64(slot)*s.lineSize+off:], p)
	return nil
}

func (s *ramStore) rawSum(line uint64, slot uint32, b int) (uint32, error) {
	at := int64(slot)*s.lineSize + int64(b)*blockSize
	return blockSum(line*uint64(s.blocks)+uint64(b), s.ram[at:at+blockSize]), nil
}

func (s *ramStore) probe(slot uint32, w, r []byte) error { return probeInPlace(s, slot, w, r) }

// span: RAM is no device.
func (s *ramStore) span(uint32, int64, int64, bool) (int64, bool) { return 0, false }

// indexBytes: the RAM tier keeps no sums.
func (s *ramStore) indexBytes(int) int { return indexBytesPerLine }

// slotStore is the store of an SSD tier of slots: slot s holds its line at s*lineSize on the tier's
// device, each block checked against its sum (sum.go).
type slotStore struct {
	unitless
	t *tier
}

// read reads the bytes [off, off+len(p)) of a run of lines from line's slot on, as whole blocks,
// and checks them.
func (s *slotStore) read(line uint64, slot uint32, p []byte, off int64, cached bool) error {
	t := s.t
	lo, _, buf, done := t.wholeBlocks(line, p, off)
	defer done()
	base := int64(slot) * t.lineSize
	var err error
	if cr, ok := t.dev.(backend.CachedReader); cached && ok {
		_, err = cr.ReadAtCached(buf, base+lo)
	} else {
		_, err = t.dev.ReadAt(buf, base+lo)
	}
	if err != nil {
		return err
	}
	if err := t.verify(line, slot, buf, lo); err != nil {
		return err
	}
	if len(buf) != len(p) {
		copy(p, buf[off-lo:])
	}
	return nil
}

// write writes p, line's bytes from off, as whole blocks, taking the rest of a block p covers in
// part from the slot (checked: the caller writes in part only a block the slot holds), and sets
// their sums (writeSums).
func (s *slotStore) write(line uint64, slot uint32, p []byte, off int64) error {
	t := s.t
	lo, hi, buf, done := t.wholeBlocks(line, p, off)
	defer done()
	if len(buf) != len(p) {
		if lo != off {
			if err := s.read(line, slot, buf[:min(blockSize, hi-lo)], lo, false); err != nil {
				return err
			}
		}
		if end := off + int64(len(p)); end != hi && (lo == off || hi-lo > blockSize) {
			tail := (end - 1) &^ (blockSize - 1)
			if err := s.read(line, slot, buf[tail-lo:], tail, false); err != nil {
				return err
			}
		}
		copy(buf[off-lo:], p)
	}
	var sumBuf [16]uint32
	sums := t.setSums(line, buf, lo, sumBuf[:0])
	return t.writeSums(line, slot, int(lo/blockSize), sums, func() error {
		_, err := t.dev.WriteAt(buf, int64(slot)*t.lineSize+lo)
		return err
	})
}

func (s *slotStore) rawSum(line uint64, slot uint32, b int) (uint32, error) {
	t := s.t
	bp := bufpool.Get(blockSize)
	defer bufpool.Put(bp)
	blk := (*bp)[:min(blockSize, t.lineBytes(line)-int64(b)*blockSize)]
	if _, err := t.dev.ReadAt(blk, int64(slot)*t.lineSize+int64(b)*blockSize); err != nil {
		return 0, err
	}
	return blockSum(line*uint64(t.blocks)+uint64(b), blk), nil
}

func (s *slotStore) probe(slot uint32, w, r []byte) error { return probeInPlace(s, slot, w, r) }

// span: a slot's bytes are on the device as they are.
func (s *slotStore) span(slot uint32, lo, _ int64, _ bool) (int64, bool) {
	return int64(slot)*s.t.lineSize + lo, true
}

func (s *slotStore) indexBytes(blocks int) int { return slotIndexBytesPerLine(blocks) }
