package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
)

// The test here is a damaged SSD tier as a user met it: an export over a file of random data, behind an SSD
// tier (a file, ssd.img) a bit over 1.5 times its size and no RAM tier, and ssd.img damaged while
// tierblk was stopped: a byte flipped in every 4 KiB block past its first MiB. The SSD tier keeps a
// CRC32C of every block it stores and checks it on every read, so after a restart:
//   - a damaged clean block is read from the backend instead: no read fails, none reads wrong;
//   - a damaged dirty block (write-back, not yet on the backend) is lost: reads of it fail with EIO
//     until it is written again, across restarts, and `tierblk flush` never writes it back, so
//     the backend keeps its older data; `tierblk stats` counts the lost bytes, the log names them
//     (the first 20 damaged ranges a minute).
//
// Before checksums, tierblk served what ssd.img held: after the damage, the clean part's reads
// would return some 5,900 blocks with a flipped byte (every block stored past the first MiB) and
// requireBlocks fails on the first; the write-back part's reads would return the dirty blocks'
// damaged bytes, neither an error nor the new data, and requireNewOrFailed fails (were it not
// checked, the flush would write them to the backend file and requireBackend would fail).

const (
	damageDisk   = 24 << 20 // the export was 96 MiB; this keeps each part to seconds
	damageSSD    = "37MiB"  // a bit over 1.5 times the export
	damageLine   = "64KiB"  // the default line
	damageBlock  = 4096     // the unit the SSD tier checks, and the unit the test reads
	damageSkip   = 1 << 20  // the first MiB of ssd.img is left whole, as in the issue
	damageBlocks = damageDisk / damageBlock
	// damageSpared is the most blocks the SSD tier can store in the MiB the damage skips: the
	// blocks that may come through it whole.
	damageSpared = damageSkip / damageBlock
)

// TestDamagedSSDTier runs it for --reduction off and compress (the default): read-cached
// (clean) data, then write-back (dirty) data, on an ssd.img damaged while tierblk was stopped.
func TestDamagedSSDTier(t *testing.T) {
	for _, tc := range []struct {
		reduction string
		// stride: one byte is flipped in every stride bytes of ssd.img past its first MiB.
		stride int64
	}{
		// The damage. Reduction off stores each block in a 4 KiB-aligned place of its
		// line's slot, so a byte flipped in every 4 KiB of the file hits every block stored there.
		{"off", 4096},
		// Compress packs units of any length, from any byte, into segments: a unit of a
		// compressible block may be far smaller than 4 KiB, and could fall between two bytes
		// flipped 4 KiB apart. A byte every 256 hits every unit of 256 bytes or more wherever it
		// lies, so that no block's unit comes through whole by luck of its size (random data's
		// units are about 4 KiB, which the damage would hit as well: this is a superset).
		{"compress", 256},
	} {
		t.Run(tc.reduction, func(t *testing.T) {
			t.Run("clean", func(t *testing.T) { checkDamagedClean(t, tc.reduction, tc.stride) })
			t.Run("write-back", func(t *testing.T) { checkDamagedDirty(t, tc.reduction, tc.stride) })
		})
	}
}

// damageRig is one test's files: the backend file holding random data (orig), and the cache
// flags over it.
type damageRig struct {
	image string
	orig  []byte
	o     cacheOpts
	extra []string // flags after o's
}

func newDamageRig(t *testing.T, reduction, mode string, extra ...string) *damageRig {
	dir := shortTempDir(t)
	image := filepath.Join(dir, "disk.img")
	randomFile(t, image, damageDisk)
	orig, err := os.ReadFile(image)
	require.NoError(t, err)
	return &damageRig{image: image, orig: orig, extra: extra,
		o: cacheOpts{backend: "file://" + image, dir: dir, ram: "0", ssdSize: damageSSD, line: damageLine, mode: mode, reduction: reduction}}
}

func (r *damageRig) start(t *testing.T) (*daemon, *client.Client) {
	t.Helper()
	d := startServe(t, append(r.o.args(), r.extra...)...)
	return d, dialNBD(t, d.Unix)
}

// stopDamage closes c and stops d with SIGTERM, which must exit 0.
func stopDamage(t *testing.T, d *daemon, c *client.Client) {
	t.Helper()
	require.NoError(t, c.Close())
	d.requireStop(syscall.SIGTERM)
}

