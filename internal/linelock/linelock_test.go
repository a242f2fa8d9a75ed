package linelock

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Locks exclude each other per line, and unused ones do not pile up: a shard keeps at most
// keepLocks of them.
func TestLocks(t *testing.T) {
	var l Locks
	entries := func() (n int) {
		for i := range l.shards {
			n += len(l.shards[i].m)
		}
		return n
	}

	// Many lines, each locked and unlocked once: the maps stay bounded.
	for line := range uint64(100_000) {
		l.Lock(line, line+1)
		l.Unlock(line, line+1)
	}
	require.LessOrEqual(t, entries(), len(l.shards)*(keepLocks+1))

	// Writers of overlapping ranges never run on a line at once.
	var wg sync.WaitGroup
	var busy [8]int
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				first := uint64((g + i) % 6)
				l.Lock(first, first+2)
				for line := first; line <= first+2; line++ {
					busy[line]++
					assert.Equal(t, 1, busy[line], "line %d held twice", line)
				}
				for line := first; line <= first+2; line++ {
					busy[line]--
				}
				l.Unlock(first, first+2)
			}
		})
	}
	// Shared holders of a line (reads that change nothing) run together, never with a writer.
	var shared [8]atomic.Int32
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				line := uint64((g + i) % 3)
				if g%2 == 0 {
					l.Lock(line, line)
					assert.Zero(t, shared[line].Load(), "line %d written while read", line)
					busy[line]++
					assert.Equal(t, 1, busy[line], "line %d held twice", line)
					busy[line]--
					l.Unlock(line, line)
					continue
				}
				if l.TryRLock(line) {
					shared[line].Add(1)
					assert.Zero(t, busy[line], "line %d read while written", line)
					shared[line].Add(-1)
					l.RUnlock(line)
				}
			}
		})
	}
	wg.Wait()
	for line := range uint64(8) {
		e := l.shard(line).m[line]
		if e != nil {
			require.Zero(t, e.refs, "line %d still referenced", line)
		}
	}
}
