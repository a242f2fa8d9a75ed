package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Cache is what a replicated export needs of its write-back cache (*cache.Cache has it).
type Cache interface {
	MarkDirty() *cache.DirtyMark
	FlushBackend() error
	FlushAll(ctx context.Context, progress func(done, total int64)) error
	SetMode(ctx context.Context, m cache.Mode, progress func(done, total int64)) error
	Mode() cache.Mode
	Stats() cache.Stats
	SetRepairSource(cache.RepairSource)
	Backend() backend.Backend
}

// What a replicated export does when a replica is lost (Options.OnLoss).
const (
	// OnLossWriteThrough switches the cache to write-through and writes its dirty data back, so
	// that FLUSH needs the backend alone, until the replica is back (FVP's behaviour).
	OnLossWriteThrough = "writethrough"
	// OnLossWait makes FLUSH and FUA writes wait until the replica is back.
	OnLossWait = "wait"
)

// Options configure Replicate.
type Options struct {
	// OnLoss is OnLossWriteThrough (or "") or OnLossWait.
	OnLoss string
	// Retry is how often a lost replica is tried again (default 2 s).
	Retry time.Duration
	// Check is how often the marks are looked at for a release, and the replicas' calls for one
	// that waits too long (default 100 ms).
	Check time.Duration
	// Timeout is how long a call to a replica (a write, a flush) may wait before the replica
	// counts as lost: its link down, the peer hung or too slow (default 30 s).
	Timeout time.Duration
	// TakeOver lets a cache that holds nothing apply the changes a replica's log holds to the
	// backend first (takeOver); without it such a start is refused.
	TakeOver bool
	Log      *slog.Logger
}

// Peer is one replica's device (an NBD export on the peer) and its name for logs and stats.
type Peer struct {
	Name string
	Dev  backend.Backend
}

// Replicated is a volume whose every change is also logged on its replicas: a FLUSH, or a FUA
// write, is acknowledged only once every write it covers is durable on the cache and on every
// replica in service (DRBD's protocol C at the block layer's granularity). It must never
// acknowledge a FLUSH that a replica in service does not hold, nor release a replica's record
// before the backend holds it durably.
type Replicated struct {
	*volume.Volume
	c     Cache
	opt   Options
	size  int64
	peers []*peer
	// gate: requests hold it shared; a resynchronisation holds it alone, so that no change is
	// between the cache's write-back and a fresh log.
	gate   sync.RWMutex
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	// switches counts the switches to write-through under way (lose); none starts once closing.
	switchMu sync.Mutex
	closing  bool
	switches sync.WaitGroup
}

// peer is one replica in the primary: its log, the seqs of its records done (cache and log both),
// and the marks that wait for the cache to write those records' data back.
type peer struct {
	Peer
	r    *Replicated
	log  atomic.Pointer[Log] // nil while lost
	win  *window
	idx  atomic.Pointer[index] // the log's blocks (Repair)
	urge chan struct{}
	// changes counts the change records done (not flush records); marked is its value at the
	// last mark, touched by the peer's loop only.
	changes atomic.Uint64
	marked  uint64
	// marks, oldest first; touched by the peer's loop only.
	marks []mark
	mu    sync.Mutex
	// back is closed when a lost replica is in service again; nil while in service.
	back chan struct{}
	// switched is closed once the cache, in OnLossWriteThrough, is in write-through with the dirty
	// data written back (switchErr if that failed): until then a FLUSH needs the lost replica.
	switched  chan struct{}
	switchErr error
	// lostLog is the log last lost, whose device calls a resync waits out.
	lostLog *Log
	stats   PeerStats
}

type mark struct {
	at   Position // the records before it are done in the cache
	m    *cache.DirtyMark
	when time.Time
}

// PeerStats is what tierblk stats shows of a replica.
type PeerStats struct {
	Name      string `json:"name"`
	State     string `json:"state"` // "ok", "lost", "resyncing"
	LastError string `json:"last_error,omitempty"`
	LagBytes  int64  `json:"lag_bytes"` // log bytes not yet released
	Losses    uint64 `json:"losses"`
	Resyncs   uint64 `json:"resyncs"`
	FullWaits uint64 `json:"full_waits"` // times a change waited for room in the log
	Flushes   uint64 `json:"flushes"`
	FlushNS   uint64 `json:"flush_ns_total"` // time spent in the replica's flushes
}

