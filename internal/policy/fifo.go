package policy

// NewFIFO builds a FIFO policy: keys leave in the order they entered, and a hit changes nothing.
// The oldest replacement policy there is (Belady, "A study of replacement algorithms for a
// virtual-storage computer", IBM Systems Journal 5(2), 1966, studies it as FIFO); it behaves as
// libCacheSim's FIFO (cache/eviction/FIFO.c). It is the LRU queue without promotion on a hit.
func NewFIFO(cfg Config) Eviction { return newQueue(cfg, false) }
