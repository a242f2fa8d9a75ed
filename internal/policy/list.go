package policy

import "github.com/tierblk/tierblk/internal/keyindex"

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
	index keyindex.Index
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
		index: keyindex.New(hint, prealloc),
	}
}

// lookup returns the node of k.
func (a *arena[M]) lookup(k Key) (int32, bool) { return a.index.Get(uint64(k)) }

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
	a.index.Put(uint64(k), i)
	return i
}

// release unindexes node i (already unlinked) and returns it to the free list.
func (a *arena[M]) release(i int32) {
	a.index.Delete(uint64(a.nodes[i].key))
	a.nodes[i].next = a.free
	a.free = i
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
