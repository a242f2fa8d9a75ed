package meta

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/require"
)

// stores are the implementations every conformance test runs against.
var stores = []struct {
	name string
	open func(t testing.TB) Store
}{
	{"mem", func(testing.TB) Store { return NewMem() }},
	{"badger", func(t testing.TB) Store { return openBadger(t, t.TempDir()) }},
}

func openBadger(t testing.TB, dir string) *Badger {
	t.Helper()
	b, err := OpenBadger(dir, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return b
}

// forEachStore runs test on a fresh store of every kind, closing it afterwards unless the test did.
func forEachStore(t *testing.T, test func(t *testing.T, s Store)) {
	for _, sk := range stores {
		t.Run(sk.name, func(t *testing.T) {
			s := sk.open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("close: %v", err)
				}
			})
			test(t, s)
		})
	}
}

func allLines(t testing.TB, s Store) []Line {
	t.Helper()
	var got []Line
	require.NoError(t, s.Lines(func(l Line) error {
		got = append(got, l)
		return nil
	}))
	return got
}

func put(line uint64, slot uint32, valid, dirty []uint64) Op {
	return Op{Rec: Line{Line: line, Slot: slot, Valid: valid, Dirty: dirty}}
}

func del(line uint64) Op { return Op{Delete: true, Rec: Line{Line: line}} }

var testSB = Superblock{Version: FormatVersion, LineSize: 1 << 20, Backend: "nbd://host/export", BackendSize: 1 << 40, Slots: 4096}

func TestSuperblockRoundTrip(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		_, ok, err := s.Superblock()
		require.NoError(t, err)
		require.False(t, ok, "a new store has no superblock")

		require.NoError(t, s.SetSuperblock(testSB))
		got, ok, err := s.Superblock()
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, testSB, got)

		changed := testSB
		changed.Slots = 8192
		require.NoError(t, s.SetSuperblock(changed))
		got, _, err = s.Superblock()
		require.NoError(t, err)
		require.Equal(t, changed, got)
	})
}

