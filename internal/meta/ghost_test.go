package meta

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/require"
)

func allGhosts(t testing.TB, s Store) []Ghost {
	t.Helper()
	var got []Ghost
	require.NoError(t, s.Ghosts(func(g Ghost) error {
		got = append(got, g)
		return nil
	}))
	return got
}

// block is n bytes of data that differ from block to block with seed.
func block(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func putGhost(epoch, line uint64, blk uint32, sum uint32, data []byte) Op {
	return Op{Ghost: &Ghost{Epoch: epoch, Line: line, Block: blk, Sum: sum, Data: data}}
}

func delGhost(epoch, line uint64, blk uint32) Op {
	return Op{Delete: true, Ghost: &Ghost{Epoch: epoch, Line: line, Block: blk}}
}

func TestGhosts(t *testing.T) {
	full := block(1, MaxGhostData)
	tests := []struct {
		name      string
		commits   [][]Op
		want      []Ghost
		wantLines []Line
	}{
		{"empty", nil, nil, nil},
		{"key order across epochs, lines and blocks, beside line ops", [][]Op{
			{putGhost(2, 1, 0, 20, []byte{2}), put(1, 1, []uint64{1}, nil), putGhost(1, 9, 0, 10, []byte{1})},
			{putGhost(1, 1, 5, 11, []byte{3}), put(9, 2, []uint64{3}, nil), putGhost(1, 1, 4, 12, []byte{4}), putGhost(1<<32, 0, 0, 30, []byte{5})},
		}, []Ghost{
			{Epoch: 1, Line: 1, Block: 4, Sum: 12, Data: []byte{4}},
			{Epoch: 1, Line: 1, Block: 5, Sum: 11, Data: []byte{3}},
			{Epoch: 1, Line: 9, Block: 0, Sum: 10, Data: []byte{1}},
			{Epoch: 2, Line: 1, Block: 0, Sum: 20, Data: []byte{2}},
			{Epoch: 1 << 32, Line: 0, Block: 0, Sum: 30, Data: []byte{5}},
		}, []Line{{Line: 1, Slot: 1, Valid: []uint64{1}}, {Line: 9, Slot: 2, Valid: []uint64{3}}}},
		{"a zero block reads back as nil", [][]Op{{putGhost(1, 1, 1, 7, nil), putGhost(1, 1, 2, 0, []byte{})}},
			[]Ghost{{Epoch: 1, Line: 1, Block: 1, Sum: 7}, {Epoch: 1, Line: 1, Block: 2}}, nil},
		{"a full block", [][]Op{{putGhost(3, 4, 5, 0xffffffff, full)}},
			[]Ghost{{Epoch: 3, Line: 4, Block: 5, Sum: 0xffffffff, Data: full}}, nil},
		{"delete removes exactly the keyed one", [][]Op{
			{putGhost(1, 2, 3, 1, []byte{1}), putGhost(1, 2, 4, 2, []byte{2}), putGhost(1, 3, 3, 3, []byte{3}), putGhost(2, 2, 3, 4, []byte{4})},
			{delGhost(1, 2, 3)},
		}, []Ghost{
			{Epoch: 1, Line: 2, Block: 4, Sum: 2, Data: []byte{2}},
			{Epoch: 1, Line: 3, Block: 3, Sum: 3, Data: []byte{3}},
			{Epoch: 2, Line: 2, Block: 3, Sum: 4, Data: []byte{4}},
		}, nil},
		{"delete ignores Sum and Data", [][]Op{
			{putGhost(1, 2, 3, 1, []byte{1})},
			{{Delete: true, Ghost: &Ghost{Epoch: 1, Line: 2, Block: 3, Sum: 9, Data: block(0, MaxGhostData+1)}}},
		}, nil, nil},
		{"delete missing", [][]Op{{delGhost(1, 2, 3)}}, nil, nil},
		{"re-put replaces", [][]Op{
			{putGhost(1, 2, 3, 1, full)},
			{putGhost(1, 2, 3, 2, []byte{9, 9})},
		}, []Ghost{{Epoch: 1, Line: 2, Block: 3, Sum: 2, Data: []byte{9, 9}}}, nil},
		{"re-put with a zero block", [][]Op{
			{putGhost(1, 2, 3, 1, full)},
			{putGhost(1, 2, 3, 0, nil)},
		}, []Ghost{{Epoch: 1, Line: 2, Block: 3}}, nil},
		{"ops apply in order", [][]Op{{
			putGhost(1, 2, 3, 1, []byte{1}), delGhost(1, 2, 3), putGhost(1, 2, 4, 2, []byte{2}), putGhost(1, 2, 4, 3, []byte{3}),
			delGhost(1, 2, 5), putGhost(1, 2, 5, 4, []byte{4}),
		}}, []Ghost{{Epoch: 1, Line: 2, Block: 4, Sum: 3, Data: []byte{3}}, {Epoch: 1, Line: 2, Block: 5, Sum: 4, Data: []byte{4}}}, nil},
		{"line ops leave ghosts of the same line alone", [][]Op{
			{put(5, 1, []uint64{1}, nil), putGhost(5, 5, 0, 1, []byte{1})},
			{del(5)},
		}, []Ghost{{Epoch: 5, Line: 5, Sum: 1, Data: []byte{1}}}, nil},
		{"ghost ops leave the line's record alone", [][]Op{
			{put(5, 1, []uint64{1}, nil), putGhost(5, 5, 0, 1, []byte{1})},
			{delGhost(5, 5, 0)},
		}, nil, []Line{{Line: 5, Slot: 1, Valid: []uint64{1}}}},
		{"Rec is ignored for a ghost op", [][]Op{{
			// A record the stores would refuse, and a delete of a line that is there.
			{Ghost: &Ghost{Epoch: 1, Line: 2, Sum: 1}, Rec: Line{Line: 2, Dirty: []uint64{1}}},
			put(3, 1, nil, nil),
			{Delete: true, Ghost: &Ghost{Epoch: 1, Line: 3, Block: 9}, Rec: Line{Line: 3}},
		}}, []Ghost{{Epoch: 1, Line: 2, Sum: 1}}, []Line{{Line: 3, Slot: 1}}},
		{"extreme values", [][]Op{{putGhost(1<<64-1, 1<<64-1, 1<<32-1, 1<<32-1, []byte{0xff})}},
			[]Ghost{{Epoch: 1<<64 - 1, Line: 1<<64 - 1, Block: 1<<32 - 1, Sum: 1<<32 - 1, Data: []byte{0xff}}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, s Store) {
				for i, ops := range tt.commits {
					require.NoError(t, s.Commit(ops, i%2 == 0))
				}
				require.Equal(t, tt.want, allGhosts(t, s))
				require.Equal(t, tt.wantLines, allLines(t, s), "Lines sees line records alone")
			})
		})
	}
}

