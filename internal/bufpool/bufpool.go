// Package bufpool is the process's one pool of I/O buffers: the NBD server's request and reply
// payloads, the cache's fetches and write-backs, and the file backend's bounce buffers. Buffers
// come by power-of-two size class from 4 KiB to MaxPooled, so that a small request never holds a
// large buffer and the steady state of a busy server allocates nothing, and each starts at an
// address aligned for direct I/O (Align), so that any of them can go to an O_DIRECT file without a
// bounce copy.
//
// It must never hand one buffer to two holders: a buffer put back is the pool's, and its holder
// must not touch it again.
package bufpool

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

const (
	// Align is the alignment of every buffer: the logical block size that O_DIRECT asks for.
	Align = 4096
	// MaxPooled is the largest size class; larger buffers are allocated and dropped when put.
	MaxPooled = 1 << maxShift

	minShift = 12 // Align
	maxShift = 27 // 128 MiB
)

// DefaultBudget is the pool's budget (Budget) in a process that sets none: a test, a benchmark.
const DefaultBudget = 16 << 20

// The pool keeps the buffers put back, through garbage collections, while its buffers in use and
// kept together stay within its budget; past it, buffers go to pools, which collections empty. A
// sync.Pool alone loses its buffers at every collection; under a memory limit (the daemon's bound)
// collections come often, and a pool that empties at each of them makes every request allocate,
// which makes collections come oftener still and, on a machine whose CPU is busy elsewhere, lets
// garbage pile up past the limit (integration's TestMemoryBoundNBD). So the pool holds at most
// the most its holders held at once, up to the budget, and a steady load allocates nothing.
var (
	pools [maxShift - minShift + 1]sync.Pool // of *[]byte, so that putting one back does not allocate
	// budgets is the sum of the budgets AddBudget added: the I/O buffers of the daemons' memory
	// plans (docs/operations.md, "How much RAM").
	budgets atomic.Int64
	// inUse is the bytes of buffers handed out by Get and not yet put back.
	inUse atomic.Int64
	kept  struct {
		bytes   atomic.Int64
		classes [maxShift - minShift + 1]keptClass
	}
)

// AddBudget adds n bytes to the pool's budget, or takes them off with a negative n: a daemon adds
// the I/O buffers its memory bound plans for while it runs.
func AddBudget(n int64) { budgets.Add(n) }

// Budget is the most bytes of buffers, in use and kept, that the pool keeps: the sum of the
// budgets added, or DefaultBudget when none is.
func Budget() int64 {
	if b := budgets.Load(); b > 0 {
		return b
	}
	return DefaultBudget
}

type keptClass struct {
	mu   sync.Mutex
	bufs []*[]byte
}

func (k *keptClass) pop() *[]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.bufs); n > 0 {
		bp := k.bufs[n-1]
		k.bufs[n-1] = nil
		k.bufs = k.bufs[:n-1]
		return bp
	}
	return nil
}

func (k *keptClass) push(bp *[]byte) {
	k.mu.Lock()
	k.bufs = append(k.bufs, bp)
	k.mu.Unlock()
}

func class(n int) int {
	if n <= 1<<minShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minShift
}

// Get returns a buffer of length n, aligned to Align. Give it back with Put.
func Get(n int) *[]byte {
	c := class(n)
	if c >= len(pools) {
		b := Aligned(n)
		return &b
	}
	inUse.Add(1 << (c + minShift))
	if bp := kept.classes[c].pop(); bp != nil {
		kept.bytes.Add(-int64(cap(*bp)))
		*bp = (*bp)[:n]
		return bp
	}
	if v := pools[c].Get(); v != nil {
		bp := v.(*[]byte)
		*bp = (*bp)[:n]
		return bp
	}
	b := Aligned(1 << (c + minShift))[:n]
	return &b
}

// Size is the capacity of the buffer Get(n) returns: what it holds of memory.
func Size(n int) int {
	if c := class(n); c < len(pools) {
		return 1 << (c + minShift)
	}
	return n
}

// Put gives back a buffer from Get; one of a size no class has is dropped.
func Put(bp *[]byte) {
	c := class(cap(*bp))
	if c < len(pools) && cap(*bp) == 1<<(c+minShift) {
		size := int64(cap(*bp))
		held := inUse.Add(-size)
		if kept.bytes.Add(size)+held <= Budget() {
			kept.classes[c].push(bp)
			return
		}
		kept.bytes.Add(-size)
		pools[c].Put(bp)
	}
}

// Aligned allocates n bytes starting at an address that is a multiple of Align, outside the pool
// (a RAM tier, a buffer kept for good).
func Aligned(n int) []byte {
	// Go's allocator aligns large power-of-two sizes already; only otherwise is more allocated.
	if b := make([]byte, n); n == 0 || uintptr(unsafe.Pointer(&b[0]))%Align == 0 {
		return b
	}
	raw := make([]byte, n+Align)
	skip := int(-uintptr(unsafe.Pointer(&raw[0])) & (Align - 1))
	return raw[skip : skip+n : skip+n]
}
