package cache

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend/fault"
)

// The tests here bypass the SSD tier for a transient reason, a metadata store that fails its
// commits for a while or an SSD that fails its I/O, and require the tier to come back into service
// (by Heal, or by itself with backoff) with the clean lines it held, minus those changed meanwhile,
// and a restart to find nothing stale.

// flakyStore fails every Commit and Sync while failing is set.
type flakyStore struct {
	meta.Store
	failing atomic.Bool
}

var errFlaky = errors.New("injected metadata failure")

func (f *flakyStore) Commit(ops []meta.Op, sync bool) error {
	if f.failing.Load() {
		return errFlaky
	}
	return f.Store.Commit(ops, sync)
}

func (f *flakyStore) Sync() error {
	if f.failing.Load() {
		return errFlaky
	}
	return f.Store.Sync()
}

// healLayout caches the whole of a small device on the SSD tier, in 4 KiB lines: 16 of them.
var healLayout = layout{line: 4 << 10, ssd: 20}

const healDevSize = 64 << 10

type healRig struct {
	t      *testing.T
	back   *crashDev
	ssdDev *crashDev
	ssd    *fault.Backend
	mem    *meta.Mem
	store  *flakyStore
	g      *gate
	c      *Cache
	m      sectorSets
}

func newHealRig(t *testing.T, mode Mode) *healRig {
	l := healLayout
	l.mode = mode
	r := &healRig{t: t, back: newCrashDev(healDevSize), ssdDev: newCrashDev(l.ssd * l.line), mem: meta.NewMem(), g: &gate{}}
	r.ssd = fault.New(gatedDev{r.g, r.ssdDev}, fault.Options{Seed: 1})
	r.store = &flakyStore{Store: gatedStore{r.g, r.mem}}
	r.c = newCache(t, gatedDev{r.g, r.back}, l, r.store, r.ssd)
	r.m = make(sectorSets, healDevSize/sector)
	return r
}

// write stamps [off, off+n) with id through the cache and records it in the model.
func (r *healRig) write(off, n int64, id int64) error {
	buf := make([]byte, n)
	stamp(buf, int(off/sector), id)
	_, err := r.c.WriteAt(buf, off)
	if err == nil {
		for s := off / sector; s < (off+n)/sector; s++ {
			r.m[s] = []int64{id}
		}
	}
	return err
}

// verify reads the whole device through the cache and checks it against the model.
func (r *healRig) verify(when string) {
	r.t.Helper()
	all := make([]byte, healDevSize)
	if _, err := r.c.ReadAt(all, 0); err != nil {
		r.t.Fatalf("%s: read: %v", when, err)
	}
	if err := r.m.check(all, 0); err != nil {
		r.t.Fatalf("%s: %v", when, err)
	}
}

func (r *healRig) ssdStats() TierStats { return r.c.Stats().Tiers[0] }

// TestHeal bypasses a warm SSD tier (metadata commits failing, or SSD I/O errors), changes one of
// its lines while it is bypassed, lets the fault clear and brings the tier back with Heal: it must
// serve the lines it held again, never the changed line's old data, and keep them across a kill.
func TestHeal(t *testing.T) {
	causes := []struct {
		name  string
		fault func(r *healRig, on bool)
		// bypass makes the tier fail once the fault is on.
		bypass func(r *healRig)
	}{
		{"metadata", func(r *healRig, on bool) { r.store.failing.Store(on) }, func(r *healRig) {
			_ = r.write(0, 4096, 2) // a new clean block to commit; the write itself may fail
			_ = r.c.Flush()         // its checkpoint fails: the tier is bypassed
		}},
		{"ssd-errors", func(r *healRig, on bool) { r.ssd.SetFailing(on) }, func(r *healRig) {
			buf := make([]byte, 4096)
			for line := range maxTierErrors { // each read hits the dead SSD once, then the backend
				if _, err := r.c.ReadAt(buf, int64(line)*4096); err != nil {
					r.t.Fatalf("read with the SSD failing: %v", err)
				}
			}
		}},
	}
	for _, mode := range []Mode{WriteThrough, WriteBack} {
		for _, cause := range causes {
			t.Run(mode.String()+"/"+cause.name, func(t *testing.T) {
				r := newHealRig(t, mode)
				defer func() { r.c.Close() }()
				if err := r.write(0, healDevSize, 1); err != nil {
					t.Fatal(err)
				}
				if err := r.c.FlushAll(context.Background(), nil); err != nil {
					t.Fatal(err)
				}
				if err := r.c.Flush(); err != nil {
					t.Fatal(err)
				}
				r.verify("warm")
				warm := r.ssdStats().Lines

				cause.fault(r, true)
				cause.bypass(r)
				st := r.ssdStats()
				if !st.Failed || st.Reason == "" || st.SetAside == 0 || st.RetryIn <= 0 || st.Bypasses != 1 {
					t.Fatalf("after the fault: %+v; want the tier bypassed, with a reason, lines set aside and a retry planned", st)
				}
				if err := r.c.Heal(); err == nil {
					t.Fatal("Heal brought the tier back while the fault is on")
				}
				cause.fault(r, false)
				hits := st.Hits
				r.verify("bypassed")
				if h := r.ssdStats().Hits; h != hits {
					t.Fatalf("a bypassed tier served %d hits", h-hits)
				}
				// A change to a line set aside: the tier must not bring its old data back.
				if err := r.write(5*4096, 4096, 3); err != nil {
					t.Fatal(err)
				}
				aside := r.ssdStats().SetAside

				if err := r.c.Heal(); err != nil {
					t.Fatalf("Heal: %v", err)
				}
				st = r.ssdStats()
				if st.Failed || st.Reason != "" || st.Heals != 1 || st.SetAside != 0 {
					t.Fatalf("after Heal: %+v", st)
				}
				if st.Lines < aside || st.Lines >= warm {
					t.Fatalf("after Heal: %d lines, want the %d set aside (of %d warm), without the one changed", st.Lines, aside, warm)
				}
				hits = st.Hits
				r.verify("healed")
				if r.ssdStats().Hits <= hits {
					t.Fatal("the healed tier served no hit")
				}

				r.c = restartAfterKill(t, healLayout, r.g, r.c, r.back, r.ssdDev, r.mem)
				r.verify("after a restart")
				if got := r.ssdStats().Lines; got < st.Lines-1 { // the verify may fill the changed line again
					t.Fatalf("after a restart: %d lines, want the %d the healed tier held", got, st.Lines)
				}
			})
		}
	}
}