// Replicate starts replicating v, whose backend is the write-back cache c, to peers. It writes the
// cache's dirty data back first and starts a fresh log on each peer: a log from before holds
// nothing the backend will lack.
func Replicate(v *volume.Volume, c Cache, peers []Peer, o Options) (*Replicated, error) {
	if o.OnLoss == "" {
		o.OnLoss = OnLossWriteThrough
	}
	if o.OnLoss != OnLossWriteThrough && o.OnLoss != OnLossWait {
		return nil, fmt.Errorf("replica: on_replica_loss %q: use writethrough or wait", o.OnLoss)
	}
	if o.Retry <= 0 {
		o.Retry = 2 * time.Second
	}
	if o.Check <= 0 {
		o.Check = 100 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	r := &Replicated{Volume: v, c: c, opt: o, size: v.Info().Size, stop: make(chan struct{})}
	if err := checkNotDrained(c, peers); err != nil {
		return nil, err
	}
	if err := takeOver(c, peers, o.TakeOver, o.Log); err != nil {
		return nil, err
	}
	if err := c.FlushAll(context.Background(), nil); err != nil {
		return nil, fmt.Errorf("replica: writing back the dirty data before the logs start: %w", err)
	}
	for _, p := range peers {
		l, err := Create(p.Dev, r.size)
		if err != nil {
			return nil, fmt.Errorf("replica %s: %w", p.Name, err)
		}
		pr := &peer{Peer: p, r: r, urge: make(chan struct{}, 1)}
		pr.start(l)
		pr.stats.Name, pr.stats.State = p.Name, "ok"
		r.peers = append(r.peers, pr)
	}
	for _, p := range r.peers {
		r.wg.Add(1)
		go p.loop()
	}
	r.wg.Add(1)
	go r.watch()
	c.SetRepairSource(r.Repair)
	return r, nil
}

// checkNotDrained refuses to start a cache that holds data over a replica log that was drained:
// the export was taken over without this primary, the backend may have moved on since, and the
// cache's lines, dirty or clean, may be older than the backend's: written back or served, they
// would be wrong bytes.
func checkNotDrained(c Cache, peers []Peer) error {
	var lines uint64
	for _, t := range c.Stats().Tiers {
		lines += t.Lines
	}
	if lines == 0 {
		return nil
	}
	for _, p := range peers {
		r, err := Open(p.Dev)
		if err != nil {
			continue // no log there yet, or not one of ours: Create formats it
		}
		if r.Drained() {
			return fmt.Errorf("replica %s: its log was drained into the backend (tierblk replica drain: the export was taken over without this host), so this cache's %d lines may be older than the backend; start with an empty cache (remove the SSD tier's metadata directory) or without the replica", p.Name, lines)
		}
	}
	return nil
}

// takeOverWait is how long a take-over watches a log for its primary's heartbeat: twice the
// heartbeat, and a second for the network. A test replaces it with what an alive primary does
// meanwhile.
var takeOverWait = func() { time.Sleep(2*Heartbeat + time.Second) }

// takeOver takes the export over from a primary that is gone (its host dead, the VM moved): a
// cache that holds nothing, over a replica whose log holds changes, applies them to the backend
// before anything else, as tierblk replica drain would, where the user allowed it (allowed: a log
// its primary stopped writing when it lost the replica, and then wrote the backend on, is older
// than the backend, which only the user can know). It refuses while the log still grows (the
// other primary writes it at least every Heartbeat: it is alive, and two writers must never share
// the backend), and where two replicas hold changes (one may have been out of service, its log
// older than the backend: which to apply is the user's to say).
func takeOver(c Cache, peers []Peer, allowed bool, log *slog.Logger) error {
	for _, t := range c.Stats().Tiers {
		if t.Lines > 0 {
			return nil // this host's cache: the primary restarting (Replicate writes it back)
		}
	}
	var holding []int
	var readers []*Reader
	for i, p := range peers {
		r, err := Open(p.Dev)
		if err != nil || r.Drained() {
			continue // no log (Create formats it), or one applied already
		}
		changes, err := holdsChanges(r)
		if err != nil {
			return fmt.Errorf("replica %s: %w", p.Name, err)
		}
		if changes {
			holding, readers = append(holding, i), append(readers, r)
		}
	}
	switch len(holding) {
	case 0:
		return nil
	case 1:
	default:
		return fmt.Errorf("replicas %s and %s both hold changes of a primary that is gone, and one of them may be older than the backend; apply the one that was in service last with tierblk replica drain on its host, then start again", peers[holding[0]].Name, peers[holding[1]].Name)
	}
	p, r := peers[holding[0]], readers[0]
	if !allowed {
		return fmt.Errorf("replica %s: its log holds changes this empty cache does not have: a primary's that is gone (its host dead, the VM moved), or this host's from before its cache was emptied; give --take-over (write_back.take_over) to apply them to the backend before serving, once that primary is stopped for good and had its replica in service when it stopped (a log it stopped writing on losing the replica is older than the backend), or drain the log with tierblk replica drain on the replica's host", p.Name)
	}
	for {
		if _, err := r.Next(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("replica %s: %w", p.Name, err)
		}
	}
	log.Warn("replica: taking the export over from another primary's log: watching for its heartbeat first", "replica", p.Name)
	takeOverWait()
	if r.grew() {
		return fmt.Errorf("replica %s: its log is being written by another primary, which is alive; two writers must never share the backend: stop it first", p.Name)
	}
	// Around the cache, which holds nothing: the log is marked drained only once the backend
	// holds its changes, flushed.
	st, err := Drain(p.Dev, c.Backend(), nil)
	if err != nil {
		return fmt.Errorf("replica %s: taking the export over: %w", p.Name, err)
	}
	log.Warn("replica: took the export over: applied the other primary's log", "replica", p.Name, "records", st.Records, "bytes", st.Bytes, "flushes", st.Flushes)
	return nil
}

// holdsChanges reports whether the log r reads, from its tail, holds a change (a write, a trim, a
// zeroing): flush records alone, a primary's heartbeats, change nothing. It leaves r after the
// first change, or at the end.
func holdsChanges(r *Reader) (bool, error) {
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if rec.Kind != KindFlush {
			return true, nil
		}
	}
}

