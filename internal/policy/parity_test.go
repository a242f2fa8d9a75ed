package policy

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The parity table: libCacheSim's miss ratios on the shared traces (../shared/traces/README.md, from
// cachesim at git aa0fc40 with every object of size 1), which every policy of that README must
// reproduce with always-admit (a miss inserts). These figures are the contract of the policies.

// tracesDir is ../shared/traces seen from the project's root; TIERBLK_TRACES overrides it.
func tracesDir() string {
	if d := os.Getenv("TIERBLK_TRACES"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "shared", "traces")
}

type parityTrace struct {
	file  string
	load  func(path string) ([]Key, error)
	sizes []int
	// want holds the miss ratio of each policy at each size of sizes.
	want map[string][]float64
}

var parityTraces = []parityTrace{
	{
		file:  "cloudPhysicsIO.vscsi",
		load:  loadVSCSI,
		sizes: []int{48, 489, 2448, 4897, 9794},
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
		file:  "oltp.arc.gz",
		load:  loadARCPages,
		sizes: []int{1868, 18688},
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

var (
	traceCacheMu sync.Mutex
	traceCache   = map[string][]Key{}
)

// loadTrace reads a parity trace once per test binary, or skips when the shared traces are absent.
func loadTrace(t testing.TB, tr parityTrace) []Key {
	traceCacheMu.Lock()
	defer traceCacheMu.Unlock()
	if keys, ok := traceCache[tr.file]; ok {
		return keys
	}
	path := filepath.Join(tracesDir(), tr.file)
	if _, err := os.Stat(path); err != nil {
		t.Skipf("shared trace absent (%v); set TIERBLK_TRACES to the traces directory", err)
	}
	keys, err := tr.load(path)
	require.NoError(t, err)
	traceCache[tr.file] = keys
	return keys
}

// loadVSCSI reads a vscsi v1 trace, one key per request: the lbn.
func loadVSCSI(path string) ([]Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	const rec = 32
	if len(b)%rec != 0 {
		return nil, fmt.Errorf("%s: %d bytes is not a whole number of vscsi v1 records", path, len(b))
	}
	keys := make([]Key, 0, len(b)/rec)
	for off := 0; off < len(b); off += rec {
		if v := binary.LittleEndian.Uint16(b[off+14:]) >> 8; v != 1 {
			return nil, fmt.Errorf("%s: record %d: vscsi version %d, want 1", path, off/rec, v)
		}
		keys = append(keys, Key(binary.LittleEndian.Uint64(b[off+16:])))
	}
	return keys, nil
}

// loadARCPages reads a gzipped ARC-paper trace, one key per 512-byte page each request touches.
func loadARCPages(path string) ([]Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var keys []Key
	s := bufio.NewScanner(z)
	for line := 1; s.Scan(); line++ {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			return nil, fmt.Errorf("%s: line %d: want start and count", path, line)
		}
		start, err1 := strconv.ParseUint(fields[0], 10, 64)
		count, err2 := strconv.ParseUint(fields[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: line %d: bad start or count %q", path, line, s.Text())
		}
		for p := start; p < start+count; p++ {
			keys = append(keys, Key(p))
		}
	}
	if err := s.Err(); err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, nil
}
