package policy

import (
	"fmt"
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
// bounded by W: a ring of the last W missed keys and a count for each distinct key in it, under 100
// bytes per unit of W; once the window is full nothing is allocated per decision.
type NHit struct {
	n uint32
	// ring holds the nodes in counts of the last W missed keys; once full, ring[pos] is the
	// oldest's. A node stays while the ring holds it, so the oldest key's count is found without a
	// lookup: one hash lookup a decision (bench cold's nas-read row makes one for each tier).
	ring []int32
	pos  int
	full bool
	// counts has a node for each distinct key of the ring, holding how often the ring has it. The
	// nodes are in no list: the arena serves as a hash table that reuses its memory.
	counts arena[uint32]
}

const (
	nhitDefaultN      = 2
	nhitDefaultWindow = 1 << 16
	nhitMaxWindow     = 1 << 22 // 4M misses: up to 400 MiB of state, more than any sane window
	nhitForm          = "write nhit:N or nhit:N,window=W with 1 <= N <= W <= 4194304"
)

// NewNHit builds an NHit policy that admits on the n-th miss within window misses.
func NewNHit(n, window int) (*NHit, error) {
	switch {
	case n < 1:
		return nil, fmt.Errorf("nhit: N=%d must be at least 1; %s", n, nhitForm)
	case window < 1 || window > nhitMaxWindow:
		return nil, fmt.Errorf("nhit: window=%d must be from 1 to %d; %s", window, nhitMaxWindow, nhitForm)
	case n > window:
		return nil, fmt.Errorf("nhit: N=%d exceeds window=%d, so no key could be admitted; %s", n, window, nhitForm)
	}
	return &NHit{n: uint32(n), ring: make([]int32, window), counts: newArena[uint32](window, false)}, nil
}

func newNHitSpec(params string, scale float64) (Admission, error) {
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
					return nil, fmt.Errorf("nhit: N %q is not a whole number of at least 1; %s", val, nhitForm)
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
	return NewNHit(n, scaled(window, scale, n))
}

// Admit counts a miss of a.Key and admits it if it is the key's N-th (or later) in the window.
func (h *NHit) Admit(a Access) bool {
	if h.full {
		old := h.ring[h.pos]
		if c := &h.counts.at(old).meta; *c > 1 {
			*c--
		} else {
			h.counts.release(old)
		}
	}
	i, ok := h.counts.lookup(a.Key)
	if !ok {
		i = h.counts.alloc(a.Key)
	}
	h.ring[h.pos] = i
	if h.pos++; h.pos == len(h.ring) {
		h.pos, h.full = 0, true
	}
	c := &h.counts.at(i).meta
	*c++
	return *c >= h.n
}