// TestHealsByItself: a bypassed tier is tried again with growing delays while the fault lasts, and
// comes back without being asked once it clears.
func TestHealsByItself(t *testing.T) {
	r := newHealRig(t, WriteThrough)
	defer func() { r.c.Close() }()
	j := r.c.ssd.j
	j.healMu.Lock()
	j.healFirst = 10 * time.Millisecond
	j.healMu.Unlock()
	if err := r.write(0, healDevSize, 1); err != nil {
		t.Fatal(err)
	}
	r.verify("warm")
	r.store.failing.Store(true)
	_ = r.write(0, 4096, 2)
	_ = r.c.Flush()
	if !r.ssdStats().Failed {
		t.Fatal("the tier was not bypassed")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		j.healMu.Lock()
		delay := j.healDelay
		j.healMu.Unlock()
		if delay >= 40*time.Millisecond {
			break // two attempts failed, each doubling the delay
		}
		if time.Now().After(deadline) {
			t.Fatalf("no retry in 10 s (delay %v)", delay)
		}
		j.askCheckpoint()
		time.Sleep(5 * time.Millisecond)
	}
	if !r.ssdStats().Failed {
		t.Fatal("the tier came back while its metadata still fails")
	}
	r.store.failing.Store(false)
	for r.ssdStats().Failed {
		if time.Now().After(deadline) {
			t.Fatalf("the tier did not come back by itself: %+v", r.ssdStats())
		}
		j.askCheckpoint()
		time.Sleep(5 * time.Millisecond)
	}
	r.verify("healed")
}

// TestBypassDuringFill: a line whose fill is under way when the tier is bypassed has no valid
// block and no stored record: it is dropped, not set aside, and the heal brings back the others.
func TestBypassDuringFill(t *testing.T) {
	r := newHealRig(t, WriteThrough)
	defer func() { r.c.Close() }()
	last := int64(healDevSize - 4096)
	if err := r.write(0, last, 1); err != nil {
		t.Fatal(err)
	}
	for s := last / sector; s < healDevSize/sector; s++ {
		r.m[s] = []int64{0} // never written: zeros
	}
	if err := r.c.Flush(); err != nil {
		t.Fatal(err)
	}
	g := r.c.ssd.acquire(uint64(last / 4096)) // the fill of the last line begins
	if !g.ok || !g.valid.IsZero() {
		t.Fatalf("acquire of an uncached line: ok %v, valid %v", g.ok, g.valid)
	}
	r.c.ssd.fail("injected")
	if st := r.ssdStats(); st.SetAside != uint64(last/4096) {
		t.Fatalf("set aside %d lines, want the %d with data", st.SetAside, last/4096)
	}
	r.c.ssd.unpin(g.slot) // the fill ends
	if err := r.c.Heal(); err != nil {
		t.Fatal(err)
	}
	if st := r.ssdStats(); st.Lines != uint64(last/4096) {
		t.Fatalf("after Heal: %d lines, want %d", st.Lines, last/4096)
	}
	r.verify("healed")
}
