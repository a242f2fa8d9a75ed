package cache

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/pkg/backend"
)

// The scenarios here walk the SSD tier's journal through fills, changes, evictions, checkpoints and
// crashes one step at a time. The background checkpoints and destaging are stopped, so that every
// commit is a step's and a scenario has one outcome. Each runs twice: its crashes are kill -9
// (every commit and write is kept) or power losses (only what was synced or flushed is kept). After
// a crash the cache restarts on what is left, and the test checks which blocks of which lines the
// tier holds, and that every sector reads as the backend holds it (in write-back, once the dirty
// data found is written back) and as the writes before the crash allow.
//
// A crash may also cut a step short, just before or after a chosen call of the SSD, the backend or
// the metadata store (cutAt): right after a write's SSD write, say, which the commit of its record
// must precede, or between a destage's backend write and the backend's flush. The step's later
// calls fail, as a request's would, and a write it cut short may read as the old or the new data
// after the restart (sector by sector), but never anything else.

// scenarioLayout has lines of two blocks on a tier of 8 slots, 7 of them for an LRU policy:
// nothing is evicted but by a step. The device has scenarioLines lines.
var scenarioLayout = layout{line: 8 << 10, ssd: 8, policy: "lru"}

const scenarioLines = 4

// initialID stamps the backend's data before the first step: a fill that a crash loses then differs
// from the backend (zeros would not).
const initialID = 1

// action is what a step does.
type action int

const (
	doRead       action = iota // read (a miss fills the tier)
	doWrite                    // write
	doFUA                      // write with FUA
	doZero                     // write zeroes
	doTrim                     // trim
	doEvict                    // the eviction policy lets the line go
	doCheckpoint               // a checkpoint, as the background loop runs one
	doFlush                    // a FLUSH
	doDestage                  // a pass of the destager over the dirty lines, as its background loop runs one
	doCut                      // a step cut short by a crash at the nth call at a hook's point
	doCrash                    // a crash, and a restart on what is left
)

// step is one step of a scenario.
type step struct {
	do    action
	line  uint64
	block int // the block of the line it touches; -1: all of them
	// during is, for doCheckpoint, a step run while the checkpoint flushes the SSD: after it took
	// its snapshot of the changes, before it commits them. For doCut it is the step cut short by a
	// crash at the nth call at point.
	during *step
	point  hookAt
	n      int
	// kill and power are, for doCrash, what the restarted tier holds after either crash, as
	// tierState writes it ("": not checked).
	kill, power string
}

// The steps of the scenarios: do to a whole line (on), to one block of it (onBlock) or to no line
// (at); a checkpoint with a step inside it (during); a step cut short by a crash at a point of it
// (cutAt), a checkpoint cut short after n commits (cutAfter); a crash. A cut step is followed by a
// crash step, which restarts on what the cut left.
func on(do action, line uint64) step             { return step{do: do, line: line, block: -1} }
func onBlock(do action, line uint64, b int) step { return step{do: do, line: line, block: b} }
func at(do action) step                          { return step{do: do, block: -1} }
func during(s step) step                         { return step{do: doCheckpoint, block: -1, during: &s} }
func cutAt(p hookAt, s step) step                { return cutNth(1, p, s) }
func cutAfter(n int) step                        { return cutNth(n, afterCommit, at(doCheckpoint)) }
func crash(kill, power string) step              { return step{do: doCrash, block: -1, kill: kill, power: power} }

func cutNth(n int, p hookAt, s step) step {
	return step{do: doCut, block: -1, during: &s, point: p, n: n}
}

// The points where the scenarios act inside a step: just before or just after a call lands.
var (
	afterSSDWrite      = hookAt{"ssd", "write", true}
	beforeSSDFlush     = hookAt{"ssd", "flush", false}
	beforeBackendFlush = hookAt{"backend", "flush", false}
	afterBackendFlush  = hookAt{"backend", "flush", true}
	afterCommit        = hookAt{"meta", "commit", true}
)

