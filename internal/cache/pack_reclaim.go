package cache

import (
	"cmp"
	"slices"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/cache/pack"
	"github.com/tierblk/tierblk/internal/linebits"
	"github.com/tierblk/tierblk/internal/policy"
)

// maxReclaimMoves bounds the block references one reclaim copies or drops, whatever the tier's
// size: a tier of a TiB short of room would otherwise list a sixteenth of its blocks at once. Its
// lists of moves and drops, its map of copies and the copies' room take 120 bytes a reference at
// most (a move of 40, a map entry of 16 in a table at least half full, and 41 for the unit's
// copy: its old and new location words, its size twice, its offset and whether it was made),
// which MemoryPlan counts. A pass that reaches the bound frees fewer segments, and the next pass
// (room is still short) goes on.
var maxReclaimMoves = 8 << 10 // a variable for TestReclaimListsBounded

// reclaimPicked, when set, runs between reclaim's choice of what to copy (units) and its taking
// the room for it: TestReclaimTakesItsRoomAtOnce takes room there, as writers may.
var reclaimPicked func(units []uint64)

// reclaimBytes is the most memory a reclaim's lists take: maxReclaimMoves references, and one
// line's blocks past them (a line is listed whole).
func reclaimBytes() uint64 { return uint64(maxReclaimMoves+MaxLineSize/blockSize) * 120 }

// victims returns the segments reclaim empties, as many as it takes to reach target free
// segments: those whose emptying copies the fewest bytes (copy, by segment: the bytes of its units
// that reclaim must keep), then the fewest live ones; but no more than copy at most
// maxReclaimMoves block references (refs, by segment, as copy; the first victim whatever its
// count: reclaim lists no more than that many, and the next goes on). secondChance is false when
// copying what it would keep does not fit the free room: hot clean lines are dropped too.
func (pk *packed) victims(copy, hot []int64, copyRefs, hotRefs []int32) (victims []int32, secondChance bool) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	want := pk.target - len(pk.free)
	if want <= 0 {
		return nil, true
	}
	isFree := make([]bool, len(pk.used))
	for _, s := range pk.free {
		isFree[s] = true
	}
	var full []int32
	for s := range pk.used {
		if !isFree[s] && int32(s) != pk.open {
			full = append(full, int32(s))
		}
	}
	room := int64(len(pk.free)) * pk.segSize
	if pk.open >= 0 {
		room += pk.segSize - pk.at
	}
	for _, secondChance = range []bool{true, false} {
		keep := func(s int32) int64 {
			if secondChance {
				return copy[s] + hot[s]
			}
			return copy[s]
		}
		slices.SortFunc(full, func(a, b int32) int {
			return cmp.Or(cmp.Compare(keep(a), keep(b)), cmp.Compare(pk.used[a], pk.used[b]))
		})
		victims = full[:min(want, len(full))]
		var copied int64
		refs := 0
		for i, s := range victims {
			r := int(copyRefs[s])
			if secondChance {
				r += int(hotRefs[s])
			}
			if i > 0 && refs+r > maxReclaimMoves {
				victims = victims[:i]
				break
			}
			refs += r
			copied += keep(s)
		}
		// Each copy may waste up to a block aligning a unit stored as it is.
		if copied+int64(len(victims))*blockSize <= room {
			break
		}
	}
	return victims, secondChance
}

// reclaim frees segments of a packed tier that runs short of room: it empties the segments with
// the fewest live bytes, dropping the clean lines with units there but copying the units of dirty
// blocks and of lines hit since their last reclaim (a second chance, which keeps a hot line's
// blocks). The room comes free after the next checkpoint (the caller runs one). It returns how many
// block references it listed to copy or drop.
func (pk *packed) reclaim() (listed int) {
	t := pk.t
	pk.mu.Lock()
	full := len(pk.free) >= pk.target
	pk.mu.Unlock()
	if full {
		return
	}
	// Held from before the units to move are picked until they are moved: none of them can die
	// and have its room written again (a unit there with the same location word would pass
	// moveBlock's check) in between.
	pk.io.RLock()
	defer pk.io.RUnlock()
	t.mu.Lock()
	victims, secondChance := pk.victims(pk.reclaimCosts())
	if len(victims) == 0 {
		t.mu.Unlock()
		return
	}
	rank := make([]int32, len(pk.used)) // a segment's place in victims, -1 for none
	for i := range rank {
		rank[i] = -1
	}
	for i, s := range victims {
		rank[s] = int32(i)
	}
	moves, drops := pk.reclaimList(rank, secondChance)
	listed = len(moves) + len(drops)
	for _, line := range drops {
		t.evict.Remove(policy.Key(line))
		t.evictions.Add(1)
		t.dropLocked(line)
	}
	t.mu.Unlock()
	pk.reclaimMoves(moves, rank, int32(len(victims)))
	return listed
}

