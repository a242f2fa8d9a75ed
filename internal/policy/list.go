package policy

// An index-based node arena with intrusive doubly-linked lists, shared by the policies.
//
// Why not container/list and pointers: a policy holds millions of entries and the simulator replays
// millions of accesses a second. Nodes live in one slice and link to each other by int32 index, so
// the garbage collector sees one pointer-free slice instead of millions of objects, a node costs
// 16 bytes plus its payload (rounded up to 8 bytes), and a freed node is reused from a free list:
// after warm-up no access allocates. One hash index finds a key's node; a policy with ghost entries (ARC, S3-FIFO) keeps them
// in the same arena and index, told apart by its payload.

// none is the index that means "no node" (the end of a list, an empty free list).
const none int32 = -1

// node is one entry: its key, its links in whichever list holds it, and the policy's payload M.
// prev points towards the list's head (newer entries), next towards its tail (older entries), as in
// libCacheSim, whose scans walk prev from the tail. meta comes first because Go pads a zero-size
// last field, which would make an LRU node 24 bytes instead of 16.
type node[M any] struct {
	meta       M
	key        Key
	prev, next int32
}

// arena owns the nodes and the key index of one policy.
type arena[M any] struct {
	nodes []node[M]
	free  int32 // first free node, chained through next
	index index
}

// arenaHintMax bounds the up-front allocation of a lazy arena, so building a policy for a huge
// capacity that a short trace never fills stays cheap; beyond it, the slice and the index grow as
// entries arrive.
const arenaHintMax = 1 << 16

// newArena builds an arena for up to hint nodes. A lazy one starts small and doubles as it fills;
// a preallocated one (Config.Preallocate) is sized for hint nodes at once and never grows unless
// hint was too small, so it costs what it holds, without the slack of doubling.
func newArena[M any](hint int, prealloc bool) arena[M] {
	if !prealloc {
		hint = min(hint, arenaHintMax)
	}
	return arena[M]{
		nodes: make([]node[M], 0, hint),
		free:  none,
		index: newIndex(hint, prealloc),
	}
}

// lookup returns the node of k.
func (a *arena[M]) lookup(k Key) (int32, bool) { return a.index.get(k) }

// at returns the node at index i, to read or update in place.
func (a *arena[M]) at(i int32) *node[M] { return &a.nodes[i] }

// alloc takes a node for k (not yet indexed), indexes it, and returns it unlinked with a zero payload.
func (a *arena[M]) alloc(k Key) int32 {
	var i int32
	if a.free != none {
		i = a.free
		a.free = a.nodes[i].next
		a.nodes[i] = node[M]{key: k, prev: none, next: none}
	} else {
		i = int32(len(a.nodes))
		a.nodes = append(a.nodes, node[M]{key: k, prev: none, next: none})
	}
	a.index.put(k, i)
	return i
}

// release unindexes node i (already unlinked) and returns it to the free list.
func (a *arena[M]) release(i int32) {
	a.index.delete(a.nodes[i].key)
	a.nodes[i].next = a.free
	a.free = i
}

// index maps keys to node indexes. It is an open-addressing hash table with linear probing and
// backward-shift deletion (no tombstones, so a replay of millions of inserts and deletes never
// degrades it). Against a Go map it saves a third of the time of an access (BenchmarkEviction): a
// lookup mostly reads one cache line, which holds the key, so a hit need not read the node.
//
// A slot is 12 bytes: the key, as two 32-bit halves so that the slot is aligned to 4 bytes, and the
// node's index. A lazy table is a power of two, kept at most half full; a preallocated one is sized
// to be at most four fifths full at the hint, any length. The home slot is the top 32 bits of the
// key's Fibonacci hash scaled to the length (Lemire's fastrange), which for a power of two is the
// hash's top bits, as Fibonacci hashing takes them.
type index struct {
	slots []slot
	n     int
	limit int  // the most entries before the table grows
	dense bool // preallocated: four fifths full at most, else half
}

type slot struct {
	lo, hi uint32 // the key
	node   uint32 // the node's index + 1; 0 marks an empty slot
}

func (s *slot) key() Key { return Key(s.hi)<<32 | Key(s.lo) }

// minSlots keeps the smallest table with room to probe.
const minSlots = 8

func newIndex(hint int, prealloc bool) index {
	if prealloc {
		// ceil(5 hint / 4) slots hold hint entries at four fifths full.
		return makeIndex(max((5*hint+3)/4, minSlots), true)
	}
	size := minSlots
	for size < 2*hint {
		size *= 2
	}
	return makeIndex(size, false)
}