// span returns the bytes st touches.
func (st step) span(line int64) (off, n int64) {
	if st.block < 0 {
		return int64(st.line) * line, line
	}
	return int64(st.line)*line + int64(st.block)*blockSize, blockSize
}

func TestJournalScenarios(t *testing.T) {
	fill4 := []step{on(doRead, 0), on(doRead, 1), on(doRead, 2), on(doRead, 3)}
	for _, sc := range []struct {
		name  string
		mode  Mode
		steps []step
	}{
		// Records that call blocks valid wait for a checkpoint, which flushes the SSD first.
		{"fills lost without a checkpoint", WriteThrough, []step{
			on(doRead, 0), on(doWrite, 1), crash(".. .. .. ..", ".. .. .. .."),
		}},
		{"fills kept by a checkpoint, across two crashes", WriteThrough, []step{
			on(doRead, 0), on(doWrite, 1), at(doCheckpoint), crash("cc cc .. ..", "cc cc .. .."),
			// The restart read every line and flushed. A power loss takes the zeroing of line
			// 1, unflushed, with its invalidation, unsynced: the old record is right again.
			on(doZero, 1), crash("cc .. cc cc", "cc cc cc cc"),
		}},
		{"fills kept by a flush", WriteThrough, []step{
			on(doWrite, 0), at(doFlush), on(doWrite, 1), crash("cc .. .. ..", "cc .. .. .."),
		}},
		// A change invalidates the stored record before it reaches the backend.
		{"overwrite after a checkpoint", WriteThrough, []step{
			on(doRead, 0), at(doCheckpoint), onBlock(doWrite, 0, 1), crash(".. .. .. ..", "cc .. .. .."),
		}},
		{"zeroing and a trim after a checkpoint", WriteThrough, []step{
			on(doRead, 0), on(doRead, 1), at(doCheckpoint), on(doZero, 0), onBlock(doTrim, 1, 0),
			crash(".. .. .. ..", "cc cc .. .."),
		}},
		{"a zeroed block, then a checkpoint", WriteThrough, []step{
			on(doRead, 0), at(doCheckpoint), onBlock(doZero, 0, 0), at(doCheckpoint),
			crash(".c .. .. ..", ".c .. .. .."),
		}},
		// A FUA write's invalidation is synced: its data survives power loss on the backend.
		{"FUA overwrite after a checkpoint", WriteThrough, []step{
			on(doRead, 0), at(doCheckpoint), onBlock(doFUA, 0, 0), crash(".. .. .. ..", ".. .. .. .."),
		}},
		// A change between a checkpoint's snapshot and its commit is not undone by the commit.
		{"zeroing during a checkpoint", WriteThrough, []step{
			on(doRead, 0), on(doRead, 1), during(on(doZero, 0)), crash(".. cc .. ..", ".. cc .. .."),
		}},
		// An evicted line's record stays until a checkpoint deletes it: its slot waits as long.
		{"evicted slot not reused before the deletion commits", WriteThrough, []step{
			on(doRead, 0), at(doCheckpoint), on(doEvict, 0), on(doRead, 1), crash("cc .. .. ..", "cc .. .. .."),
		}},
		{"evicted slot reused after the deletion commits", WriteThrough, []step{
			on(doRead, 0), at(doCheckpoint), on(doEvict, 0), at(doCheckpoint), on(doRead, 1), at(doCheckpoint),
			crash(".. cc .. ..", ".. cc .. .."),
		}},
		// Four records commit in two parts (newMachine): only the last syncs.
		{"checkpoint cut after its first part", WriteThrough, slices.Concat(fill4, []step{
			cutAfter(1), crash("cc cc .. ..", ".. .. .. .."),
		})},
		{"checkpoint cut after its last part", WriteThrough, slices.Concat(fill4, []step{
			cutAfter(2), crash("cc cc cc cc", "cc cc cc cc"),
		})},
		// Write-back: dirty data is durable once a FLUSH or FUA write has checkpointed it.
		{"write-back write lost without a flush", WriteBack, []step{
			on(doWrite, 0), crash(".. .. .. ..", ".. .. .. .."),
		}},
		{"write-back write kept by a flush", WriteBack, []step{
			on(doWrite, 0), at(doFlush), onBlock(doWrite, 1, 0), crash("dd .. .. ..", "dd .. .. .."),
		}},
		{"write-back FUA write keeps the writes before it", WriteBack, []step{
			on(doWrite, 0), on(doFUA, 1), crash("dd dd .. ..", "dd dd .. .."),
		}},
		{"write-back overwrite of clean blocks", WriteBack, []step{
			on(doRead, 0), at(doCheckpoint), onBlock(doWrite, 0, 0), crash(".. .. .. ..", "cc .. .. .."),
		}},
		// Crashes inside a request. A write-through write commits the invalidation of the blocks
		// it overwrites (the deletion of the whole line: its clean block goes too), then writes
		// the SSD, then the backend: cut after its SSD write, kill -9 keeps the new data on the
		// SSD, and only the invalidation keeps a restart from serving it while the backend has the
		// old (an SSD write before the invalidation fails here). A power loss takes the unsynced
		// deletion and the unflushed SSD write: the checkpointed record and data are right again.
		{"write-through write cut after its SSD write", WriteThrough, []step{
			on(doRead, 0), at(doCheckpoint), cutAt(afterSSDWrite, onBlock(doWrite, 0, 1)),
			crash(".. .. .. ..", "cc .. .. .."),
		}},
		// A FUA write's invalidation is synced: the power loss keeps it too.
		{"write-through FUA write cut after its SSD write", WriteThrough, []step{
			on(doRead, 0), at(doCheckpoint), cutAt(afterSSDWrite, onBlock(doFUA, 0, 1)),
			crash(".. .. .. ..", ".. .. .. .."),
		}},
		// In write-back the invalidation of the clean blocks overwritten commits before the SSD
		// write, as in write-through (one not committed fails here: the clean record finds the new
		// data). The write itself is acknowledged, its record of dirty data not committed (it
		// waits for a checkpoint): lost, as write-back may lose what no flush made durable.
		{"write-back overwrite of clean blocks cut after its SSD write", WriteBack, []step{
			on(doRead, 0), at(doCheckpoint), cutAt(afterSSDWrite, onBlock(doWrite, 0, 0)),
			crash(".. .. .. ..", "cc .. .. .."),
		}},
		// A write-back FUA write's record of dirty data commits at a checkpoint, after the SSD's
		// flush: cut before that flush, nothing claims the data (a commit before the flush fails
		// here: after power loss the record finds data the SSD lost).
		{"write-back FUA write cut before the SSD flush", WriteBack, []step{
			cutAt(beforeSSDFlush, on(doFUA, 0)), crash(".. .. .. ..", ".. .. .. .."),
		}},
		// A destage writes the backend, flushes it, then marks the line clean in memory; a later
		// checkpoint commits that without flushing the backend (it flushes only for foreground
		// changes). Cut before the backend flush or after it, the line is still dirty on the
		// store, and the restart writes it back again. Committed clean, it must be on the backend
		// through power loss (a destage that does not flush the backend fails the third).
		{"destage cut before the backend flush", WriteBack, []step{
			on(doWrite, 0), at(doFlush), cutAt(beforeBackendFlush, at(doDestage)),
			crash("dd .. .. ..", "dd .. .. .."),
		}},
		{"destage cut after the backend flush, before the clean record", WriteBack, []step{
			on(doWrite, 0), at(doFlush), cutAt(afterBackendFlush, at(doDestage)),
			crash("dd .. .. ..", "dd .. .. .."),
		}},
		// A line evicted clean and written again in another slot (the old one waits for the
		// deletion's commit) still has its old clean record stored: the destage deletes it, synced,
		// before its backend write (one that does not fails here: the old record finds the old
		// data where the backend has the new). The new dirty record was never committed: lost.
		{"destage of a line that moved slots cut before the backend flush", WriteBack, []step{
			on(doRead, 0), at(doCheckpoint), on(doEvict, 0), on(doWrite, 0), cutAt(beforeBackendFlush, at(doDestage)),
			crash(".. .. .. ..", ".. .. .. .."),
		}},
		{"destage, then a crash after the clean record commits", WriteBack, []step{
			on(doWrite, 0), at(doFlush), at(doDestage), cutAfter(1), crash("cc .. .. ..", "cc .. .. .."),
		}},
	} {
		for _, kind := range []crashKind{kill9, powerLoss} {
			name := sc.name + map[crashKind]string{kill9: "/kill9", powerLoss: "/powerloss"}[kind]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				runScenario(t, sc.mode, kind, sc.steps)
			})
		}
	}
}

