package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/testenv"
	"github.com/tierblk/tierblk/internal/uring/uringtest"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/file"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// The tests in this file and in crash_test.go, faults_test.go and model_test.go write stamped
// sectors: every 512-byte sector a write puts down names the write (a unique id) and the sector, so
// a read tells exactly which write each sector it returns comes from, and a sector mixed from two
// writes or put at the wrong place reads as corrupt.

const sector = 512

// corrupt is the id of a sector that is neither zero nor a well-formed stamp for its place.
const corrupt = -1

// stamp fills p, which starts at sector first of the device, with write id's stamp.
func stamp(p []byte, first int, id int64) {
	for i := 0; i*sector < len(p); i++ {
		s := p[i*sector : (i+1)*sector]
		binary.LittleEndian.PutUint64(s, uint64(id))
		binary.LittleEndian.PutUint64(s[8:], uint64(first+i))
		stampFill(s[16:], id, first+i)
	}
}

// stampFill fills the rest of a sector of write id: a byte that depends on both for an even id
// (data that compresses well), bytes that look random for an odd one (data that does not, which a
// packed SSD tier stores as it is, and rewrites in place when dirty).
func stampFill(p []byte, id int64, sec int) {
	if id%2 == 0 {
		fill := byte(id*31 + int64(sec))
		for k := range p {
			p[k] = fill
		}
		return
	}
	x := uint64(id)*0x9e3779b97f4a7c15 ^ uint64(sec)*0xbf58476d1ce4e5b9 | 1
	for k := range p {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		p[k] = byte(x)
	}
}

// stamps decodes p, which starts at sector first: the write id of each sector, 0 for a zero sector.
func stamps(p []byte, first int) []int64 {
	ids := make([]int64, len(p)/sector)
	for i := range ids {
		s := p[i*sector : (i+1)*sector]
		id := int64(binary.LittleEndian.Uint64(s))
		ids[i] = id
		if id == 0 {
			for _, b := range s {
				if b != 0 {
					ids[i] = corrupt
					break
				}
			}
			continue
		}
		if binary.LittleEndian.Uint64(s[8:]) != uint64(first+i) {
			ids[i] = corrupt
			continue
		}
		var want [sector - 16]byte
		stampFill(want[:], id, first+i)
		if !bytes.Equal(s[16:], want[:]) {
			ids[i] = corrupt
		}
	}
	return ids
}

// testSeed is the seed a randomized test starts from: CACHE_TEST_SEED if set, so that a failure
// printed with its seed can be replayed, else fixed.
func testSeed(t testing.TB) uint64 {
	if s := os.Getenv("CACHE_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CACHE_TEST_SEED=%q: %v", s, err)
		}
		return v
	}
	return 1
}

// linOp is one client request as recorded: sectors [first, first+n) read (got holds their ids) or
// set to id (0: trimmed or zeroed).
type linOp struct {
	write    bool
	first, n int
	id       int64
	what     string
}

// regOp is the part of a request that falls in one sector, which the model treats as a register.
type regOp struct {
	write  bool
	sector int
	id     int64 // the value written; for a read, the value returned
	what   string
}

// sectorModel checks each sector as a register holding the id of the write that set it last.
var sectorModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		per := map[int][]porcupine.Operation{}
		for _, op := range history {
			in := op.Input.(linOp)
			for i := range in.n {
				r := regOp{write: in.write, sector: in.first + i, id: in.id, what: in.what}
				if !in.write {
					r.id = op.Output.([]int64)[i]
				}
				per[r.sector] = append(per[r.sector], porcupine.Operation{ClientId: op.ClientId, Input: r,
					Output: r.id, Call: op.Call, Return: op.Return})
			}
		}
		out := make([][]porcupine.Operation, 0, len(per))
		for _, ops := range per {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regOp)
		if in.write {
			return true, in.id
		}
		return output.(int64) == state.(int64), state
	},
	DescribeOperation: func(input, output any) string {
		if in, ok := input.(regOp); ok {
			if in.write {
				return fmt.Sprintf("sector %d: %s %d", in.sector, in.what, in.id)
			}
			return fmt.Sprintf("sector %d: read -> %d", in.sector, in.id)
		}
		in := input.(linOp)
		return fmt.Sprintf("%s sectors [%d,%d) id %d -> %v", in.what, in.first, in.first+in.n, in.id, output)
	},
}

