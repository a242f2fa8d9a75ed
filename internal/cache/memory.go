package cache

// MemoryPlan is the most RAM the cache takes besides its copies of the requests in flight,
// whatever the load: the RAM tier's bytes; the index of both tiers full (every slot holding a
// line), with its checksums and, on a packed tier, its location words (TestIndexBytesPerLine);
// and, with an SSD tier (which write-back, or a switch to it, fills with dirty data), work: the
// destager's buffers, and on a packed tier reclaim's lists. The daemon's memory bound and
// docs/operations.md's "How much RAM" are made of these.
func (c *Cache) MemoryPlan() (ramTier, index, work uint64) {
	if c.ram != nil {
		ramTier = uint64(len(c.ram.ram))
		index += uint64(c.ram.slots) * indexBytesPerLine
	}
	if t := c.ssd; t != nil {
		per := slotIndexBytesPerLine(t.blocks)
		if t.pk != nil {
			per = packedIndexBytesPerLine(t.blocks)
		}
		index += uint64(t.slots) * uint64(per)
		work = destageBytesInFlight
		if t.pk != nil {
			work += reclaimBytes()
		}
	}
	return ramTier, index, work
}