// start puts l in service: a new window of seqs from its head.
func (p *peer) start(l *Log) {
	p.win = newWindow(l.Head())
	p.idx.Store(newIndex())
	l.SetOnFull(func() {
		p.mu.Lock()
		p.stats.FullWaits++
		p.mu.Unlock()
		select {
		case p.urge <- struct{}{}:
		default:
		}
	})
	p.log.Store(l)
}

// WriteAtAsync and WriteAtOn decline: a replicated write is logged as it is written (WriteAt).
func (r *Replicated) WriteAtAsync([]byte, int64, bool, func(error)) bool { return false }

// WriteAtOn declines, as WriteAtAsync.
func (r *Replicated) WriteAtOn(backend.Ring, []byte, int64, bool, func(error)) bool { return false }

// WriteAt writes p to the cache and logs it on every replica, both at once.
func (r *Replicated) WriteAt(p []byte, off int64, fua bool) error {
	return r.change(KindWrite, off, int64(len(p)), p, fua, func() error { return r.Volume.WriteAt(p, off, fua) })
}

// Trim is logged too: a write the log holds from before it must not come back over it in a drain.
func (r *Replicated) Trim(off, length int64, fua bool) error {
	return r.change(KindTrim, off, length, nil, fua, func() error { return r.Volume.Trim(off, length, fua) })
}

// WriteZeroes is logged as the range zeroed.
func (r *Replicated) WriteZeroes(off, length int64, f volume.ZeroFlags) error {
	return r.change(KindZero, off, length, nil, f.FUA, func() error { return r.Volume.WriteZeroes(off, length, f) })
}

