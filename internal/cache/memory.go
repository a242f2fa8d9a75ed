package cache

import (
	"log/slog"

	"github.com/tierblk/tierblk/internal/meta"
)

// MemoryPlan is the most RAM the cache takes besides its copies of the requests in flight,
// whatever the load: the RAM tier's bytes; the index of both tiers full (every slot holding a
// line), with its checksums and, on a packed tier, its location words (TestIndexBytesPerLine);
// and, with an SSD tier (which write-back, or a switch to it, fills with dirty data), work: the
// destager's buffers, on a packed tier reclaim's lists, and in FLUSH order the epochs of the most
// dirty lines there may be (epochBytes) and the ghosts of blocks written over (maxGhostBytes). The daemon's memory bound and
// docs/operations.md's "How much RAM" are made of these.
func (c *Cache) MemoryPlan() (ramTier, index, work uint64) {
	if c.ram != nil {
		ramTier = uint64(c.ram.slots) * uint64(c.ram.lineSize)
		index += uint64(c.ram.slots) * uint64(c.ram.st.indexBytes(c.ram.blocks))
	}
	if t := c.ssd; t != nil {
		index += uint64(t.slots) * uint64(t.st.indexBytes(t.blocks))
		work = destageBytesInFlight + t.st.workBytes()
		if t.ep != nil && c.wb != nil {
			work += uint64(c.wb.maxLines)*uint64(epochBytes(t.blocks)) + maxGhostBytes
		}
	}
	return ramTier, index, work
}

// indexBytesPerLine is the most RAM the SSD tier's index takes per line it indexes with the default
// policy, but for the blocks' checksums, 4 bytes each (TestIndexBytesPerLine holds it to
// slotIndexBytesPerLine); a packed tier adds each block's location word and the slot's gen
// (TestPackedIndexBytesPerLine).
const indexBytesPerLine = 128

func slotIndexBytesPerLine(blocks int) int   { return indexBytesPerLine + blocks*4 }
func packedIndexBytesPerLine(blocks int) int { return slotIndexBytesPerLine(blocks) + blocks*8 + 4 }

// warnIndexRAM warns when the SSD tier's index, full, would take more than half of the machine's
// RAM: with reduction compress it indexes packedSlotsPerLine lines per line of room, each with its
// location words, several times what reduction zero needs.
func warnIndexRAM(log *slog.Logger, indexed, blocks int, r Reduction) {
	per := slotIndexBytesPerLine(blocks)
	if layoutOf(r) == meta.LayoutPacked {
		per = packedIndexBytesPerLine(blocks)
	}
	need, ram := uint64(indexed)*uint64(per), totalRAM()
	if ram == 0 || need <= ram/2 {
		return
	}
	zero := uint64(indexed) * uint64(slotIndexBytesPerLine(blocks))
	if layoutOf(r) == meta.LayoutPacked {
		zero /= packedSlotsPerLine
	}
	log.Warn("the SSD tier's index, full, may take more than half of this machine's RAM; reduction zero, or a larger line, needs less",
		"index_bytes", need, "ram_bytes", ram, "reduction", r.String(), "index_bytes_with_zero", zero)
}

// epochBytes is the most RAM FLUSH order's bookkeeping (epochs) takes for a dirty line of blocks
// blocks: its slot's entry with one epoch, and an entry for each further epoch among its blocks,
// at worst one a block, each with the line's place in that epoch's list
// (TestEpochBytesPerDirtyLine).
func epochBytes(blocks int) int { return epochLineBytes + (blocks-1)*epochEntryBytes }

const (
	epochLineBytes  = 192
	epochEntryBytes = 56
)
