package policy

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// NHit admits a missed key on its N-th miss among the last W misses it was asked about, so that
// keys read once (a backup, a scan, a one-off file) never displace cached ones. Caching on the
// second hit is how CDNs keep one-hit wonders out of their disk caches (Maggs and Sitaraman,
// "Algorithmic Nuggets in Content Delivery", ACM SIGCOMM CCR 45(3), 2015); SSD caches select
// blocks by their recent access count in the same way (Pritchett and Thottethodi, "SieveStore: A
// Highly-Selective, Ensemble-level Disk Cache for Cost-Performance", ISCA 2010).
//
// Spec: "nhit" (N=2, W=65536), "nhit:N" or "nhit:N,window=W". The window counts admission
// decisions, which the cache asks for on misses only, so W is a number of misses; a sensible W is
// about ten times the cache's capacity in keys (a key missed twice within that span is reused
// within a few cache lifetimes), and the default suits a cache of a few thousand lines. Memory is
// bounded by W: a ring of the last W missed keys and a hash table of their counts, 40 to 72 bytes
// per unit of W; nothing is allocated per decision.
type NHit struct {
	n      uint32
	ring   []Key // the last W missed keys; once full, ring[pos] is the oldest
	pos    int
	full   bool
	counts countTable
}

const (
	nhitDefaultN      = 2
	nhitDefaultWindow = 1 << 16
	nhitMaxWindow     = 1 << 24 // 16M misses: about 640 MiB of state, more than any sane window
	nhitForm          = "write nhit:N or nhit:N,window=W with 1 <= N <= W <= 16777216"
)

// NewNHit builds an NHit policy that admits on the n-th miss within window misses.
func NewNHit(n, window int) (*NHit, error) {
	if n < 1 || window < n || window > nhitMaxWindow {
		return nil, fmt.Errorf("N=%d, window=%d out of range; %s", n, window, nhitForm)
	}
	return &NHit{n: uint32(n), ring: make([]Key, window), counts: newCountTable(window)}, nil
}

func newNHitSpec(params string) (Admission, error) {
	n, window := nhitDefaultN, nhitDefaultWindow
	if params != "" {
		for i, item := range strings.Split(params, ",") {
			name, val, named := strings.Cut(strings.TrimSpace(item), "=")
			if !named && i == 0 {
				name, val = "n", name
			}
			v, err := strconv.Atoi(strings.TrimSpace(val))
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "n":
				if err != nil || v < 1 {
					return nil, fmt.Errorf("N %q is not a whole number of at least 1; %s", val, nhitForm)
				}
				n = v
			case "window":
				if err != nil || v < 1 || v > nhitMaxWindow {
					return nil, fmt.Errorf("window %q is not a whole number from 1 to %d; %s", val, nhitMaxWindow, nhitForm)
				}
				window = v
			default:
				return nil, fmt.Errorf("unknown parameter %q; %s", item, nhitForm)
			}
		}
	}
	return NewNHit(n, window)
}

// Admit counts a miss of a.Key and admits it if it is the key's N-th (or later) in the window.
func (h *NHit) Admit(a Access) bool {
	if h.full {
		h.counts.dec(h.ring[h.pos])
	}
	h.ring[h.pos] = a.Key
	if h.pos++; h.pos == len(h.ring) {
		h.pos, h.full = 0, true
	}
	return h.counts.inc(a.Key) >= h.n
}

// countTable counts keys in an open-addressing hash table with linear probing, sized for at most
// max distinct keys at half load. A count of zero marks a free slot; removal shifts the following
// entries back instead of leaving tombstones, so the table never needs rebuilding.
type countTable struct {
	slots []countSlot
	mask  uint64
}

type countSlot struct {
	key   Key
	count uint32
}

func newCountTable(max int) countTable {
	n := uint64(1) << bits.Len64(uint64(2*max-1))
	return countTable{slots: make([]countSlot, n), mask: n - 1}
}

func (t *countTable) home(k Key) uint64 { return mix64(uint64(k)) & t.mask }

// inc adds one to k's count and returns it.
func (t *countTable) inc(k Key) uint32 {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.count == 0 {
			*s = countSlot{key: k, count: 1}
			return 1
		}
		if s.key == k {
			s.count++
			return s.count
		}
	}
}

// dec takes one from the count of k, which must be counted, and frees its slot at zero.
func (t *countTable) dec(k Key) {
	i := t.home(k)
	for t.slots[i].key != k || t.slots[i].count == 0 {
		i = (i + 1) & t.mask
	}
	if t.slots[i].count--; t.slots[i].count > 0 {
		return
	}
	// Backward-shift deletion: move up each later entry of the probe run whose home slot does not
	// lie between the hole and it, so every entry stays reachable from its home slot.
	for j := (i + 1) & t.mask; t.slots[j].count != 0; j = (j + 1) & t.mask {
		if (j-t.home(t.slots[j].key))&t.mask >= (j-i)&t.mask {
			t.slots[i] = t.slots[j]
			t.slots[j].count = 0
			i = j
		}
	}
}
