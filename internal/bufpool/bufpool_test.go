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

// drainKept empties the kept buffers (what earlier tests kept), so that a test starts from none,
// and returns the room the budget leaves beside the buffers earlier tests did not put back.
func drainKept() int {
	for c := range kept.classes {
		for bp := kept.classes[c].pop(); bp != nil; bp = kept.classes[c].pop() {
			kept.bytes.Add(-int64(cap(*bp)))
		}
	}
	return int(Budget() - inUse.Load())
}

// Buffers put back survive garbage collections while the pool's buffers, in use and kept, stay
// within its budget: a daemon under its memory limit collects often, and a pool that lost its
// buffers at each collection would make every request allocate.
func TestKeptThroughCollections(t *testing.T) {
	const size = 1 << 20
	budget := drainKept()
	var bufs []*[]byte
	for range budget/size + 2 {
		bufs = append(bufs, Get(size))
	}
	for _, bp := range bufs {
		Put(bp)
	}
	require.LessOrEqual(t, kept.bytes.Load(), int64(budget))
	runtime.GC()
	runtime.GC() // a sync.Pool's buffers are gone after two
	again := map[*[]byte]bool{}
	for range budget / size {
		again[Get(size)] = true
	}
	// The first ones put back were not kept: with the rest still in use, the budget was full.
	for _, bp := range bufs[len(bufs)-budget/size:] {
		require.True(t, again[bp], "a kept buffer came back")
	}
	for bp := range again {
		Put(bp)
	}
}

// Buffers in use count against the budget: the pool keeps only what, with them, fits in it, and
// a budget added (a daemon's) lets it keep more.
func TestBudgetCountsBuffersInUse(t *testing.T) {
	const size = 1 << 20
	// Whole buffers: buffers another test left in use need not be a multiple of size.
	budget := drainKept() / size * size
	held := make([]*[]byte, budget/size/2)
	for i := range held {
		held[i] = Get(size)
	}
	var back []*[]byte
	for range budget / size {
		back = append(back, Get(size))
	}
	for _, bp := range back {
		Put(bp)
	}
	require.Equal(t, int64(budget-len(held)*size), kept.bytes.Load(), "kept beside the buffers in use: the budget's rest")

	AddBudget(2 * DefaultBudget)
	defer AddBudget(-2 * DefaultBudget)
	require.Equal(t, int64(2*DefaultBudget), Budget(), "an added budget replaces the default")
	for _, bp := range held {
		Put(bp)
	}
	require.Equal(t, int64(budget), kept.bytes.Load(), "all kept within the daemon's budget")
	drainKept()
}