// checkDamagedClean is part 1: clean lines. Every block is read twice (the SSD tier then holds the
// export), ssd.img is damaged while tierblk is stopped, and after a restart every block must read
// as the backend file holds it, none failing.
func checkDamagedClean(t *testing.T, reduction string, stride int64) {
	r := newDamageRig(t, reduction, "writethrough")
	d, c := r.start(t)
	got := make([]byte, damageDisk)
	for pass := range 2 {
		requireBlocks(t, readEach(t, c, got), got, r.orig, fmt.Sprintf("read pass %d", pass+1))
	}
	st := adminStats(t, r.o.admin())
	ssd := st.tier(t, "ssd")
	require.Equal(t, reduction, ssd.Reduction)
	require.Equal(t, uint64(damageDisk), ssd.LogicalBytes, "bytes the SSD tier holds after every block was read twice: the export")
	stopDamage(t, d, c)

	flipped := damageFile(t, r.o.ssd(), stride)
	t.Logf("flipped %d bytes of %s, one in every %d past its first MiB", flipped, r.o.ssd(), stride)

	d, c = r.start(t)
	requireBlocks(t, readEach(t, c, got), got, r.orig, "after the damage")
	sums := adminStats(t, r.o.admin())
	require.Positive(t, sums.tier(t, "ssd").ChecksumErrors, "SSD tier checksum_errors after reading blocks it stored damaged")
	require.Zero(t, sums.Lost.Bytes, "lost bytes: no data was dirty")
	st = adminStats(t, r.o.admin())
	require.Zero(t, st.Backend.Errors, "backend errors")
	ssd = st.tier(t, "ssd")
	// After a few damaged blocks the SSD tier is bypassed for a while (they count towards its
	// errors: a device that damages many blocks in a short time is not trusted), so the count is
	// of the blocks read before that, not of all the damaged ones; every read must be right all the
	// same, which is what a client sees.
	t.Logf("after the damage: %d checksum errors; the SSD tier holds %d of %d bytes, bypassed %v", sums.tier(t, "ssd").ChecksumErrors,
		ssd.LogicalBytes, damageDisk, ssd.Failed)
	// Read again: what the damaged blocks left (and what the reads put back) is whole too.
	requireBlocks(t, readEach(t, c, got), got, r.orig, "read again after the damage")
	stopDamage(t, d, c)
	require.True(t, bytes.Equal(r.orig, readFile(t, r.image)), "the backend file changed, but nothing was written")
}

