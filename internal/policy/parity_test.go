package policy

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/trace"
)

// The parity table: libCacheSim's miss ratios on the real traces (testdata/traces/README.md, from
// cachesim at git aa0fc40 with every object of size 1), which every policy of that README must
// reproduce with always-admit (a miss inserts). These figures are the contract of the policies.

// tracesDir is the repository's testdata/traces; TIERBLK_TRACES overrides it.
func tracesDir() string {
	if d := os.Getenv("TIERBLK_TRACES"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "testdata", "traces")
}

type parityTrace struct {
	file   string
	format string
	// pageSize is 0 for one key per request, else the size of the pages each request is split into.
	pageSize int64
	sizes    []int
	// long traces are skipped under -short (the whole table takes about 25 s with -race on 2 cores).
	long bool
	// want holds the miss ratio of each policy at each size of sizes.
	want map[string][]float64
}

var parityTraces = []parityTrace{
	{
		file:   "cloudPhysicsIO.vscsi.xz",
		format: "vscsi",
		sizes:  []int{48, 489, 2448, 4897, 9794},
		want: map[string][]float64{
			"fifo":   {0.9121, 0.8476, 0.8266, 0.8054, 0.7128},
			"lru":    {0.9030, 0.8380, 0.8246, 0.8049, 0.7249},
			"clock":  {0.9010, 0.8372, 0.8240, 0.8044, 0.7483},
			"arc":    {0.8770, 0.8275, 0.8114, 0.7728, 0.7026},
			"2q":     {0.8689, 0.8305, 0.8151, 0.7742, 0.6954},
			"s3fifo": {0.8765, 0.8304, 0.8026, 0.7525, 0.6780},
			"sieve":  {0.8809, 0.8292, 0.8172, 0.7907, 0.7162},
			"lirs":   {0.8824, 0.8315, 0.8138, 0.7518, 0.6559},
		},
	},
	{
		file:     "oltp.arc.xz",
		format:   "arc",
		pageSize: 512,
		sizes:    []int{1868, 18688},
		long:     true,
		want: map[string][]float64{
			"fifo":   {0.6341, 0.3666},
			"lru":    {0.5837, 0.3348},
			"clock":  {0.5783, 0.3314},
			"arc":    {0.5460, 0.3273},
			"2q":     {0.5412, 0.3233},
			"s3fifo": {0.5353, 0.3222},
			"sieve":  {0.5971, 0.3334},
			"lirs":   {0.5837, 0.3434},
		},
	},
}

// parityTolerance is how far a policy may land from libCacheSim: the simple policies exactly (to the
// README's rounding), the adaptive ones within a few thousandths.
func parityTolerance(policy string) float64 {
	switch policy {
	case "lru", "fifo", "clock":
		return 0.0005
	}
	return 0.005
}

func TestParityWithLibCacheSim(t *testing.T) {
	for _, tr := range parityTraces {
		t.Run(tr.file, func(t *testing.T) {
			if tr.long && testing.Short() {
				t.Skip("long trace skipped with -short")
			}
			keys := loadTrace(t, tr)
			for _, name := range sortedKeys(tr.want) {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					_, registered := evictions[name]
					require.True(t, registered, "policy %s of the parity table is not registered", name)
					for j, size := range tr.sizes {
						got := missRatio(t, name, size, keys)
						want := tr.want[name][j]
						t.Logf("%s at %d: %.4f (libCacheSim %.4f)", tr.file, size, got, want)
						require.InDelta(t, want, got, parityTolerance(name),
							"%s on %s at %d: miss ratio %.4f, libCacheSim %.4f", name, tr.file, size, got, want)
					}
				})
			}
		})
	}
}

// missRatio replays keys through a new policy with always-admit.
func missRatio(t testing.TB, name string, size int, keys []Key) float64 {
	p, err := NewEviction(name, Config{Capacity: size})
	require.NoError(t, err)
	misses := 0
	for _, k := range keys {
		if !p.Get(k) {
			misses++
			p.Insert(k)
		}
	}
	return float64(misses) / float64(len(keys))
}

// loadTrace reads a parity trace, failing when it is absent: the repository carries them.
func loadTrace(t testing.TB, tr parityTrace) []Key {
	path := filepath.Join(tracesDir(), tr.file)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("trace absent (%v): the repository carries it in testdata/traces", err)
	}
	keys, err := loadKeys(path, tr.format, tr.pageSize)
	require.NoError(t, err)
	return keys
}

// loadKeys reads a trace with internal/trace, one key per request (the lbn, for vscsi) or, with
// pageSize > 0, one key per page of each request (the ARC paper's traces count 512-byte pages).
func loadKeys(path, format string, pageSize int64) ([]Key, error) {
	r, err := trace.Open(path, format)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var keys []Key
	for {
		req, err := r.Next()
		if err == io.EOF {
			return keys, nil
		}
		if err != nil {
			return nil, err
		}
		if pageSize == 0 {
			keys = append(keys, Key(req.ID))
			continue
		}
		for p := req.Offset / pageSize; p < (req.Offset+req.Length)/pageSize; p++ {
			keys = append(keys, Key(p))
		}
	}
}
