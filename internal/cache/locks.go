package cache

import "sync"

// lineLocks gives each line in use its own mutex. Every request locks the lines it touches, in
// ascending order so that two requests can never deadlock; that makes a request atomic against any
// other on the same lines, and makes concurrent misses on a line fetch it once (the second waits for
// the first, then hits). A shard keeps up to keepLocks unused locks in its map, so that a line
// written again and again (a log, a sequential stream) does not insert and delete its entry for
// every request; past that, unused locks go.
type lineLocks struct {
	shards [64]lockShard
}

type lockShard struct {
	mu sync.Mutex
	m  map[uint64]*lineLock
}

type lineLock struct {
	mu   sync.Mutex
	refs int
}

const keepLocks = 32

var lineLockPool = sync.Pool{New: func() any { return new(lineLock) }}

func (l *lineLocks) shard(line uint64) *lockShard {
	return &l.shards[(line*0x9E3779B97F4A7C15)>>58]
}

// lock locks lines [first, last] in order.
func (l *lineLocks) lock(first, last uint64) {
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

// tryLock locks line if no other request holds it, and reports whether it did.
func (l *lineLocks) tryLock(line uint64) bool {
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

// unlock unlocks lines [first, last].
func (l *lineLocks) unlock(first, last uint64) {
	for line := first; line <= last; line++ {
		s := l.shard(line)
		s.mu.Lock()
		e := s.m[line]
		e.mu.Unlock()
		if e.refs--; e.refs == 0 && len(s.m) > keepLocks {
			delete(s.m, line)
			lineLockPool.Put(e)
		}
		s.mu.Unlock()
	}
}