// checkDamagedDirty is part 2: write-back. New data is written over every block (the SSD tier then
// holds the export dirty), tierblk is stopped without a flush, ssd.img is damaged, and after a
// restart every block must either fail with EIO (lost) or read the new data; `tierblk flush`
// must write back only the latter; the lost blocks must stay lost across a restart until written.
func checkDamagedDirty(t *testing.T, reduction string, stride int64) {
	// Watermarks above the export's share of the tier (about 0.65 of its lines), so that the
	// destager leaves the data dirty for the stop rather than write most of it back at the default
	// high watermark (0.5); the destager's other trigger, a second without client requests, is
	// kept off by keepBusy. Address order: the lost blocks stay lost and the rest goes back
	// (in FLUSH order a lost dirty block halts the write back: the cache's TestOrderLostBlock).
	r := newDamageRig(t, reduction, "writeback", "--dirty-high", "0.9", "--dirty-low", "0.8", "--dirty-max", "0.95",
		"--write-back-order", "address")
	d, c := r.start(t)
	ctx, cancel := context.WithCancel(context.Background())
	busy := keepBusy(ctx, c)
	fresh := randomBytes(damageDisk, 'n', 'e', 'w')
	const chunk = 256 << 10
	for off := 0; off < damageDisk; off += chunk {
		_, err := c.WriteAt(fresh[off:off+chunk], int64(off))
		require.NoError(t, err, "writing at %d", off)
	}
	// Most of it dirty at least: a machine too busy to run keepBusy for a second lets the
	// destager write some back, which changes what is lost, not what a read may return.
	sums := adminStats(t, r.o.admin())
	dirty := int(sums.Dirty.Bytes / damageBlock)
	require.GreaterOrEqual(t, dirty, damageBlocks/2, "dirty blocks after new data was written over the whole export")
	cancel()
	require.NoError(t, <-busy, "the reads that kept the cache busy")
	stopDamage(t, d, c)

	flipped := damageFile(t, r.o.ssd(), stride)
	t.Logf("flipped %d bytes of %s, one in every %d past its first MiB", flipped, r.o.ssd(), stride)

	d, c = r.start(t)
	got := make([]byte, damageDisk)
	lost := requireNewOrFailed(t, readEach(t, c, got), got, fresh, "after the damage")
	nLost := countTrue(lost)
	t.Logf("after the damage: %d of %d blocks fail (lost), the others read the new data", nLost, damageBlocks)
	// Each block dirty at the stop and stored past the first MiB is lost.
	require.GreaterOrEqual(t, nLost, dirty-damageSpared, "blocks that fail to read")
	sums = adminStats(t, r.o.admin())
	require.Equal(t, uint64(nLost)*damageBlock, sums.Lost.Bytes, "lost.bytes: 4096 times the blocks that fail")
	require.Equal(t, uint64(nLost), sums.Lost.Blocks, "lost.blocks")
	require.GreaterOrEqual(t, sums.tier(t, "ssd").ChecksumErrors, uint64(nLost), "SSD tier checksum_errors")
	requireListed(t, sums.Lost.Ranges, lost)

	// Part 3: the log names lost ranges, and only blocks that fail to read.
	requireLoggedLost(t, d.output.String(), lost)

	// Nothing damaged reaches the backend: the flush writes back the blocks that read the new
	// data; the lost ones keep the backend's old data, and the flush says so.
	flushLost(t, r.o.admin())
	requireBackend(t, r, lost, fresh, "after tierblk flush")
	stopDamage(t, d, c)

	// The lost ranges survive a restart.
	d, c = r.start(t)
	sums = adminStats(t, r.o.admin())
	require.Equal(t, uint64(nLost)*damageBlock, sums.Lost.Bytes, "lost.bytes after a restart")
	again := requireNewOrFailed(t, readEach(t, c, got), got, fresh, "after a restart")
	require.Equal(t, lost, again, "the blocks that fail after a restart: those lost before it")

	// Writing a lost block makes it whole again. One 1 MiB write over [8 MiB, 9 MiB), lost blocks
	// or not, and 4 KiB writes over every 32nd lost block elsewhere (each clears its range durably,
	// a metadata commit: all of them one by one would take most of the test's time).
	fresh2 := randomBytes(damageDisk, 'f', 'i', 'x')
	rewritten := make([]bool, damageBlocks)
	const spanOff, spanLen = 8 << 20, 1 << 20
	_, err := c.WriteAt(fresh2[spanOff:spanOff+spanLen], spanOff)
	require.NoError(t, err, "writing %d bytes at %d", spanLen, spanOff)
	for b := spanOff / damageBlock; b < (spanOff+spanLen)/damageBlock; b++ {
		rewritten[b] = true
	}
	k := 0
	for b, l := range lost {
		if !l || rewritten[b] {
			continue
		}
		if k++; k%32 == 0 {
			off := b * damageBlock
			_, err := c.WriteAt(fresh2[off:off+damageBlock], int64(off))
			require.NoError(t, err, "writing lost block %d", b)
			rewritten[b] = true
		}
	}
	want := bytes.Clone(fresh)
	stillLost := make([]bool, damageBlocks)
	nRewritten := 0
	for b := range lost {
		if rewritten[b] {
			copy(want[b*damageBlock:(b+1)*damageBlock], fresh2[b*damageBlock:])
			if lost[b] {
				nRewritten++
			}
		} else {
			stillLost[b] = lost[b]
		}
	}
	require.Positive(t, nRewritten, "lost blocks rewritten")
	left := requireNewOrFailed(t, readEach(t, c, got), got, want, "after rewriting lost blocks")
	require.Equal(t, stillLost, left, "the blocks that fail after some of the lost ones were written")
	sums = adminStats(t, r.o.admin())
	require.Equal(t, uint64(nLost-nRewritten)*damageBlock, sums.Lost.Bytes, "lost.bytes after %d of the %d lost blocks were written", nRewritten, nLost)
	t.Logf("%d of the %d lost blocks written again: they read back; the others still fail", nRewritten, nLost)
	flushLost(t, r.o.admin())
	requireBackend(t, r, stillLost, want, "after the rewrite and tierblk flush")
	require.Zero(t, adminStats(t, r.o.admin()).Backend.Errors, "backend errors")
	stopDamage(t, d, c)
}

