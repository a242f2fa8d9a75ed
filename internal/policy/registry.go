package policy

// The registries: one line per policy. Adding a policy is one file implementing the interface and
// one line here; `tierblk sim` and `tierblk serve` then accept its name.
var (
	evictions = map[string]EvictionFactory{
		"lru":      NewLRU,
		"fifo":     NewFIFO,
		"clock":    NewClock,
		"sieve":    NewSieve,
		"s3fifo":   NewS3FIFO,
		"arc":      NewARC,
		"2q":       NewTwoQ,
		"lirs":     NewLIRS,
		"wtinylfu": NewWTinyLFU,
	}

	admissions = map[string]AdmissionFactory{
		"always":    newAlways,
		"auto":      newAutoSpec,
		"nhit":      newNHitSpec,
		"seqcutoff": newSeqCutoffSpec,
	}
)