// reclaimMove is a block reclaim moves: its unit is copied, and the block points at the copy.
type reclaimMove struct {
	line uint64
	slot uint32
	b    int
	loc  uint64
	gen  uint32 // the slot's: a unit written in place since is not moved
	sum  uint32 // the block's checksum, which the unit's bytes must match to be copied
}

// reclaimCosts returns, by segment, what emptying it would copy: the bytes and block references of
// the units of dirty lines (copyBytes, copyRefs), and of hot ones (hotBytes, hotRefs). The caller
// holds the tier's mu.
func (pk *packed) reclaimCosts() (copyBytes, hotBytes []int64, copyRefs, hotRefs []int32) {
	t := pk.t
	nseg := len(pk.used)
	copyBytes, hotBytes = make([]int64, nseg), make([]int64, nseg)
	copyRefs, hotRefs = make([]int32, nseg), make([]int32, nseg)
	for _, s := range t.index.All() {
		slot := uint32(s)
		to, refs := hotBytes, hotRefs
		if !t.dirtyAt(slot).IsZero() {
			to, refs = copyBytes, copyRefs
		} else if !pk.isHotLocked(slot) {
			continue
		}
		for _, l := range pk.slotLocs(slot, 0, pk.blocks) {
			if l != 0 {
				to[pack.Off(l)/pk.segSize] += int64(pack.Len(l))
				refs[pack.Off(l)/pk.segSize]++
			}
		}
	}
	return copyBytes, hotBytes, copyRefs, hotRefs
}

// reclaimList lists what emptying the victims (the segments of rank 0 or more) takes: the blocks
// to move, and the clean lines to drop (those not hot, or all with no second chance). A line loses
// its second chance as it is listed. The caller holds the tier's mu.
func (pk *packed) reclaimList(rank []int32, secondChance bool) (moves []reclaimMove, drops []uint64) {
	t := pk.t
	for line, s := range t.index.All() {
		if len(moves)+len(drops) >= maxReclaimMoves {
			// One victim with more references than that (tiny units, or one shared by many
			// deduplicated lines): the rest stay for the next reclaim, which finds them there.
			break
		}
		slot := uint32(s)
		locs := pk.slotLocs(slot, 0, pk.blocks)
		var there lineBits
		for b, l := range locs {
			if l != 0 && rank[pack.Off(l)/pk.segSize] >= 0 {
				there[b/64] |= 1 << (b % 64)
			}
		}
		if there.IsZero() {
			continue
		}
		hot := pk.isHotLocked(slot) && secondChance
		pk.hot[slot/64] &^= 1 << (slot % 64)
		if !hot && t.dirtyAt(slot).IsZero() {
			drops = append(drops, line)
			continue
		}
		if pk.gen[slot]%2 == 1 {
			continue // written in place now: moved by a later reclaim
		}
		// A line with dirty blocks is never dropped: its clean units there are copied too.
		for b := range pk.blocks {
			if there.Has(b) {
				moves = append(moves, reclaimMove{line, slot, b, locs[b], pk.gen[slot], t.sumsOf(slot)[b].Load()})
			}
		}
	}
	return moves, drops
}

