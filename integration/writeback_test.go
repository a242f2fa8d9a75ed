package integration

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
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
	var resp struct {
		Exports []struct {
			Stats struct {
				Mode  string     `json:"mode"`
				Dirty dirtyStats `json:"dirty"`
			} `json:"stats"`
		} `json:"exports"`
	}
	out := statsJSON(t, admin, &resp)
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
	fioVerify(t, tcpURI(d.TCP, ""), 4, "--name=writeback", "--rw=randwrite",
		"--bssplit=4k/25:6k/20:20k/20:64k/20:192k/15", "--iodepth=16", "--size=6m", "--offset_increment=6m")

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
// The restart replays the SSD tier's run log (in the test's run directory), so after each restart
// every block must hold its last acknowledged write, or a write issued after it that the kill cut
// short: none may come back older, flushed or not (the contract alone would allow a write never
// made durable to be lost). At the end `tierblk flush` must leave exactly what clients saw on
// the backend.
//
// It runs on a small tier of 64 KiB lines, where dirty lines must be destaged to make room, and on
// a tier of 131,072 lines of 4 KiB that a reader fills meanwhile with 1 MiB reads elsewhere on
// the disk (256 new lines each), with few flushes: there the kills land among checkpoints of
// thousands of records (at least two metadata transactions' worth), which commit in parts.
// TIERBLK_KILL_CYCLES sets the number of cycles of each (make crash-campaign).
func TestWriteBackKill9(t *testing.T) {
	requireTools(t, "nbdkit")
	const (
		seed    = 5
		region  = 8 << 20 // the blocks the workers use
		workers = 4
	)
	cycles := envCount(t, "TIERBLK_KILL_CYCLES", 8)
	for _, tc := range []struct {
		name, line, ssdSize string
		fill                int64 // bytes after region that a reader keeps reading
		durableOneIn        int
		run                 time.Duration // the least a cycle runs before its kill
		minCheckpoint       uint64
	}{
		{"64KiB-lines", "64KiB", "4MiB", 0, 1, 100 * time.Millisecond, 0}, // the region is twice the SSD tier
		{"4KiB-lines-131k", "4KiB", "512MiB", 1 << 30, 100, 1500 * time.Millisecond, 8192},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A file, not an nbdkit disk: nbdkit 1.32 aborts (an assertion in raw_send_socket)
			// when a client dies while it sends a reply, which one kill in a few hundred does.
			image := filepath.Join(shortTempDir(t), "disk.img")
			backend := fmt.Sprintf("file://%s?size=%d", image, region+tc.fill)
			o := cacheOpts{backend: backend, dir: shortTempDir(t), ram: "512KiB", ssdSize: tc.ssdSize, line: tc.line, mode: "writeback"}
			m := newDurableModel(region / blockBytes)
			m.durableOneIn = tc.durableOneIn
			rng := rand.New(rand.NewPCG(seed, 0))
			var acked, flushed atomic.Int64
			var largest uint64
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
				if tc.fill > 0 {
					fc := dialNBD(t, d.Unix)
					from := rng.Int64N(tc.fill>>20) << 20 // lines the tier lacks, or has evicted
					wg.Go(func() {
						defer fc.Close()
						buf := make([]byte, 1<<20)
						for off := from; ctx.Err() == nil; off = (off + int64(len(buf))) % tc.fill {
							if _, err := fc.ReadAt(buf, region+off); err != nil {
								return // the kill
							}
						}
					})
				}
				time.Sleep(tc.run + time.Duration(rng.IntN(1400))*time.Millisecond)
				select {
				case <-d.exited:
					t.Fatalf("cycle %d: tierblk exited before the kill (%v)\n%s", cycle, d.err, d.output.String())
				default:
				}
				if tc.fill > 0 {
					s := ssdState(t, o.admin())
					require.False(t, s.Failed, "cycle %d: the SSD tier failed: %s", cycle, s.Reason)
					largest = max(largest, s.LargestCheckpoint)
					t.Logf("cycle %d: %d lines, %d checkpoints, the largest %d records", cycle, s.Lines, s.Checkpoints, s.LargestCheckpoint)
				}
				d.stop(syscall.SIGKILL)
				cancel()
				wg.Wait()
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
			require.GreaterOrEqual(t, largest, tc.minCheckpoint, "the largest checkpoint before a kill, in records")
			t.Logf("%d writes acknowledged, %d flushes completed in %d cycles", acked.Load(), flushed.Load(), cycles)
			require.Zero(t, m.lost, "times a block came back older than its last acknowledged write after a kill: the run log lost records")
			if tc.fill > 0 {
				t.Logf("the largest checkpoint before a kill: %d records", largest)
			}

			// A last start: the dirty data found on the SSD is checked, written back by `tierblk
			// flush`, and then the backend itself holds exactly what the cache served.
			d := startServe(t, o.args()...)
			c := dialNBD(t, d.Unix)
			m.verify(t, c, "after the last restart")
			require.NoError(t, c.Close())
			flushAdmin(t, o.admin())
			d.requireStop(syscall.SIGTERM)
			direct := dialNBD(t, startNbdkit(t, "file", image))
			m.verifyExact(t, direct, "on the backend after tierblk flush")
			require.NoError(t, direct.Close())
			logCampaign(t, cycles, "kill -9 cycles", m.sectors)
		})
	}
}

