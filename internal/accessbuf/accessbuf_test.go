package accessbuf

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Hits recorded from many goroutines at once are all drained, once each, up to what the stripes
// hold; the rest are dropped, and a full stripe says so.
func TestBuffer(t *testing.T) {
	var b Buffer
	const workers, each = 8, 100 // fewer than the stripes hold: none may be dropped
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				b.Record(uint64(w*each + i))
			}
		})
	}
	wg.Wait()
	seen := map[uint64]int{}
	b.Drain(func(line uint64) { seen[line]++ })
	total := 0
	for _, n := range seen {
		require.Equal(t, 1, n)
		total += n
	}
	// A stripe is chosen at random, so one may fill before the others: at most its overflow is lost.
	require.LessOrEqual(t, total, workers*each)
	require.Greater(t, total, workers*each-accessStripes*accessStripeLen/2)
	require.Zero(t, b.pending.Load())
	drained := 0
	b.Drain(func(uint64) { drained++ })
	require.Zero(t, drained, "a drained buffer is empty")

	full := false
	for i := range accessStripes*accessStripeLen + 1 {
		full = b.Record(uint64(i)) || full
	}
	require.True(t, full, "recording more than the buffer holds fills a stripe")
	require.LessOrEqual(t, int(b.pending.Load()), accessStripes*accessStripeLen)
}
