package policy

// The registries: one line per policy. Adding a policy is one file implementing the interface and
// one line here; `tierblk sim` and `tierblk serve` then accept its name (the write-back policies:
// `tierblk serve` and the config's write_back).
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

	// Write-back's policies (a cache in write-back mode): when dirty data is written back, and
	// how writers are slowed down as it fills the SSD tier.
	destages = map[string]func() Destage{
		"watermark": newWatermark,
	}
	throttles = map[string]func() Throttle{
		"proportional": newProportional,
		"none":         newNoThrottle,
	}
)
