package replica

import "sync"

// index maps each 4 KiB block of the volume to the newest record of a log that wrote it whole, so
// that a dirty block the primary's SSD tier damaged can be read back from the replica (Repair). It
// holds a record only once the cache holds its change too. Entries of released records are
// stale: a lookup ignores them, and they are dropped when the map has doubled since the last
// pruning, so its size stays within twice the blocks the log holds, amortised O(1) a write.
type index struct {
	mu     sync.Mutex
	m      map[int64]*logged // block number -> the newest record written whole over it
	pruned int               // len(m) after the last pruning
}

func newIndex() *index { return &index{m: map[int64]*logged{}} }

// indexBlock is the block size of the index: the cache's.
const indexBlock = 4096

// note records lt, whose change the cache now holds. A write covers the blocks it writes whole;
// a zeroing covers its whole blocks as zeroes (lt.t.Kind says so); anything else it touches (the
// part of a block a write leaves, a trim) is no longer known.
func (x *index) note(lt *logged) {
	t := lt.t
	first, end := t.Off/indexBlock, (t.Off+t.Len+indexBlock-1)/indexBlock
	whole0, whole1 := (t.Off+indexBlock-1)/indexBlock, (t.Off+t.Len)/indexBlock
	x.mu.Lock()
	defer x.mu.Unlock()
	for b := first; b < end; b++ {
		if cur := x.m[b]; cur != nil && cur.t.Seq > t.Seq {
			continue // a newer change's, whose cache part ended first
		}
		if t.Kind != KindTrim && b >= whole0 && b < whole1 {
			x.m[b] = lt
		} else {
			delete(x.m, b)
		}
	}
	if len(x.m) > 2*max(x.pruned, 1024) {
		tail := lt.l.Tail().Seq
		for b, lt := range x.m {
			if lt.t.Seq < tail {
				delete(x.m, b)
			}
		}
		x.pruned = len(x.m)
	}
}

func (x *index) get(block int64) *logged {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.m[block]
}

// Repair fills p, whole 4 KiB blocks at the volume's offset off (the last one may end with the
// volume), with the bytes of the newest change there, read back from a replica's log and checked
// against its record's checksum, and reports whether it could: the repair source of the cache
// (cache.SetRepairSource) for dirty data its SSD tier damaged. It knows a block only while the
// record that last wrote it whole is in a log in service and not released.
func (r *Replicated) Repair(off int64, p []byte) bool {
	if off%indexBlock != 0 || len(p) == 0 || off+int64(len(p)) > r.size {
		return false
	}
	for b := int64(0); b*indexBlock < int64(len(p)); b++ {
		q := p[b*indexBlock : min(int64(len(p)), (b+1)*indexBlock)]
		if !r.repairBlock(off/indexBlock+b, q) {
			return false
		}
	}
	return true
}

func (r *Replicated) repairBlock(block int64, p []byte) bool {
	for _, pr := range r.peers {
		l := pr.log.Load()
		if l == nil {
			continue
		}
		lt := pr.idx.Load().get(block)
		if lt == nil || lt.l != l || lt.t.Seq < l.Tail().Seq {
			continue
		}
		if lt.t.Kind == KindZero {
			clear(p)
			return true
		}
		// Its write to the log was queued before the cache's change: it ends (written or
		// failed), whatever else waits.
		<-lt.logEnded()
		rec, err := l.ReadRecord(lt.t)
		if err != nil {
			r.opt.Log.Warn("replica: reading a damaged block back from the log", "replica", pr.Name, "block", block, "err", err)
			continue
		}
		at := block*indexBlock - rec.Off
		copy(p, rec.Data[at:at+int64(len(p))])
		return true
	}
	return false
}

// logEnded returns a channel closed once lt's write to the log has ended.
func (lt *logged) logEnded() <-chan struct{} {
	lt.endMu.Lock()
	defer lt.endMu.Unlock()
	if lt.ended == nil {
		lt.ended = make(chan struct{})
		if lt.logDone {
			close(lt.ended)
		}
	}
	return lt.ended
}

// markLogEnded is the log part's end: logEnded's waiters, if any, go on.
func (lt *logged) markLogEnded() {
	lt.endMu.Lock()
	defer lt.endMu.Unlock()
	lt.logDone = true
	if lt.ended != nil {
		close(lt.ended)
	}
}