func makeIndex(size int, dense bool) index {
	limit := size / 2
	if dense {
		limit = size * 4 / 5
	}
	return index{slots: make([]slot, size), limit: limit, dense: dense}
}

// home is k's preferred slot: the top half of k times 2^64/φ, which spreads the runs of consecutive
// block numbers that traces are made of, scaled to the table's length.
func (x *index) home(k Key) int {
	h := uint64(k) * 0x9E3779B97F4A7C15 >> 32
	return int(h * uint64(len(x.slots)) >> 32)
}

// next is the slot after i, wrapping at the end of the table.
func (x *index) next(i int) int {
	if i++; i == len(x.slots) {
		return 0
	}
	return i
}

func (x *index) get(k Key) (int32, bool) {
	for i := x.home(k); ; i = x.next(i) {
		s := &x.slots[i]
		if s.node == 0 {
			return none, false
		}
		if s.key() == k {
			return int32(s.node - 1), true
		}
	}
}

// put adds k, which must be absent.
func (x *index) put(k Key, node int32) {
	if x.n >= x.limit {
		x.grow()
	}
	i := x.home(k)
	for x.slots[i].node != 0 {
		i = x.next(i)
	}
	x.slots[i] = slot{lo: uint32(k), hi: uint32(k >> 32), node: uint32(node) + 1}
	x.n++
}

// grow doubles the table, keeping its maximum load.
func (x *index) grow() {
	old := x.slots
	*x = makeIndex(2*len(old), x.dense)
	for i := range old {
		if s := &old[i]; s.node != 0 {
			x.put(s.key(), int32(s.node-1))
		}
	}
}

// delete removes k, which must be present, and shifts back the entries of its probe run that
// the empty slot would otherwise cut off from their home.
func (x *index) delete(k Key) {
	i := x.home(k)
	for x.slots[i].node == 0 || x.slots[i].key() != k {
		i = x.next(i)
	}
	for j := x.next(i); x.slots[j].node != 0; j = x.next(j) {
		// The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
		if x.distance(x.home(x.slots[j].key()), j) >= x.distance(i, j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = slot{}
	x.n--
}

// distance is how many steps of next lead from slot from to slot to.
func (x *index) distance(from, to int) int {
	if d := to - from; d >= 0 {
		return d
	}
	return to - from + len(x.slots)
}

// list is one queue of nodes in an arena: head is the newest entry, tail the oldest.
type list struct {
	head, tail int32
	len        int
}

func newList() list { return list{head: none, tail: none} }

// pushFront links the unlinked node i at the head of l.
func (a *arena[M]) pushFront(l *list, i int32) {
	n := &a.nodes[i]
	n.prev = none
	n.next = l.head
	if l.head != none {
		a.nodes[l.head].prev = i
	} else {
		l.tail = i
	}
	l.head = i
	l.len++
}

// unlink takes node i out of l, leaving it allocated and indexed.
func (a *arena[M]) unlink(l *list, i int32) {
	n := &a.nodes[i]
	if n.prev != none {
		a.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next != none {
		a.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = none, none
	l.len--
}

// remove unlinks node i from l, frees it and returns its key.
func (a *arena[M]) remove(l *list, i int32) Key {
	k := a.nodes[i].key
	a.unlink(l, i)
	a.release(i)
	return k
}

// removeKey drops k from l, if it is there, and reports whether it was.
func (a *arena[M]) removeKey(l *list, k Key) bool {
	i, ok := a.lookup(k)
	if ok {
		a.remove(l, i)
	}
	return ok
}

// moveToFront moves node i of l to its head.
func (a *arena[M]) moveToFront(l *list, i int32) {
	if l.head == i {
		return
	}
	a.unlink(l, i)
	a.pushFront(l, i)
}

// base holds what every eviction policy has: its capacity and the eviction hook.
type base struct {
	capacity int
	onEvict  func(Key)
}

// newBase takes a capacity below 1 (which NewEviction refuses) as 1.
func newBase(cfg Config) base { return base{capacity: max(cfg.Capacity, 1), onEvict: cfg.OnEvict} }

// Capacity is the most keys the policy holds.
func (b *base) Capacity() int { return b.capacity }

// evicted reports k to the hook of Config.
func (b *base) evicted(k Key) {
	if b.onEvict != nil {
		b.onEvict(k)
	}
}