// TestGhostTooMuchData: a ghost put with more data than a block fails its whole commit, line ops
// and other ghost ops included.
func TestGhostTooMuchData(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		before := Ghost{Epoch: 1, Line: 1, Block: 1, Sum: 1, Data: []byte{1}}
		require.NoError(t, s.Commit([]Op{{Ghost: &before}}, true))
		err := s.Commit([]Op{
			put(1, 1, []uint64{1}, nil),
			delGhost(1, 1, 1),
			putGhost(1, 1, 2, 2, block(0, MaxGhostData)),
			putGhost(2, 3, 4, 5, block(0, MaxGhostData+1)),
		}, true)
		require.ErrorContains(t, err, "op 3: the ghost of line 3 block 4, epoch 2, has 4097 bytes of data, more than a block's 4096")
		require.Empty(t, allLines(t, s), "a rejected commit applies none of its ops")
		require.Equal(t, []Ghost{before}, allGhosts(t, s), "a rejected commit applies none of its ops")
	})
}

func TestGhostsOrderAndStop(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		rng := rand.New(rand.NewPCG(3, 4))
		type key struct {
			epoch, line uint64
			block       uint32
		}
		want := map[key]bool{{0, 0, 0}: true, {1<<64 - 1, 1<<64 - 1, 1<<32 - 1}: true, {1, 1 << 40, 0}: true, {1 << 40, 1, 0}: true}
		for len(want) < 200 {
			// Few epochs and lines, so that keys share their first fields.
			want[key{rng.Uint64N(4), rng.Uint64N(8), rng.Uint32()}] = true
		}
		var ops []Op
		for k := range want { // map order: random
			ops = append(ops, putGhost(k.epoch, k.line, k.block, uint32(k.line), binaryOf(k.block)))
		}
		require.NoError(t, s.Commit(ops, false))

		got := allGhosts(t, s)
		require.Len(t, got, len(want))
		for i, g := range got {
			require.True(t, want[key{g.Epoch, g.Line, g.Block}])
			require.Equal(t, uint32(g.Line), g.Sum)
			require.Equal(t, binaryOf(g.Block), g.Data)
			if i > 0 {
				p := got[i-1]
				require.True(t, p.Epoch < g.Epoch || p.Epoch == g.Epoch && (p.Line < g.Line || p.Line == g.Line && p.Block < g.Block),
					"ghosts out of order: %+v before %+v", p, g)
			}
		}

		stop := errors.New("stop")
		calls := 0
		err := s.Ghosts(func(Ghost) error {
			calls++
			if calls == 3 {
				return stop
			}
			return nil
		})
		require.Same(t, stop, err, "Ghosts returns fn's error as is")
		require.Equal(t, 3, calls, "Ghosts went on after fn's error")
	})
}

