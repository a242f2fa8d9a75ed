package meta

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
)

// Mem is an in-memory Store, for tests and for a cache that does not persist its SSD tier. It
// models power loss: Crash forgets every commit that was not synced, as a machine that loses power
// forgets what its disk had not flushed. Like Badger, it takes at most a bounded number of ops in one
// commit (PartOps, or what SetMaxOps says), so that tests meet that limit as the daemon does.
type Mem struct {
	mu     sync.Mutex
	closed bool
	sb     *Superblock
	lines  map[uint64]Line
	// undo holds, for every line changed since the last sync, its record at that sync (nil when
	// it had none). Keeping the first value per line, rather than a log of commits, bounds it by
	// the number of lines even when nothing ever syncs.
	undo    map[uint64]*Line
	commits int
	maxOps  int
}

var _ Store = (*Mem)(nil)

// NewMem returns an empty in-memory store.
func NewMem() *Mem {
	return &Mem{lines: make(map[uint64]Line), undo: make(map[uint64]*Line), maxOps: PartOps}
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
	clear(m.undo)
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
	for _, op := range ops {
		n := op.Rec.Line
		if _, saved := m.undo[n]; !saved {
			var before *Line
			if old, ok := m.lines[n]; ok {
				before = &old
			}
			m.undo[n] = before
		}
		if op.Delete {
			delete(m.lines, n)
		} else {
			m.lines[n] = cloneLine(op.Rec)
		}
	}
	if sync {
		clear(m.undo)
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
	clear(m.undo)
	return nil
}

// Lines implements Store. It calls fn on a snapshot taken when it starts, without holding the
// store's lock, so fn may commit.
func (m *Mem) Lines(fn func(Line) error) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	snap := make([]Line, 0, len(m.lines))
	for _, l := range m.lines {
		snap = append(snap, l)
	}
	m.mu.Unlock()
	slices.SortFunc(snap, func(a, b Line) int { return cmp.Compare(a.Line, b.Line) })
	for _, l := range snap {
		// A copy, so that fn cannot change the stored record through its bitmaps.
		if err := fn(cloneLine(l)); err != nil {
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
	clear(m.undo)
	return nil
}

// Crash forgets every commit that was not synced (by sync=true, Sync, SetSuperblock or Close),
// mimicking power loss, and reopens the store if it was closed, so that a test can start a new
// engine on it as a rebooted machine would.
func (m *Mem) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for n, before := range m.undo {
		if before == nil {
			delete(m.lines, n)
		} else {
			m.lines[n] = *before
		}
	}
	clear(m.undo)
	m.closed = false
}

// Commits returns how many commits the store has applied, so that a test can tell whether a
// write reached the metadata at all.
func (m *Mem) Commits() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commits
}
