// Package linelock gives each line (a fixed-size, numbered unit of a block device) in use its own
// lock, taken by a request for the lines it touches: exclusive for a request that changes a line,
// shared for one that only reads it. It only locks: it must never know what a line holds, do I/O
// or take any other lock, and it never waits for a lock while holding its shard's mutex.
package linelock

import "sync"

// Locks gives each line in use its own mutex; the zero value is ready. Every request locks the
// lines it touches, in ascending order so that two requests can never deadlock; that makes a
// request atomic against any other on the same lines, and makes concurrent misses on a line fetch
// it once (the second waits for the first, then hits). A read that changes nothing but counters
// may hold a line shared with others like it (TryRLock). A shard keeps up to keepLocks unused locks
// in its map, so that a line written again and again (a log, a sequential stream) does not insert
// and delete its entry for every request; past that, unused locks go.
type Locks struct {
	shards [64]lockShard
}

type lockShard struct {
	// mu guards m and the refs of the locks in it. It is held to find, insert or drop a line's
	// lock, to try one and to unlock one, never while waiting for one.
	mu sync.Mutex
	m  map[uint64]*lineLock
}

type lineLock struct {
	// mu is the line's lock, held for a whole request (shared only by reads that change nothing
	// but counters): no other request reads or changes the line meanwhile. Lines are locked in
	// ascending order; where they come in the user's lock order is the user's to say (the cache
	// engine's package doc).
	mu   sync.RWMutex
	refs int // holders and waiters; guarded by the shard's mu
}

const keepLocks = 32

var lineLockPool = sync.Pool{New: func() any { return new(lineLock) }}

func (l *Locks) shard(line uint64) *lockShard {
	return &l.shards[(line*0x9E3779B97F4A7C15)>>58]
}

// Lock locks lines [first, last] in order.
func (l *Locks) Lock(first, last uint64) {
	for line := first; line <= last; line++ {
		s := l.shard(line)
		s.mu.Lock()
		if s.m == nil {
			s.m = map[uint64]*lineLock{}
		}
		e := s.m[line]
		if e == nil {
			e = lineLockPool.Get().(*lineLock)
			s.m[line] = e
		}
		e.refs++
		s.mu.Unlock()
		e.mu.Lock()
	}
}

// TryLock locks line if no other request holds it, and reports whether it did.
func (l *Locks) TryLock(line uint64) bool {
	s := l.shard(line)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[line]; e != nil {
		if e.refs > 0 || !e.mu.TryLock() {
			return false
		}
		e.refs++
		return true
	}
	if s.m == nil {
		s.m = map[uint64]*lineLock{}
	}
	e := lineLockPool.Get().(*lineLock)
	e.mu.Lock() // a pooled lock is unlocked
	e.refs = 1
	s.m[line] = e
	return true
}

// TryRLock locks line shared if no request holds it exclusively or waits to, and reports whether
// it did.
func (l *Locks) TryRLock(line uint64) bool {
	s := l.shard(line)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[line]
	if e == nil {
		if s.m == nil {
			s.m = map[uint64]*lineLock{}
		}
		e = lineLockPool.Get().(*lineLock)
		s.m[line] = e
	}
	if !e.mu.TryRLock() {
		return false
	}
	e.refs++
	return true
}

// RUnlock releases a shared hold of line.
func (l *Locks) RUnlock(line uint64) {
	l.release(line, func(e *lineLock) { e.mu.RUnlock() })
}

// Unlock unlocks lines [first, last].
func (l *Locks) Unlock(first, last uint64) {
	for line := first; line <= last; line++ {
		l.release(line, func(e *lineLock) { e.mu.Unlock() })
	}
}

// release lets go of a hold of line with unlock, dropping its lock once unused if the shard keeps
// enough others.
func (l *Locks) release(line uint64, unlock func(*lineLock)) {
	s := l.shard(line)
	s.mu.Lock()
	e := s.m[line]
	unlock(e)
	if e.refs--; e.refs == 0 && len(s.m) > keepLocks {
		delete(s.m, line)
		lineLockPool.Put(e)
	}
	s.mu.Unlock()
}
