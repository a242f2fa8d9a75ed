package cache

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/runlog"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// killed is a crash step for TestRunLogScenarios: a kill -9 with the SSD tier's run log, after
// which the restarted tier holds want (as tierState writes it).
func killed(want string) step { return step{do: doCrash, block: -1, kill: want} }

// TestRunLogScenarios walks the journal through the steps of TestJournalScenarios with a run log:
// after a kill -9 the restart replays it, so every acknowledged write reads back (dirty data
// included, flushed or not), and nothing reads older data than the last write, trim or zeroing
// acknowledged before the kill (checkRestart, with no loss allowed). A write the kill cut short
// may read old or new.
func TestRunLogScenarios(t *testing.T) {
	fill4 := []step{on(doWrite, 0), on(doWrite, 1), on(doWrite, 2), on(doWrite, 3)}
	for _, sc := range []struct {
		name  string
		mode  Mode
		steps []step
	}{
		// Without a flush, a write-back write's dirty record is only in the log.
		{"write-back writes kept without a flush", WriteBack, []step{
			on(doWrite, 0), onBlock(doWrite, 1, 1), killed("dd .d .. .."),
		}},
		{"write-back overwrite of clean blocks", WriteBack, []step{
			on(doRead, 0), at(doCheckpoint), onBlock(doWrite, 0, 0), killed("dc .. .. .."),
		}},
		// Invalidations are logged in order: a trim or zeroing after a write is not undone by
		// the write's record. (A trim writes the line's dirty blocks back first.)
		{"write-back write, then a trim and a zeroing", WriteBack, []step{
			on(doWrite, 0), on(doWrite, 1), onBlock(doTrim, 0, 1), on(doZero, 1), killed("c. .. .. .."),
		}},
		{"write-through fill, then an overwrite", WriteThrough, []step{
			on(doRead, 0), on(doRead, 1), onBlock(doWrite, 1, 0), killed("cc cc .. .."),
		}},
		// A line evicted and its slot reused: the deletion is replayed before the new line.
		{"evicted slot reused after the deletion commits", WriteBack, []step{
			on(doRead, 0), at(doCheckpoint), on(doEvict, 0), at(doCheckpoint), on(doWrite, 1),
			killed(".. dd .. .."),
		}},
		{"eviction not committed", WriteBack, []step{
			on(doRead, 0), at(doCheckpoint), on(doEvict, 0), on(doWrite, 1), killed(".. dd .. .."),
		}},
		// Records logged before a checkpoint's snapshot and changes during its commit.
		{"write during a checkpoint", WriteBack, []step{
			on(doWrite, 0), during(on(doWrite, 1)), killed("dd dd .. .."),
		}},
		{"zeroing during a checkpoint", WriteBack, []step{
			on(doWrite, 0), on(doWrite, 1), during(on(doZero, 0)), killed(".. dd .. .."),
		}},
		// A checkpoint cut after its first part leaves the log's watermark where it was.
		{"checkpoint cut after its first part", WriteBack, slices.Concat(fill4, []step{
			cutAfter(1), killed("dd dd dd dd"),
		})},
		{"checkpoint cut after its last part", WriteBack, slices.Concat(fill4, []step{
			cutAfter(2), killed("dd dd dd dd"),
		})},
		// A write cut after its SSD write was never acknowledged: the log has the invalidation of
		// the clean block it overwrites, not its record (old or new may be read).
		{"write-back overwrite cut after its SSD write", WriteBack, []step{
			on(doRead, 0), at(doCheckpoint), cutAt(afterSSDWrite, onBlock(doWrite, 0, 0)), killed(".c .. .. .."),
		}},
		{"destage, then a kill before a checkpoint", WriteBack, []step{
			on(doWrite, 0), at(doFlush), at(doDestage), killed("cc .. .. .."),
		}},
		// Two kills: the second replays the second run's log, not the first's (the first restart
		// read every line and wrote the dirty data back).
		{"a kill after a replay", WriteBack, []step{
			on(doWrite, 0), killed("dd .. .. .."), on(doWrite, 2), killed("cc cc dd cc"),
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runScenario(t, sc.mode, kill9Logged, sc.steps)
		})
	}
}