// scenario runs steps on successive engines over one machine.
type scenario struct {
	t     *testing.T
	l     layout
	kind  crashKind // what the crashes are
	m     *machine
	g     *gate
	hooks *hooks // at the calls of the engine's SSD, backend and metadata store
	c     *Cache
	id    int64 // the last write's id
	// cut is set while a step runs that a crash cuts short: its calls after the crash fail, and
	// so may the step.
	cut bool
}

func runScenario(t *testing.T, mode Mode, kind crashKind, steps []step) {
	s := newScenario(t, mode, kind)
	defer func() { s.c.Close() }()
	for i, st := range steps {
		s.do(i, st)
	}
}

// newScenario starts a scenario's first engine, on a backend stamped with initialID.
func newScenario(t *testing.T, mode Mode, kind crashKind) *scenario {
	l := scenarioLayout
	l.mode = mode
	size := scenarioLines * l.line
	m := newMachine(size, l.ssd*l.line)
	if kind == kill9Logged {
		m.withRunLog(t.TempDir(), &l)
	}
	s := &scenario{t: t, l: l, kind: kind, m: m, id: initialID}
	data := make([]byte, size)
	stamp(data, 0, initialID)
	s.m.back.WriteAt(data, 0)
	s.m.back.Flush()
	for sec := range s.m.hist {
		s.m.hist[sec] = []ack{{id: initialID}}
	}
	s.start()
	return s
}