// durableModel is what each block of the write-back kill test may hold. Workers own disjoint
// chunks (chunkBlocks, as in blockModel) and issue one request at a time, so each block has one
// writer and the model needs no lock. Write ids come from one counter; id 0 is zeros.
type durableModel struct {
	blocks []durableBlock
	ids    atomic.Uint64
	// lost counts the blocks found after a restart holding a write older than their last
	// acknowledged one: losses the contract allows after a power cut, and the run log prevents
	// after a kill.
	lost int
	// durableOneIn, above 1, keeps only one flush or FUA write in that many (the others become
	// plain writes), so that checkpoints come from the index's own schedule and grow large.
	durableOneIn int
	// sectors counts the 512-byte sectors that verify and verifyExact found as the model allows,
	// not the workers' own checked reads.
	sectors int64
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

// matchWrite returns the index of the newest of the writes ids that block b's data is, or -1.
func matchWrite(b int, data []byte, ids []uint64) int {
	want := make([]byte, blockBytes)
	for i := len(ids) - 1; i >= 0; i-- {
		fillBlock(want, b, ids[i])
		if string(want) == string(data) {
			return i
		}
	}
	return -1
}

// blockOf returns write id's data for block b.
func blockOf(b int, id uint64) []byte {
	p := make([]byte, blockBytes)
	fillBlock(p, b, id)
	return p
}

// describe names a block's data for an error message.
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
	allowed := append([]uint64{s.durable}, s.since...)
	i := matchWrite(b, data, allowed)
	if i < 0 {
		return &durableBlockError{block: b, got: describe(data),
			want: fmt.Sprintf("durable write %d or one of the later writes %v", s.durable, s.since)}
	}
	if i < matchWrite(b, blockOf(b, s.current), allowed) {
		m.lost++
	}
	s.current = allowed[i]
	return nil
}

// checkCurrent requires block b to hold what the running cycle last wrote or saw there.
func (m *durableModel) checkCurrent(b int, data []byte) error {
	s := &m.blocks[b]
	if matchWrite(b, data, []uint64{s.current}) < 0 {
		return &durableBlockError{block: b, got: describe(data), want: fmt.Sprintf("write %d", s.current)}
	}
	return nil
}

// readAll reads the region through c and applies check to every block.
func (m *durableModel) readAll(t *testing.T, c *client.Client, when string, check func(int, []byte) error) {
	t.Helper()
	buf := make([]byte, 256<<10)
	per := len(buf) / blockBytes
	for first := 0; first < len(m.blocks); first += per {
		_, err := c.ReadAt(buf, int64(first)*blockBytes)
		require.NoError(t, err, "%s: reading at %d", when, first*blockBytes)
		for i := range per {
			require.NoError(t, check(first+i, buf[i*blockBytes:(i+1)*blockBytes]), when)
			m.sectors += blockBytes / sectorBytes
		}
	}
}

// verify checks the region after a restart: every block holds its durable write or a later one.
func (m *durableModel) verify(t *testing.T, c *client.Client, when string) {
	t.Helper()
	m.readAll(t, c, when, m.checkAfterCrash)
}

// verifyExact requires every block to hold exactly what the cache last served.
func (m *durableModel) verifyExact(t *testing.T, c *client.Client, when string) {
	t.Helper()
	m.readAll(t, c, when, m.checkCurrent)
}