// TestRunLogRandom runs seeded random scenarios: reads, writes (some FUA), zeroings, trims,
// evictions, checkpoints (some with a write, zeroing or trim inside), flushes and destages on the
// lines of TestJournalScenarios' tiny tier, in write-back and write-through, killed with -9 now and
// then and restarted on the run log: after each restart every sector must read its last
// acknowledged write (checkRestart, no loss allowed), and the engine's own reads must never be
// stale. CACHE_TEST_SEED changes the seeds; a failure names the seed and the steps.
func TestRunLogRandom(t *testing.T) {
	base := testSeed(t)
	runs := 40
	if testing.Short() {
		runs = 10
	}
	for r := range runs {
		seed := base*1000 + uint64(r)
		mode := []Mode{WriteBack, WriteThrough}[r%2]
		t.Run(fmt.Sprintf("%v-seed%d", mode, seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 1))
			s := newScenario(t, mode, kill9Logged)
			defer func() { s.c.Close() }()
			var done []string
			defer func() {
				if t.Failed() {
					t.Logf("seed %d (CACHE_TEST_SEED=%d), steps: %s", seed, base, strings.Join(done, ", "))
				}
			}()
			// change draws a write, zeroing or trim; inside a checkpoint no FUA write, which
			// would wait for the checkpoint the hook holds up.
			change := func(fua bool) step {
				line := uint64(rng.IntN(scenarioLines))
				do := []action{doWrite, doWrite, doZero, doTrim, doWrite, doFUA}[rng.IntN(map[bool]int{false: 5, true: 6}[fua])]
				if rng.IntN(2) == 0 {
					return onBlock(do, line, rng.IntN(2))
				}
				return on(do, line)
			}
			for i := range 40 {
				var st step
				switch r := rng.IntN(20); {
				case r < 4:
					st = on(doRead, uint64(rng.IntN(scenarioLines)))
				case r < 12:
					st = change(true)
				case r < 13:
					line := uint64(rng.IntN(scenarioLines))
					if v, d := s.c.ssd.bits(line); v.IsZero() || !d.IsZero() {
						continue // not cached, or dirty (doomed rather than evicted)
					}
					st = on(doEvict, line)
				case r < 15:
					st = at(doCheckpoint)
					if rng.IntN(2) == 0 {
						st = during(change(false))
					}
				case r < 16:
					st = at(doFlush)
				case r < 17:
					if s.c.ssd.dirtyCount.Load() == 0 {
						continue
					}
					st = at(doDestage)
				default:
					st = killed("")
				}
				done = append(done, stepString(st))
				s.do(i, st)
			}
			s.do(40, killed(""))
		})
	}
}

// stepString writes a step for a failure's log.
func stepString(st step) string {
	name := [...]string{"read", "write", "fua", "zero", "trim", "evict", "checkpoint", "flush", "destage", "cut", "kill"}[st.do]
	if st.during != nil {
		return name + "{" + stepString(*st.during) + "}"
	}
	if st.do >= doCheckpoint {
		return name
	}
	if st.block >= 0 {
		return fmt.Sprintf("%s %d.%d", name, st.line, st.block)
	}
	return fmt.Sprintf("%s %d", name, st.line)
}

// A run log is replayed only on the store it was written beside, by the last run: one copied from
// another SSD tier, or an older one put back after a later run, is refused (Recovered says why),
// and the start goes on as without a log. Replayed, either would bring back data that is not the
// tier's (another tier's slots), or older than a trim the later run committed.
func TestRunLogRefused(t *testing.T) {
	l := layout{line: 8 << 10, ssd: 8, mode: WriteBack, policy: "lru"}
	type node struct {
		m *machine
		l layout
	}
	newNode := func() *node {
		n := &node{m: newMachine(4*l.line, l.ssd*l.line), l: l}
		n.m.withRunLog(t.TempDir(), &n.l)
		return n
	}
	// start starts an engine on n's machine; kill kills it, keeping the run log as it was.
	start := func(n *node) (*Cache, *gate) {
		g := &gate{}
		n.m.keepRunLog(g, kill9Logged)
		c := newCache(t, gatedDev{g, n.m.back}, n.l, gatedStore{g, n.m.store}, gatedDev{g, n.m.ssd})
		return c, g
	}
	kill := func(c *Cache, g *gate) { g.crash(); c.Close() }
	write := func(c *Cache, line int64, id int64) {
		buf := make([]byte, l.line)
		stamp(buf, int(line*l.line/sector), id)
		_, err := c.WriteAt(buf, line*l.line)
		require.NoError(t, err)
	}
	read := func(c *Cache, line int64) int64 {
		buf := make([]byte, sector)
		_, err := c.ReadAt(buf, line*l.line)
		require.NoError(t, err)
		return stamps(buf, int(line*l.line/sector))[0]
	}

	a, b := newNode(), newNode()
	c, _ := start(b)
	c.Close()
	c, g := start(a)
	write(c, 0, 7)
	kill(c, g)
	// A's log at B's path: another tier's.
	b.m.killed = a.m.killed
	b.m.restoreRunLog(t)
	c, _ = start(b)
	require.ErrorIs(t, c.Recovered(), runlog.ErrUnusable)
	require.ErrorContains(t, c.Recovered(), "written for SSD tier")
	require.Equal(t, int64(0), read(c, 0), "B's backend, not A's slot")
	c.Close()

	// A's log, replayed by the next run, which then trims the line and stops cleanly: put back,
	// the old log is older than that run.
	old := a.m.killed
	a.m.restoreRunLog(t)
	c, _ = start(a)
	require.NoError(t, c.Recovered())
	require.Equal(t, int64(7), read(c, 0))
	require.NoError(t, c.Trim(0, l.line))
	require.NoError(t, c.Close())
	a.m.killed = old
	a.m.restoreRunLog(t)
	c, _ = start(a)
	require.ErrorIs(t, c.Recovered(), runlog.ErrUnusable)
	require.Equal(t, int64(0), read(c, 0), "the trim, not the old log's record of the data before it")
	c.Close()
}

