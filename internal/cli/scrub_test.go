package cli

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// serveScrubs is an admin endpoint over exports whose SSD tiers hold 8 lines of 4 KiB: "clean"
// (write-through) and "dirty" (write-back), whose SSD devices rotted; "sound", whose did not; and
// "ram", a RAM-only cache.
func serveScrubs(t *testing.T) string {
	t.Helper()
	const line, lines = 4 << 10, 8
	open := func(mode cache.Mode, rotten bool) *cache.Cache {
		b, ssd := mem.New(1<<20), mem.New(64*line)
		c, err := cache.New(b, cache.Config{LineSize: line, Mode: mode, BackendID: "test",
			SSD: cache.TierConfig{Size: 64 * line, Admission: "always"}, SSDDevice: ssd, Meta: meta.NewMem(),
			WriteBack: cache.WriteBackConfig{Throttle: "none", Order: cache.OrderAddress}}) // the damaged dirty blocks lost, the rest written back
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		data := make([]byte, lines*line)
		rand.NewChaCha8([32]byte{3}).Read(data)
		// At 64 KiB, so that the lost range's offset shows in binary units too.
		if mode == cache.WriteBack {
			_, err = c.WriteAt(data, 64<<10)
		} else {
			_, err = c.ReadAt(data, 64<<10)
		}
		require.NoError(t, err)
		if rotten {
			buf := make([]byte, ssd.Size())
			_, err = ssd.ReadAt(buf, 0)
			require.NoError(t, err)
			for i := 7; i < len(buf); i += 16 {
				buf[i] ^= 0x5a
			}
			_, err = ssd.WriteAt(buf, 0)
			require.NoError(t, err)
		}
		return c
	}
	ram, err := cache.New(mem.New(1<<20), cache.Config{LineSize: line, BackendID: "test", RAM: cache.TierConfig{Size: 8 * line}})
	require.NoError(t, err)
	t.Cleanup(func() { ram.Close() })
	sources := []metrics.Source{
		metrics.CacheSource("clean", open(cache.WriteThrough, true)),
		metrics.CacheSource("dirty", open(cache.WriteBack, true)),
		metrics.CacheSource("sound", open(cache.WriteBack, false)),
		metrics.CacheSource("ram", ram),
	}
	bound := serveAdmin(t, sources)
	return bound
}

func scrubCmd(o scrubOpts) (string, error) {
	var out bytes.Buffer
	o.stdout = &out
	err := runScrub(context.Background(), o)
	return out.String(), err
}

// TestScrub: what a scrub says it found, and its exit status: 0 unless data is lost.
func TestScrub(t *testing.T) {
	admin := serveScrubs(t)
	const ssdAdvice = "The SSD damaged data it stored: check its health (smartctl -a DEVICE) and consider replacing it.\n"
	for _, tc := range []struct {
		export string
		want   []string // the summary's lines after its first, which ends with what follows ";"
		first  string
		err    string
	}{
		{"sound", nil, "no damaged block", ""},
		{"clean", []string{
			"  8 held clean data: dropped from the SSD tier, read from the backend again; nothing of them is lost\n",
			ssdAdvice,
		}, "8 damaged blocks", ""},
		{"dirty", []string{
			"  8 held data not yet written back to the backend: lost\n",
			ssdAdvice,
			"Lost ranges, 32KiB in all: reads of them fail until they are written again\n",
			"  offset          length\n",
			"  65536 (64KiB)   32768 (32KiB)\n",
		}, "8 damaged blocks",
			`export "dirty": 32KiB of data is lost: the SSD tier damaged it before it was written back, and reads of the ranges listed fail (EIO) until they are written again; write them, or restore their data from a backup`},
	} {
		t.Run(tc.export, func(t *testing.T) {
			out, err := scrubCmd(scrubOpts{actionOpts: actionOpts{admin: admin, export: tc.export}, rate: "0"})
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				require.Equal(t, 1, ExitCode(err))
			} else {
				require.NoError(t, err)
			}
			first, rest, _ := strings.Cut(out, "\n")
			require.True(t, strings.HasPrefix(first, `export "`+tc.export+`": scrub done: 8 lines, 32KiB read and checked in `), first)
			require.True(t, strings.HasSuffix(first, "; "+tc.first), first)
			require.Equal(t, strings.Join(tc.want, ""), rest)
		})
	}

	// Scrubbed again, the dirty export finds nothing more (the damaged blocks left the tier),
	// but its range is still lost.
	out, err := scrubCmd(scrubOpts{actionOpts: actionOpts{admin: admin, export: "dirty"}, rate: "1GiB/s"})
	require.ErrorContains(t, err, "32KiB of data is lost")
	require.Contains(t, out, `export "dirty": scrub done: 0 lines, 0B read and checked in `)
	require.Contains(t, out, "; no damaged block\nLost ranges, 32KiB in all")
}

