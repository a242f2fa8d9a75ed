package meta

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Mem is an in-memory Store, for tests and for a cache that does not persist its SSD tier. It
// models power loss: Crash forgets the commits that were not synced (their ghost ops with their
// line ops), all of them or the latest ones (CrashKeeping), as a machine that loses power keeps
// of badger's log what reached the disk, which is some prefix of it. Like Badger, it takes at
// most a bounded number of ops in one commit (PartOps, or what SetMaxOps says), so that tests
// meet that limit as the daemon does.
type Mem struct {
	mu     sync.Mutex
	closed bool
	sb     *Superblock
	lines  map[uint64]Line
	ghosts map[ghostID]Ghost
	// undo holds, for every commit since the last sync, oldest first, the records and ghosts
	// its ops replaced (nil where there were none), for a crash to take the latest commits back.
	undo    [][]replaced
	commits int
	maxOps  int
}

var _ Store = (*Mem)(nil)

// NewMem returns an empty in-memory store.
func NewMem() *Mem {
	return &Mem{lines: make(map[uint64]Line), ghosts: make(map[ghostID]Ghost), maxOps: PartOps}
}

// ghostID is the key a ghost is stored under.
type ghostID struct {
	epoch, line uint64
	block       uint32
}

func idOf(g *Ghost) ghostID { return ghostID{g.Epoch, g.Line, g.Block} }

// replaced is a line's record before an op of a commit changed it, or, for a ghost op (ghost
// set), the ghost of that key.
type replaced struct {
	line   uint64
	before *Line

	ghost       *ghostID
	ghostBefore *Ghost
}

// SetMaxOps sets the most ops one commit may hold (at least 1); a larger one fails with ErrTooBig.
// A small limit lets a test split every commit its engine makes.
func (m *Mem) SetMaxOps(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.maxOps = max(n, 1)
}

// Superblock implements Store.
func (m *Mem) Superblock() (Superblock, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Superblock{}, false, ErrClosed
	}
	if m.sb == nil {
		return Superblock{}, false, nil
	}
	return *m.sb, true, nil
}

// SetSuperblock implements Store; like every synced write, it also makes earlier commits durable.
func (m *Mem) SetSuperblock(sb Superblock) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.sb = &sb
	m.undo = nil
	return nil
}

// Commit implements Store. Each call counts as one write in Commits.
func (m *Mem) Commit(ops []Op, sync bool) error {
	if err := checkOps(ops); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if len(ops) > m.maxOps {
		return fmt.Errorf("%w: %d ops, at most %d", ErrTooBig, len(ops), m.maxOps)
	}
	var undo []replaced
	for _, op := range ops {
		if op.Ghost != nil {
			k := idOf(op.Ghost)
			var before *Ghost
			if old, ok := m.ghosts[k]; ok {
				before = &old
			}
			undo = append(undo, replaced{ghost: &k, ghostBefore: before})
			if op.Delete {
				delete(m.ghosts, k)
			} else {
				m.ghosts[k] = cloneGhost(*op.Ghost)
			}
			continue
		}
		n := op.Rec.Line
		var before *Line
		if old, ok := m.lines[n]; ok {
			before = &old
		}
		undo = append(undo, replaced{line: n, before: before})
		if op.Delete {
			delete(m.lines, n)
		} else {
			m.lines[n] = cloneLine(op.Rec)
		}
	}
	m.undo = append(m.undo, undo)
	if sync {
		m.undo = nil
	}
	m.commits++
	return nil
}

// Sync implements Store.
func (m *Mem) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.undo = nil
	return nil
}

// Lines implements Store. It calls fn on a snapshot taken when it starts, without holding the
// store's lock, so fn may commit.
func (m *Mem) Lines(fn func(Line) error) error {
	return scanMem(m, func() []Line { return slices.Collect(maps.Values(m.lines)) },
		func(a, b Line) int { return cmp.Compare(a.Line, b.Line) }, cloneLine, fn)
}

// Ghosts implements Store, as Lines does.
func (m *Mem) Ghosts(fn func(Ghost) error) error {
	return scanMem(m, func() []Ghost { return slices.Collect(maps.Values(m.ghosts)) },
		func(a, b Ghost) int {
			return cmp.Or(cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Block, b.Block))
		}, cloneGhost, fn)
}

// scanMem calls fn on a copy of each value snapshot returns, called under the store's lock, in
// order; fn runs without the lock. The copies keep fn from changing what the store holds.
func scanMem[V any](m *Mem, snapshot func() []V, order func(a, b V) int, clone func(V) V, fn func(V) error) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	snap := snapshot()
	m.mu.Unlock()
	slices.SortFunc(snap, order)
	for _, v := range snap {
		if err := fn(clone(v)); err != nil {
			return err
		}
	}
	return nil
}

// Close implements Store. Like Badger's, it flushes: a Crash after Close loses nothing.
func (m *Mem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	m.undo = nil
	return nil
}

// Crash forgets every commit that was not synced (by sync=true, Sync, SetSuperblock or Close),
// mimicking power loss, and reopens the store if it was closed, so that a test can start a new
// engine on it as a rebooted machine would.
func (m *Mem) Crash() { m.CrashKeeping(0) }

// CrashKeeping is Crash keeping the oldest keep of the commits not synced (Unsynced says how many
// there are): what of a log reached the disk before the power went.
func (m *Mem) CrashKeeping(keep int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.undo) - 1; i >= max(keep, 0); i-- {
		for j := len(m.undo[i]) - 1; j >= 0; j-- {
			r := m.undo[i][j]
			switch {
			case r.ghost != nil && r.ghostBefore == nil:
				delete(m.ghosts, *r.ghost)
			case r.ghost != nil:
				m.ghosts[*r.ghost] = *r.ghostBefore
			case r.before == nil:
				delete(m.lines, r.line)
			default:
				m.lines[r.line] = *r.before
			}
		}
	}
	m.undo = nil
	m.closed = false
}

// Unsynced is how many commits a crash would forget.
func (m *Mem) Unsynced() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.undo)
}

// Commits returns how many commits the store has applied, so that a test can tell whether a
// write reached the metadata at all.
func (m *Mem) Commits() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commits
}