func TestSuperblockMismatch(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Superblock)
		want   []string // substrings of the error; none means a match
	}{
		{"same", func(*Superblock) {}, nil},
		{"version", func(sb *Superblock) { sb.Version = 7 }, []string{"format version 7, this tierblk writes 1"}},
		{"line size", func(sb *Superblock) { sb.LineSize = 4096 }, []string{"line size 4096, configured 1048576"}},
		{"backend", func(sb *Superblock) { sb.Backend = "file:///x" }, []string{`backend "file:///x", configured "nbd://host/export"`}},
		{"backend size", func(sb *Superblock) { sb.BackendSize = 5 }, []string{"backend size 5, now 1099511627776"}},
		{"slots", func(sb *Superblock) { sb.Slots = 1 }, []string{"1 lines, configured 4096"}},
		{"several", func(sb *Superblock) { sb.Slots, sb.LineSize = 1, 4096 }, []string{"line size 4096", "1 lines"}},
		{"layout", func(sb *Superblock) { sb.Layout = LayoutPacked },
			[]string{"SSD tier layout packed (reduction compress or dedupe), configured slots (reduction off or zero)"}},
		{"unknown layout", func(sb *Superblock) { sb.Layout = "striped" }, []string{`SSD tier layout "striped", configured slots`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stored := testSB
			tt.change(&stored)
			err := stored.Mismatch(testSB)
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}

	// The other way round: a slot-layout tier configured for the packed layout.
	packed := testSB
	packed.Layout = LayoutPacked
	require.EqualError(t, testSB.Mismatch(packed),
		"SSD tier layout slots (reduction off or zero), configured packed (reduction compress or dedupe)")
	require.NoError(t, packed.Mismatch(packed))
}

func TestCommit(t *testing.T) {
	tests := []struct {
		name    string
		commits [][]Op
		want    []Line
	}{
		{"empty", nil, nil},
		{"put", [][]Op{{put(3, 1, []uint64{0xff}, []uint64{0x0f})}},
			[]Line{{Line: 3, Slot: 1, Valid: []uint64{0xff}, Dirty: []uint64{0x0f}}}},
		{"empty bitmaps read back as nil", [][]Op{{put(3, 1, []uint64{}, []uint64{})}},
			[]Line{{Line: 3, Slot: 1}}},
		{"replace", [][]Op{{put(3, 1, []uint64{1}, nil)}, {put(3, 9, []uint64{1, 2, 3}, []uint64{0, 2})}},
			[]Line{{Line: 3, Slot: 9, Valid: []uint64{1, 2, 3}, Dirty: []uint64{0, 2}}}},
		{"delete", [][]Op{{put(3, 1, []uint64{1}, nil), put(4, 2, []uint64{1}, nil)}, {del(3)}},
			[]Line{{Line: 4, Slot: 2, Valid: []uint64{1}}}},
		{"delete missing", [][]Op{{del(5)}}, nil},
		{"ops apply in order", [][]Op{{put(1, 1, []uint64{1}, nil), del(1), put(2, 2, nil, nil), put(2, 3, []uint64{7}, nil)}},
			[]Line{{Line: 2, Slot: 3, Valid: []uint64{7}}}},
		{"zero blocks", [][]Op{{{Rec: Line{Line: 3, Slot: 1, Valid: []uint64{0xff, 1}, Dirty: []uint64{0x0f}, Zero: []uint64{0xf0}}}}},
			[]Line{{Line: 3, Slot: 1, Valid: []uint64{0xff, 1}, Dirty: []uint64{0x0f}, Zero: []uint64{0xf0}}}},
		{"zero blocks replaced by none", [][]Op{{{Rec: Line{Line: 3, Slot: 1, Valid: []uint64{3}, Zero: []uint64{1}}}}, {put(3, 1, []uint64{3}, nil)}},
			[]Line{{Line: 3, Slot: 1, Valid: []uint64{3}}}},
		{"location words", [][]Op{{{Rec: packedLine(3, 16, 0xfff, 0x0f0, 0x003)}}},
			[]Line{packedLine(3, 16, 0xfff, 0x0f0, 0x003)}},
		{"location words of a 1 MiB line", [][]Op{{{Rec: packedLine(3, 256, 0xffff, 0xff, 0xf00)}}},
			[]Line{packedLine(3, 256, 0xffff, 0xff, 0xf00)}},
		{"location words, all blocks zero", [][]Op{{{Rec: packedLine(3, 16, 0xff, 0, 0xff)}}},
			[]Line{packedLine(3, 16, 0xff, 0, 0xff)}},
		{"location words replaced by none", [][]Op{{{Rec: packedLine(3, 16, 0x3, 0x1, 0)}}, {put(3, 1, []uint64{3}, nil)}},
			[]Line{{Line: 3, Slot: 1, Valid: []uint64{3}}}},
		{"checksums", [][]Op{{{Rec: Line{Line: 3, Slot: 1, Valid: []uint64{0x7}, Zero: []uint64{0x2}, Sum: []uint32{9, 0, 0xffffffff}}}}},
			[]Line{{Line: 3, Slot: 1, Valid: []uint64{0x7}, Zero: []uint64{0x2}, Sum: []uint32{9, 0, 0xffffffff}}}},
		{"empty checksums read back as nil", [][]Op{{{Rec: Line{Line: 3, Slot: 1, Valid: []uint64{0x7}, Sum: []uint32{}}}}},
			[]Line{{Line: 3, Slot: 1, Valid: []uint64{0x7}}}},
		{"checksums and location words", [][]Op{{{Rec: withSums(packedLine(3, 16, 0xfff, 0x0f0, 0x003))}}},
			[]Line{withSums(packedLine(3, 16, 0xfff, 0x0f0, 0x003))}},
		{"checksums of a 1 MiB line", [][]Op{{{Rec: withSums(packedLine(3, 256, 0xffff, 0xff, 0xf00))}}},
			[]Line{withSums(packedLine(3, 256, 0xffff, 0xff, 0xf00))}},
		{"checksums replaced by none", [][]Op{{{Rec: withSums(packedLine(3, 16, 0x3, 0x1, 0))}}, {{Rec: packedLine(3, 16, 0x3, 0x1, 0)}}},
			[]Line{packedLine(3, 16, 0x3, 0x1, 0)}},
		{"extreme values", [][]Op{{put(1<<64-1, 1<<32-1, []uint64{1<<64 - 1}, []uint64{1<<64 - 1})}},
			[]Line{{Line: 1<<64 - 1, Slot: 1<<32 - 1, Valid: []uint64{1<<64 - 1}, Dirty: []uint64{1<<64 - 1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, s Store) {
				for i, ops := range tt.commits {
					require.NoError(t, s.Commit(ops, i%2 == 0))
				}
				require.Equal(t, tt.want, allLines(t, s))
			})
		})
	}
}

// packedLine is a record of the packed layout for a line of blocks blocks whose first word of
// valid, dirty and zero bits are given: block i's location is i+1 where it is valid and not zero.
func packedLine(line uint64, blocks int, valid, dirty, zero uint64) Line {
	words := (blocks + 63) / 64
	l := Line{Line: line, Valid: make([]uint64, words), Loc: make([]uint64, blocks)}
	l.Valid[0] = valid
	if dirty != 0 {
		l.Dirty = []uint64{dirty}
	}
	if zero != 0 {
		l.Zero = []uint64{zero}
	}
	for i := range min(blocks, 64) {
		if (valid&^zero)>>i&1 != 0 {
			l.Loc[i] = uint64(i + 1)
		}
	}
	return l
}

// withSums gives l a checksum for each block that has a location word: one derived from the
// location, nonzero.
func withSums(l Line) Line {
	l.Sum = make([]uint32, len(l.Loc))
	for i, loc := range l.Loc {
		if loc != 0 {
			l.Sum[i] = uint32(loc)<<16 | 0xc5
		}
	}
	return l
}

func TestCommitRejectsBitsNotValid(t *testing.T) {
	withLoc := func(l Line, block int, loc uint64) Line {
		l.Loc = append([]uint64(nil), l.Loc...)
		l.Loc[block] = loc
		return l
	}
	withSum := func(l Line, block int, sum uint32) Line {
		l.Sum = append([]uint32(nil), l.Sum...)
		l.Sum[block] = sum
		return l
	}
	good := packedLine(42, 16, 0x0f, 0x01, 0x0c) // blocks 0 and 1 stored, 2 and 3 zero
	beyond := make([]uint64, 66)                 // past the one word of valid bits
	beyond[0], beyond[65] = 1, 7
	sumBeyond := make([]uint32, 66)
	sumBeyond[0], sumBeyond[65] = 1, 7
	tests := []struct {
		name string
		rec  Line
		want string
	}{
		{"dirty", Line{Line: 42, Slot: 2, Valid: []uint64{0x1}, Dirty: []uint64{0x1, 0x4}}, "line 42 has dirty blocks that are not valid"},
		{"zero", Line{Line: 42, Slot: 2, Valid: []uint64{0x1}, Zero: []uint64{0x3}}, "line 42 has zero blocks that are not valid"},
		{"location of a block not valid", withLoc(good, 9, 0xabc), "line 42 has location 0xabc for block 9, which is not valid"},
		{"location of a zero block", withLoc(good, 3, 0xabc), "line 42 has location 0xabc for block 3, which is a zero block"},
		{"no location for a stored block", withLoc(good, 1, 0), "line 42 has no location for block 1, which is valid and not a zero block (16 location words)"},
		{"location words short of the valid blocks", Line{Line: 42, Valid: []uint64{0x7}, Loc: []uint64{1, 2}},
			"line 42 has no location for block 2"},
		{"empty location words", Line{Line: 42, Valid: []uint64{0x1}, Loc: []uint64{}}, "line 42 has no location for block 0"},
		{"location beyond the valid bits", Line{Line: 42, Valid: []uint64{0x1}, Loc: beyond}, "line 42 has location 0x7 for block 65, which is not valid"},
		{"checksum of a block not valid", withSum(withSums(good), 9, 0xabc), "line 42 has checksum 0xabc for block 9, which is not valid"},
		{"checksum of a zero block", withSum(withSums(good), 3, 0xabc), "line 42 has checksum 0xabc for block 3, which is a zero block"},
		{"checksum of a zero block in the slot layout", Line{Line: 42, Slot: 2, Valid: []uint64{0x3}, Zero: []uint64{0x2}, Sum: []uint32{1, 2}},
			"line 42 has checksum 0x2 for block 1, which is a zero block"},
		{"checksum beyond the valid bits", Line{Line: 42, Valid: []uint64{0x1}, Sum: sumBeyond}, "line 42 has checksum 0x7 for block 65, which is not valid"},
		{"checksum without valid bits", Line{Line: 42, Sum: []uint32{0, 5}}, "line 42 has checksum 0x5 for block 1, which is not valid"},
		{"no epoch for a dirty block", Line{Line: 42, Valid: []uint64{0x3}, Dirty: []uint64{0x3}, Epoch: []uint64{4, 0}},
			"line 42 has no epoch for block 1, which is dirty"},
		{"epoch of a clean block", Line{Line: 42, Valid: []uint64{0x3}, Dirty: []uint64{0x1}, Epoch: []uint64{4, 4}},
			"line 42 has epoch 4 for block 1, which is not dirty"},
		{"epochs short of the dirty blocks", Line{Line: 42, Valid: []uint64{0x7}, Dirty: []uint64{0x5}, Epoch: []uint64{4}},
			"line 42 has 1 epochs, fewer than its dirty blocks need"},
	}
	for _, rec := range []Line{
		good, packedLine(42, 256, 0, 0, 0), {Line: 42, Valid: []uint64{0x1}, Zero: []uint64{0x1}, Loc: []uint64{0}},
		withSums(good), withSum(withSums(good), 1, 0), // a stored block's checksum may be 0
		{Line: 42, Valid: []uint64{0x3}, Zero: []uint64{0x2}, Sum: []uint32{1, 0, 0, 0}}, // 0 past the blocks stored
		{Line: 42, Valid: []uint64{0x1}, Sum: make([]uint32, 200)},
		{Line: 42, Valid: []uint64{0x7}, Dirty: []uint64{0x5}, Epoch: []uint64{4, 0, 9, 0}},
	} {
		require.NoError(t, checkOps([]Op{{Rec: rec}}), "%+v", rec)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, s Store) {
				err := s.Commit([]Op{put(1, 1, []uint64{1}, nil), {Rec: tt.rec}}, true)
				require.ErrorContains(t, err, tt.want)
				require.Empty(t, allLines(t, s), "a rejected commit applies none of its ops")
			})
		})
	}
}

