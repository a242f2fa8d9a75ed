package meta

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// memModel is the reference a Mem is checked against: the committed lines and ghosts, those as of
// the last sync, which is what survives a crash, and those after each commit since, which is what
// survives a crash that keeps that many of them.
type memModel struct {
	now, synced memState
	unsynced    []memState
}

type memState struct {
	lines  map[uint64]Line
	ghosts map[ghostID]Ghost
}

func newMemState() memState { return memState{map[uint64]Line{}, map[ghostID]Ghost{}} }

func (s memState) clone() memState { return memState{maps.Clone(s.lines), maps.Clone(s.ghosts)} }

func (m *memModel) apply(op Op) {
	switch {
	case op.Ghost != nil && op.Delete:
		delete(m.now.ghosts, idOf(op.Ghost))
	case op.Ghost != nil:
		m.now.ghosts[idOf(op.Ghost)] = cloneGhost(*op.Ghost)
	case op.Delete:
		delete(m.now.lines, op.Rec.Line)
	default:
		m.now.lines[op.Rec.Line] = cloneLine(op.Rec)
	}
}

func (m *memModel) sync() {
	m.synced = m.now.clone()
	m.unsynced = nil
}

// commit is a commit without sync: the lines and ghosts it leaves are what a crash keeping it
// keeps.
func (m *memModel) commit() { m.unsynced = append(m.unsynced, m.now.clone()) }

// crashKeeping is what CrashKeeping(keep) leaves.
func (m *memModel) crashKeeping(keep int) {
	m.now = m.synced.clone()
	if keep > 0 {
		m.now = m.unsynced[keep-1].clone()
	}
	m.sync()
}

func (m *memModel) want() []Line {
	var out []Line
	for _, n := range slices.Sorted(maps.Keys(m.now.lines)) {
		out = append(out, m.now.lines[n])
	}
	return out
}

func (m *memModel) wantGhosts() []Ghost {
	var out []Ghost
	for _, k := range slices.SortedFunc(maps.Keys(m.now.ghosts), func(a, b ghostID) int {
		return cmp.Or(cmp.Compare(a.epoch, b.epoch), cmp.Compare(a.line, b.line), cmp.Compare(a.block, b.block))
	}) {
		out = append(out, m.now.ghosts[k])
	}
	return out
}

// opGen draws ops on few lines, so that puts, replaces and deletes hit the same lines often. Half
// the puts are of the packed layout: location words for a line of any number of blocks that its
// bitmaps' words hold. Half have checksums, of either layout.
var opGen = rapid.Custom(func(t *rapid.T) Op {
	line := rapid.Uint64Range(0, 15).Draw(t, "line")
	if rapid.Bool().Draw(t, "delete") {
		return del(line)
	}
	valid := rapid.SliceOfN(rapid.Uint64(), 1, 3).Draw(t, "valid")
	packed := rapid.Bool().Draw(t, "packed")
	blocks := 64 * len(valid)
	if packed {
		blocks = rapid.IntRange(blocks-63, blocks).Draw(t, "blocks")
		if r := blocks % 64; r != 0 {
			valid[len(valid)-1] &= 1<<r - 1
		}
	}
	dirty := make([]uint64, rapid.IntRange(0, len(valid)).Draw(t, "dirty words"))
	for i := range dirty {
		dirty[i] = valid[i] & rapid.Uint64().Draw(t, "dirty")
	}
	op := put(line, rapid.Uint32().Draw(t, "slot"), valid, dirty)
	if zero := make([]uint64, rapid.IntRange(0, len(valid)).Draw(t, "zero words")); len(zero) > 0 {
		for i := range zero {
			zero[i] = valid[i] & rapid.Uint64().Draw(t, "zero")
		}
		op.Rec.Zero = zero
	}
	if packed {
		// One drawn word, rotated, for every stored block: nonzero, and different from block
		// to block, without drawing up to 192 of them.
		loc := rapid.Uint64Min(1).Draw(t, "location")
		op.Rec.Loc = make([]uint64, blocks)
		for i := range op.Rec.Loc {
			stored := valid[i/64]
			if i/64 < len(op.Rec.Zero) {
				stored &^= op.Rec.Zero[i/64]
			}
			if stored>>(i%64)&1 != 0 {
				op.Rec.Loc[i] = bits.RotateLeft64(loc, i)
			}
		}
	}
	if rapid.Bool().Draw(t, "checksums") {
		// As for locations: one drawn value, rotated, for every stored block; 0 among them
		// too, which a block's bytes may have as their checksum.
		sum := rapid.Uint32().Draw(t, "checksum")
		op.Rec.Sum = make([]uint32, rapid.IntRange(0, blocks).Draw(t, "checksum count"))
		for i := range op.Rec.Sum {
			stored := valid[i/64]
			if i/64 < len(op.Rec.Zero) {
				stored &^= op.Rec.Zero[i/64]
			}
			if stored>>(i%64)&1 != 0 {
				op.Rec.Sum[i] = bits.RotateLeft32(sum, i)
			}
		}
	}
	return op
})

// ghostGen draws ghosts on few keys, and on the lines opGen draws, so that puts, replaces and
// deletes hit the same ghosts often, beside records of the same lines. Their data is of any
// length a ghost may have, none included: a pattern from one drawn byte.
var ghostGen = rapid.Custom(func(t *rapid.T) Ghost {
	g := Ghost{
		Epoch: rapid.Uint64Range(1, 3).Draw(t, "epoch"),
		Line:  rapid.Uint64Range(0, 15).Draw(t, "line"),
		Block: rapid.Uint32Range(0, 3).Draw(t, "block"),
		Sum:   rapid.Uint32().Draw(t, "checksum"),
	}
	seed := rapid.Byte().Draw(t, "data")
	g.Data = make([]byte, rapid.IntRange(0, MaxGhostData).Draw(t, "data length"))
	for i := range g.Data {
		g.Data[i] = seed ^ byte(i)
	}
	return g
})

