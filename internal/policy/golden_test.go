package policy

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGoldenTraces replays testdata/<policy>.txt for every registered eviction policy: access
// sequences with the hit or miss (and the evictions) expected on each line, worked out by hand from
// the algorithm. The format is described at the top of testdata/lru.txt.
func TestGoldenTraces(t *testing.T) {
	for _, name := range EvictionNames() {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name+".txt")
			f, err := os.Open(path)
			require.NoError(t, err, "every eviction policy needs a golden trace")
			defer f.Close()
			runGolden(t, name, path, bufio.NewScanner(f))
		})
	}
}

func runGolden(t *testing.T, name, path string, s *bufio.Scanner) {
	var (
		p       Eviction
		evicted []Key
		keys    = map[string]Key{}
		names   = map[Key]string{}
	)
	key := func(s string) Key {
		k, ok := keys[s]
		if !ok {
			k = Key(len(keys) + 1)
			keys[s], names[k] = k, s
		}
		return k
	}
	for n := 1; s.Scan(); n++ {
		line, _, _ := strings.Cut(s.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		where := path + ":" + strconv.Itoa(n) + ": " + strings.TrimSpace(line)
		if f[0] == "capacity" {
			require.Len(t, f, 2, where)
			c, err := strconv.Atoi(f[1])
			require.NoError(t, err, where)
			p, err = NewEviction(name, Config{Capacity: c, OnEvict: func(k Key) { evicted = append(evicted, k) }})
			require.NoError(t, err, where)
			continue
		}
		require.NotNil(t, p, "%s: no capacity line before the first access", where)
		switch {
		case f[0] == "len":
			require.Len(t, f, 2, where)
			require.Equal(t, f[1], strconv.Itoa(p.Len()), where)
		case f[0] == "remove":
			require.True(t, len(f) == 2 || len(f) == 3 && f[2] == "absent", where)
			require.Equal(t, len(f) == 2, p.Remove(key(f[1])), where)
		case len(f) >= 2 && (f[1] == "hit" || f[1] == "miss"):
			k := key(f[0])
			evicted = evicted[:0]
			hit := p.Get(k)
			require.Equal(t, f[1] == "hit", hit, where)
			var want []string
			if !hit {
				if len(f) > 2 {
					require.Equal(t, "evict", f[2], where)
					want = f[3:]
				}
				p.Insert(k)
			} else {
				require.Len(t, f, 2, "%s: a hit evicts nothing", where)
			}
			got := []string{}
			for _, e := range evicted {
				got = append(got, names[e])
			}
			if want == nil {
				want = []string{}
			}
			require.Equal(t, want, got, "%s: evicted keys", where)
			require.LessOrEqual(t, p.Len(), p.Capacity(), where)
		default:
			t.Fatalf("%s: unknown line", where)
		}
	}
	require.NoError(t, s.Err())
}