// binaryOf is some data that says which block it is of.
func binaryOf(b uint32) []byte { return []byte(fmt.Sprint(b)) }

// TestGhostsSnapshot: Ghosts reads the ghosts there were when it started, while fn commits.
func TestGhostsSnapshot(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		var ops []Op
		for i := range uint64(10) {
			ops = append(ops, putGhost(1, i, 0, uint32(i), []byte{byte(i)}))
		}
		require.NoError(t, s.Commit(ops, false))
		var seen []uint64
		require.NoError(t, s.Ghosts(func(g Ghost) error {
			seen = append(seen, g.Line)
			// Each deletes the ghost after it, and adds one that sorts last.
			return s.Commit([]Op{delGhost(1, g.Line+1, 0), putGhost(2, g.Line, 0, 0, nil)}, false)
		}))
		require.Equal(t, []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, seen)
		got := allGhosts(t, s)
		require.Len(t, got, 11) // epoch 1's line 0, and epoch 2's ten
		require.Equal(t, Ghost{Epoch: 1, Sum: 0, Data: []byte{0}}, got[0])
	})
}

func TestStoreDoesNotShareGhostData(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		data := []byte{1, 2, 3}
		g := Ghost{Epoch: 1, Line: 2, Block: 3, Sum: 4, Data: data}
		require.NoError(t, s.Commit([]Op{{Ghost: &g}}, false))
		data[0] = 9
		g.Sum = 9
		require.NoError(t, s.Ghosts(func(g Ghost) error {
			g.Data[1] = 9
			return nil
		}))
		require.Equal(t, []Ghost{{Epoch: 1, Line: 2, Block: 3, Sum: 4, Data: []byte{1, 2, 3}}}, allGhosts(t, s))
	})
}

// TestGhostCommitTooBig: ghosts count towards a commit's limit as line records do (Badger: by
// their bytes, some 76 ghosts of 4 KiB in a transaction; Mem: by ops), and CommitParts splits a
// commit of them.
func TestGhostCommitTooBig(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		n := PartOps + 1
		if b, ok := s.(*Badger); ok {
			n = int(b.db.MaxBatchSize())/MaxGhostData + 1
		}
		ops := make([]Op, n)
		for i := range ops {
			ops[i] = putGhost(1, uint64(i), 0, uint32(i), block(byte(i), MaxGhostData))
		}
		require.ErrorIs(t, s.Commit(ops, true), ErrTooBig)
		require.Empty(t, allGhosts(t, s), "a commit refused as too big applied nothing")

		var parts int
		require.NoError(t, CommitParts(s, ops, true, func([]Op) { parts++ }))
		require.Greater(t, parts, 1)
		got := allGhosts(t, s)
		require.Len(t, got, n)
		require.Equal(t, *ops[n-1].Ghost, got[n-1])

		if _, ok := s.(*Badger); ok {
			for i := range ops {
				ops[i].Ghost.Epoch = 2
			}
			require.NoError(t, s.Commit(ops[:76], false), "Badger.Commit's comment")
		}
	})
}

// need counts a commit's ghosts: their bytes on top, and a ghost put is never an invalidation.
func TestNeedCountsGhosts(t *testing.T) {
	const ghost = ghostKeyLen + 4 // a zero block's ghost
	tests := []struct {
		name string
		ops  []Op
		want uint64
	}{
		{"invalidations alone", []Op{{Delete: true, Invalidates: true}}, ReserveFree},
		{"a line put", []Op{put(1, 1, nil, nil)}, MinFree},
		{"a ghost delete that invalidates", []Op{{Delete: true, Invalidates: true, Ghost: &Ghost{}}}, ReserveFree},
		{"a ghost delete", []Op{{Delete: true, Ghost: &Ghost{}}}, MinFree},
		{"a ghost put that says it invalidates", []Op{{Invalidates: true, Ghost: &Ghost{}}}, MinFree + ghost},
		{"ghost puts with data", []Op{putGhost(1, 1, 1, 1, block(0, MaxGhostData)), put(1, 1, nil, nil), putGhost(1, 1, 2, 1, []byte{1})},
			MinFree + ghost + MaxGhostData + ghost + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, need(tt.ops))
		})
	}
}

func TestBadgerGhostsReopen(t *testing.T) {
	dir := t.TempDir()
	b := openBadger(t, dir)
	require.NoError(t, b.SetSuperblock(testSB))
	var want []Ghost
	var lines []Line
	for i := range uint64(100) {
		g := Ghost{Epoch: i / 10, Line: i % 10, Block: uint32(i), Sum: uint32(i) * 3, Data: block(byte(i), int(i)*41)}
		l := Line{Line: i, Slot: uint32(i), Valid: []uint64{i | 1}}
		want = append(want, cloneGhost(g))
		lines = append(lines, l)
		require.NoError(t, b.Commit([]Op{{Ghost: &g}, {Rec: l}}, i%7 == 0))
	}
	require.NoError(t, b.Commit([]Op{delGhost(0, 0, 0)}, false))
	require.NoError(t, b.Close())

	b = openBadger(t, dir)
	defer b.Close()
	sb, ok, err := b.Superblock()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, testSB, sb)
	require.Equal(t, want[1:], allGhosts(t, b))
	require.Equal(t, lines, allLines(t, b))
}