// anyOpGen draws line ops and ghost ops alike.
var anyOpGen = rapid.OneOf(opGen, rapid.Custom(func(t *rapid.T) Op {
	g := ghostGen.Draw(t, "ghost")
	return Op{Delete: rapid.Bool().Draw(t, "delete"), Ghost: &g}
}))

func TestMemMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := NewMem()
		m := &memModel{now: newMemState(), synced: newMemState()}
		t.Repeat(map[string]func(*rapid.T){
			"commit": func(t *rapid.T) {
				ops := rapid.SliceOfN(anyOpGen, 0, 6).Draw(t, "ops")
				sync := rapid.Bool().Draw(t, "sync")
				if err := s.Commit(ops, sync); err != nil {
					t.Fatalf("commit: %v", err)
				}
				for _, op := range ops {
					m.apply(op)
				}
				if sync {
					m.sync()
				} else {
					m.commit()
				}
			},
			"sync": func(t *rapid.T) {
				if err := s.Sync(); err != nil {
					t.Fatalf("sync: %v", err)
				}
				m.sync()
			},
			"crash": func(t *rapid.T) {
				s.Crash()
				m.crashKeeping(0)
			},
			"crash keeping a prefix": func(t *rapid.T) {
				if s.Unsynced() != len(m.unsynced) {
					t.Fatalf("%d commits not synced, want %d", s.Unsynced(), len(m.unsynced))
				}
				keep := rapid.IntRange(0, len(m.unsynced)).Draw(t, "keep")
				s.CrashKeeping(keep)
				m.crashKeeping(keep)
			},
			"close and reopen": func(t *rapid.T) {
				if err := s.Close(); err != nil {
					t.Fatalf("close: %v", err)
				}
				s.Crash()
				m.sync()
			},
			"": func(t *rapid.T) {
				var got []Line
				if err := s.Lines(func(l Line) error { got = append(got, l); return nil }); err != nil {
					t.Fatalf("lines: %v", err)
				}
				want := m.want()
				if len(got) != len(want) {
					t.Fatalf("got %d lines %v, want %d %v", len(got), got, len(want), want)
				}
				for i := range want {
					if !lineEqual(got[i], want[i]) {
						t.Fatalf("line %d: got %+v, want %+v", i, got[i], want[i])
					}
				}
				var ghosts []Ghost
				if err := s.Ghosts(func(g Ghost) error { ghosts = append(ghosts, g); return nil }); err != nil {
					t.Fatalf("ghosts: %v", err)
				}
				if wantGhosts := m.wantGhosts(); !slices.EqualFunc(ghosts, wantGhosts, ghostEqual) {
					t.Fatalf("got ghosts %v, want %v", ghostKeys(ghosts), ghostKeys(wantGhosts))
				}
			},
		})
	})
}

// ghostEqual is whether a and b are the same ghost; a zero block's data is nil in both.
func ghostEqual(a, b Ghost) bool {
	return a.Epoch == b.Epoch && a.Line == b.Line && a.Block == b.Block && a.Sum == b.Sum &&
		(a.Data == nil) == (b.Data == nil) && bytes.Equal(a.Data, b.Data)
}

// ghostKeys describes ghosts without their data, which would fill a failure's report.
func ghostKeys(gs []Ghost) []string {
	var out []string
	for _, g := range gs {
		out = append(out, fmt.Sprintf("(%d,%d,%d) sum %#x, %d bytes", g.Epoch, g.Line, g.Block, g.Sum, len(g.Data)))
	}
	return out
}

func lineEqual(a, b Line) bool {
	return a.Line == b.Line && a.Slot == b.Slot && slices.Equal(a.Valid, b.Valid) && slices.Equal(a.Dirty, b.Dirty) &&
		slices.Equal(a.Zero, b.Zero) && slices.Equal(a.Loc, b.Loc) && slices.Equal(a.Sum, b.Sum)
}

// TestLineEncodingRoundTrip checks that every record the stores accept decodes to itself.
func TestLineEncodingRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		op := opGen.Filter(func(op Op) bool { return !op.Delete }).Draw(t, "op")
		op.Rec.Line = rapid.Uint64().Draw(t, "line number")
		if err := checkOps([]Op{op}); err != nil {
			t.Fatalf("the generator drew a record the stores refuse: %v", err)
		}
		got, err := decodeLine(lineKey(op.Rec.Line), encodeLine(op.Rec))
		if err != nil {
			t.Fatal(err)
		}
		if want := cloneLine(op.Rec); !lineEqual(got, want) {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	})
}

// TestGhostEncodingRoundTrip checks that every ghost the stores accept decodes to itself, its
// data nil for a zero block.
func TestGhostEncodingRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := ghostGen.Draw(t, "ghost")
		g.Epoch = rapid.Uint64().Draw(t, "any epoch")
		g.Line = rapid.Uint64().Draw(t, "any line")
		g.Block = rapid.Uint32().Draw(t, "any block")
		if err := checkOps([]Op{{Ghost: &g}}); err != nil {
			t.Fatalf("the generator drew a ghost the stores refuse: %v", err)
		}
		got, err := decodeGhost(ghostKey(&g), encodeGhost(&g))
		if err != nil {
			t.Fatal(err)
		}
		if want := cloneGhost(g); !ghostEqual(got, want) {
			t.Fatalf("got %v, want %v", ghostKeys([]Ghost{got}), ghostKeys([]Ghost{want}))
		}
	})
}