// start starts an engine on the machine, with its background checkpoints and destaging stopped
// (Close finds them stopped).
func (s *scenario) start() {
	s.g, s.hooks = &gate{}, &hooks{}
	s.m.keepRunLog(s.g, s.kind)
	store := hookedStore{gatedStore{s.g, s.m.store}, s.hooks}
	ssd := hookedDev{gatedDev{s.g, s.m.ssd}, "ssd", s.hooks}
	back := hookedDev{gatedDev{s.g, s.m.back}, "backend", s.hooks}
	s.m.restoreRunLog(s.t)
	s.c = newCache(s.t, back, s.l, store, ssd)
	s.c.bg.halt()
	s.c.bg.wait()
}

func (s *scenario) do(i int, st step) {
	t, c, m := s.t, s.c, s.m
	off, n := st.span(s.l.line)
	first, sectors := int(off/sector), int(n/sector)
	switch st.do {
	case doRead:
		buf := make([]byte, n)
		if _, err := c.ReadAt(buf, off); err != nil {
			s.check(i, "read", err)
			return
		}
		for k, id := range stamps(buf, first) {
			if want := m.acceptable(first+k, false)[0]; id != want {
				t.Fatalf("step %d: sector %d reads write %d, want %d", i, first+k, id, want)
			}
		}
	case doWrite, doFUA, doZero, doTrim:
		buf := make([]byte, n)
		a := ack{fua: st.do == doFUA}
		var err error
		switch st.do {
		case doWrite, doFUA:
			s.id++
			a.id = s.id
			stamp(buf, first, a.id)
			if a.fua {
				_, err = c.WriteAtFUA(buf, off)
			} else {
				_, err = c.WriteAt(buf, off)
			}
		case doZero:
			err = c.WriteZeroes(off, n, false)
		default:
			err = c.Trim(off, n)
		}
		s.check(i, "change", err)
		// Cut short by a crash: never acknowledged, even where the engine, which goes on after
		// the crash as a killed process would not, returned no error.
		a.pending = err != nil || s.cut
		a.seq = m.seq.Add(1)
		m.record(first, sectors, a)
	case doEvict:
		tr := c.ssd
		tr.mu.Lock()
		_, cached := tr.slotOf(st.line)
		if cached { // as an insertion that evicts the line does (acquireLocked)
			tr.evict.Remove(policy.Key(st.line))
			tr.victims = append(tr.victims[:0], st.line)
			tr.dropVictimsLocked()
		}
		tr.mu.Unlock()
		if !cached {
			t.Fatalf("step %d: line %d is not cached: nothing to evict", i, st.line)
		}
	case doCheckpoint:
		ran := st.during == nil
		if !ran {
			s.hooks.set(beforeSSDFlush, func() { ran = true; s.do(i, *st.during) })
		}
		backendErr, tierErr := c.ssd.j.checkpoint()
		s.check(i, "checkpoint", errors.Join(backendErr, tierErr))
		if !ran && !s.cut {
			t.Fatalf("step %d: the checkpoint did not flush the SSD", i)
		}
	case doFlush:
		call := m.seq.Add(1)
		err := c.Flush()
		if s.check(i, "flush", err); err == nil {
			m.durable.Store(call)
		}
	case doDestage:
		var cursor uint64
		_, found, err := c.destageNext(&cursor, false)
		s.check(i, "destage", err)
		if !found {
			t.Fatalf("step %d: nothing dirty to destage", i)
		}
	case doCut:
		// The crash comes at the nth call at st.point: the hook sets itself again until then.
		left := st.n
		var hook func()
		hook = func() {
			if left--; left == 0 {
				s.g.crash()
			} else {
				s.hooks.set(st.point, hook)
			}
		}
		s.hooks.set(st.point, hook)
		s.cut = true
		s.do(i, *st.during)
		s.cut = false
		if left > 0 {
			t.Fatalf("step %d: the step made %d calls at %v, not the %d to crash at", i, st.n-left, st.point, st.n)
		}
	case doCrash:
		s.crash(i, st)
	}
}