// keepBusy reads the first block through c until ctx ends, a read every 100 ms, so that the
// destager, which writes everything back after a second without client requests, leaves the
// dirty data alone. It returns the first error.
func keepBusy(ctx context.Context, c *client.Client) <-chan error {
	done := make(chan error, 1)
	go func() {
		p := make([]byte, damageBlock)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := c.ReadAt(p, 0); err != nil {
				done <- err
				return
			}
			select {
			case <-ctx.Done():
				done <- nil
				return
			case <-tick.C:
			}
		}
	}()
	return done
}

// readEach reads every 4 KiB block of the export through c, each by a request of its own (a
// request that spans a lost block fails whole), into its place in got, four requests in flight.
// It returns each block's error.
func readEach(t *testing.T, c *client.Client, got []byte) []error {
	t.Helper()
	errs := make([]error, damageBlocks)
	const workers = 4
	var wg sync.WaitGroup
	for w := range workers {
		// Each worker reads a quarter of the export in order, as a sequential reader would.
		wg.Go(func() {
			for b := w * damageBlocks / workers; b < (w+1)*damageBlocks/workers; b++ {
				_, errs[b] = c.ReadAt(got[b*damageBlock:(b+1)*damageBlock], int64(b)*damageBlock)
			}
		})
	}
	wg.Wait()
	return errs
}

// requireBlocks requires every block to have read without an error and to equal want's.
func requireBlocks(t *testing.T, errs []error, got, want []byte, when string) {
	t.Helper()
	var failed, wrong []int
	for b, err := range errs {
		switch {
		case err != nil:
			failed = append(failed, b)
		case !bytes.Equal(got[b*damageBlock:(b+1)*damageBlock], want[b*damageBlock:(b+1)*damageBlock]):
			wrong = append(wrong, b)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%s: %d of %d blocks failed to read, the first %d: %v", when, len(failed), damageBlocks, failed[0], errs[failed[0]])
	}
	if len(wrong) > 0 {
		t.Fatalf("%s: %d of %d blocks read other bytes than the backend file's, the first at offset %d", when, len(wrong), damageBlocks,
			wrong[0]*damageBlock)
	}
}

// requireNewOrFailed requires every block to have read want's bytes or failed with EIO, and returns
// which failed.
func requireNewOrFailed(t *testing.T, errs []error, got, want []byte, when string) []bool {
	t.Helper()
	failed := make([]bool, damageBlocks)
	var wrong []int
	for b, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, syscall.EIO, "%s: reading block %d", when, b)
			failed[b] = true
			continue
		}
		if !bytes.Equal(got[b*damageBlock:(b+1)*damageBlock], want[b*damageBlock:(b+1)*damageBlock]) {
			wrong = append(wrong, b)
		}
	}
	if len(wrong) > 0 {
		first := wrong[0] * damageBlock
		what := "other bytes"
		if bytes.Equal(got[first:first+damageBlock], make([]byte, damageBlock)) {
			what = "zeros"
		}
		t.Fatalf("%s: %d of %d blocks read neither an error nor what was written last; the first, at offset %d, read %s",
			when, len(wrong), damageBlocks, first, what)
	}
	return failed
}

// requireBackend requires the backend file to hold, in every block, the original data where old
// is set (a lost block), else written's.
func requireBackend(t *testing.T, r *damageRig, old []bool, written []byte, when string) {
	t.Helper()
	disk := readFile(t, r.image)
	require.Len(t, disk, damageDisk)
	var bad []string
	n := 0
	for b := range damageBlocks {
		want, name := written, "the data written last"
		if old[b] {
			want, name = r.orig, "the original data (a lost block)"
		}
		lo, hi := b*damageBlock, (b+1)*damageBlock
		if !bytes.Equal(disk[lo:hi], want[lo:hi]) {
			if n++; len(bad) < 8 {
				bad = append(bad, fmt.Sprintf("offset %d: want %s", lo, name))
			}
		}
	}
	require.Zero(t, n, "%s: blocks of the backend file that hold other bytes than the data written last, or for lost blocks the original data; the first: %v",
		when, bad)
}