// change applies one change to the cache (apply) and logs it on every replica in service; it
// returns once the cache holds it, the records streaming to the replicas behind it (a FLUSH waits
// for them), or with fua once it is durable on the replicas too.
func (r *Replicated) change(kind Kind, off, length int64, data []byte, fua bool, apply func() error) error {
	if length == 0 || off < 0 || off+length > r.size {
		return apply() // the volume's checks say what is wrong, and nothing is logged
	}
	r.gate.RLock()
	defer r.gate.RUnlock()
	var held [2]*logged
	tickets := held[:0]
	for _, p := range r.peers {
		l := p.log.Load()
		if l == nil {
			continue
		}
		t, err := l.Reserve(context.Background(), kind, off, length, len(data))
		if err != nil {
			p.lose(l, err)
			continue
		}
		lt := &logged{p: p, l: l, w: p.win, x: p.idx.Load(), t: t}
		lt.parts.Store(2)
		tickets = append(tickets, lt)
		l.WriteAsync(t, data, lt.logEnd)
	}
	err := apply()
	for _, lt := range tickets {
		if err == nil {
			lt.x.note(lt)
		}
		lt.end(nil)
	}
	if err != nil || !fua {
		return err
	}
	for _, lt := range tickets {
		if err := lt.p.syncUpTo(lt.l, lt.t.Seq); err != nil {
			return err
		}
	}
	return r.waitLost()
}

// logged is a change's record on one replica, done once both of its parts have ended: its write
// to the log and its change to the cache.
type logged struct {
	p *peer
	l *Log
	// l's window and index: a resync gives the peer new ones while this record may still be
	// written.
	w     *window
	x     *index
	t     Ticket
	parts atomic.Int32
	// logDone is set, and ended closed if a repair waits for it, once the log's part has ended.
	endMu   sync.Mutex
	logDone bool
	ended   chan struct{}
}

// logEnd is the log's part's end.
func (lt *logged) logEnd(err error) {
	lt.markLogEnded()
	lt.end(err)
}

// end ends one part, the log's write with its error or the cache's change (nil). The record counts
// as done once both have: a FLUSH waits for it (win), and a mark taken after it covers its data in
// the cache (changes).
func (lt *logged) end(err error) {
	if err != nil {
		lt.p.lose(lt.l, err)
	}
	if lt.parts.Add(-1) == 0 {
		lt.w.done(lt.t)
		lt.p.changes.Add(1)
	}
}

// Flush makes every write that completed before it durable on the cache and on every replica in
// service; a lost replica's part is what OnLoss says.
func (r *Replicated) Flush() error {
	r.gate.RLock()
	defer r.gate.RUnlock()
	var wg sync.WaitGroup
	var cacheErr error
	wg.Go(func() { cacheErr = r.Volume.Flush() })
	errs := make([]error, len(r.peers))
	for i, p := range r.peers {
		wg.Go(func() { errs[i] = p.flush() })
	}
	wg.Wait()
	if err := errors.Join(append(errs, cacheErr)...); err != nil {
		return err
	}
	return r.waitLost()
}

// waitLost is a FLUSH's wait for lost replicas: with OnLossWait until they are back; with
// OnLossWriteThrough until the cache is in write-through with its dirty data written back.
func (r *Replicated) waitLost() error {
	for _, p := range r.peers {
		p.mu.Lock()
		back, switched := p.back, p.switched
		p.mu.Unlock()
		if back == nil {
			continue
		}
		if r.opt.OnLoss == OnLossWait {
			r.gate.RUnlock() // a resync needs the gate to itself
			select {
			case <-back:
			case <-r.stop:
			}
			r.gate.RLock()
			continue
		}
		// writethrough: once the switch has written the dirty data back, the backend holds
		// every write acknowledged before it.
		<-switched
		p.mu.Lock()
		err := p.switchErr
		p.mu.Unlock()
		if err != nil {
			return fmt.Errorf("replica %s lost, and the switch to write-through failed: %w", p.Name, err)
		}
		if r.c.Mode() == cache.WriteBack {
			// Switched back by hand (tierblk mode) while the replica is lost: the dirty data
			// since is on this host alone, and goes to the backend before the FLUSH is done.
			if err := r.c.FlushAll(context.Background(), nil); err != nil {
				return fmt.Errorf("replica %s lost: writing the dirty data back for a FLUSH: %w", p.Name, err)
			}
		}
	}
	if r.closed.Load() {
		return backend.ErrClosed
	}
	return nil
}

