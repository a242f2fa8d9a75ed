package cache

import (
	"math/rand/v2"
	"slices"
	"strings"
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
	doCut                      // a checkpoint cut short by a crash once n commits have landed
	doCrash                    // a crash, and a restart on what is left
)

// step is one step of a scenario.
type step struct {
	do    action
	line  uint64
	block int // the block of the line it touches; -1: all of them
	n     int // doCut
	// during is, for doCheckpoint, a step run while the checkpoint flushes the SSD: after it took
	// its snapshot of the changes, before it commits them.
	during *step
	// kill and power are, for doCrash, what the restarted tier holds after either crash, as
	// tierState writes it.
	kill, power string
}

// The steps of the scenarios: do to a whole line (on), to one block of it (onBlock) or to no line
// (at); a checkpoint with a step inside it (during), one cut short (cutAfter), a crash.
func on(do action, line uint64) step             { return step{do: do, line: line, block: -1} }
func onBlock(do action, line uint64, b int) step { return step{do: do, line: line, block: b} }
func at(do action) step                          { return step{do: do, block: -1} }
func during(s step) step                         { return step{do: doCheckpoint, block: -1, during: &s} }
func cutAfter(n int) step                        { return step{do: doCut, block: -1, n: n} }
func crash(kill, power string) step              { return step{do: doCrash, block: -1, kill: kill, power: power} }

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
	} {
		for _, power := range []bool{false, true} {
			name := sc.name + map[bool]string{false: "/kill9", true: "/powerloss"}[power]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				runScenario(t, sc.mode, power, sc.steps)
			})
		}
	}
}

// scenario runs steps on successive engines over one machine.
type scenario struct {
	t     *testing.T
	l     layout
	power bool // crashes are power losses, not kill -9
	m     *machine
	g     *gate
	store *hookedStore
	ssd   *hookedDev
	c     *Cache
	id    int64 // the last write's id
}

func runScenario(t *testing.T, mode Mode, power bool, steps []step) {
	l := scenarioLayout
	l.mode = mode
	size := scenarioLines * l.line
	s := &scenario{t: t, l: l, power: power, m: newMachine(size, l.ssd*l.line), id: initialID}
	data := make([]byte, size)
	stamp(data, 0, initialID)
	s.m.back.WriteAt(data, 0)
	s.m.back.Flush()
	for sec := range s.m.hist {
		s.m.hist[sec] = []ack{{id: initialID}}
	}
	s.start()
	defer func() { s.c.Close() }()
	for i, st := range steps {
		s.do(i, st)
	}
}

// start starts an engine on the machine, with its background checkpoints and destaging stopped
// (Close finds them stopped).
func (s *scenario) start() {
	s.g = &gate{}
	s.store = &hookedStore{Store: gatedStore{s.g, s.m.store}}
	s.ssd = &hookedDev{Backend: gatedDev{s.g, s.m.ssd}}
	s.c = newCache(s.t, gatedDev{s.g, s.m.back}, s.l, s.store, s.ssd)
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
			t.Fatalf("step %d: read of line %d: %v", i, st.line, err)
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
		if err != nil {
			t.Fatalf("step %d: change of line %d: %v", i, st.line, err)
		}
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
			s.ssd.beforeFlush = func() { ran = true; s.do(i, *st.during) }
		}
		if backendErr, tierErr := c.ssd.j.checkpoint(); backendErr != nil || tierErr != nil {
			t.Fatalf("step %d: checkpoint: %v, %v", i, backendErr, tierErr)
		}
		if !ran {
			t.Fatalf("step %d: the checkpoint did not flush the SSD", i)
		}
	case doFlush:
		call := m.seq.Add(1)
		if err := c.Flush(); err != nil {
			t.Fatalf("step %d: flush: %v", i, err)
		}
		m.durable.Store(call)
	case doCut:
		left := st.n
		s.store.afterCommit = func() {
			if left--; left == 0 {
				s.g.crash()
			}
		}
		c.ssd.j.checkpoint() // its errors are the crash's
		s.store.afterCommit = nil
		if left > 0 {
			t.Fatalf("step %d: the checkpoint landed %d commits, not the %d to cut after", i, st.n-left, st.n)
		}
	case doCrash:
		s.crash(i, st)
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
	if s.power {
		want = st.power
		s.m.store.Crash()
		keepNone := rand.New(rand.NewPCG(0, 0)) // drawn from in vain: nothing is kept
		s.m.back.powerLoss(keepNone, 0)
		s.m.ssd.powerLoss(keepNone, 0)
	}
	s.c.Close() // every call of the engine fails now
	s.start()
	if got := tierState(s.c); got != want {
		t.Fatalf("step %d: after the restart the SSD tier holds %q, want %q", i, got, want)
	}
	_, split, err := s.m.checkRestart(s.c, s.power || s.l.mode == WriteBack)
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
			case d.has(blk):
				b.WriteByte('d')
			case v.has(blk):
				b.WriteByte('c')
			default:
				b.WriteByte('.')
			}
		}
	}
	return b.String()
}

// hookedStore runs afterCommit, when set, after each commit that lands: a step's way to crash
// between the parts of a checkpoint's commit, or right after its last.
type hookedStore struct {
	meta.Store
	afterCommit func()
}

func (s *hookedStore) Commit(ops []meta.Op, sync bool) error {
	err := s.Store.Commit(ops, sync)
	if err == nil && s.afterCommit != nil {
		s.afterCommit()
	}
	return err
}

// hookedDev runs beforeFlush, when set, once, at the next flush of the SSD: a step's way to act
// inside a checkpoint, after its snapshot and before its commit.
type hookedDev struct {
	backend.Backend
	beforeFlush func()
}

func (d *hookedDev) Flush() error {
	if f := d.beforeFlush; f != nil {
		d.beforeFlush = nil
		f()
	}
	return d.Backend.Flush()
}
