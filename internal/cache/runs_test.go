package cache

import (
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// TestLineRuns: the lines that one request of several lines brings into the SSD tier take adjacent
// slots, even while other such requests fill it at the same time, and a read of them is one request
// to the device. A run read that fails is read again line by line: the reader gets its data, and
// only the lines that fail are dropped.
func TestLineRuns(t *testing.T) {
	const (
		line     = 16 << 10
		runLines = 4
		requests = 8
	)
	write := func(c *Cache, p []byte, off int64) error { _, err := c.WriteAt(p, off); return err }
	for _, tc := range []struct {
		name string
		mode Mode
		fill func(c *Cache, p []byte, off int64) error
	}{
		{"write-through writes", WriteThrough, write},
		{"write-back writes", WriteBack, write},
		{"read misses", WriteThrough, func(c *Cache, p []byte, off int64) error { _, err := c.ReadAt(p, off); return err }},
		{"prefetches", WriteThrough, func(c *Cache, p []byte, off int64) error { return c.Prefetch(off, int64(len(p))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := make([]byte, 2*requests*runLines*line)
			for i := range want {
				want[i] = byte(i*7 + i/4096)
			}
			b := mem.New(int64(len(want)))
			_, err := b.WriteAt(want, 0)
			require.NoError(t, err)
			ssd := fault.New(mem.New(2*requests*runLines*line), fault.Options{})
			c := newCache(t, b, layout{line: line, ssd: 2 * requests * runLines, mode: tc.mode, admission: "always"}, nil, ssd)
			defer c.Close()

			var wg sync.WaitGroup
			for r := range requests {
				off := int64(r) * runLines * line
				wg.Go(func() {
					buf := make([]byte, runLines*line)
					copy(buf, want[off:])
					require.NoError(t, tc.fill(c, buf, off))
				})
			}
			wg.Wait()

			buf := make([]byte, runLines*line)
			for r := range requests {
				first := uint64(r * runLines)
				s0, ok := c.ssd.slotOf(first)
				require.True(t, ok, "line %d cached", first)
				for l := first + 1; l < first+runLines; l++ {
					s, ok := c.ssd.slotOf(l)
					require.True(t, ok, "line %d cached", l)
					require.Equal(t, s0+uint32(l-first), s, "line %d's slot follows line %d's", l, first)
				}
				off := int64(first) * line
				reads := ssd.Counts()[fault.Read]
				_, err := c.ReadAt(buf, off)
				require.NoError(t, err)
				require.Equal(t, want[off:off+runLines*line], buf)
				require.Equal(t, reads+1, ssd.Counts()[fault.Read], "request %d: one read of the device", r)
			}

			errs := c.Stats().Tiers[0].Errors
			reads := ssd.Counts()[fault.Read]
			ssd.AddRule(fault.Rule{Op: fault.Read, Nth: reads + 1})
			_, err = c.ReadAt(buf, 0)
			require.NoError(t, err)
			require.Equal(t, want[:runLines*line], buf)
			require.Equal(t, reads+1+runLines, ssd.Counts()[fault.Read], "the failed run, then each line")
			require.Equal(t, errs, c.Stats().Tiers[0].Errors, "no line failed")

			if tc.mode == WriteBack {
				return // the lines are dirty: the backend lacks their data
			}
			ssd.SetFailing(true)
			_, err = c.ReadAt(buf, 0)
			ssd.SetFailing(false)
			require.NoError(t, err, "served from the backend")
			require.Equal(t, want[:runLines*line], buf)
			for l := range uint64(runLines) {
				_, ok := c.ssd.slotOf(l)
				require.False(t, ok, "line %d dropped after its read failed", l)
			}
		})
	}
}

// TestAcquireLinesOrder: slots freed by evictions are given to a run of new lines in ascending
// order, and a single line takes the last slot released, as before runs existed.
func TestAcquireLinesOrder(t *testing.T) {
	tr, err := newTier(tierSpec{name: "ram", slots: 16, lineSize: 64 << 10, policy: "lru", admission: "always"},
		slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	tr.st = newRAMStore(tr.slots, tr.lineSize)
	for line := range uint64(16) {
		g := tr.acquire(line)
		require.True(t, g.ok)
		require.Equal(t, uint32(line), g.slot)
		tr.unpin(g.slot)
	}
	tr.mu.Lock()
	for _, line := range []uint64{12, 3, 9, 5, 14} {
		tr.evict.Remove(policy.Key(line))
		tr.dropLocked(line)
	}
	tr.mu.Unlock()
	lines := []uint64{100, 101, 102}
	got := make([]grant, len(lines))
	tr.acquireLines(lines, got)
	for i, g := range got {
		require.True(t, g.ok)
		require.Equal(t, []uint32{5, 9, 14}[i], g.slot, "line %d", lines[i])
	}
	g := tr.acquire(200)
	require.True(t, g.ok)
	require.Equal(t, uint32(3), g.slot, "the last released of those left")
}
