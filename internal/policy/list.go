package policy

// An index-based node arena with intrusive doubly-linked lists, shared by the policies.
//
// Why not container/list and pointers: a policy holds millions of entries and the simulator replays
// millions of accesses a second. Nodes live in one slice and link to each other by int32 index, so
// the garbage collector sees one pointer-free slice instead of millions of objects, a node costs
// 16 bytes plus its payload, and a freed node is reused from a free list: after warm-up no access
// allocates. One hash index finds a key's node; a policy with ghost entries (ARC, S3-FIFO) keeps them
// in the same arena and index, told apart by its payload.

// none is the index that means "no node" (the end of a list, an empty free list).
const none int32 = -1

// node is one entry: its key, its links in whichever list holds it, and the policy's payload M.
// prev points towards the list's head (newer entries), next towards its tail (older entries), as in
// libCacheSim, whose scans walk prev from the tail.
type node[M any] struct {
	key        Key
	prev, next int32
	meta       M
}

// arena owns the nodes and the key index of one policy.
type arena[M any] struct {
	nodes []node[M]
	free  int32 // first free node, chained through next
	index index
}

// arenaHintMax bounds the up-front allocation, so building a policy for a huge capacity that a short
// trace never fills stays cheap; beyond it, the slice and the map grow as entries arrive.
const arenaHintMax = 1 << 16

func newArena[M any](hint int) arena[M] {
	hint = min(hint, arenaHintMax)
	return arena[M]{
		nodes: make([]node[M], 0, hint),
		free:  none,
		index: newIndex(hint),
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

// index maps keys to node indexes. It is an open-addressing hash table with linear probing,
// kept at most half full, with backward-shift deletion (no tombstones, so a replay of millions of
// inserts and deletes never degrades it). Against a Go map it saves a third of the time of an access
// (BenchmarkEviction): a lookup mostly reads one cache line, and a slot is 16 bytes.
type index struct {
	slots []slot // a power of two
	mask  uint64
	shift uint8 // 64 - log2(len(slots)), for Fibonacci hashing
	n     int
}

type slot struct {
	key  Key
	node int32 // the node's index + 1; 0 marks an empty slot
}

func newIndex(hint int) index {
	var x index
	x.resize(max(2*hint, 8))
	return x
}

// resize rebuilds the table with at least size slots.
func (x *index) resize(size int) {
	bits := uint8(3)
	for 1<<bits < size {
		bits++
	}
	old := x.slots
	x.slots = make([]slot, 1<<bits)
	x.mask = 1<<bits - 1
	x.shift = 64 - bits
	x.n = 0
	for _, s := range old {
		if s.node != 0 {
			x.put(s.key, s.node-1)
		}
	}
}

// home is k's preferred slot: the top bits of k times 2^64/φ, which spreads the runs of consecutive
// block numbers that traces are made of.
func (x *index) home(k Key) uint64 { return uint64(k) * 0x9E3779B97F4A7C15 >> x.shift }

func (x *index) get(k Key) (int32, bool) {
	for i := x.home(k); ; i = (i + 1) & x.mask {
		s := &x.slots[i]
		if s.node == 0 {
			return none, false
		}
		if s.key == k {
			return s.node - 1, true
		}
	}
}

// put adds k, which must be absent.
func (x *index) put(k Key, node int32) {
	if 2*(x.n+1) > len(x.slots) {
		x.resize(2 * len(x.slots))
	}
	i := x.home(k)
	for x.slots[i].node != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = slot{key: k, node: node + 1}
	x.n++
}

// delete removes k, which must be present, and shifts back the entries of its probe run that
// the empty slot would otherwise cut off from their home.
func (x *index) delete(k Key) {
	i := x.home(k)
	for x.slots[i].key != k || x.slots[i].node == 0 {
		i = (i + 1) & x.mask
	}
	for j := (i + 1) & x.mask; x.slots[j].node != 0; j = (j + 1) & x.mask {
		// The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
		if (j-x.home(x.slots[j].key))&x.mask >= (j-i)&x.mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = slot{}
	x.n--
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
	i, ok := a.index.get(k)
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