// check fails the test if err, step i's, is not nil, unless a crash cuts the step short: then its
// calls after the crash fail, and so may it.
func (s *scenario) check(i int, what string, err error) {
	if err != nil && !s.cut {
		s.t.Fatalf("step %d: %s: %v", i, what, err)
	}
}

// crash stops the engine at once and starts another on what is left, then checks what its tier
// holds and every sector (checkRestart). A power loss keeps none of the unflushed writes: with some
// kept, the cache and the backend could differ in ways the contract allows (TestCrashRestart
// covers those), where here they must agree.
func (s *scenario) crash(i int, st step) {
	t := s.t
	s.g.crash()
	want := st.kill
	if s.kind == powerLoss {
		want = st.power
		s.m.store.Crash()
		keepNone := rand.New(rand.NewPCG(0, 0)) // drawn from in vain: nothing is kept
		s.m.back.powerLoss(keepNone, 0)
		s.m.ssd.powerLoss(keepNone, 0)
	}
	s.c.Close() // every call of the engine fails now
	s.start()
	if got := tierState(s.c); want != "" && got != want {
		t.Fatalf("step %d: after the restart the SSD tier holds %q, want %q", i, got, want)
	}
	if err := s.c.Recovered(); s.kind == kill9Logged && err != nil {
		t.Fatalf("step %d: the restart found no run log: %v", i, err)
	}
	_, split, err := s.m.checkRestart(s.c, s.kind.lossy(s.l.mode))
	if err != nil {
		t.Fatalf("step %d: %v", i, err)
	}
	if len(split) > 0 {
		t.Fatalf("step %d: after the restart sector %d reads differently from the cache and the backend", i, split[0])
	}
	// What the model holds now is durable, as after TestCrashRestart's restarts.
	if err := s.c.Flush(); err != nil {
		t.Fatalf("step %d: flush after the restart: %v", i, err)
	}
}