// BenchmarkWriteBack4K measures 4 KiB writes in write-back, over a RAM backend and SSD, without
// and with a run log (on /dev/shm where there is one): what logging the records costs a write.
// "rewrite" writes at random over blocks mostly dirty already (a rewrite in place changes no
// record); "new" writes each to a line not cached yet (a new record each, and a new slot); run it
// with -benchtime of at most 30000x, so that it stays below the SSD tier's high watermark. The data
// is random, and each case runs with reduction off and zero: what looking for zero blocks costs a
// write of data.
func BenchmarkWriteBack4K(b *testing.B) {
	dir := b.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "tierblk-bench"); err == nil {
		dir = shm
		defer os.RemoveAll(shm)
	}
	for _, kind := range []string{"rewrite", "new"} {
		for _, logged := range []bool{false, true} {
			for _, r := range []Reduction{ReductionOff, ReductionZero, ReductionCompress, ReductionDedupe} {
				b.Run(kind+"/"+map[bool]string{false: "nolog", true: "runlog"}[logged]+"/reduction-"+r.String(), func(b *testing.B) {
					l := layout{line: 64 << 10, ssd: 1024, mode: WriteBack, reduction: r}
					size := int64(24 << 20) // below the high watermark: no destage
					if kind == "new" {
						l = layout{line: 4 << 10, ssd: 64 << 10, mode: WriteBack, reduction: r}
						size = 1 << 30
					}
					if logged {
						l.runLog = filepath.Join(dir, b.Name())
						require.NoError(b, os.MkdirAll(filepath.Dir(l.runLog), 0o755))
					}
					c := newCache(b, mem.New(size), l, nil, nil)
					defer c.Close()
					var next atomic.Int64
					b.SetBytes(4096)
					b.RunParallel(func(pb *testing.PB) {
						rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
						buf := make([]byte, 4096)
						for i := range buf {
							buf[i] = byte(rng.Uint32())
						}
						for pb.Next() {
							off := rng.Int64N(size/4096) * 4096
							if kind == "new" {
								off = next.Add(1) * 4096 % size
							}
							if _, err := c.WriteAt(buf, off); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
		}
	}
}

// A run log of this tier and run whose record the store's index cannot take (a slot another line
// holds) fails the start with an error that names the log, not the metadata, as what to delete.
func TestRunLogBadRecord(t *testing.T) {
	l := layout{line: 16 << 10, ssd: 8, mode: WriteBack, runLog: filepath.Join(t.TempDir(), "log")}
	b, store, ssd := mem.New(64*l.line), meta.NewMem(), mem.New(8*l.line)
	newCache(t, b, l, store, ssd).Close()
	store.Crash() // reopens it; Close synced everything
	all := []uint64{0xf}
	require.NoError(t, store.Commit([]meta.Op{{Rec: meta.Line{Line: 1, Slot: 2, Valid: all}}}, true))
	sb, _, err := store.Superblock()
	require.NoError(t, err)
	log, err := runlog.Create(l.runLog, runlog.Identity{Tier: sb.ID, Epoch: sb.Epoch}, runlog.Shape{Words: 1, Sums: int(l.line / 4096)}, 0)
	require.NoError(t, err)
	log.Append(meta.Op{Rec: meta.Line{Line: 3, Slot: 2, Valid: all, Dirty: all}})
	require.NoError(t, log.Close())
	_, err = New(b, testConfig(l, store, ssd))
	require.ErrorContains(t, err, "a record of the run log does not fit")
	require.ErrorContains(t, err, "slot 2 is out of range or used twice")
	require.ErrorContains(t, err, "Delete "+l.runLog)
	require.NotErrorIs(t, err, ErrCorrupt)
}