func TestStoreDoesNotShareBitmaps(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		valid := []uint64{1}
		require.NoError(t, s.Commit([]Op{put(1, 1, valid, nil)}, false))
		valid[0] = 3
		require.NoError(t, s.Lines(func(l Line) error {
			l.Valid[0] = 7
			return nil
		}))
		require.Equal(t, []Line{{Line: 1, Slot: 1, Valid: []uint64{1}}}, allLines(t, s))
	})
}

func TestLinesOrderAndStop(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		rng := rand.New(rand.NewPCG(1, 2))
		want := map[uint64]bool{0: true, 1 << 32: true, 1<<64 - 1: true}
		for len(want) < 200 {
			want[rng.Uint64N(1<<40)] = true
		}
		var ops []Op
		for n := range want { // map order: random
			ops = append(ops, put(n, uint32(n), []uint64{n}, nil))
		}
		require.NoError(t, s.Commit(ops, false))

		got := allLines(t, s)
		require.Len(t, got, len(want))
		for i, l := range got {
			require.True(t, want[l.Line])
			require.Equal(t, []uint64{l.Line}, l.Valid)
			if i > 0 {
				require.Less(t, got[i-1].Line, l.Line, "lines out of order")
			}
		}

		stop := errors.New("stop")
		calls := 0
		err := s.Lines(func(Line) error {
			calls++
			if calls == 3 {
				return stop
			}
			return nil
		})
		require.ErrorIs(t, err, stop)
		require.Equal(t, 3, calls, "Lines went on after fn's error")
	})
}