// work runs worker w's requests on its own chunks until ctx ends or a request fails: writes
// (some FUA), zeroings, checked reads and flushes. A flush makes durable what this worker had
// acknowledged before sending it; the model does not count other workers' writes, which only
// makes it accept less. It returns the first failure.
func (m *durableModel) work(ctx context.Context, c *client.Client, rng *rand.Rand, w, workers int, acked, flushed *atomic.Int64) error {
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
		op := rng.IntN(20)
		if (op == 6 || op == 9 || op == 10) && m.durableOneIn > 1 && rng.IntN(m.durableOneIn) != 0 {
			op = 11 // a plain write instead of a flush or FUA write
		}
		switch {
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

// TestWriteBackPowerCut cuts the power of a VM (kills qemu) while the kernel's NBD client writes
// through tierblk in write-back mode, with the SSD tier, its metadata and the backend on virtual
// disks, the first two losing what they had not flushed; then boots the VM again on the same
// disk images and requires every write the guest had made durable (fsync on /dev/nbd0) to read
// back, and to reach the backend on `tierblk flush`. TIERBLK_POWER_CUTS sets the number of cuts
// (make crash-campaign), each on fresh disks after its own seeded number of records.
func TestWriteBackPowerCut(t *testing.T) {
	requireTools(t, "qemu-system-x86_64", "nbdkit")
	const seed = 5
	cuts := envCount(t, "TIERBLK_POWER_CUTS", 1)
	script, err := os.ReadFile("vm/guest/writeback-powercut.sh")
	require.NoError(t, err)
	var sectors int64
	for i := range cuts {
		ok := t.Run(fmt.Sprintf("cut-%d", i), func(t *testing.T) {
			sectors += powerCut(t, string(script), seed+uint64(i))
		})
		if !ok {
			// A failed check is what the cuts look for; the cuts after it would take minutes to
			// say nothing more (the kill tests stop at their first failure too).
			return
		}
	}
	logCampaign(t, cuts, "power cuts", sectors)
}

// guestBlockBytes is the size of the power-cut guest's writes (vm/guest/writeback-powercut.sh).
const guestBlockBytes = 4096

// wbVerified is the line the power-cut guest prints after each check of the second boot: the
// number of blocks it read back whole through /dev/nbd0, then on the backend after tierblk flush.
var wbVerified = regexp.MustCompile(`(?m)^TIERBLK-WB: verified (nbd0|backend) (\d+)$`)

// powerCut runs one power cut (seed picks when) and the boot that checks it, and returns the
// number of 512-byte sectors the guest verified.
func powerCut(t *testing.T, script string, seed uint64) int64 {
	rng := rand.New(rand.NewPCG(seed, 0))
	// The power goes after this many records: the guest writes a few per second under emulation.
	cutAfter := 40 + rng.IntN(60)
	dir := t.TempDir()
	var disks []string
	for _, d := range []struct {
		name string
		size int64
	}{{"ssd", 32 << 20}, {"backend", 64 << 20}, {"meta", 128 << 20}} { // meta: above meta.MinFree free
		path := filepath.Join(dir, d.name+".img")
		f, err := os.Create(path)
		require.NoError(t, err)
		require.NoError(t, f.Truncate(d.size))
		require.NoError(t, f.Close())
		disks = append(disks, path)
	}

	// The SSD and the metadata disk have volatile write caches: nbdkit's cache filter keeps what
	// the guest writes until it flushes, and the cut kills it too, as a power cut empties a
	// disk's cache. The backend keeps everything (the host's page cache).
	booted := slices.Clone(disks)
	var caches []*daemon
	for _, i := range []int{0, 2} {
		sock := filepath.Join(shortTempDir(t), "disk.sock")
		caches = append(caches, startDaemon(t, "nbdkit", []string{"-f", "-U", sock, "--filter=cache", "file", disks[i], "cache=writeback"}, "unix:"+sock))
		booted[i] = "nbd+unix:///?socket=" + sock
	}
	console := bootVM(t, "phase=write\n"+script, booted, cutAfter)
	for _, d := range caches {
		require.NoError(t, d.cmd.Process.Kill())
		<-d.exited
	}
	expect, durable := durableWrites(t, console)
	require.Positive(t, durable, "the guest made no write durable before the power cut:\n%s", console)
	t.Logf("power cut after %d records: %d durable writes on %d blocks", cutAfter, durable, len(expect))

	var list strings.Builder
	for blk, seq := range expect {
		fmt.Fprintf(&list, "%d %d\n", blk, seq)
	}
	check := "phase=check\ncat >/tmp/expect <<'EOF'\n" + list.String() + "EOF\n" + script
	out := bootVM(t, check, disks, 0)
	require.Contains(t, out, "\n"+vmPassMarker, "the second boot did not pass:\n%s", out)
	if m := regexp.MustCompile(`msg="SSD tier holds dirty data.*`).FindString(out); m != "" {
		t.Logf("second boot: %s", m)
	}
	verified := wbVerified.FindAllStringSubmatch(out, -1)
	require.Len(t, verified, 2, "the second boot's counts of verified blocks:\n%s", out)
	var sectors int64
	for _, v := range verified {
		n, err := strconv.Atoi(v[2])
		require.NoError(t, err)
		require.Equal(t, len(expect), n, "blocks the guest verified (%s) of the %d durable ones", v[1], len(expect))
		sectors += int64(n) * guestBlockBytes / sectorBytes
	}
	return sectors
}

// wbRecord is one line the power-cut guest prints: "TIERBLK-WB: written|durable BLOCK SEQ" or
// "TIERBLK-WB: flushed SEQ".
var wbRecord = regexp.MustCompile(`(?m)^TIERBLK-WB: (written|durable|flushed) (\d+)(?: (\d+))?\r?$`)

// durableWrites returns, for each block, the seq of its last durable write in the guest's
// console: one written with fsync, or written before a completed flush of the whole device.
func durableWrites(t *testing.T, console string) (map[int]int, int) {
	t.Helper()
	type write struct{ blk, seq int }
	var written []write
	expect := map[int]int{}
	durable := 0
	for _, m := range wbRecord.FindAllStringSubmatch(console, -1) {
		a, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		switch m[1] {
		case "flushed":
			for _, w := range written {
				expect[w.blk] = max(expect[w.blk], w.seq)
				durable++
			}
			written = written[:0]
		case "written", "durable":
			seq, err := strconv.Atoi(m[3])
			require.NoError(t, err)
			if m[1] == "written" {
				written = append(written, write{a, seq})
				continue
			}
			expect[a] = max(expect[a], seq)
			durable++
		}
	}
	return expect, durable
}

// bootVM boots the test VM (vm/run.sh) with the guest script text on the disks (raw images, or
// NBD URIs) and returns its console. With cutAfter > 0 it kills qemu (a power cut for the guest) once the
// guest has printed cutAfter TIERBLK-WB records, and fails the test if the guest ended first.
func bootVM(t *testing.T, script string, disks []string, cutAfter int) string {
	t.Helper()
	work := t.TempDir()
	scriptPath := filepath.Join(work, "guest.sh")
	require.NoError(t, os.WriteFile(scriptPath, []byte(script), 0o644))
	args := []string{"--script", scriptPath, "--tierblk", tierblkPath, "--timeout", "300"}
	for _, d := range disks {
		if strings.HasPrefix(d, "nbd") {
			args = append(args, "--disk-nbd", d)
		} else {
			args = append(args, "--disk-file", d)
		}
	}
	cmd := exec.Command("vm/run.sh", args...)
	// run.sh's work directory, which a killed run.sh cannot remove, goes under the test's own.
	cmd.Env = append(os.Environ(), "TMPDIR="+work)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	timer := time.AfterFunc(7*time.Minute, func() { killTree(cmd.Process.Pid) })
	defer timer.Stop()

	var console strings.Builder
	records, cut := 0, false
	scan := bufio.NewScanner(stdout)
	for scan.Scan() {
		line := strings.TrimRight(scan.Text(), "\r")
		console.WriteString(line + "\n")
		if cutAfter > 0 && !cut && wbRecord.MatchString(line) {
			if records++; records == cutAfter {
				killTree(cmd.Process.Pid)
				cut = true
			}
		}
	}
	err = cmd.Wait()
	if cutAfter > 0 {
		require.True(t, cut, "the guest ended before the power cut (%v):\n%s", err, console.String())
	}
	return console.String()
}

// killTree kills process pid and every process under it with SIGKILL, by id: run.sh and its
// children, among them qemu, which timeout(1) has moved to a process group of its own.
func killTree(pid int) {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process has exited
		}
		// "PID (COMM) STATE PPID ...": COMM may hold spaces, so parse after its last ')'.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) < 2 {
			continue
		}
		self, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		parent, _ := strconv.Atoi(fields[1])
		children[parent] = append(children[parent], self)
	}
	var tree []int
	var walk func(int)
	walk = func(p int) {
		tree = append(tree, p)
		for _, c := range children[p] {
			walk(c)
		}
	}
	walk(pid)
	// Children first: qemu goes before the shell that would notice it gone.
	for i := len(tree) - 1; i >= 0; i-- {
		_ = syscall.Kill(tree[i], syscall.SIGKILL)
	}
}
