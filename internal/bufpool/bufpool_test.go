package bufpool

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// Every buffer has the length asked for, a power-of-two capacity of its class, and an aligned
// start; a buffer put back is handed out again for its class, and one of no class is dropped.
func TestGetPut(t *testing.T) {
	for _, tc := range []struct{ n, capacity int }{
		{0, 4096}, {1, 4096}, {4096, 4096}, {4097, 8192}, {65536, 65536}, {3 << 20, 4 << 20}, {MaxPooled, MaxPooled},
		{MaxPooled + 1, MaxPooled + 1},
	} {
		bp := Get(tc.n)
		require.Len(t, *bp, tc.n)
		require.Equal(t, tc.capacity, cap(*bp), "n=%d", tc.n)
		require.Equal(t, tc.capacity, Size(tc.n), "n=%d", tc.n)
		if tc.n > 0 {
			require.Zero(t, uintptr(unsafe.Pointer(&(*bp)[0]))%Align, "n=%d", tc.n)
		}
		Put(bp)
	}
	for _, n := range []int{1, 5000, 100, 1 << 20} {
		require.Zero(t, uintptr(unsafe.Pointer(&Aligned(n)[0]))%Align, "n=%d", n)
	}
}

// A steady Get and Put of one size allocates nothing.
func TestNoAllocations(t *testing.T) {
	Put(Get(64 << 10))
	require.Zero(t, testing.AllocsPerRun(100, func() { Put(Get(64 << 10)) }))
}

// Buffers put back survive garbage collections, up to MaxKept bytes: a daemon under its memory
// limit, collecting often, still reuses them rather than allocating at every request.
func TestKeptThroughCollections(t *testing.T) {
	const size = 1 << 20
	for c := range kept.classes { // what earlier tests kept
		for bp := kept.classes[c].pop(); bp != nil; bp = kept.classes[c].pop() {
			kept.bytes.Add(-int64(cap(*bp)))
		}
	}
	var bufs []*[]byte
	for range MaxKept/size + 2 {
		bufs = append(bufs, Get(size))
	}
	for _, bp := range bufs {
		Put(bp)
	}
	require.LessOrEqual(t, kept.bytes.Load(), int64(MaxKept))
	runtime.GC()
	runtime.GC() // a sync.Pool's buffers are gone after two
	again := map[*[]byte]bool{}
	for range MaxKept / size {
		again[Get(size)] = true
	}
	for _, bp := range bufs[:MaxKept/size] {
		require.True(t, again[bp], "a kept buffer came back")
	}
	for bp := range again {
		Put(bp)
	}
}