// tierState writes what c's SSD tier holds of each line: a character per block, c if it is clean,
// d if it is dirty, . if it is not held, the lines apart ("cc d. .. ..").
func tierState(c *Cache) string {
	var b strings.Builder
	for line := range uint64(c.size / c.line) {
		if line > 0 {
			b.WriteByte(' ')
		}
		v, d := c.ssd.bits(line)
		for blk := range c.ssd.blocks {
			switch {
			case d.Has(blk):
				b.WriteByte('d')
			case v.Has(blk):
				b.WriteByte('c')
			default:
				b.WriteByte('.')
			}
		}
	}
	return b.String()
}

// hookAt names a point in the calls of a scenario's engine: the device ("ssd", "backend") or the
// metadata store ("meta"), the call ("write": WriteAt, Trim and WriteZeroes; "flush"; "commit"),
// and whether it is just before the call or just after it landed.
type hookAt struct {
	dev, call string
	after     bool
}

func (p hookAt) String() string {
	return map[bool]string{false: "before", true: "after"}[p.after] + " the " + p.dev + " " + p.call
}

// hooks holds functions to run at points of an engine's calls, each once, at the next call at its
// point: a step's way to act (during) or crash (cutAt) inside another. A hook runs outside the call
// and the gate, so it may crash the gate, which waits for the calls in flight.
type hooks struct {
	mu  sync.Mutex // the calls of a destage or a checkpoint run in goroutines of their own
	fns map[hookAt]func()
}

func (h *hooks) set(p hookAt, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fns == nil {
		h.fns = map[hookAt]func(){}
	}
	h.fns[p] = fn
}

// fire runs and removes the hook at p, if any.
func (h *hooks) fire(p hookAt) {
	h.mu.Lock()
	fn := h.fns[p]
	delete(h.fns, p)
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
}

// around runs dev's call between its hooks: the one after only if it landed.
func (h *hooks) around(dev, call string, do func() error) error {
	h.fire(hookAt{dev, call, false})
	err := do()
	if err == nil {
		h.fire(hookAt{dev, call, true})
	}
	return err
}

// hookedStore is a metadata store whose commits run the hooks at them.
type hookedStore struct {
	meta.Store
	h *hooks
}

func (s hookedStore) Commit(ops []meta.Op, sync bool) error {
	return s.h.around("meta", "commit", func() error { return s.Store.Commit(ops, sync) })
}

// hookedDev is a device (dev names it) whose writes and flushes run the hooks at them. It trims and
// writes zeroes as the device it wraps does (gatedDev, here).
type hookedDev struct {
	backend.Backend
	dev string
	h   *hooks
}

func (d hookedDev) WriteAt(p []byte, off int64) (n int, err error) {
	err = d.h.around(d.dev, "write", func() (e error) { n, e = d.Backend.WriteAt(p, off); return })
	return
}

func (d hookedDev) Trim(off, length int64) error {
	return d.h.around(d.dev, "write", func() error { return d.Backend.(backend.Trimmer).Trim(off, length) })
}

func (d hookedDev) WriteZeroes(off, length int64, mayUnmap bool) error {
	return d.h.around(d.dev, "write", func() error {
		return d.Backend.(backend.ZeroWriter).WriteZeroes(off, length, mayUnmap)
	})
}

func (d hookedDev) Flush() error { return d.h.around(d.dev, "flush", d.Backend.Flush) }