// linCase is one cache setup the linearizability test runs.
type linCase struct {
	name     string
	line     int64
	ram, ssd int64 // lines
	mode     Mode
	policy   string
	// admission of both tiers: nhit:2 is what the default, auto, does while a tier does not pay
	admission string
	ssdFault  float64 // rate of failed reads and writes of the SSD
	// badSectors: only its reads fail, and a read that failed fails again (a medium error)
	badSectors bool
	// ssdFile puts the SSD tier on a file as tierblk serve does (direct reads through io_uring)
	// rather than in memory; pread reads it with pread, as where the kernel has no io_uring.
	ssdFile, pread bool
	// backendFile puts the backend on a file read direct, without delays: its reads go on a
	// ring client's ring (missAsync). backendNBD puts it on an NBD export (tierblk's own server
	// over memory), with delays: its reads are asynchronous (missAsync too).
	backendFile, backendNBD bool
	reduction               Reduction
}

// TestLinearizable runs concurrent clients against caches with tiny tiers over delaying backends,
// so that requests overlap and lines are promoted, evicted and invalidated all the time, and checks
// with porcupine that every sector behaves as a linearizable register. Each case runs with every
// reduction of the SSD tier.
func TestLinearizable(t *testing.T) {
	cases := []linCase{
		{name: "wt-4k-lru", line: 4 << 10, ram: 2, ssd: 4, mode: WriteThrough},
		{name: "wt-16k-s3fifo", line: 16 << 10, ram: 2, ssd: 3, mode: WriteThrough, policy: "s3fifo"},
		{name: "wt-64k-arc", line: 64 << 10, ram: 1, ssd: 2, mode: WriteThrough, policy: "arc"},
		{name: "wt-8k-ssd-only", line: 8 << 10, ssd: 5, mode: WriteThrough, policy: "sieve"},
		{name: "wt-4k-ssd-faults", line: 4 << 10, ram: 2, ssd: 6, mode: WriteThrough, ssdFault: 0.01},
		{name: "wt-64k-ssd-file", line: 64 << 10, ram: 1, ssd: 2, mode: WriteThrough, ssdFile: true},
		{name: "wb-16k-ssd-file", line: 16 << 10, ram: 1, ssd: 4, mode: WriteBack, policy: "s3fifo", ssdFile: true},
		{name: "wt-4k-ssd-file-faults", line: 4 << 10, ssd: 6, mode: WriteThrough, ssdFile: true, ssdFault: 0.02},
		{name: "wb-8k-ssd-file-only", line: 8 << 10, ssd: 5, mode: WriteBack, ssdFile: true},
		{name: "wt-16k-ssd-file-pread", line: 16 << 10, ram: 1, ssd: 4, mode: WriteThrough, ssdFile: true, pread: true},
		{name: "wt-16k-files", line: 16 << 10, ram: 1, ssd: 4, mode: WriteThrough, ssdFile: true, backendFile: true},
		{name: "wb-8k-files-ssd-only", line: 8 << 10, ssd: 5, mode: WriteBack, ssdFile: true, backendFile: true},
		{name: "wt-16k-nbd", line: 16 << 10, ram: 1, ssd: 4, mode: WriteThrough, ssdFile: true, backendNBD: true},
		{name: "wb-8k-nbd-ssd-only", line: 8 << 10, ssd: 5, mode: WriteBack, backendNBD: true},
		{name: "wa-4k-lru", line: 4 << 10, ram: 2, ssd: 4, mode: WriteAround},
		{name: "wa-16k-2q", line: 16 << 10, ram: 1, ssd: 3, mode: WriteAround, policy: "2q"},
		{name: "pt-8k", line: 8 << 10, ram: 2, ssd: 4, mode: PassThrough},
		{name: "wb-4k-lru", line: 4 << 10, ram: 2, ssd: 6, mode: WriteBack},
		{name: "wb-16k-s3fifo", line: 16 << 10, ram: 1, ssd: 4, mode: WriteBack, policy: "s3fifo"},
		{name: "wb-8k-ssd-only", line: 8 << 10, ssd: 5, mode: WriteBack, policy: "sieve"},
		{name: "wt-4k-doorkeeper", line: 4 << 10, ram: 2, ssd: 4, mode: WriteThrough, admission: "nhit:2"},
		{name: "wb-4k-ssd-faults", line: 4 << 10, ram: 2, ssd: 6, mode: WriteBack, ssdFault: 0.01},
		{name: "wb-8k-ssd-file-faults", line: 8 << 10, ssd: 5, mode: WriteBack, ssdFile: true, ssdFault: 0.02},
		{name: "wb-4k-ssd-bad-sectors", line: 4 << 10, ram: 1, ssd: 8, mode: WriteBack, ssdFault: 0.02, badSectors: true},
		{name: "wb-16k-doorkeeper", line: 16 << 10, ram: 1, ssd: 4, mode: WriteBack, admission: "nhit:2"},
	}
	seed := testSeed(t)
	for i, lc := range cases {
		for _, r := range []Reduction{ReductionOff, ReductionZero, ReductionCompress, ReductionDedupe} {
			lc := lc // each subtest its own: they run after the loop
			lc.reduction = r
			t.Run(lc.name+"-reduction-"+r.String(), func(t *testing.T) {
				t.Parallel()
				runLinearizable(t, lc, seed, seed+uint64(i)*1000)
			})
		}
	}
}