// flush is a FLUSH's part on one replica: a flush record after every record reserved so far,
// then the replica's device flushed.
func (p *peer) flush() error {
	l := p.log.Load()
	if l == nil {
		return nil
	}
	t, err := l.Reserve(context.Background(), KindFlush, 0, 0, 0)
	if err != nil {
		p.lose(l, err)
		return nil
	}
	err = l.Write(t, nil)
	p.win.done(t)
	if err != nil {
		p.lose(l, err)
		return nil
	}
	return p.syncUpTo(l, t.Seq)
}

// syncUpTo waits for every record up to seq to be done, then flushes the replica's device: a
// reader of the log stops at the first record missing, so a record is durable only with all
// before it.
func (p *peer) syncUpTo(l *Log, seq uint64) error {
	if !p.win.wait(seq) {
		return nil // lost meanwhile: waitLost decides
	}
	t0 := time.Now()
	err := l.Sync()
	p.mu.Lock()
	p.stats.Flushes++
	p.stats.FlushNS += uint64(time.Since(t0))
	p.mu.Unlock()
	if err != nil {
		p.lose(l, err)
	}
	return nil
}

// lose takes l, failed with err, out of service (once) and does what OnLoss says.
func (p *peer) lose(l *Log, err error) {
	if !p.log.CompareAndSwap(l, nil) {
		return
	}
	r := p.r
	if r.closed.Load() {
		// The export closing: its records in flight end so, and nothing is lost.
		l.Close()
		p.win.fail()
		return
	}
	switched := make(chan struct{})
	p.mu.Lock()
	p.back, p.switched, p.switchErr, p.lostLog = make(chan struct{}), switched, nil, l
	p.stats.State, p.stats.LastError, p.stats.LagBytes = "lost", err.Error(), 0
	p.stats.Losses++
	p.mu.Unlock()
	// Only now are the log's waiters let go: a FLUSH among them finds the loss (waitLost) and
	// waits for what OnLoss says, rather than returning as if the replica had its records.
	l.Close()
	p.win.fail()
	r.opt.Log.Error("replica lost", "replica", p.Name, "err", err, "on_replica_loss", r.opt.OnLoss)
	r.switchMu.Lock()
	defer r.switchMu.Unlock()
	if r.opt.OnLoss != OnLossWriteThrough || r.closing {
		close(switched)
		return
	}
	// The cache stops holding data only the lost replica had; FLUSHes wait for it (waitLost).
	// Not on the caller's goroutine: that is a request's, or the log's writer with other
	// records to end, and writing the dirty data back takes as long as the backend needs.
	r.switches.Add(1)
	go func() {
		defer r.switches.Done()
		err := r.c.SetMode(context.Background(), cache.WriteThrough, nil)
		if err != nil {
			r.opt.Log.Error("replica lost: switching to write-through", "replica", p.Name, "err", err)
		}
		p.mu.Lock()
		p.switchErr = err
		p.mu.Unlock()
		close(switched)
	}()
}

// watch takes out of service a replica whose device has left a call unanswered for
// Options.Timeout: the writers it holds back (a full queue) and the FLUSHes that wait for it go
// on as OnLoss says. Apart from the peers' loops, which such a call may hold too.
func (r *Replicated) watch() {
	defer r.wg.Done()
	tick := time.NewTicker(r.opt.Check)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		for _, p := range r.peers {
			if l := p.log.Load(); l != nil {
				if d := l.Stalled(); d > r.opt.Timeout {
					p.lose(l, fmt.Errorf("replica: a call to the peer has waited %s (the link down, the peer hung or too slow)", d.Round(time.Millisecond)))
				}
			}
		}
	}
}

