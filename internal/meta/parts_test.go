package meta

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// bigCommit returns n puts of lines 0..n-1, each of a 1 MiB line (256 blocks) with every block
// valid and half of them dirty: the largest record the engine writes.
func bigCommit(n int) []Op {
	ops := make([]Op, n)
	for i := range ops {
		ops[i] = put(uint64(i), uint32(i), []uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)},
			[]uint64{^uint64(0), 0, ^uint64(0), 0})
	}
	return ops
}

// TestCommitTooBig: a commit over the store's transaction limit fails whole with ErrTooBig, and
// CommitParts writes it all, in order, reporting each part.
func TestCommitTooBig(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		n := 40_000 // over badger's limit with 16 MiB memory tables, and over Mem's
		if b, ok := s.(*Badger); ok {
			n = max(n, int(b.db.MaxBatchCount())+1)
		}
		ops := bigCommit(n)
		require.ErrorIs(t, s.Commit(ops, true), ErrTooBig)
		require.Empty(t, allLines(t, s), "a commit refused as too big applied nothing")

		var parts, seen int
		require.NoError(t, CommitParts(s, ops, true, func(part []Op) {
			require.Equal(t, ops[seen].Rec.Line, part[0].Rec.Line, "parts come in order")
			require.LessOrEqual(t, len(part), PartOps)
			parts++
			seen += len(part)
		}))
		require.Equal(t, n, seen)
		require.Greater(t, parts, 1)
		got := allLines(t, s)
		require.Len(t, got, n)
		require.Equal(t, ops[n-1].Rec, got[n-1])
	})
}

// TestPartFitsBadger: a part of PartOps of the largest records fits one badger transaction, so
// CommitParts never needs to halve its parts on the daemon's store.
func TestPartFitsBadger(t *testing.T) {
	b := openBadger(t, t.TempDir())
	defer b.Close()
	require.NoError(t, b.Commit(bigCommit(PartOps), true))
}

// TestPackedPartsFitBadger: records of the packed layout, with 256 location words each, are too
// large for PartOps of them in one badger transaction; CommitParts halves its parts until they fit.
func TestPackedPartsFitBadger(t *testing.T) {
	b := openBadger(t, t.TempDir())
	defer b.Close()
	ops := bigCommit(PartOps + 10)
	for i := range ops {
		ops[i].Rec.Loc = make([]uint64, 256)
		for j := range ops[i].Rec.Loc {
			ops[i].Rec.Loc[j] = uint64(i)<<8 | uint64(j) | 1<<63
		}
	}
	require.ErrorIs(t, b.Commit(ops[:PartOps], false), ErrTooBig)
	var parts int
	require.NoError(t, CommitParts(b, ops, true, func([]Op) { parts++ }))
	require.Greater(t, parts, 2)
	got := allLines(t, b)
	require.Len(t, got, len(ops))
	require.Equal(t, ops[len(ops)-1].Rec, got[len(got)-1])
}

// TestCommitPartsHalves: under a store limit below PartOps, parts shrink until they fit.
func TestCommitPartsHalves(t *testing.T) {
	m := NewMem()
	m.SetMaxOps(3)
	ops := bigCommit(50)
	var sizes []int
	require.NoError(t, CommitParts(m, ops, true, func(part []Op) { sizes = append(sizes, len(part)) }))
	for _, n := range sizes {
		require.LessOrEqual(t, n, 3)
	}
	require.Len(t, allLines(t, m), 50)
	m.Crash()
	require.Len(t, allLines(t, m), 50, "the last part's sync covers the earlier parts")
}

// failAfter passes the first n commits to its store and fails every later one.
type failAfter struct {
	Store
	mu sync.Mutex
	n  int
}

var errInjected = errors.New("injected commit failure")

func (f *failAfter) Commit(ops []Op, sync bool) error {
	f.mu.Lock()
	ok := f.n > 0
	f.n--
	f.mu.Unlock()
	if !ok {
		return errInjected
	}
	return f.Store.Commit(ops, sync)
}

// TestCommitPartsFailsHalfWay: when a part fails, the parts before it are applied (and reported),
// the ones after it are not, and the error says how far it got.
func TestCommitPartsFailsHalfWay(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ops := bigCommit(3*PartOps + 10)
		var reported int
		err := CommitParts(&failAfter{Store: s, n: 2}, ops, true, func(part []Op) { reported += len(part) })
		require.ErrorIs(t, err, errInjected)
		require.ErrorContains(t, err, fmt.Sprintf("after %d of its %d ops", 2*PartOps, 3*PartOps+10))
		require.Equal(t, 2*PartOps, reported)
		got := allLines(t, s)
		require.Len(t, got, 2*PartOps, "exactly the parts before the failure are applied")
		require.Equal(t, uint64(2*PartOps-1), got[len(got)-1].Line)
	})
}
