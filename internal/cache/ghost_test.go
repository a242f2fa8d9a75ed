package cache

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// TestOrderOverwriteKeepsGhost: in FLUSH order, writes over a dirty block of an epoch the backend
// does not have yet go on while the backend stalls (the block's older bytes are kept, a ghost, for
// each epoch), and the backend gets each epoch's version of the block in turn, the newest last.
func TestOrderOverwriteKeepsGhost(t *testing.T) {
	s := newStalledOrder(t, nil, nil)
	c, back, write, letGo, want := s.c, s.back, s.write, s.letGo, s.want
	const block = 8 // line 2, another line than block 0's
	require.NoError(t, write(0, 1))
	back.stall.Store(true)
	require.NoError(t, c.Flush()) // ends epoch 1, which the destager writes back, and stalls
	<-back.waiting
	require.NoError(t, write(block, 2))
	require.NoError(t, c.Flush()) // ends epoch 2: waits behind epoch 1

	done := make(chan error, 1)
	go func() {
		if err := write(block, 3); err != nil { // over epoch 2's block: kept
			done <- err
			return
		}
		if err := c.Flush(); err != nil {
			done <- err
			return
		}
		done <- write(block, 4) // over epoch 3's: kept too
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("a write over a dirty block of an older epoch waits for the backend")
	}
	st := c.Stats().Dirty
	require.Equal(t, 2, st.Ghosts)
	require.EqualValues(t, 2*blockSize, st.GhostBytes)
	require.EqualValues(t, 2, st.GhostsKept)
	got := make([]byte, blockSize)
	_, err := c.ReadAt(got, block*blockSize)
	require.NoError(t, err)
	require.Equal(t, []int64{4}, runsOf(stamps(got, block*blockSize/sector)), "a read gets the newest data")

	letGo()
	require.NoError(t, c.FlushAll(context.Background(), nil))
	st = c.Stats().Dirty
	require.Zero(t, st.Ghosts)
	require.Zero(t, st.GhostBytes)
	require.Equal(t, []int64{2, 3, 4}, back.writesOf(block), "each epoch's version, in order")
	checkBackend(t, back.crashDev, want)
}

// runsOf returns ids without repeats in a row.
func runsOf(ids []int64) []int64 {
	var out []int64
	for _, id := range ids {
		if len(out) == 0 || out[len(out)-1] != id {
			out = append(out, id)
		}
	}
	return out
}

// TestOrderGhostAcrossRestart: a ghost kept while the backend fails outlives a restart of the
// cache (in the store) and is written back in its epoch's place by the next run; a restart in
// address order deletes the ghosts instead, and writes the newest data back. After a kill that
// lost the record of the write over the block (no run log, no FLUSH since), the block holds the
// ghost's bytes again, whatever the write left in the slot, and the backend gets those.
func TestOrderGhostAcrossRestart(t *testing.T) {
	for _, tc := range []struct {
		name, order string
		kill        bool
		want        []int64 // the ids the backend gets for the block, in order
		read        int64   // what a read of the block gets after the restart
	}{
		{"flush order keeps it", OrderFlush, false, []int64{1, 2}, 2},
		{"address order drops it", OrderAddress, false, []int64{2}, 2},
		{"a kill before the write's record takes it back", OrderFlush, true, []int64{1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := layout{line: 16 << 10, ssd: 8, mode: WriteBack}
			store := meta.NewMem()
			ssd := mem.New(l.ssd * l.line)
			back := &stallingDev{crashDev: newCrashDev(orderDevSize), written: map[int][]int64{}}
			failing := fault.New(back, fault.Options{Seed: 1})
			// Behind a gate, which keeps what Close would close open for the next run, and which
			// a kill cuts.
			open := func(g *gate, order string) *Cache {
				cfg := testConfig(l, gatedStore{g, store}, gatedDev{g, ssd})
				cfg.WriteBack = WriteBackConfig{High: 0.9, Low: 0.8, Max: 0.95, Throttle: "none", Order: order}
				c, err := New(gatedDev{g, failing}, cfg)
				require.NoError(t, err)
				return c
			}
			g := &gate{}
			c := open(g, OrderFlush)
			const block = 4
			data := func(id int64) []byte {
				p := make([]byte, blockSize)
				stamp(p, block*blockSize/sector, id)
				return p
			}
			failing.SetFailing(true) // the write backs fail: epoch 1 stays pending
			_, err := c.WriteAt(data(1), block*blockSize)
			require.NoError(t, err)
			require.NoError(t, c.Flush())
			_, err = c.WriteAt(data(2), block*blockSize)
			require.NoError(t, err)
			require.Equal(t, 1, c.Stats().Dirty.Ghosts)
			if tc.kill {
				g.crash()
			}
			c.Close()
			ghosts := 0
			require.NoError(t, store.Ghosts(func(meta.Ghost) error { ghosts++; return nil }))
			require.Equal(t, 1, ghosts, "the ghost is in the store")

			failing.SetFailing(false)
			c = open(&gate{}, tc.order)
			defer c.Close()
			got := make([]byte, blockSize)
			_, err = c.ReadAt(got, block*blockSize)
			require.NoError(t, err)
			require.Equal(t, data(tc.read), got)
			require.NoError(t, c.FlushAll(context.Background(), nil))
			require.Equal(t, tc.want, back.writesOf(block))
			want := make([]byte, orderDevSize)
			copy(want[block*blockSize:], data(tc.read))
			checkBackend(t, back.crashDev, want)
			ghosts = 0
			require.NoError(t, store.Ghosts(func(meta.Ghost) error { ghosts++; return nil }))
			require.Zero(t, ghosts, "the ghost is deleted once written back or dropped")
		})
	}
}

