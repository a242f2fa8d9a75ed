package rangelock

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExclusive has goroutines increment counters over random overlapping ranges without any
// other lock: a lost update shows two holders of overlapping ranges (and -race sees the race).
func TestExclusive(t *testing.T) {
	const size, workers, rounds = 64, 4, 500
	l := New()
	counts := make([]int, size)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				lo := int64((i*7 + w*13) % size)
				hi := min(size, lo+1+int64((i*5+w)%9))
				l.Lock(lo, hi)
				for k := lo; k < hi; k++ {
					v := counts[k]
					counts[k] = v + 1
				}
				l.Unlock(lo, hi)
			}
		})
	}
	wg.Wait()
	want := make([]int, size)
	for w := range workers {
		for i := range rounds {
			lo := (i*7 + w*13) % size
			hi := min(size, lo+1+(i*5+w)%9)
			for k := lo; k < hi; k++ {
				want[k]++
			}
		}
	}
	require.Equal(t, want, counts)
}

// TestDisjointAtOnce holds two disjoint ranges at once from one goroutine: Lock does not wait for
// a range that only touches another's end.
func TestDisjointAtOnce(t *testing.T) {
	l := New()
	l.Lock(0, 10)
	l.Lock(10, 20)
	l.Unlock(0, 10)
	l.Unlock(10, 20)
	l.Lock(5, 15)
	l.Unlock(5, 15)
}
