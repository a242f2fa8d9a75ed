package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/sim"
	"github.com/tierblk/tierblk/internal/trace"
)

// liveCurves are the curves of a real estimator after a loop over 3/4 of a tier of 256 lines, with
// a RAM tier of 64 lines in front: every policy hits the loop at the tier's size and above, and
// the RAM tier at none of its sizes below 192 lines.
func liveCurves(t *testing.T) *sim.Curves {
	t.Helper()
	l, err := sim.NewLive(sim.LiveConfig{LineSize: 4096, Lines: 256, Tier: "ssd", RAMLines: 64, Policy: "s3fifo", Admission: "always"})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	for n := range 20_000 {
		l.Observe(trace.OpRead, int64(n%192)*4096, 4096)
		if n%1000 == 0 {
			l.Curves() // the estimator keeps up: nothing dropped
		}
	}
	c := l.Curves()
	require.Zero(t, c.Dropped)
	return c
}

func mrcCmd(t *testing.T, o mrcOpts) (string, error) {
	var out bytes.Buffer
	o.stdout = &out
	err := runMRC(context.Background(), o)
	return out.String(), err
}

func TestMRC(t *testing.T) {
	c := liveCurves(t)
	admin := serveAdmin(t, []metrics.Source{
		{Export: "nas", Stats: statsFixture, Curves: func() *sim.Curves { return c }},
		{Export: "plain", Stats: func() cache.Stats { return cache.Stats{Mode: "write-through", LineSize: 4096} }},
	})

	out, err := mrcCmd(t, mrcOpts{admin: admin})
	require.NoError(t, err)
	lines := strings.Split(out, "\n")
	require.Equal(t, "export nas:", lines[0], "only the export with curves")
	for _, p := range []string{"lru", "s3fifo", "arc", "sieve", "wtinylfu", "2q", "lru (SHARDS)"} {
		require.Contains(t, lines[1], p)
	}
	require.Len(t, c.Sizes, 37)
	require.Contains(t, out, "  today 1MiB  0.0")
	require.Contains(t, out, "miss ratio: * s3fifo")
	require.Contains(t, out, "s3fifo at 1MiB hits 9")
	require.Contains(t, out, "size for 90% of that: 1MiB; 95%: 1MiB;", "the loop's 768KiB, between the sizes simulated (256KiB and 1MiB): interpolated, the curve reaches 90 % at 1MiB")
	require.NotContains(t, out, "best policy", "all policies hit a loop that fits alike")
	require.Contains(t, out, fmt.Sprintf("ram tier (LRU's curve) at 256KiB hits %.1f%%", 100*c.RAM.Advice.Target))
	require.Less(t, c.RAM.Advice.Double, 0.1, "twice the RAM tier does not hold the loop")
	require.Greater(t, c.RAM.BestHit, 0.9, "8 times it does")

	stats, err := statsCmd(statsOpts{admin: admin, export: "nas"})
	require.NoError(t, err)
	require.Contains(t, stats, "curves (last ", "tierblk stats gives the advice")
	require.NotContains(t, stats, "miss ratio: *", "and the curves only with --mrc")
	full, err := statsCmd(statsOpts{admin: admin, export: "nas", mrc: true})
	require.NoError(t, err)
	require.Contains(t, full, "miss ratio: *")

	dir := t.TempDir()
	for _, name := range []string{"c.png", "c.svg"} {
		_, err = mrcCmd(t, mrcOpts{admin: admin, plot: filepath.Join(dir, name)})
		require.NoError(t, err)
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Greater(t, st.Size(), int64(1000))
	}
	_, err = mrcCmd(t, mrcOpts{admin: admin, plot: filepath.Join(dir, "c.jpg")})
	require.ErrorContains(t, err, ".png or .svg")
	_, err = mrcCmd(t, mrcOpts{admin: admin, export: "plain"})
	require.ErrorContains(t, err, "no export of the daemon keeps live curves")
}