// reclaimMoves copies the units of moves and points their blocks at the copies. A shared unit has
// a move for each block that finds it: the first copies it, and the others point at the copy. The
// room of the copies is taken at once, before the first is written (reclaimRoom). Each copy holds
// a reference of reclaim's until the moves are done; a copy never made (damage, an error) is dead
// at once.
func (pk *packed) reclaimMoves(moves []reclaimMove, rank []int32, nvictims int32) {
	t := pk.t
	copies := map[uint64]int{} // a unit's index in units
	var units []uint64         // the units to copy, each once, in the order of moves
	var sizes []int
	for _, m := range moves {
		if _, ok := copies[m.loc]; !ok {
			copies[m.loc] = len(units)
			units = append(units, m.loc)
			sizes = append(sizes, pack.Len(m.loc))
		}
	}
	if reclaimPicked != nil {
		reclaimPicked(units)
	}
	news := pk.reclaimRoom(units, sizes, rank, nvictims)
	made := make([]bool, len(units))
	defer func() {
		t.mu.Lock()
		for i, nl := range news {
			switch {
			case made[i]:
				pk.deadLocked(nl)
			case nl != 0:
				pk.dead = append(pk.dead, nl) // never live
			}
		}
		t.mu.Unlock()
	}()
	for _, m := range moves {
		i := copies[m.loc]
		nl := news[i]
		if nl == 0 {
			continue // its segment did not fit: the next reclaim picks again
		}
		if !made[i] {
			if err := pk.copyUnit(m.line, m.b, m.loc, nl, m.sum); err != nil {
				if _, ok := asDamage(err); ok {
					// Not copied: the unit stays, and its segment with it, until a check of
					// the line under its lock (which a write to it may be changing) deals
					// with the block.
					t.recheck(m.line)
					continue
				}
				t.log.Warn("cache tier reclaim: copy failed", "tier", t.name, "err", err)
				return
			}
			made[i] = true
			t.mu.Lock()
			pk.bornLocked(nl)
			if pk.dd != nil {
				pk.dd.Moved(m.loc, nl)
			}
			t.mu.Unlock()
		}
		pk.moveBlock(m, nl)
	}
}

// reclaimRoom takes the room of the copies of units (of sizes), for as many whole victims as it
// fits (the cheapest first): copies that ran out of room half-way (writers take free segments
// meanwhile) would leave their victims half full and the room they took lost, until reclaim had
// none left to copy into at all (TestReclaimTakesItsRoomAtOnce). It returns the copies' location
// words, as mutable as the units were; 0 for a unit not copied this time.
func (pk *packed) reclaimRoom(units []uint64, sizes []int, rank []int32, nvictims int32) []uint64 {
	news := make([]uint64, len(units))
	for k := nvictims; k > 0; k-- {
		var sz []int
		for i, l := range units {
			if rank[pack.Off(l)/pk.segSize] < k {
				sz = append(sz, sizes[i])
			}
		}
		offs := make([]int64, len(sz))
		if pk.alloc(sz, offs, true) != nil {
			continue
		}
		j := 0
		for i, l := range units {
			if rank[pack.Off(l)/pk.segSize] < k {
				news[i] = pack.Loc(offs[j], sz[j], pack.Codec(l)) | l&pack.Mutable // the block's, as mutable as it was
				j++
			}
		}
		break
	}
	return news
}

// moveBlock points m's block at nl, the copy of its unit, if the block still has the unit and no
// write in place went over it since it was listed; the line's record follows.
func (pk *packed) moveBlock(m reclaimMove, nl uint64) {
	t := pk.t
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := pk.slotLocs(m.slot, m.b, m.b+1)
	if s, ok := t.slotOf(m.line); ok && s == m.slot && cur[0] == m.loc && pk.gen[m.slot] == m.gen {
		if t.j != nil {
			t.j.keepStoredLocked(m.line, m.slot)
		}
		pk.deadLocked(m.loc)
		cur[0] = nl
		pk.shareLocked(nl)
		if t.j != nil {
			t.j.record(t.recordLocked(m.line, m.slot))
		}
	}
}

// copyUnit writes a copy of unit l, block b of line, to nl (room reclaim took for it), if its
// bytes match the block's sum; else it returns a *damageError.
func (pk *packed) copyUnit(line uint64, b int, l, nl uint64, sum uint32) error {
	t := pk.t
	// A pooled buffer: reclaim copies every unit it keeps, and allocating each would make garbage
	// at the rate the tier is written (TestMemoryBoundNBD).
	bp := bufpool.Get(pack.Len(l))
	defer bufpool.Put(bp)
	unit := *bp
	if err := pk.readUnits([]uint64{l}, false, func(_ int, u []byte) error {
		copy(unit, u)
		return nil
	}); err != nil {
		return err
	}
	if got, err := t.unitSum(line, b, unit, l); err != nil || got != sum {
		return &damageError{line: line, bits: linebits.Range(b, b+1)}
	}
	return pk.writeUnits(unit, []uint64{nl})
}
