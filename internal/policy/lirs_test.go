package policy

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// listKeys returns the keys of l from head to tail.
func listKeys[M any](a *arena[M], l *list) []Key {
	var keys []Key
	for i := l.head; i != none; i = a.at(i).next {
		keys = append(keys, a.at(i).key)
	}
	return keys
}

// TestLIRSInvariants checks LIRS's bookkeeping on random operation sequences: the LIR count is the
// number of LIR keys in S; a key in S is resident exactly when it is LIR or in Q; Q holds only
// HIR keys; the non-resident list is exactly S's non-resident keys; S stays within twice the
// capacity; Len is the LIR keys plus Q.
func TestLIRSInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(2, 12).Draw(t, "capacity")
		p := NewLIRS(Config{Capacity: capacity}).(*LIRS)
		keyGen := rapid.Custom(func(t *rapid.T) Key { return Key(rapid.IntRange(0, 4*capacity).Draw(t, "key")) })
		for range rapid.IntRange(1, 400).Draw(t, "steps") {
			k := keyGen.Draw(t, "k")
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 8:
				if !p.Get(k) && op < 7 {
					p.Insert(k)
				}
			default:
				p.Remove(k)
			}
			checkLIRS(t, p)
		}
	})
}

func checkLIRS(t *rapid.T, p *LIRS) {
	inQ := map[Key]bool{}
	for _, k := range listKeys(&p.q, &p.ql) {
		inQ[k] = true
	}
	nonResident := map[Key]bool{}
	for _, k := range listKeys(&p.nr, &p.nrl) {
		nonResident[k] = true
	}
	lir, nr := 0, 0
	for _, k := range listKeys(&p.s, &p.sl) {
		i, _ := p.s.lookup(k)
		m := p.s.at(i).meta
		require.Equal(t, m.lir || inQ[k], m.resident, "key %d: resident", k)
		require.False(t, m.lir && inQ[k], "LIR key %d in Q", k)
		require.Equal(t, !m.resident, nonResident[k], "key %d: in the non-resident list", k)
		if m.lir {
			lir++
		}
		if !m.resident {
			nr++
		}
	}
	require.Equal(t, lir, p.lirCount)
	require.LessOrEqual(t, p.lirCount, p.lirLimit)
	require.Equal(t, nr, p.nrl.len, "non-resident list has keys S does not")
	require.LessOrEqual(t, p.sl.len, 2*p.capacity)
	require.Equal(t, p.lirCount+p.ql.len, p.Len())
	require.LessOrEqual(t, p.Len(), p.capacity)
}

// libCacheSim's split of the capacity: 1 % for resident HIR keys (at least one), the rest LIR.
func TestLIRSLimits(t *testing.T) {
	tests := []struct{ capacity, lir, hir int }{
		{2, 1, 1}, {100, 99, 1}, {199, 198, 1}, {200, 198, 2}, {4897, 4849, 48},
	}
	for _, tt := range tests {
		p := NewLIRS(Config{Capacity: tt.capacity}).(*LIRS)
		require.Equal(t, tt.lir, p.lirLimit, "capacity %d", tt.capacity)
		require.Equal(t, tt.hir, p.hirLimit, "capacity %d", tt.capacity)
	}
	_, isLRU := NewLIRS(Config{Capacity: 1}).(*LRU)
	require.True(t, isLRU, "capacity 1 is an LRU of one key")
}