func TestConcurrentCommits(t *testing.T) {
	const writers, commits = 16, 40
	forEachStore(t, func(t *testing.T, s Store) {
		var wg sync.WaitGroup
		errs := make(chan error, writers*commits)
		for w := range writers {
			wg.Go(func() {
				for c := range commits {
					n := uint64(w*commits + c)
					// Each commit also deletes the writer's previous line, so a lost or
					// reordered commit shows as a missing or extra line.
					ops := []Op{put(n, uint32(n), []uint64{n}, nil), put(1<<40+n, 1, nil, nil)}
					if c > 0 {
						ops = append(ops, del(1<<40+n-1))
					}
					errs <- s.Commit(ops, c%3 == 0)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		got := allLines(t, s)
		require.Len(t, got, writers*commits+writers)
		for i, l := range got[:writers*commits] {
			require.Equal(t, uint64(i), l.Line)
			require.Equal(t, []uint64{uint64(i)}, l.Valid)
		}
		for w, l := range got[writers*commits:] {
			require.Equal(t, uint64(1<<40+w*commits+commits-1), l.Line, "writer %d's last line", w)
		}
	})
}

func TestClosed(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		require.NoError(t, s.Commit([]Op{put(1, 1, nil, nil)}, false))
		require.NoError(t, s.Close())
		calls := []struct {
			name string
			call func() error
		}{
			{"Superblock", func() error { _, _, err := s.Superblock(); return err }},
			{"SetSuperblock", func() error { return s.SetSuperblock(testSB) }},
			{"Commit", func() error { return s.Commit([]Op{put(2, 2, nil, nil)}, true) }},
			{"Sync", s.Sync},
			{"Lines", func() error { return s.Lines(func(Line) error { return nil }) }},
			{"Ghosts", func() error { return s.Ghosts(func(Ghost) error { return nil }) }},
			{"Close", s.Close},
		}
		for _, c := range calls {
			require.ErrorIs(t, c.call(), ErrClosed, c.name)
		}
	})
}

func TestMemCrash(t *testing.T) {
	m := NewMem()
	commits := []struct {
		ops  []Op
		sync bool
	}{
		{[]Op{put(1, 1, []uint64{1}, nil)}, false},
		{[]Op{put(2, 2, []uint64{1}, nil)}, true}, // makes commit 0 durable too
		{[]Op{put(3, 3, []uint64{1}, nil)}, false},
		{nil, false}, // a Sync call, below
		{[]Op{put(1, 9, []uint64{3}, []uint64{2})}, false},
		{[]Op{del(2), put(4, 4, nil, nil)}, false},
		{[]Op{del(4), put(5, 5, nil, nil)}, false},
	}
	for i, c := range commits {
		if c.ops == nil {
			require.NoError(t, m.Sync())
			continue
		}
		require.NoError(t, m.Commit(c.ops, c.sync), "commit %d", i)
	}
	require.Equal(t, 6, m.Commits())
	require.Len(t, allLines(t, m), 3) // lines 1, 3 and 5

	m.Crash()
	want := []Line{
		{Line: 1, Slot: 1, Valid: []uint64{1}},
		{Line: 2, Slot: 2, Valid: []uint64{1}},
		{Line: 3, Slot: 3, Valid: []uint64{1}},
	}
	require.Equal(t, want, allLines(t, m))

	// Close flushes, and Crash reopens.
	require.NoError(t, m.Commit([]Op{del(3)}, false))
	require.NoError(t, m.Close())
	m.Crash()
	require.Equal(t, want[:2], allLines(t, m))
}

func TestBadgerReopen(t *testing.T) {
	dir := t.TempDir()
	b := openBadger(t, dir)
	require.NoError(t, b.SetSuperblock(testSB))
	var want []Line
	for i := range uint64(100) {
		l := Line{Line: i, Slot: uint32(i), Valid: []uint64{i, 1}}
		if i%3 == 0 {
			l = packedLine(i, 128, i, i/2&i, i&0x30)
		}
		want = append(want, l)
		require.NoError(t, b.Commit([]Op{{Rec: l}}, false))
	}
	require.NoError(t, b.Commit([]Op{del(0)}, false))
	require.NoError(t, b.Close())

	b = openBadger(t, dir)
	defer b.Close()
	sb, ok, err := b.Superblock()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, testSB, sb)
	require.Equal(t, want[1:], allLines(t, b))
}

// TestBadgerDamagedTable flips a byte in the records of a table on disk: opening or reading the
// store fails, rather than return a record the damage changed or leave records out.
func TestBadgerDamagedTable(t *testing.T) {
	dir := t.TempDir()
	b := openBadger(t, dir)
	var ops []Op
	for i := range uint64(2000) {
		ops = append(ops, Op{Rec: Line{Line: i, Slot: uint32(i), Valid: []uint64{i | 1}}})
	}
	require.NoError(t, b.Commit(ops, true))
	require.NoError(t, b.Close()) // writes the records to a table
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	for _, path := range tables {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		require.NoError(t, err)
		var c [1]byte
		_, err = f.ReadAt(c[:], 1000) // among the first block's records
		require.NoError(t, err)
		c[0] ^= 0x10
		_, err = f.WriteAt(c[:], 1000)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	b, err = OpenBadger(dir, slog.New(slog.DiscardHandler))
	if err == nil {
		defer b.Close()
		err = b.Lines(func(Line) error { return nil })
	}
	require.Error(t, err, "a damaged table was read without an error")
}

// A crash between badger's creating a memory-table or value-log file and its sizing leaves the
// file empty; the store opens on such a directory, with what was committed before.
func TestOpenAfterEmptyLogs(t *testing.T) {
	for _, empty := range []string{"99999.mem", "999999.vlog"} { // the next files badger would make
		t.Run(empty, func(t *testing.T) {
			dir := t.TempDir()
			b := openBadger(t, dir)
			l := Line{Line: 7, Slot: 3, Valid: []uint64{1}}
			require.NoError(t, b.Commit([]Op{{Rec: l}}, true))
			require.NoError(t, b.Close())
			require.NoError(t, os.WriteFile(filepath.Join(dir, empty), nil, 0o644))

			b = openBadger(t, dir)
			defer b.Close()
			require.Equal(t, []Line{l}, allLines(t, b))
		})
	}
}

func TestBadgerDirectoryInUse(t *testing.T) {
	dir := t.TempDir()
	b := openBadger(t, dir)
	_, err := OpenBadger(dir, nil)
	require.ErrorContains(t, err, fmt.Sprintf("metadata directory %s is in use by another tierblk", dir))
	require.NoError(t, b.Close())

	b = openBadger(t, dir) // the lock goes with Close
	require.NoError(t, b.Close())
}

func TestBadgerCorruptRecord(t *testing.T) {
	good := encodeLine(Line{Line: 1, Slot: 1, Valid: []uint64{1, 2}, Dirty: []uint64{1}})
	tests := []struct {
		name  string
		key   []byte
		value []byte
		want  string
	}{
		{"short value", lineKey(7), []byte{1, 2}, "key 4c0000000000000007: value is 2 bytes"},
		{"truncated bitmaps", lineKey(7), good[:len(good)-1], "bytes of bitmaps for 2 valid and 1 dirty words"},
		{"extra bytes", lineKey(7), append(append([]byte(nil), good...), 0, 0, 0, 0, 0, 0, 0, 0), "8 bytes after the valid and dirty bitmaps are no zero bitmap"},
		{"truncated zero bitmap", lineKey(7), append(append([]byte(nil), good...), 1, 0, 0, 0), "4 bytes after the valid and dirty bitmaps"},
		{"bad count", lineKey(7), []byte{0, 0, 0, 1, 0xff}, "bad bitmap word count"},
		{"huge count", lineKey(7), append([]byte{0, 0, 0, 1}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0), "bytes of bitmaps"},
		{"counts that overflow", lineKey(7), append([]byte{0, 0, 0, 1}, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01), "bytes of bitmaps"},
		{"short key", []byte{linePrefix, 1}, good, "key 4c01: key is 2 bytes"},
		{"empty zero bitmap alone", lineKey(7), append(append([]byte(nil), good...), 0), "1 bytes after the valid and dirty bitmaps are no zero bitmap"},
		{"empty location words", lineKey(7), append(append([]byte(nil), good...), 0, 0), "2 bytes after the valid and dirty bitmaps are no zero bitmap"},
		{"truncated location words", lineKey(7), append(append([]byte(nil), good...), 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0), "11 bytes after the valid and dirty bitmaps"},
		{"extra bytes after location words", lineKey(7), append(append([]byte(nil), good...), 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0), "11 bytes after the valid and dirty bitmaps"},
		{"huge location count", lineKey(7), append(append([]byte(nil), good...), 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), "after the valid and dirty bitmaps"},
		{"empty checksums", lineKey(7), append(append([]byte(nil), good...), 0, 0, 0), "3 bytes after the valid and dirty bitmaps are no zero bitmap"},
		{"empty checksums after location words", lineKey(7), append(append([]byte(nil), good...), 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0), "11 bytes after the valid and dirty bitmaps"},
		{"truncated checksums", lineKey(7), append(append([]byte(nil), good...), 0, 0, 2, 0, 0, 0, 1, 0, 0, 0), "10 bytes after the valid and dirty bitmaps"},
		{"extra bytes after checksums", lineKey(7), append(append([]byte(nil), good...), 0, 0, 1, 0, 0, 0, 1, 0), "8 bytes after the valid and dirty bitmaps"},
		{"empty checksums, nothing after", lineKey(7), append(append([]byte(nil), good...), 0, 0, 0), "3 bytes after the valid and dirty bitmaps"},
		{"extra bytes after epochs", lineKey(7), append(append([]byte(nil), good...), 0, 0, 0, 1, 5, 5), "6 bytes after the valid and dirty bitmaps"},
		{"huge checksum count", lineKey(7), append(append([]byte(nil), good...), 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), "after the valid and dirty bitmaps"},
		{"bad checksum count", lineKey(7), append(append([]byte(nil), good...), 0, 0, 0xff), "3 bytes after the valid and dirty bitmaps"},
		{"location count past the checksums", lineKey(7), append(append([]byte(nil), good...), 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1), "15 bytes after the valid and dirty bitmaps"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := openBadger(t, t.TempDir())
			defer b.Close()
			require.NoError(t, b.Commit([]Op{put(1, 1, nil, nil)}, false))
			require.NoError(t, b.db.Update(func(txn *badger.Txn) error { return txn.Set(tt.key, tt.value) }))
			err := b.Lines(func(Line) error { return nil })
			require.ErrorContains(t, err, "corrupt line record")
			require.ErrorContains(t, err, tt.want)
		})
	}

	t.Run("superblock", func(t *testing.T) {
		b := openBadger(t, t.TempDir())
		defer b.Close()
		require.NoError(t, b.db.Update(func(txn *badger.Txn) error { return txn.Set(superblockKey, []byte("{")) }))
		_, _, err := b.Superblock()
		require.ErrorContains(t, err, "reading superblock, key 53")
	})
}

// TestBadgerGroupSplit writes one group larger than a badger transaction: it must go in several
// transactions, whole requests each, and a request too large for any transaction must fail alone.
func TestBadgerGroupSplit(t *testing.T) {
	b := openBadger(t, t.TempDir())
	defer b.Close()
	maxCount := int(b.db.MaxBatchCount())
	newRequest := func(first, n int) *request {
		r := &request{sync: first%2 == 0, done: make(chan error, 1)}
		for i := range n {
			r.ops = append(r.ops, put(uint64(first+i), 1, []uint64{1}, nil))
		}
		return r
	}
	third := maxCount / 3
	group := []*request{
		newRequest(0, third*2),
		newRequest(third*2, third*2),
		newRequest(1<<30, maxCount+1), // too big for any transaction
		newRequest(third*4, third*2),
	}
	b.write(group)
	for i, r := range group {
		err := <-r.done
		if i == 2 {
			require.ErrorIs(t, err, ErrTooBig)
			require.ErrorContains(t, err, fmt.Sprintf("%d ops", maxCount+1))
			continue
		}
		require.NoError(t, err, "request %d", i)
	}
	got := allLines(t, b)
	require.Len(t, got, third*6)
	require.Equal(t, uint64(third*6-1), got[len(got)-1].Line)
}

func BenchmarkCommitParallel(b *testing.B) {
	for _, sk := range stores {
		for _, synced := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/sync=%v", sk.name, synced), func(b *testing.B) {
				s := sk.open(b)
				defer s.Close()
				var next atomic.Uint64
				b.SetParallelism(16)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						n := next.Add(1)
						if err := s.Commit([]Op{put(n, uint32(n), []uint64{n, n, n, n}, nil)}, synced); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