// loop releases what the backend holds and brings a lost replica back.
func (p *peer) loop() {
	defer p.r.wg.Done()
	tick := time.NewTicker(p.r.opt.Check)
	defer tick.Stop()
	var retry <-chan time.Time
	beat := time.Now()
	for {
		select {
		case <-p.r.stop:
			p.dropMarks()
			return
		case <-tick.C:
		case <-p.urge:
			p.urgent()
		case <-retry:
		}
		if p.log.Load() == nil {
			p.dropMarks()
			if retry == nil {
				retry = time.After(p.r.opt.Retry)
			} else if p.resync() {
				retry = nil
			} else {
				retry = time.After(p.r.opt.Retry)
			}
			continue
		}
		p.release()
		if time.Since(beat) >= Heartbeat {
			// The peer's drain takes a log written within its lease for one whose primary
			// may be alive: an idle primary writes anyway.
			beat = time.Now()
			p.flush()
		}
	}
}

// Heartbeat is how often a primary writes its replicas' logs at the least (a flush record).
const Heartbeat = 2 * time.Second

func (p *peer) dropMarks() {
	for _, m := range p.marks {
		m.m.Drop()
	}
	p.marks = nil
}

// markEvery is how often a mark is taken, maxMarks how many may wait at once (each holds a copy of
// the dirty bits), and releaseAt the share of the log's capacity it holds before marks start.
const (
	markEvery = 250 * time.Millisecond
	maxMarks  = 8
	releaseAt = 8 // 1/8 of the log's capacity
)

// release takes a mark when one is due and moves the log's tail past the marks whose dirty data
// the cache has written back since.
func (p *peer) release() {
	l := p.log.Load()
	if l == nil {
		return // lost since the loop looked
	}
	// A mark is due once a change was logged since the last one, or the log holds releaseAt of
	// its capacity: an idle export's heartbeats alone do not make a release, each of which
	// flushes the backend. Counted before the watermark is read, so that a change the mark may
	// miss makes the next one due.
	changes := p.changes.Load()
	at := p.win.watermark()
	due := changes != p.marked || l.Used() >= l.Capacity()/releaseAt
	if due && len(p.marks) < maxMarks && at != l.Tail() && (len(p.marks) == 0 || (time.Since(p.marks[len(p.marks)-1].when) >= markEvery && p.marks[len(p.marks)-1].at != at)) {
		p.marks = append(p.marks, mark{at: at, m: p.r.c.MarkDirty(), when: time.Now()})
		p.marked = changes
	}
	var to *Position
	for len(p.marks) > 0 && p.marks[0].m.Left() == 0 {
		to = &p.marks[0].at
		p.marks[0].m.Drop()
		p.marks = p.marks[1:]
	}
	if to != nil {
		// The marks' blocks are on the backend, flushed; writes that went to it around the cache
		// (a full tier, trims) need its flush too.
		if err := p.r.c.FlushBackend(); err != nil {
			p.r.opt.Log.Warn("replica: release waits: flush", "replica", p.Name, "err", err)
			return
		}
		if err := l.Release(*to); err != nil {
			p.lose(l, err)
			return
		}
	}
	p.mu.Lock()
	p.stats.LagBytes = l.Used()
	p.mu.Unlock()
}

// urgent is the log full: the cache writes back what the oldest records hold now, so that a
// release makes room.
func (p *peer) urgent() {
	if p.log.Load() == nil {
		return
	}
	at := p.win.watermark()
	p.marks = append(p.marks, mark{at: at, m: p.r.c.MarkDirty(), when: time.Now()})
	if err := p.r.c.FlushAll(context.Background(), nil); err != nil {
		p.r.opt.Log.Warn("replica: log full: writing back", "replica", p.Name, "err", err)
	}
}

