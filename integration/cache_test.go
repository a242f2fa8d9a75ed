package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
)

// The tests here drive the tiered cache of `tierblk serve` (--ram, --ssd, --mode ...) through real
// clients, over an nbdkit backend that stays up while tierblk is stopped, restarted and killed.

// cacheOpts are the cache flags of one `tierblk serve`. The SSD image, its metadata and the admin
// socket live in dir, so that a restart with the same opts finds the same SSD tier.
type cacheOpts struct {
	backend string
	dir     string
	ram     string
	ssdSize string
	line    string
	mode    string
	// reduction is --reduction; empty leaves the default (compress).
	reduction string
	// adminAddr is the admin endpoint; default a unix socket in dir.
	adminAddr string
}

func (o cacheOpts) admin() string {
	if o.adminAddr != "" {
		return o.adminAddr
	}
	return "unix:" + filepath.Join(o.dir, "admin.sock")
}
func (o cacheOpts) ssd() string  { return filepath.Join(o.dir, "ssd.img") }
func (o cacheOpts) meta() string { return filepath.Join(o.dir, "meta") }

func (o cacheOpts) args() []string {
	args := []string{"--backend", o.backend, "--ram", o.ram, "--ssd", o.ssd(), "--ssd-size", o.ssdSize,
		"--meta", o.meta(), "--line", o.line, "--mode", o.mode, "--admin", o.admin(), "--run-dir", filepath.Join(o.dir, "run")}
	if o.reduction != "" {
		args = append(args, "--reduction", o.reduction)
	}
	return args
}

// startNbdkit runs nbdkit with args (filters, plugin, parameters) on a new unix socket and returns
// the socket's path. It keeps running while the test restarts tierblk in front of it.
func startNbdkit(t *testing.T, args ...string) string {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "nbdkit.sock")
	startDaemon(t, "nbdkit", append([]string{"-f", "-U", sock}, args...), "unix:"+sock)
	return sock
}

// slowDisk is an nbdkit RAM disk of size that serves one request at a time with a delay, like a
// small NAS, only faster so that the tests stay short.
func slowDisk(size string) []string {
	return []string{"--filter=noparallel", "--filter=delay", "memory", size, "delay-read=1ms", "delay-write=1ms"}
}

// cacheStats are the parts of `tierblk stats --json` the tests check, decoded from the JSON the
// stats command documents rather than with tierblk's own types.
type cacheStats struct {
	Mode     string      `json:"mode"`
	LineSize int64       `json:"line_size"`
	Tiers    []tierStats `json:"tiers"`
	Backend  struct {
		Reads      uint64 `json:"reads"`
		Writes     uint64 `json:"writes"`
		ReadBytes  uint64 `json:"read_bytes"`
		WriteBytes uint64 `json:"write_bytes"`
		Errors     uint64 `json:"errors"`
	} `json:"backend"`
	ReadBytes    uint64 `json:"read_bytes"` // what clients read
	WriteLatency struct {
		Count uint64 `json:"count"` // client writes
	} `json:"write_latency"`
	Dirty struct {
		Bytes uint64 `json:"bytes"`
	} `json:"dirty"`
	// Lost: the ranges whose dirty data the SSD tier damaged before it was written back.
	Lost struct {
		Bytes  uint64      `json:"bytes"`
		Blocks uint64      `json:"blocks"`
		Ranges []lostRange `json:"ranges"`
	} `json:"lost"`
}

type lostRange struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

type tierStats struct {
	Name      string `json:"name"`
	Hits      uint64 `json:"hits"`
	Misses    uint64 `json:"misses"`
	Lines     uint64 `json:"lines"`
	Capacity  uint64 `json:"capacity"`
	Evictions uint64 `json:"evictions"`
	Errors    uint64 `json:"errors"`
	Failed    bool   `json:"failed"`
	// ChecksumErrors: blocks read from the tier that failed their checksums.
	ChecksumErrors uint64 `json:"checksum_errors"`
	// Data reduction: the bytes of the blocks held as clients read them, and as stored.
	LogicalBytes   uint64  `json:"logical_bytes"`
	PhysicalBytes  uint64  `json:"physical_bytes"`
	ReductionRatio float64 `json:"reduction_ratio"`
	Reduction      string  `json:"reduction"`
	// With reduction dedupe: blocks stored as one more reference to a unit, and content hashes
	// that named a unit with other bytes.
	DedupeHits       uint64 `json:"dedupe_hits"`
	DedupeCollisions uint64 `json:"dedupe_collisions"`
}