func TestScrubErrors(t *testing.T) {
	admin := serveScrubs(t)
	for _, tc := range []struct {
		name string
		o    scrubOpts
		want string
		code int
	}{
		{"no admin", scrubOpts{rate: "0"}, "--admin is required", 2},
		{"bad rate", scrubOpts{actionOpts: actionOpts{admin: admin}, rate: "fast"}, `--rate: rate "fast" is not a size a second`, 2},
		{"negative rate", scrubOpts{actionOpts: actionOpts{admin: admin}, rate: "-1MiB"}, `--rate: rate "-1MiB" is not a size a second (size "-1MiB" is negative)`, 2},
		{"no SSD tier", scrubOpts{actionOpts: actionOpts{admin: admin, export: "ram"}, rate: "0"},
			`scrub: export "ram" has no SSD tier to scrub: only the SSD tier keeps checksums of its blocks`, 1},
		{"unknown export", scrubOpts{actionOpts: actionOpts{admin: admin, export: "nope"}, rate: "0"}, `scrub: no export "nope"`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := scrubCmd(tc.o)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, tc.code, ExitCode(err))
			require.Empty(t, out)
		})
	}
}

// TestScrubProgress: a scrub's progress, as lines and as a bar, read one second apart on a fake
// clock: the estimate comes from the lines checked since the first report.
func TestScrubProgress(t *testing.T) {
	reports := []metrics.ActionLine{
		{Done: 100, Total: 400, Scrub: &cache.ScrubStats{Bytes: 100 << 16}},
		{Done: 200, Total: 400, Scrub: &cache.ScrubStats{Bytes: 200 << 16, Damaged: 3}},
		{Done: 400, Total: 400, Scrub: &cache.ScrubStats{Bytes: 400 << 16, Damaged: 3}},
	}
	for _, tc := range []struct {
		bar  bool
		want string
	}{
		{false, "checked 100 of 400 lines (25%), 6.2MiB read, 0 damaged blocks\n" +
			"checked 200 of 400 lines (50%), 12.5MiB read, 3 damaged blocks, about 2s left\n" +
			"checked 400 of 400 lines (100%), 25MiB read, 3 damaged blocks\n"},
		{true, "\r[##########                              ]  25% 100 of 400 lines, 6.2MiB read, 0 damaged" +
			"\r[####################                    ]  50% 200 of 400 lines, 12.5MiB read, 3 damaged, about 2s left" +
			"\r[########################################] 100% 400 of 400 lines, 25MiB read, 3 damaged" +
			strings.Repeat(" ", len("12.5MiB read, 3 damaged, about 2s left")-len("25MiB read, 3 damaged")) + "\n"},
	} {
		var out bytes.Buffer
		t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		n := -1
		p := progress{w: &out, bar: tc.bar, describe: scrubbed,
			now: func() time.Time { n++; return t0.Add(time.Duration(n) * time.Second) }}
		for _, l := range reports {
			p.show(l)
		}
		p.end()
		require.Equal(t, tc.want, out.String())
	}
}

// TestWriteScrubSummary covers what a real scrub rarely shows: read errors, lost ranges found
// before it, more ranges than the daemon lists.
func TestWriteScrubSummary(t *testing.T) {
	done := cache.ScrubStats{Lines: 10, Done: 10, Bytes: 40 << 10, Started: 100, Ended: 102.5}
	withErrors := done
	withErrors.Errors = 2
	for _, tc := range []struct {
		name string
		s    cache.ScrubStats
		lost cache.LostStats
		want string
		err  bool
	}{
		{"read errors", withErrors, cache.LostStats{},
			"disk: scrub done: 10 lines, 40KiB read and checked in 3s; no damaged block; 2 lines could not be read (I/O errors: the daemon's log says which)\n", false},
		{"lost before", done, cache.LostStats{Bytes: 512, Ranges: []meta.Range{{Off: 512, Len: 512}}},
			"disk: scrub done: 10 lines, 40KiB read and checked in 3s; no damaged block\n" +
				"Lost ranges, 512B in all: reads of them fail until they are written again\n" +
				"  offset   length\n" +
				"  512      512\n", true},
		{"more than listed", done, cache.LostStats{Bytes: 3 << 20, Ranges: []meta.Range{{Off: 1 << 30, Len: 1 << 20}}},
			"disk: scrub done: 10 lines, 40KiB read and checked in 3s; no damaged block\n" +
				"Lost ranges, 3MiB in all: reads of them fail until they are written again\n" +
				"  offset              length\n" +
				"  1073741824 (1GiB)   1048576 (1MiB)\n" +
				"  and 2MiB more in further ranges (the daemon lists the first 1)\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := writeScrubSummary(&out, "disk", tc.s, tc.lost)
			require.Equal(t, tc.want, out.String())
			require.Equal(t, tc.err, err != nil, "%v", err)
		})
	}
}
