package blocklock

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Writers locking pairs of blocks, in either order and with stripes that wrap, never deadlock,
// and a stripe is never held by two of them at once.
func TestStripes(t *testing.T) {
	var s Stripes
	var held [len(Stripes{})]atomic.Int32
	var clashes atomic.Int32
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				first, last := int64(i%70), int64(63+(i+w)%3)
				if w%2 == 1 {
					first, last = last, first
				}
				stripes := map[int64]bool{first % 64: true, last % 64: true}
				unlock := s.Lock(first, last)
				for x := range stripes {
					if held[x].Add(1) != 1 {
						clashes.Add(1)
					}
				}
				for x := range stripes {
					held[x].Add(-1)
				}
				unlock()
			}
		})
	}
	wg.Wait()
	require.Zero(t, clashes.Load(), "a stripe held by two writers at once")
}