// tier returns the named tier's counters and fails the test when the cache has no such tier.
func (s cacheStats) tier(t *testing.T, name string) tierStats {
	t.Helper()
	for _, ts := range s.Tiers {
		if ts.Name == name {
			return ts
		}
	}
	t.Fatalf("the stats have no %s tier: %+v", name, s.Tiers)
	return tierStats{}
}

// statsJSON runs `tierblk stats --admin ADDR --json`, requires it to succeed, decodes its output
// into v and returns it (for the tests' messages).
func statsJSON(t *testing.T, admin string, v any) string {
	t.Helper()
	code, out := runTierblk(t, "stats", "--admin", admin, "--json")
	require.Zero(t, code, "tierblk stats --admin %s --json:\n%s", admin, out)
	require.NoError(t, json.Unmarshal([]byte(out), v), "tierblk stats --json:\n%s", out)
	return out
}

// adminStats runs `tierblk stats --admin ADDR --json` and returns the one export's statistics.
func adminStats(t *testing.T, admin string) cacheStats {
	t.Helper()
	var resp struct {
		Exports []struct {
			Name  string     `json:"name"`
			Stats cacheStats `json:"stats"`
		} `json:"exports"`
	}
	out := statsJSON(t, admin, &resp)
	require.Len(t, resp.Exports, 1, "tierblk stats --json:\n%s", out)
	return resp.Exports[0].Stats
}

// sameImage requires the two NBD exports to hold the same bytes, read whole with nbdcopy.
func sameImage(t *testing.T, uriA, uriB string) {
	t.Helper()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
	mustRunTool(t, "nbdcopy", uriA, a)
	mustRunTool(t, "nbdcopy", uriB, b)
	require.Equal(t, fileSHA256(t, b), fileSHA256(t, a), "%s and %s hold different data", uriA, uriB)
}

var cacheModes = []string{"writethrough", "writearound", "passthrough"}