// resync brings a lost replica back: with no change under way (the gate), the cache's dirty data
// is written back, so a fresh, empty log holds everything the backend lacks; in write-through the
// cache goes back to write-back.
func (p *peer) resync() bool {
	r := p.r
	p.mu.Lock()
	p.stats.State = "resyncing"
	switched, lost := p.switched, p.lostLog
	p.mu.Unlock()
	// The switch to write-through its loss started ends first: else it could end after the
	// switch back below, leaving the cache in write-through with every replica in service.
	select {
	case <-switched:
	case <-r.stop:
		return false
	}
	if lost != nil && (lost.Writing() || lost.Stalled() > 0) {
		// A write of the lost log still under way (the NBD client resends it once the link is
		// back) could land over the fresh log's records: it ends first.
		return false
	}
	// The fresh log first, with nothing held: a peer that fails or hangs again holds up only
	// this loop. Nothing writes it before start.
	l, err := Create(p.Dev, r.size)
	if err == nil {
		r.gate.Lock()
		defer r.gate.Unlock()
		if r.closed.Load() {
			return false
		}
		err = r.c.FlushAll(context.Background(), nil)
	}
	if err != nil {
		p.mu.Lock()
		p.stats.State, p.stats.LastError = "lost", err.Error()
		p.mu.Unlock()
		return false
	}
	p.start(l)
	if r.opt.OnLoss == OnLossWriteThrough && r.allInService() && r.c.Mode() == cache.WriteThrough {
		if err := r.c.SetMode(context.Background(), cache.WriteBack, nil); err != nil {
			r.opt.Log.Error("replica back: switching to write-back", "replica", p.Name, "err", err)
		}
	}
	p.mu.Lock()
	close(p.back)
	p.back = nil
	p.stats.State = "ok"
	p.stats.Resyncs++
	p.mu.Unlock()
	r.opt.Log.Info("replica back in service", "replica", p.Name)
	return true
}

func (r *Replicated) allInService() bool {
	for _, p := range r.peers {
		if p.log.Load() == nil {
			return false
		}
	}
	return true
}

// Stats returns each replica's state.
func (r *Replicated) Stats() []PeerStats {
	out := make([]PeerStats, len(r.peers))
	for i, p := range r.peers {
		p.mu.Lock()
		out[i] = p.stats
		p.mu.Unlock()
	}
	return out
}

// Close stops the loops and closes the logs (not their devices: their owner closes them). It
// releases nothing: what the logs hold stays for a drain.
//
// The logs close first: a loop writing a heartbeat or a release waits for its record, which may
// be queued behind batches a hung replica never takes, and closing the log ends it. A loop inside
// a device call that never returns is waited for only closeWait: the device's owner closes the
// device after Close, which ends the call and then the loop.
func (r *Replicated) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.c.SetRepairSource(nil)
	r.switchMu.Lock()
	r.closing = true
	r.switchMu.Unlock()
	close(r.stop)
	for _, p := range r.peers {
		if l := p.log.Load(); l != nil {
			l.Close()
		}
	}
	loops := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(loops)
	}()
	select {
	case <-loops:
	case <-time.After(closeWait):
		r.opt.Log.Warn("replica: closing with a call to a replica unanswered; it ends when the replica's connection closes", "waited", closeWait)
	}
	r.switches.Wait()
	return nil
}

// closeWait is how long Close waits for the loops; a test shortens it.
var closeWait = 10 * time.Second

// window follows which of a log's records are done (in the cache and on the replica's device):
// the position before which all are, and waiters for it.
type window struct {
	mu     sync.Mutex
	cond   *sync.Cond
	at     Position            // every record before it is done
	early  map[uint64]Position // records done past a gap: seq -> the position after them
	failed bool
}

func newWindow(head Position) *window {
	w := &window{at: head, early: map[uint64]Position{}}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// done marks t's record done.
func (w *window) done(t Ticket) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.Seq != w.at.Seq {
		w.early[t.Seq] = t.End
		return
	}
	w.at = t.End
	for {
		end, ok := w.early[w.at.Seq]
		if !ok {
			break
		}
		delete(w.early, w.at.Seq)
		w.at = end
	}
	w.cond.Broadcast()
}

// wait waits until every record up to seq is done; false if the log failed first.
func (w *window) wait(seq uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.at.Seq <= seq && !w.failed {
		w.cond.Wait()
	}
	return !w.failed
}

func (w *window) watermark() Position {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at
}

// fail ends every wait.
func (w *window) fail() {
	w.mu.Lock()
	w.failed = true
	w.mu.Unlock()
	w.cond.Broadcast()
}