// ghostPutFails fails every commit of the ghost of block of line alone (over a store that takes
// one op a commit, so that the ghosts committed with it in one CommitParts land apart).
type ghostPutFails struct {
	meta.Store
	line  uint64
	block uint32
	fired atomic.Bool
}

func (f *ghostPutFails) Commit(ops []meta.Op, sync bool) error {
	if g := ops[0].Ghost; len(ops) == 1 && g != nil && !ops[0].Delete && g.Line == f.line && g.Block == f.block {
		f.fired.Store(true)
		return errors.New("injected metadata failure")
	}
	return f.Store.Commit(ops, sync)
}

// TestOrderGhostCommitFails: when the commit of the ghosts of a write fails part way, the parts
// that landed are taken back (a restart must not find them), and the write waits for its epoch's
// write back instead, then goes on; the backend ends with the newest data.
func TestOrderGhostCommitFails(t *testing.T) {
	ms := meta.NewMem()
	ms.SetMaxOps(1) // a commit a ghost: block 9's fails, after block 8's landed
	store := &ghostPutFails{Store: ms, line: 2, block: 1}
	s := newStalledOrder(t, nil, store)
	c, back, letGo, want := s.c, s.back, s.letGo, s.want
	write := func(block, blocks int, id int64) error { // blocks of one line, in one request
		p := want[block*blockSize : (block+blocks)*blockSize]
		stamp(p, block*blockSize/sector, id)
		_, err := c.WriteAt(p, int64(block)*blockSize)
		return err
	}
	require.NoError(t, write(0, 1, 1))
	back.stall.Store(true)
	require.NoError(t, c.Flush()) // epoch 1: its write back stalls
	<-back.waiting
	require.NoError(t, write(8, 2, 2))
	require.NoError(t, c.Flush()) // epoch 2, behind it

	done := make(chan error, 1)
	go func() { done <- write(8, 2, 3) }() // over both of epoch 2's blocks: two ghosts, one fails
	require.Eventually(t, store.fired.Load, time.Minute, time.Millisecond)
	ghosts := 0
	require.Eventually(t, func() bool {
		ghosts = 0
		require.NoError(t, ms.Ghosts(func(meta.Ghost) error { ghosts++; return nil }))
		return ghosts == 0
	}, time.Minute, time.Millisecond, "the ghost that landed is taken back")
	letGo()
	require.NoError(t, <-done, "the write waits for its epoch instead")
	require.NoError(t, c.FlushAll(context.Background(), nil))
	require.Zero(t, c.Stats().Dirty.Ghosts)
	require.Equal(t, []int64{2, 3}, back.writesOf(8))
	checkBackend(t, back.crashDev, want)
}

// TestOrderGhostRestoredOnlyWhereOverwritten: after a kill that lost the record of a write over a
// dirty block whose older version is a ghost, a packed tier, which wrote the new bytes to a unit
// of their own, still holds the ghost's bytes where the committed record finds them: the restart
// writes nothing back into the block, so it starts even when the SSD tier takes no write (a full
// packed tier: TestCrashRestart's write-back cases met it), and serves and writes back the
// ghost's data. A tier of slots wrote over the block in place, and a restart that cannot write it
// back fails, saying so.
func TestOrderGhostRestoredOnlyWhereOverwritten(t *testing.T) {
	for _, tc := range []struct {
		reduction Reduction
		restores  bool
	}{
		{ReductionOff, true},
		{ReductionCompress, false},
		{ReductionDedupe, false},
	} {
		t.Run(tc.reduction.String(), func(t *testing.T) {
			l := layout{line: 16 << 10, ssd: 8, mode: WriteBack, reduction: tc.reduction}
			store := meta.NewMem()
			ssd := mem.New(l.ssd * l.line)
			back := &stallingDev{crashDev: newCrashDev(orderDevSize), written: map[int][]int64{}}
			failing := fault.New(back, fault.Options{Seed: 1})
			open := func(g *gate, dev backend.Backend) (*Cache, error) {
				cfg := testConfig(l, gatedStore{g, store}, gatedDev{g, dev})
				cfg.WriteBack = WriteBackConfig{High: 0.9, Low: 0.8, Max: 0.95, Throttle: "none", Order: OrderFlush}
				return New(gatedDev{g, failing}, cfg)
			}
			const block = 4
			data := func(id int64) []byte {
				p := make([]byte, blockSize)
				stamp(p, block*blockSize/sector, id)
				return p
			}
			g := &gate{}
			c, err := open(g, ssd)
			require.NoError(t, err)
			failing.SetFailing(true) // the write backs fail: epoch 1 stays pending
			_, err = c.WriteAt(data(1), block*blockSize)
			require.NoError(t, err)
			require.NoError(t, c.Flush())
			_, err = c.WriteAt(data(2), block*blockSize)
			require.NoError(t, err)
			require.Equal(t, 1, c.Stats().Dirty.Ghosts)
			g.crash() // the record of the write of 2 is lost with the run log
			c.Close()
			failing.SetFailing(false)

			// The restart over an SSD tier that fails every write.
			noWrites := fault.New(ssd, fault.Options{Seed: 1, Rates: map[fault.Op]float64{fault.Write: 1}})
			c, err = open(&gate{}, noWrites)
			if tc.restores {
				require.ErrorContains(t, err, "restoring block 0 of line 1 from its older version")
				return
			}
			require.NoError(t, err, "nothing to restore: the block holds the ghost's bytes")
			defer c.Close()
			got := make([]byte, blockSize)
			_, err = c.ReadAt(got, block*blockSize)
			require.NoError(t, err)
			require.Equal(t, data(1), got)
			require.NoError(t, c.FlushAll(context.Background(), nil))
			require.Equal(t, []int64{1}, back.writesOf(block))
		})
	}
}