func TestCacheClients(t *testing.T) {
	requireTools(t, "nbdkit", "fio", "qemu-io", "nbdcopy")
	for _, mode := range cacheModes {
		t.Run(mode, func(t *testing.T) {
			sock := startNbdkit(t, slowDisk("48M")...)
			o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "4MiB", ssdSize: "16MiB", line: "64KiB", mode: mode}
			d := startServe(t, o.args()...)

			// fio over TCP: four connections write and then verify 6 MiB each, 24 MiB in all, more
			// than both tiers hold, so lines are evicted while the data is still being checked.
			// Block sizes of 6k and 20k make writes that end inside a 4 KiB block.
			written := fioVerify(t, tcpURI(d.TCP, ""), 4, "--name=cache", "--rw=randwrite",
				"--bssplit=4k/25:6k/20:20k/20:64k/20:192k/15", "--iodepth=16", "--size=6m", "--offset_increment=6m")

			// qemu-io over the unix socket, in the region fio left alone (32M..48M).
			mustQemuIO(t, unixURI(d.Unix, ""),
				"write -P 0xa1 32M 1M",
				"read -P 0xa1 32M 1M",
				// Across a line boundary, part of two lines that are cached.
				"write -P 0xa2 32828k 8k",
				"read -P 0xa1 32M 60k",
				"read -P 0xa2 32828k 8k",
				"read -P 0xa1 32836k 956k",
				// Zeroing and discarding cached lines must drop the cached copies.
				"write -P 0xa3 33M 256k",
				"read -P 0xa3 33M 256k",
				"write -z 33856k 64k",
				"read -P 0xa3 33M 64k",
				"read -P 0 33856k 64k",
				"read -P 0xa3 33920k 128k",
				"write -P 0xa4 34M 256k",
				"read -P 0xa4 34M 256k",
				"discard 34M 256k",
				"read -P 0 34M 256k",
				// Ten bytes into a cached line, inside one 4 KiB block.
				"read -P 0 35M 64k",
				fmt.Sprintf("write -P 0x11 %d 10", 35<<20+100),
				fmt.Sprintf("read -P 0x11 %d 10", 35<<20+100),
				"read -P 0 35M 100",
				fmt.Sprintf("read -P 0 %d %d", 35<<20+110, 64<<10-110),
				// FUA and flush.
				"write -f -P 0xa5 36M 128k",
				"flush",
				"read -P 0xa5 36M 128k",
				// Reading fio's 24 MiB evicts everything above; it must come back from the backend.
				"read 0 24M",
				"read -P 0xa1 32M 60k",
				"read -P 0xa2 32828k 8k",
				"read -P 0xa5 36M 128k",
				// The last block of the device.
				fmt.Sprintf("write -P 0x77 %d 4k", 48<<20-4096),
				fmt.Sprintf("read -P 0x77 %d 4k", 48<<20-4096),
			)

			st := adminStats(t, o.admin())
			require.Equal(t, mode, st.Mode)
			require.EqualValues(t, 64<<10, st.LineSize)
			// No mode keeps a write only in the cache.
			require.GreaterOrEqual(t, st.Backend.WriteBytes, uint64(written), "backend write bytes vs fio's writes")
			require.Zero(t, st.Backend.Errors)
			for _, name := range []string{"ram", "ssd"} {
				ts := st.tier(t, name)
				require.False(t, ts.Failed, "%s tier failed: %+v", name, ts)
				require.Zero(t, ts.Errors, "%s tier errors", name)
				if mode == "passthrough" {
					require.Zero(t, ts.Lines, "%s tier holds lines in passthrough mode", name)
					require.Zero(t, ts.Hits, "%s tier hits in passthrough mode", name)
				} else {
					require.Positive(t, ts.Hits, "%s tier hits", name)
					require.Positive(t, ts.Evictions, "%s tier evictions: the data set is larger than the tier", name)
				}
			}

			// What a client sees through the cache is what the backend holds, before and after stop.
			sameImage(t, unixURI(d.Unix, ""), unixURI(sock, ""))
			d.requireStop(syscall.SIGTERM)
			mustQemuIO(t, unixURI(sock, ""), "read -P 0xa1 32M 60k", "read -P 0xa5 36M 128k", "read -P 0 34M 256k")
		})
	}
}

