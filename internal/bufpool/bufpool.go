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

// A *[]byte is pooled, not a []byte, so that putting it back does not allocate.
var pools [maxShift - minShift + 1]sync.Pool

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
