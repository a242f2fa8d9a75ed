package cache

import (
	"log/slog"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/linebits"
)

// maxIndexBytesPerLine is the budget the README states for the default policy: a 1 TiB SSD tier of
// 64 KiB lines (2^24 lines) must fit in 3 GiB of index RAM; with lru, in 2 GiB. Of each line's
// bytes, 64 are its 16 blocks' checksums.
var maxIndexBytesPerLine = map[string]float64{DefaultPolicy: float64(slotIndexBytesPerLine(16)), "lru": 64 + 16*4}

// TestIndexBytesPerLine measures the RAM the SSD tier's index takes per cached line with the default
// policy and others: the line map, the valid bits, the free list and the eviction policy, full.
func TestIndexBytesPerLine(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a large index")
	}
	const slots = 1 << 20
	for _, pol := range []string{"lru", "s3fifo", "arc"} {
		before := heapInUse()
		// With the write-back state too: the dirty bits per line, and the set of dirty lines, here
		// over a backend of the tier's size (it costs one bit per backend line beside).
		tr, err := newTier(tierSpec{name: "ssd", slots: slots, lineSize: 64 << 10, policy: pol,
			admission: "always", lines: slots}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		tr.st = &slotStore{t: tr}
		// Insert twice the capacity so that policies with ghost entries fill those too.
		for line := range uint64(2 * slots) {
			g := tr.acquire(line * 7)
			if !g.ok {
				t.Fatalf("no slot for line %d", line)
			}
			tr.markValid(line*7, g.slot, linebits.Range(0, tr.blocks), false, lineBits{})
		}
		after := heapInUse()
		perLine := float64(after-before) / slots
		t.Logf("%s: %.1f bytes of index per line; a 1 TiB SSD tier of 64 KiB lines needs %.0f MiB",
			pol, perLine, perLine*(1<<24)/(1<<20))
		if budget, ok := maxIndexBytesPerLine[pol]; ok && perLine > budget {
			t.Errorf("%s: %.1f bytes per line, over the budget of %.0f", pol, perLine, budget)
		}
		runtime.KeepAlive(tr)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// maxPackedIndexBytesPerLine is the budget docs/architecture.md states for the index of a tier with
// reduction compress, per line it indexes (the default policy): the slot layout's, and the location
// word of each of a 64 KiB line's 16 blocks.
var maxPackedIndexBytesPerLine = packedIndexBytesPerLine(16)

// TestPackedIndexBytesPerLine measures the same with reduction compress: a packed tier indexes
// packedSlotsPerLine lines per line of room, each with its blocks' location words.
func TestPackedIndexBytesPerLine(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a large index")
	}
	const slots = 1 << 20
	before := heapInUse()
	tr, err := newTier(tierSpec{name: "ssd", slots: slots, lineSize: 64 << 10, policy: DefaultPolicy,
		admission: "always", lines: slots, reduction: ReductionCompress}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	tr.st, err = newPacked(tr, nil, slots/packedSlotsPerLine*(64<<10))
	require.NoError(t, err)
	for line := range uint64(2 * slots) {
		g := tr.acquire(line * 7)
		require.True(t, g.ok, "no slot for line %d", line)
		tr.markValid(line*7, g.slot, linebits.Range(0, tr.blocks), false, lineBits{})
	}
	perLine := float64(heapInUse()-before) / slots
	t.Logf("%.1f bytes of index per line indexed; a 1 TiB SSD tier of 64 KiB lines holding %d:1 needs %.0f MiB",
		perLine, packedSlotsPerLine, perLine*packedSlotsPerLine*(1<<24)/(1<<20))
	require.LessOrEqual(t, perLine, float64(maxPackedIndexBytesPerLine))
	runtime.KeepAlive(tr)
}

// TestEpochBytesPerDirtyLine measures the RAM FLUSH order's bookkeeping (epochs) takes per dirty
// line of 64 KiB, with its blocks in one epoch and with each in an epoch of its own (the most a
// line's blocks can be in), against epochBytes, which the memory plan counts for each line that
// may be dirty.
func TestEpochBytesPerDirtyLine(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a large index")
	}
	const blocks = 16
	// Maps grow by doubling: at a count just past a doubling each entry has the most room.
	for _, c := range []struct {
		lines  int
		spread bool
	}{{1 << 17, false}, {1<<17 + 1<<12, false}, {1 << 17, true}, {1<<17 + 1<<12, true}} {
		lines, spread := c.lines, c.spread
		before := heapInUse()
		e := newEpochs()
		for b := range blocks {
			for slot := range uint32(lines) {
				if b == 0 || spread {
					e.update(uint64(slot)*7, slot, linebits.Range(0, b), linebits.Range(0, b+1))
				}
			}
			if spread {
				e.next()
			}
		}
		perLine := float64(heapInUse()-before) / float64(lines)
		t.Logf("%d lines, one epoch a block: %v: %.1f bytes per dirty line (epochBytes: %d)", lines, spread, perLine, epochBytes(blocks))
		if spread {
			require.LessOrEqual(t, perLine, float64(epochBytes(blocks)))
		} else {
			require.LessOrEqual(t, perLine, float64(epochLineBytes))
		}
		runtime.KeepAlive(e)
	}
}