func TestCacheRestartWarm(t *testing.T) {
	requireTools(t, "nbdkit", "qemu-io")
	sock := startNbdkit(t, slowDisk("32M")...)
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "4MiB", ssdSize: "16MiB", line: "64KiB", mode: "writethrough"}
	const dataSet = 8 << 20 // fits the SSD tier, not the RAM tier
	const lines = dataSet / (64 << 10)

	d := startServe(t, o.args()...)
	mustQemuIO(t, unixURI(d.Unix, ""), "write -P 0x5c 0 8M", "read -P 0x5c 0 8M")
	d.requireStop(syscall.SIGTERM)

	// warmStart starts tierblk again on the same SSD tier and requires it warm: the data set is
	// on the SSD before any read, and reading it costs (almost) no backend reads.
	warmStart := func() {
		t.Helper()
		d := startServe(t, o.args()...)
		before := adminStats(t, o.admin())
		ssd := before.tier(t, "ssd")
		require.GreaterOrEqual(t, ssd.Lines, uint64(lines), "SSD lines right after a restart: the data set was written whole")
		mustQemuIO(t, unixURI(d.Unix, ""), "read -P 0x5c 0 8M")
		after := adminStats(t, o.admin())
		require.LessOrEqual(t, after.Backend.ReadBytes-before.Backend.ReadBytes, uint64(dataSet/16),
			"backend bytes read for an 8 MiB data set that the warm SSD tier holds")
		require.GreaterOrEqual(t, after.tier(t, "ssd").Hits-ssd.Hits, uint64(lines), "SSD hits reading the data set")
		d.requireStop(syscall.SIGTERM)
	}
	warmStart()

	// Another setup must not reuse the SSD tier, nor change it, nor write to the other backend.
	other := startNbdkit(t, "memory", "32M")
	ssdSum := fileSHA256(t, o.ssd())
	mismatches := []struct {
		name string
		opts cacheOpts
		msg  []*regexp.Regexp // the error must name what differs: the setting, the old and new values
	}{
		{"another backend", func() cacheOpts { c := o; c.backend = unixURI(other, ""); return c }(), []*regexp.Regexp{
			regexp.MustCompile(`(?i)backend`), regexp.MustCompile(regexp.QuoteMeta(sock)), regexp.MustCompile(regexp.QuoteMeta(other))}},
		{"another line size", func() cacheOpts { c := o; c.line = "32KiB"; return c }(), []*regexp.Regexp{
			regexp.MustCompile(`(?i)line size`), regexp.MustCompile(`65536|64 ?KiB`), regexp.MustCompile(`32768|32 ?KiB`)}},
	}
	for _, m := range mismatches {
		t.Run(m.name, func(t *testing.T) {
			sockDir := shortTempDir(t)
			args := append(append([]string{"serve"}, m.opts.args()...), "--nbd", "unix:"+filepath.Join(sockDir, "s.sock"))
			code, out := runTierblk(t, args...)
			require.NotZero(t, code, "tierblk serve on an SSD tier made for another setup:\n%s", out)
			for _, re := range m.msg {
				require.Regexp(t, re, out)
			}
			require.NotContains(t, out, "goroutine", "a refusal must not be a crash")
			require.Equal(t, ssdSum, fileSHA256(t, o.ssd()), "the refused start changed the SSD image")
		})
	}
	mustQemuIO(t, unixURI(other, ""), "read -P 0 0 32M")
	// The SSD tier is still warm for its own setup.
	warmStart()
}