// fileSSD is an SSD tier of size bytes on a file, opened as the daemon opens one: writes through
// the page cache, direct reads through io_uring where the kernel has it, or with pread if pread is
// set (uring=false). It skips the test where the temporary directory has no direct I/O.
func fileSSD(t *testing.T, size int64, pread bool) backend.Backend {
	q := url.Values{"size": {strconv.FormatInt(size, 10)}, "direct": {"reads"}}
	if pread {
		q.Set("uring", "false")
	}
	u := &url.URL{Scheme: "file", Path: filepath.Join(t.TempDir(), "ssd.img"), RawQuery: q.Encode()}
	dev, err := file.Open(u, backend.Options{})
	if errors.Is(err, backend.ErrNoDirectIO) {
		testenv.Skip(t, testenv.DirectIO, fmt.Sprintf("%s: %v", t.TempDir(), err))
	}
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	return dev
}

// runLinearizable runs case lc with seed, derived from base (what CACHE_TEST_SEED replays).
func runLinearizable(t *testing.T, lc linCase, base, seed uint64) {
	const (
		devSize = 128 << 10
		clients = 8
	)
	opsPer := 120
	if testing.Short() {
		opsPer = 40
	}
	delay := 150 * time.Microsecond
	var b backend.Backend = fault.New(mem.New(devSize), fault.Options{Seed: int64(seed), MaxDelay: delay})
	switch {
	case lc.backendFile:
		b = fileSSD(t, devSize, false)
	case lc.backendNBD:
		b = fault.New(nbdBackend(t, devSize), fault.Options{Seed: int64(seed), MaxDelay: delay})
	}
	l := layout{line: lc.line, ram: lc.ram, ssd: lc.ssd, mode: lc.mode, policy: lc.policy, admission: lc.admission,
		reduction: lc.reduction}
	l = withReduction(l, lc.reduction)
	var ssd *fault.Backend
	if lc.ssd > 0 {
		rates := map[fault.Op]float64{fault.Read: lc.ssdFault, fault.Write: lc.ssdFault}
		if lc.badSectors {
			delete(rates, fault.Write)
		}
		var dev backend.Backend = mem.New(lc.ssd * lc.line)
		if lc.ssdFile {
			dev = fileSSD(t, lc.ssd*lc.line, lc.pread)
		}
		ssd = fault.New(dev, fault.Options{Seed: int64(seed) + 1, MaxDelay: delay, Rates: rates, BadSectors: lc.badSectors})
	}
	c := newCache(t, b, l, nil, ssd)
	defer c.Close()

	// In write-back the SSD tier may hold the only copy of written data: when it fails, a read of
	// that data fails (never returns the backend's older copy), and so may the writes on it.
	mayFail := lc.mode == WriteBack && lc.ssdFault > 0
	var failed atomic.Int64
	var mu sync.Mutex
	var history []porcupine.Operation
	var wg sync.WaitGroup
	for client := range clients {
		var loop *uringtest.Loop // half the clients read as a ublk queue does
		if client%2 == 1 {
			if loop = uringtest.New(t, 4); loop == nil {
				testenv.Without(t, testenv.IOUring, "every client reads with ReadAt: no ring to read on")
			}
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(client)))
			for k := range opsPer {
				op, call, got, err := linRequest(c, loop, rng, int64(client*opsPer+k+1), devSize/sector)
				ret := linNow()
				switch {
				case err != nil && !mayFail:
					t.Errorf("seed %d: client %d: %s sectors [%d,%d): %v", seed, client, op.what, op.first, op.first+op.n, err)
					return
				case err != nil && !op.write:
					failed.Add(1)
					continue // a read that failed returned nothing to check
				case err != nil:
					// A write that failed may have changed any of its sectors, then or later
					// (a write-back of it under way): it is pending until the end.
					failed.Add(1)
					ret = math.MaxInt64
				}
				if op.n == 0 { // a flush: no sector changes
					continue
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: client, Input: op, Output: got,
					Call: call, Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res, info := porcupine.CheckOperationsVerbose(sectorModel, history, 30*time.Second)
	switch res {
	case porcupine.Illegal:
		dir, err := os.MkdirTemp("", "tierblk-lin-")
		if err == nil {
			path := filepath.Join(dir, "history.html")
			if err := porcupine.VisualizePath(sectorModel, info, path); err == nil {
				t.Logf("visualization: %s", path)
			}
		}
		t.Fatalf("seed %d: history of %d requests is not linearizable (replay with CACHE_TEST_SEED=%d)",
			seed, len(history), base)
	case porcupine.Unknown:
		t.Logf("seed %d: porcupine timed out; nothing proven", seed)
	}
	if failed.Load() > 0 {
		t.Logf("seed %d: %d requests failed on SSD faults", seed, failed.Load())
	}
	st := c.Stats()
	for _, tr := range st.Tiers {
		if tr.Lines > tr.Capacity {
			t.Errorf("seed %d: tier %s holds %d lines, capacity %d", seed, tr.Name, tr.Lines, tr.Capacity)
		}
	}
	if ssd != nil && lc.ssdFault == 0 && st.Tiers[len(st.Tiers)-1].Failed {
		t.Errorf("seed %d: the SSD tier failed without faults: %s", seed, st.Tiers[len(st.Tiers)-1].Reason)
	}
}

// linEpoch and linNow give the call and return times of requests: monotonic, as porcupine needs.
var linEpoch = time.Now()

func linNow() int64 { return int64(time.Since(linEpoch)) }

// linRequest issues one random request and returns what it did, when it was called and, for a
// read, the ids it returned. A read goes as the NBD server's do (ReadAtAsync) or, with loop, as a ublk queue's (ReadAtOn on
// the loop's ring), where the cache starts it so (an SSD-tier hit on a file through io_uring),
// else with ReadAt.
func linRequest(c *Cache, loop *uringtest.Loop, rng *rand.Rand, id int64, sectors int) (op linOp, call int64, got []int64, err error) {
	const perBlock = blockSize / sector
	if rng.IntN(2) == 0 { // whole 4 KiB blocks
		op.n = perBlock * (1 + rng.IntN(3))
		op.first = perBlock * rng.IntN((sectors-op.n)/perBlock+1)
	} else { // any sectors
		op.n = 1 + rng.IntN(20)
		op.first = rng.IntN(sectors - op.n + 1)
	}
	off, length := int64(op.first)*sector, int64(op.n)*sector
	buf := make([]byte, length)
	switch r := rng.IntN(100); {
	case r < 40:
		op.what = "read"
		call = linNow()
		var started bool
		if loop != nil {
			started, err = readAtOn(loop, c, buf, off)
		} else {
			started, err = readAtAsync(nil, c, buf, off)
		}
		if !started {
			_, err = c.ReadAt(buf, off)
		}
		if err == nil {
			got = stamps(buf, op.first)
		}
	case r < 70, r < 80:
		op.write, op.id, op.what = true, id, "write"
		stamp(buf, op.first, id)
		call = linNow()
		if r < 70 {
			_, err = c.WriteAt(buf, off)
		} else {
			op.what = "fua-write"
			_, err = c.WriteAtFUA(buf, off)
		}
	case r < 84:
		op.write, op.what = true, "trim"
		call = linNow()
		err = c.Trim(off, length)
	case r < 88:
		op.write, op.what = true, "write-of-zeros" // zero blocks, where the SSD tier reduces
		call = linNow()
		_, err = c.WriteAt(buf, off)
	case r < 95:
		op.write, op.what = true, "write-zeroes"
		call = linNow()
		err = c.WriteZeroes(off, length, rng.IntN(2) == 0)
	default:
		op = linOp{what: "flush"}
		call = linNow()
		err = c.Flush()
	}
	return op, call, got, err
}
