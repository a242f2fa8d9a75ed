package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd"
)

// The tests here run the cache in write-back mode (--mode writeback), where a write is
// acknowledged once it is on the SSD tier and reaches the backend later. What they hold it to is
// the NBD durability contract: only a completed FLUSH, or a FUA write, promises that data survives
// a crash; `tierblk flush` writes every dirty line back, after which the backend alone holds what
// clients see.

// dirtyStats are the write-back counters of `tierblk stats --json` that the tests check.
type dirtyStats struct {
	Lines         uint64 `json:"lines"`
	DestagedBytes uint64 `json:"destaged_bytes"`
	DestageErrors uint64 `json:"destage_errors"`
}

// adminDirty runs `tierblk stats --admin ADDR --json` and returns the one export's mode and
// write-back counters.
func adminDirty(t *testing.T, admin string) (string, dirtyStats) {
	t.Helper()
	code, out := runTierblk(t, "stats", "--admin", admin, "--json")
	require.Zero(t, code, "tierblk stats --admin %s --json:\n%s", admin, out)
	var resp struct {
		Exports []struct {
			Stats struct {
				Mode  string     `json:"mode"`
				Dirty dirtyStats `json:"dirty"`
			} `json:"stats"`
		} `json:"exports"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &resp), "tierblk stats --json:\n%s", out)
	require.Len(t, resp.Exports, 1, "tierblk stats --json:\n%s", out)
	return resp.Exports[0].Stats.Mode, resp.Exports[0].Stats.Dirty
}

// flushAdmin runs `tierblk flush --admin ADDR` and requires exit status 0, after which the
// cache must hold no dirty line.
func flushAdmin(t *testing.T, admin string) {
	t.Helper()
	code, out := runTierblk(t, "flush", "--admin", admin)
	require.Zero(t, code, "tierblk flush --admin %s:\n%s", admin, out)
	_, dirty := adminDirty(t, admin)
	require.Zero(t, dirty.Lines, "dirty lines after tierblk flush exited 0")
}

func TestWriteBackClients(t *testing.T) {
	requireTools(t, "nbdkit", "fio", "qemu-io", "nbdcopy")
	sock := startNbdkit(t, slowDisk("48M")...)
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "4MiB", ssdSize: "16MiB", line: "64KiB", mode: "writeback"}
	d := startServe(t, o.args()...)

	// fio over TCP: 24 MiB in all, more than the SSD tier, so that writes outrun the slow disk,
	// dirty lines are destaged (and writes throttled) while fio still verifies its data.
	const jobs = 4
	report := filepath.Join(t.TempDir(), "fio.json")
	out := mustRunTool(t, "fio", "--name=writeback", "--ioengine=nbd", "--uri="+tcpURI(d.TCP, ""),
		"--rw=randwrite", "--bssplit=4k/25:6k/20:20k/20:64k/20:192k/15", "--iodepth=16",
		fmt.Sprintf("--numjobs=%d", jobs), "--size=6m", "--offset_increment=6m",
		"--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
		"--output-format=json", "--output="+report)
	js, err := os.ReadFile(report)
	require.NoError(t, err)
	var res fioResult
	require.NoError(t, json.Unmarshal(jsonPart(js), &res), "fio report:\n%s\n%s", js, out)
	require.Len(t, res.Jobs, jobs)
	for _, j := range res.Jobs {
		require.Zero(t, j.Error, "fio job error:\n%s", out)
		require.Positive(t, j.Write.Bytes)
		require.Equal(t, j.Write.Bytes, j.Read.Bytes, "every written byte must be read back and verified")
	}

	// qemu-io over the unix socket, in the region fio left alone (32M..48M): partial lines and
	// blocks, zeroing and discarding dirty lines, FUA and flush.
	mustQemuIO(t, unixURI(d.Unix, ""),
		"write -P 0xb1 32M 1M",
		"write -P 0xb2 32828k 8k",
		"read -P 0xb1 32M 60k",
		"read -P 0xb2 32828k 8k",
		"read -P 0xb1 32836k 956k",
		"write -P 0xb3 33M 256k",
		"write -z 33856k 64k",
		"read -P 0xb3 33M 64k",
		"read -P 0 33856k 64k",
		"read -P 0xb3 33920k 128k",
		"write -P 0xb4 34M 256k",
		"discard 34M 256k",
		"read -P 0 34M 256k",
		fmt.Sprintf("write -P 0x12 %d 10", 35<<20+100),
		fmt.Sprintf("read -P 0x12 %d 10", 35<<20+100),
		"read -P 0 35M 100",
		fmt.Sprintf("read -P 0 %d %d", 35<<20+110, 64<<10-110),
		"write -f -P 0xb5 36M 128k",
		"flush",
		"read -P 0xb5 36M 128k",
		fmt.Sprintf("write -P 0x78 %d 4k", 48<<20-4096),
		fmt.Sprintf("read -P 0x78 %d 4k", 48<<20-4096),
	)

	mode, _ := adminDirty(t, o.admin())
	require.Equal(t, "writeback", mode)
	flushAdmin(t, o.admin())
	_, dirty := adminDirty(t, o.admin())
	require.Positive(t, dirty.DestagedBytes, "bytes destaged to the backend")
	require.Zero(t, dirty.DestageErrors)

	// After the flush the slow disk itself, read straight from nbdkit, is what tierblk serves.
	sameImage(t, unixURI(d.Unix, ""), unixURI(sock, ""))
	d.requireStop(syscall.SIGTERM)
	mustQemuIO(t, unixURI(sock, ""), "read -P 0xb1 32M 60k", "read -P 0xb5 36M 128k", "read -P 0 34M 256k",
		fmt.Sprintf("read -P 0x78 %d 4k", 48<<20-4096))
}

// TestWriteBackKill9 kills tierblk in write-back mode with SIGKILL at seeded random moments
// while workers write, flush and check data through it, and restarts it on the same SSD tier.
// A write that was never made durable may be lost, so after each restart every block must hold
// its last durable write (acknowledged before a completed flush, or a FUA write) or a write
// issued after it. At the end `tierblk flush` must leave exactly what clients saw on the backend.
func TestWriteBackKill9(t *testing.T) {
	requireTools(t, "nbdkit")
	const (
		seed    = 5
		cycles  = 8
		region  = 8 << 20 // the blocks the workers use, twice the SSD tier: dirty lines must be destaged
		workers = 4
	)
	sock := startNbdkit(t, "memory", "16M")
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "512KiB", ssdSize: "4MiB", line: "64KiB", mode: "writeback"}
	m := newDurableModel(region / blockBytes)
	rng := rand.New(rand.NewPCG(seed, 0))
	var acked, flushed atomic.Int64
	for cycle := range cycles {
		d := startServe(t, o.args()...)
		c := dialNBD(t, d.Unix)
		m.verify(t, c, fmt.Sprintf("cycle %d, after restart", cycle))

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wrng := rand.New(rand.NewPCG(seed, uint64(cycle*workers+w+1)))
			wg.Go(func() { errs[w] = m.work(ctx, c, wrng, w, workers, &acked, &flushed) })
		}
		time.Sleep(time.Duration(100+rng.IntN(1400)) * time.Millisecond)
		select {
		case <-d.exited:
			t.Fatalf("cycle %d: tierblk exited before the kill (%v)\n%s", cycle, d.err, d.output.String())
		default:
		}
		d.stop(syscall.SIGKILL)
		wg.Wait()
		cancel()
		c.Close()
		for w, err := range errs {
			// A worker stops at its first failed request, which the kill causes; a wrong read
			// is a test failure.
			var bad *durableBlockError
			require.NotErrorAs(t, err, &bad, "cycle %d, worker %d", cycle, w)
		}
	}
	require.Positive(t, acked.Load(), "no write was acknowledged in %d cycles", cycles)
	require.Positive(t, flushed.Load(), "no flush completed in %d cycles", cycles)
	t.Logf("%d writes acknowledged, %d flushes completed in %d cycles", acked.Load(), flushed.Load(), cycles)

	// A last start: the dirty data found on the SSD is checked, written back by `tierblk flush`,
	// and then the backend itself holds exactly what the cache served.
	d := startServe(t, o.args()...)
	c := dialNBD(t, d.Unix)
	m.verify(t, c, "after the last restart")
	require.NoError(t, c.Close())
	flushAdmin(t, o.admin())
	direct := dialNBD(t, sock)
	m.verifyExact(t, direct, "on the backend after tierblk flush")
	require.NoError(t, direct.Close())
	d.requireStop(syscall.SIGTERM)
}

// durableModel is what each block of the write-back kill test may hold. Workers own disjoint
// chunks (chunkBlocks, as in blockModel) and issue one request at a time, so each block has one
// writer and the model needs no lock. Write ids come from one counter; id 0 is zeros.
type durableModel struct {
	blocks []durableBlock
	ids    atomic.Uint64
}

type durableBlock struct {
	durable uint64   // the last write that a flush or FUA made durable (0: zeros, as at the start)
	since   []uint64 // writes issued after durable, acknowledged or cut off, in order
	current uint64   // what the block holds as far as the running cycle knows
}

func newDurableModel(blocks int) *durableModel {
	return &durableModel{blocks: make([]durableBlock, blocks)}
}

// durableBlockError is a block that holds neither its durable write nor a later one.
type durableBlockError struct {
	block int
	want  string
	got   string
}

func (e *durableBlockError) Error() string {
	return fmt.Sprintf("block %d (offset %d) holds %s, want %s (write 0 is zeros)", e.block, e.block*blockBytes, e.got, e.want)
}

// match returns which of the writes ids block b's data is, if any.
func (s *durableBlock) match(b int, data []byte, ids []uint64) (uint64, bool) {
	want := make([]byte, blockBytes)
	for _, id := range ids {
		fillBlock(want, b, id)
		if string(want) == string(data) {
			return id, true
		}
	}
	return 0, false
}

func describe(data []byte) string {
	if string(data) == string(make([]byte, blockBytes)) {
		return "zeros"
	}
	return fmt.Sprintf("data starting with word %d", binary.LittleEndian.Uint64(data))
}

// checkAfterCrash requires block b to hold its durable write or a later one, and makes that
// what the block holds now.
func (m *durableModel) checkAfterCrash(b int, data []byte) error {
	s := &m.blocks[b]
	id, ok := s.match(b, data, append([]uint64{s.durable}, s.since...))
	if !ok {
		return &durableBlockError{block: b, got: describe(data),
			want: fmt.Sprintf("durable write %d or one of the later writes %v", s.durable, s.since)}
	}
	s.current = id
	return nil
}

// checkCurrent requires block b to hold what the running cycle last wrote or saw there.
func (m *durableModel) checkCurrent(b int, data []byte) error {
	s := &m.blocks[b]
	if _, ok := s.match(b, data, []uint64{s.current}); !ok {
		return &durableBlockError{block: b, got: describe(data), want: fmt.Sprintf("write %d", s.current)}
	}
	return nil
}

// readAll reads the region through c and applies check to every block.
func (m *durableModel) readAll(t *testing.T, c *nbd.Client, when string, check func(int, []byte) error) {
	t.Helper()
	buf := make([]byte, 256<<10)
	per := len(buf) / blockBytes
	for first := 0; first < len(m.blocks); first += per {
		_, err := c.ReadAt(buf, int64(first)*blockBytes)
		require.NoError(t, err, "%s: reading at %d", when, first*blockBytes)
		for i := range per {
			require.NoError(t, check(first+i, buf[i*blockBytes:(i+1)*blockBytes]), when)
		}
	}
}

// verify checks the region after a restart: every block holds its durable write or a later one.
func (m *durableModel) verify(t *testing.T, c *nbd.Client, when string) {
	t.Helper()
	m.readAll(t, c, when, m.checkAfterCrash)
}

// verifyExact requires every block to hold exactly what the cache last served.
func (m *durableModel) verifyExact(t *testing.T, c *nbd.Client, when string) {
	t.Helper()
	m.readAll(t, c, when, m.checkCurrent)
}

// work runs worker w's requests on its own chunks until ctx ends or a request fails: writes
// (some FUA), zeroings, checked reads and flushes. A flush makes durable what this worker had
// acknowledged before sending it; the model does not count other workers' writes, which only
// makes it accept less. It returns the first failure.
func (m *durableModel) work(ctx context.Context, c *nbd.Client, rng *rand.Rand, w, workers int, acked, flushed *atomic.Int64) error {
	chunks := len(m.blocks) / chunkBlocks / workers
	const maxBlocks = 256
	buf := make([]byte, maxBlocks*blockBytes)
	var written []int // blocks written since this worker's last completed flush
	for ctx.Err() == nil {
		chunk := (rng.IntN(chunks)*workers + w) * chunkBlocks
		start := chunk + rng.IntN(chunkBlocks)
		n := 1 + rng.IntN(min([]int{8, 64, maxBlocks}[rng.IntN(3)], chunk+chunkBlocks-start))
		p := buf[:n*blockBytes]
		off := int64(start) * blockBytes
		var err error
		fua := false
		id := uint64(0)
		switch op := rng.IntN(20); {
		case op < 6:
			if _, err = c.ReadAt(p, off); err != nil {
				return err
			}
			for i := range n {
				if err := m.checkCurrent(start+i, p[i*blockBytes:(i+1)*blockBytes]); err != nil {
					return err
				}
			}
			continue
		case op < 7:
			if err = c.Flush(); err != nil {
				return err
			}
			for _, b := range written {
				s := &m.blocks[b]
				s.durable, s.since = s.current, nil
			}
			written = written[:0]
			flushed.Add(1)
			continue
		case op < 9:
			m.issue(start, n, 0)
			err = c.WriteZeroes(off, int64(len(p)), false)
		default:
			id = m.ids.Add(1)
			for i := range n {
				fillBlock(p[i*blockBytes:(i+1)*blockBytes], start+i, id)
			}
			m.issue(start, n, id)
			fua = op < 11
			if fua {
				_, err = c.WriteAtFUA(p, off)
			} else {
				_, err = c.WriteAt(p, off)
			}
		}
		if err != nil {
			return err // the write stays among the blocks' later writes: it may have happened
		}
		for i := range n {
			s := &m.blocks[start+i]
			s.current = id
			if fua {
				s.durable, s.since = id, nil
			} else {
				written = append(written, start+i)
			}
		}
		acked.Add(1)
	}
	return nil
}

// issue records that n blocks from start are being written with id.
func (m *durableModel) issue(start, n int, id uint64) {
	for i := range n {
		s := &m.blocks[start+i]
		s.since = append(s.since, id)
	}
}