// TestBadgerCorruptGhost: a ghost whose key or value is not one Badger writes fails Ghosts, saying
// which, and Lines never reads it.
func TestBadgerCorruptGhost(t *testing.T) {
	good := Ghost{Epoch: 1, Line: 2, Block: 3, Sum: 4, Data: []byte{5}}
	tests := []struct {
		name  string
		key   []byte
		value []byte
		want  string
	}{
		{"short value", ghostKey(&good), []byte{1, 2, 3}, "key 470000000000000001000000000000000200000003: value is 3 bytes, shorter than a checksum"},
		{"empty value", ghostKey(&good), nil, "value is 0 bytes"},
		{"too much data", ghostKey(&good), make([]byte, 4+MaxGhostData+1), "4097 bytes of data, more than a block's 4096"},
		{"short key", []byte{ghostPrefix, 1}, encodeGhost(&good), "key 4701: key is 2 bytes, want 21"},
		{"long key", append(ghostKey(&good), 0), encodeGhost(&good), "key is 22 bytes, want 21"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := openBadger(t, t.TempDir())
			defer b.Close()
			require.NoError(t, b.Commit([]Op{put(1, 1, nil, nil), {Ghost: &good}}, false))
			require.NoError(t, b.db.Update(func(txn *badger.Txn) error { return txn.Set(tt.key, tt.value) }))
			err := b.Ghosts(func(Ghost) error { return nil })
			require.ErrorContains(t, err, "corrupt ghost")
			require.ErrorContains(t, err, tt.want)
			require.Equal(t, []Line{{Line: 1, Slot: 1}}, allLines(t, b))
		})
	}
}

func TestMemCrashGhosts(t *testing.T) {
	g := func(line uint64, sum uint32) Ghost {
		return Ghost{Epoch: 1, Line: line, Sum: sum, Data: bytes.Repeat([]byte{byte(sum)}, 8)}
	}
	m := NewMem()
	commits := []struct {
		ops  []Op
		sync bool
	}{
		{[]Op{{Ghost: ptr(g(1, 1))}, {Ghost: ptr(g(2, 2))}}, false},
		{[]Op{put(1, 1, []uint64{1}, nil), {Ghost: ptr(g(3, 3))}}, true}, // makes commit 0 durable too
		{[]Op{{Ghost: ptr(g(4, 4))}, put(2, 2, []uint64{1}, nil), delGhost(1, 1, 0)}, false},
		{[]Op{{Ghost: ptr(g(2, 9))}, del(1)}, false},
		{[]Op{delGhost(1, 3, 0), {Ghost: ptr(g(5, 5))}}, false},
	}
	for i, c := range commits {
		require.NoError(t, m.Commit(c.ops, c.sync), "commit %d", i)
	}
	require.Equal(t, 3, m.Unsynced())
	require.Equal(t, []Ghost{g(2, 9), g(4, 4), g(5, 5)}, allGhosts(t, m))

	// Keeping the first commit not synced: its ghost put and delete, and its line op.
	m.CrashKeeping(1)
	require.Equal(t, []Ghost{g(2, 2), g(3, 3), g(4, 4)}, allGhosts(t, m))
	require.Equal(t, []Line{{Line: 1, Slot: 1, Valid: []uint64{1}}, {Line: 2, Slot: 2, Valid: []uint64{1}}}, allLines(t, m))

	// A crash forgets unsynced ghost puts, replacements and deletes: a deleted ghost comes back.
	require.NoError(t, m.Commit([]Op{delGhost(1, 2, 0), {Ghost: ptr(g(3, 7))}, {Ghost: ptr(g(6, 6))}}, false))
	require.NoError(t, m.Commit([]Op{delGhost(1, 3, 0)}, false))
	require.Equal(t, []Ghost{g(4, 4), g(6, 6)}, allGhosts(t, m))
	m.Crash()
	require.Equal(t, []Ghost{g(2, 2), g(3, 3), g(4, 4)}, allGhosts(t, m))

	// Close flushes, and Crash reopens.
	require.NoError(t, m.Commit([]Op{delGhost(1, 4, 0)}, false))
	require.NoError(t, m.Close())
	m.Crash()
	require.Equal(t, []Ghost{g(2, 2), g(3, 3)}, allGhosts(t, m))
}

func ptr[T any](v T) *T { return &v }