// requireListed requires every lost range in the stats to be 4 KiB blocks that fail to read.
func requireListed(t *testing.T, ranges []lostRange, lost []bool) {
	t.Helper()
	require.NotEmpty(t, ranges, "lost.ranges")
	for _, rg := range ranges {
		require.Zero(t, rg.Offset%damageBlock, "lost range %+v: not on a 4 KiB block", rg)
		require.Zero(t, rg.Length%damageBlock, "lost range %+v: not whole 4 KiB blocks", rg)
		for off := rg.Offset; off < rg.Offset+rg.Length; off += damageBlock {
			require.True(t, lost[off/damageBlock], "lost range %+v lists block %d, which reads", rg, off)
		}
	}
}

// lostLog matches the daemon's log line for a lost range (slog's text format): a message that says
// lost, then the range.
var lostLog = regexp.MustCompile(`(?m)^.*msg="[^"]*\blost\b[^"]*".* offset=(\d+) bytes=(\d+)\b.*$`)

// requireLoggedLost requires the log to name lost ranges, and every range it names to be blocks
// that fail to read. It may not name them all: tierblk logs at most 20 damaged ranges a minute
// (stats count them all).
func requireLoggedLost(t *testing.T, log string, lost []bool) {
	t.Helper()
	logged := make([]bool, damageBlocks)
	lines := lostLog.FindAllStringSubmatch(log, -1)
	require.NotEmpty(t, lines, "the log has no line about a lost range:\n%s", tail(log, 4000))
	for _, m := range lines {
		off, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		n, err := strconv.ParseInt(m[2], 10, 64)
		require.NoError(t, err)
		require.True(t, off >= 0 && n > 0 && off+n <= damageDisk && off%damageBlock == 0 && n%damageBlock == 0,
			"a lost range in the log that is not whole 4 KiB blocks of the export: %s", m[0])
		for o := off; o < off+n; o += damageBlock {
			logged[o/damageBlock] = true
		}
	}
	for b := range damageBlocks {
		if logged[b] {
			require.True(t, lost[b], "the log names the block at offset %d lost, but it reads", b*damageBlock)
		}
	}
	t.Logf("the log names the lost ranges in %d lines, the first: %s", len(lines), strings.TrimSpace(lines[0][0]))
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// damageFile flips one byte (xor 0xff), at a random place, in every stride bytes of path past its
// first MiB, in place, and returns how many it flipped.
func damageFile(t *testing.T, path string, stride int64) int {
	t.Helper()
	data := readFile(t, path)
	rng := rand.New(rand.NewPCG(43, uint64(stride)))
	n := 0
	for off := int64(damageSkip); off+stride <= int64(len(data)); off += stride {
		data[off+rng.Int64N(stride)] ^= 0xff
		n++
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(data, 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
	return n
}

// randomBytes returns n bytes of a random stream seeded with seed.
func randomBytes(n int, seed ...byte) []byte {
	var key [32]byte
	copy(key[:], seed)
	p := make([]byte, n)
	_, _ = io.ReadFull(rand.NewChaCha8(key), p)
	return p
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

func countTrue(s []bool) int {
	n := 0
	for _, v := range s {
		if v {
			n++
		}
	}
	return n
}

// flushLost runs tierblk flush on a cache that lost data: it writes back every dirty block, and
// fails, listing the lost ranges, since the backend holds older data there.
func flushLost(t *testing.T, admin string) {
	t.Helper()
	code, out := runTierblk(t, "flush", "--admin", admin)
	require.NotZero(t, code, "tierblk flush --admin %s exited 0 with data lost:\n%s", admin, out)
	require.Contains(t, out, "the SSD tier damaged before it could be", "tierblk flush --admin %s", admin)
	require.Contains(t, out, "Lost ranges", "tierblk flush --admin %s", admin)
	_, dirty := adminDirty(t, admin)
	require.Zero(t, dirty.Lines, "dirty lines after tierblk flush")
}