// TestCacheKill9 kills tierblk with SIGKILL at seeded random moments while workers write and
// check data through it, restarts it on the same SSD tier each time, and requires every block
// to hold the last write acknowledged before the kill (a write cut off by the kill may read as
// the old data or the new). Each cycle runs in another mode, so a restart also changes the mode.
// TIERBLK_KILL_CYCLES sets the number of cycles (make crash-campaign).
func TestCacheKill9(t *testing.T) {
	const (
		seed    = 9
		region  = 8 << 20 // the blocks the workers use, twice the SSD tier
		workers = 4
	)
	cycles := envCount(t, "TIERBLK_KILL_CYCLES", 10)
	// A file, not an nbdkit disk: nbdkit 1.32 aborts (an assertion in raw_send_socket) when a
	// client dies while it sends a reply, which one kill in a few hundred does.
	image := filepath.Join(shortTempDir(t), "disk.img")
	o := cacheOpts{backend: fmt.Sprintf("file://%s?size=%d", image, 2*region), dir: shortTempDir(t), ram: "512KiB", ssdSize: "4MiB", line: "64KiB"}
	m := newBlockModel(region / blockBytes)
	rng := rand.New(rand.NewPCG(seed, 0))
	var acked atomic.Int64
	for cycle := range cycles {
		o.mode = cacheModes[cycle%len(cacheModes)]
		d := startServe(t, o.args()...)
		c := dialNBD(t, d.Unix)
		m.verify(t, c, fmt.Sprintf("cycle %d (%s), after restart", cycle, o.mode))

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wrng := rand.New(rand.NewPCG(seed, uint64(cycle*workers+w+1)))
			wg.Go(func() { errs[w] = m.work(ctx, c, wrng, w, workers, &acked) })
		}
		// Up to 1.5 s: the index is checkpointed every second, and on flushes and slot shortages.
		time.Sleep(time.Duration(100+rng.IntN(1400)) * time.Millisecond)
		select {
		case <-d.exited:
			t.Fatalf("cycle %d (%s): tierblk exited before the kill (%v); was it sent a signal?\n%s", cycle, o.mode, d.err, d.output.String())
		default:
		}
		d.stop(syscall.SIGKILL)
		wg.Wait()
		cancel()
		c.Close()
		for w, err := range errs {
			// A worker stops at the first failed request, which the kill causes; a wrong read is
			// not a failed request but a test failure.
			var bad *badBlockError
			require.NotErrorAs(t, err, &bad, "cycle %d (%s), worker %d", cycle, o.mode, w)
		}
	}
	require.Positive(t, acked.Load(), "no write was acknowledged in %d cycles", cycles)
	t.Logf("%d writes acknowledged in %d cycles", acked.Load(), cycles)

	// Two last starts, each stopped cleanly: the data is right through the cache, and on the backend
	// itself. The second start reads lines from the SSD tier that the first one cached. (The kill
	// cycles' short writes may leave no cached line whole, and a whole-line read of a partly valid
	// line misses: the first start's reads fetch whole lines. They scan twice the SSD tier, which
	// leaves LRU the second half, and the second start reads the first half first: so the first
	// start reads that half again at the end.)
	o.mode = "writethrough"
	for pass := range 2 {
		d := startServe(t, o.args()...)
		c := dialNBD(t, d.Unix)
		m.verify(t, c, fmt.Sprintf("after the last restarts (%d)", pass))
		if pass == 0 {
			_, err := c.ReadAt(make([]byte, region/4), 0)
			require.NoError(t, err)
		} else {
			require.Positive(t, adminStats(t, o.admin()).tier(t, "ssd").Hits, "reads after a restart must find lines on the SSD tier")
		}
		require.NoError(t, c.Close())
		d.requireStop(syscall.SIGTERM)
	}
	direct, err := os.Open(image)
	require.NoError(t, err)
	defer direct.Close()
	m.verify(t, direct, "on the backend")
	logCampaign(t, cycles, "kill -9 cycles", m.sectors)
}

