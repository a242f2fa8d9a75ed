package bufpool

import (
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