func dialNBD(t *testing.T, sock string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A short reconnect wait: after a kill, requests fail at once rather than wait for the restart.
	c, err := client.Dial(ctx, client.Config{Network: "unix", Address: sock, MaxReconnectWait: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	return c
}

// blockBytes is the unit of the kill test's model: each such block holds one write's pattern.
// It is an eighth of the cache's 4 KiB blocks, so that requests also begin and end inside those.
const blockBytes = 512

// blockModel is what each block of the kill test must hold: the id of the last acknowledged write
// (0: zeros), and a write that failed when tierblk was killed, which may or may not have happened.
// Workers own disjoint chunks and issue one request at a time, so each block has one writer and
// the model needs no lock.
type blockModel struct {
	blocks []blockState
	ids    atomic.Uint64
	// sectors counts the 512-byte sectors that verify found as the model allows: the checks
	// after each restart and on the backend, not the workers' own checked reads.
	sectors int64
}

type blockState struct {
	acked   uint64
	pending uint64 // the write in doubt, when doubt is set
	doubt   bool
}

func newBlockModel(blocks int) *blockModel { return &blockModel{blocks: make([]blockState, blocks)} }

// chunkBlocks is the ownership unit (256 KiB): chunk i belongs to worker i%workers. Requests stay
// inside one chunk, and a chunk spans several lines so that requests cross line boundaries.
const chunkBlocks = 512

// fillBlock writes write id's pattern for block b into p (blockBytes); id 0 is zeros.
func fillBlock(p []byte, b int, id uint64) {
	if id == 0 {
		clear(p)
		return
	}
	x := uint64(b)<<40 ^ id
	for i := 0; i < len(p); i += 8 {
		// splitmix64: every word depends on the block and the write.
		x += 0x9e3779b97f4a7c15
		z := (x ^ x>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(p[i:], z^z>>31)
	}
	binary.LittleEndian.PutUint64(p, id) // the first word names the write, for the error message
}

// badBlockError is a block that holds neither the acknowledged data nor the write in doubt.
type badBlockError struct {
	block int
	state blockState
	got   string
}

func (e *badBlockError) Error() string {
	doubt := ""
	if e.state.doubt {
		doubt = fmt.Sprintf(" or write %d, cut off by a kill", e.state.pending)
	}
	return fmt.Sprintf("block %d (offset %d) holds %s, want write %d%s (write 0 is zeros)",
		e.block, e.block*blockBytes, e.got, e.state.acked, doubt)
}

// check compares block b's data with the model and settles a write in doubt to what was read.
func (m *blockModel) check(b int, data []byte) error {
	s := &m.blocks[b]
	want := make([]byte, blockBytes)
	fillBlock(want, b, s.acked)
	if string(want) == string(data) {
		s.doubt = false
		return nil
	}
	if s.doubt {
		fillBlock(want, b, s.pending)
		if string(want) == string(data) {
			s.acked, s.doubt = s.pending, false
			return nil
		}
	}
	got := fmt.Sprintf("data starting with word %d", binary.LittleEndian.Uint64(data))
	if string(data) == string(make([]byte, blockBytes)) {
		got = "zeros"
	}
	return &badBlockError{block: b, state: *s, got: got}
}

// verify reads the whole region through c and requires every block to match the model.
func (m *blockModel) verify(t *testing.T, c io.ReaderAt, when string) {
	t.Helper()
	buf := make([]byte, 256<<10)
	per := len(buf) / blockBytes
	for first := 0; first < len(m.blocks); first += per {
		_, err := c.ReadAt(buf, int64(first)*blockBytes)
		require.NoError(t, err, "%s: reading at %d", when, first*blockBytes)
		for i := range per {
			require.NoError(t, m.check(first+i, buf[i*blockBytes:(i+1)*blockBytes]), when)
			m.sectors += blockBytes / sectorBytes
		}
	}
}

// pend marks n blocks from start as being written with id.
func (m *blockModel) pend(start, n int, id uint64) {
	for i := range n {
		m.blocks[start+i].pending, m.blocks[start+i].doubt = id, true
	}
}

// work runs worker w's requests on its own chunks until ctx ends or a request fails: writes,
// some FUA; zeroings; checked reads of 512 bytes to 128 KiB; and flushes. It returns the first
// failure.
func (m *blockModel) work(ctx context.Context, c *client.Client, rng *rand.Rand, w, workers int, acked *atomic.Int64) error {
	chunks := len(m.blocks) / chunkBlocks / workers
	const maxBlocks = 256
	buf := make([]byte, maxBlocks*blockBytes)
	for ctx.Err() == nil {
		chunk := (rng.IntN(chunks)*workers + w) * chunkBlocks
		start := chunk + rng.IntN(chunkBlocks)
		// Mostly short requests, inside one cache block or across a few.
		n := 1 + rng.IntN(min([]int{8, 64, maxBlocks}[rng.IntN(3)], chunk+chunkBlocks-start))
		p := buf[:n*blockBytes]
		off := int64(start) * blockBytes
		var err error
		switch op := rng.IntN(20); {
		case op < 6:
			if _, err = c.ReadAt(p, off); err != nil {
				return err
			}
			for i := range n {
				if err := m.check(start+i, p[i*blockBytes:(i+1)*blockBytes]); err != nil {
					return err
				}
			}
			continue
		case op < 7:
			// A flush makes tierblk checkpoint the SSD tier's index: kills land around those too.
			if err = c.Flush(); err != nil {
				return err
			}
			continue
		case op < 9:
			m.pend(start, n, 0)
			err = c.WriteZeroes(off, int64(len(p)), false)
		default:
			id := m.ids.Add(1)
			for i := range n {
				fillBlock(p[i*blockBytes:(i+1)*blockBytes], start+i, id)
			}
			m.pend(start, n, id)
			if op < 11 {
				_, err = c.WriteAtFUA(p, off)
			} else {
				_, err = c.WriteAt(p, off)
			}
		}
		if err != nil {
			return err // the blocks stay in doubt until the next verify
		}
		for i := range n {
			s := &m.blocks[start+i]
			s.acked, s.doubt = s.pending, false
		}
		acked.Add(1)
	}
	return nil
}

func TestCacheAdmin(t *testing.T) {
	requireTools(t, "qemu-io")
	dir := shortTempDir(t)
	admins := []struct {
		name string
		addr string
	}{
		{"unix", "unix:" + filepath.Join(dir, "admin.sock")},
		{"tcp", freeTCPAddr(t)},
	}
	for _, a := range admins {
		t.Run(a.name, func(t *testing.T) {
			dir := shortTempDir(t)
			o := cacheOpts{backend: "file://" + filepath.Join(dir, "disk.img") + "?size=32MiB", dir: dir, ram: "1MiB",
				ssdSize: "4MiB", line: "64KiB", mode: "writethrough", adminAddr: a.addr}
			d := startServe(t, append(o.args(), "--export", "disk0")...)
			// 2 MiB: 32 lines, more than the RAM tier's 16, fewer than the SSD tier's.
			mustQemuIO(t, unixURI(d.Unix, "disk0"), "write -P 0x42 0 2M", "read -P 0x42 0 2M")

			code, out := runTierblk(t, "stats", "--admin", a.addr)
			require.Zero(t, code, "tierblk stats:\n%s", out)
			require.Contains(t, out, "export disk0: mode writethrough, line size 64KiB")
			require.Regexp(t, `(?m)^tier\s+policy\s+hits\s+misses\s+hit ratio\s+lines/capacity`, out, "the table's header")
			require.Regexp(t, `(?m)^ram\s+s3fifo\s+\d+\s+\d+\s+\S+\s+16/16\s`, out, "the RAM tier's row: full")
			require.Regexp(t, `(?m)^ssd\s+s3fifo\s+\d+\s+\d+\s+\S+\s+32/\d+\s`, out, "the SSD tier's row: the 32 lines written")
			require.Regexp(t, `(?m)^backend: \d+ reads .*, \d+ writes \(2MiB\)`, out)
		})
	}

	// Usage errors: exit status 2 and a message naming the flag.
	sock := "unix:" + filepath.Join(dir, "bad.sock")
	bad := []struct {
		name string
		args []string
		msg  []string
	}{
		{"admin not on loopback", []string{"--admin", "0.0.0.0:9000"}, []string{"--admin", "0.0.0.0:9000", "loopback"}},
		{"unknown mode", []string{"--mode", "writeback"}, []string{"--mode", "writeback"}},
		{"line not a power of two", []string{"--line", "48KiB"}, []string{"--line"}},
		{"line too large", []string{"--line", "2MiB"}, []string{"--line"}},
		{"bad RAM size", []string{"--ram", "lots"}, []string{"--ram", "lots"}},
		{"unknown policy", []string{"--policy", "nosuch"}, []string{"--policy", "nosuch"}},
		// mem:// forgets its data on exit; an SSD tier kept across restarts would then be stale.
		{"SSD tier over mem://", []string{"--ssd", filepath.Join(dir, "ssd.img"), "--ssd-size", "4MiB"}, []string{"--ssd", "mem://"}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"serve", "--backend", "mem://16MiB", "--ram", "1MiB", "--nbd", sock}
			code, out := runTierblk(t, append(args, tt.args...)...)
			require.Equal(t, 2, code, "exit status of tierblk %s:\n%s", strings.Join(tt.args, " "), out)
			for _, m := range tt.msg {
				require.Contains(t, out, m)
			}
			require.NoFileExists(t, filepath.Join(dir, "ssd.img"), "a refused start created the SSD image")
		})
	}
}

// TestCongestedSSDDevice puts the SSD tier on a device that takes 20 ms a request (null_blk in the
// test kernel) and checks that the tier turns missed lines away while the kernel's counters show
// it congested, and that reads are still the backend's bytes (vm/guest/congestion.sh).
func TestCongestedSSDDevice(t *testing.T) {
	runVMWith(t, vmOptions{fio: true}, "vm/guest/congestion.sh", "128M")
}
