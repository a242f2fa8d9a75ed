package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// minDev is the smallest device a log accepts: a record area of exactly 1 MiB.
const minDev = areaStart + minArea

func newLog(t *testing.T, devSize, volSize int64) (*mem.Mem, *Log) {
	t.Helper()
	dev := mem.New(devSize)
	l, err := Create(dev, volSize)
	require.NoError(t, err)
	return dev, l
}

// op is a record as a test submits it.
type op struct {
	kind     Kind
	off, len int64
	data     []byte
}

func (o op) record(seq uint64) Record {
	return Record{Seq: seq, Kind: o.kind, Off: o.off, Len: o.len, Data: o.data}
}

// put reserves and writes o, failing the test on an error.
func put(t *testing.T, l *Log, o op) Ticket {
	t.Helper()
	tk, err := l.Reserve(context.Background(), o.kind, o.off, o.len, len(o.data))
	require.NoError(t, err)
	require.NoError(t, l.Write(tk, o.data))
	return tk
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b[:n:n]
}

func writeOp(rng *rand.Rand, vol int64, maxLen int) op {
	n := 1 + rng.IntN(maxLen)
	off := rng.Int64N(vol - int64(n) + 1)
	return op{kind: KindWrite, off: off, len: int64(n), data: randBytes(rng, n)}
}

// readAll opens dev and returns every record Next gives before io.EOF.
func readAll(t *testing.T, dev *mem.Mem) []Record {
	t.Helper()
	r, err := Open(dev)
	require.NoError(t, err)
	var recs []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return recs
		}
		require.NoError(t, err)
		recs = append(recs, rec)
	}
}

// normalize makes empty Data nil, as the reader's copy of no bytes may be either.
func normalize(recs []Record) []Record {
	for i := range recs {
		if len(recs[i].Data) == 0 {
			recs[i].Data = nil
		}
	}
	return recs
}

func TestKindString(t *testing.T) {
	for _, tc := range []struct {
		k    Kind
		want string
	}{
		{KindWrite, "write"}, {KindTrim, "trim"}, {KindZero, "zero"}, {KindFlush, "flush"},
		{0, "Kind(0)"}, {9, "Kind(9)"},
	} {
		assert.Equal(t, tc.want, tc.k.String())
	}
}

func TestCreateRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dev     int64
		vol     int64
		wantErr string
	}{
		{"device too small", minDev - sector, 1 << 20, "too small"},
		{"zero volume", minDev, 0, "must be positive"},
		{"negative volume", minDev, -1, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Create(mem.New(tc.dev), tc.vol)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestCreateLayout(t *testing.T) {
	// A size that is not a multiple of a sector: the area ends at the last whole one.
	dev, l := newLog(t, minDev+1000, 1<<30)
	assert.Equal(t, int64(minArea+512), l.Capacity())
	assert.NotZero(t, l.ID())
	assert.Equal(t, Position{Seq: 1, Pos: areaStart}, l.Head())
	assert.Equal(t, Position{Seq: 1, Pos: areaStart}, l.Tail())
	assert.Zero(t, l.Used())

	r, err := Open(dev)
	require.NoError(t, err)
	assert.Equal(t, l.ID(), r.ID())
	assert.Equal(t, int64(1<<30), r.VolumeSize())
	assert.Equal(t, Position{Seq: 1, Pos: areaStart}, r.Tail())
	assert.Equal(t, r.Tail(), r.End())
	_, err = r.Next()
	assert.ErrorIs(t, err, io.EOF)

	// Formatting again gives a new id and outranks the old superblocks.
	old := l.ID()
	l2, err := Create(dev, 1<<30)
	require.NoError(t, err)
	assert.NotEqual(t, old, l2.ID())
	r, err = Open(dev)
	require.NoError(t, err)
	assert.Equal(t, l2.ID(), r.ID())
}

func TestRoundTrip(t *testing.T) {
	const vol = 1 << 20
	dev, l := newLog(t, 8<<20, vol)
	rng := rand.New(rand.NewPCG(1, 2))
	var ops []op
	for i := range 200 {
		switch i % 5 {
		case 0, 1:
			ops = append(ops, writeOp(rng, vol, 20000))
		case 2:
			ops = append(ops, op{kind: KindTrim, off: rng.Int64N(vol / 2), len: rng.Int64N(vol / 2)})
		case 3:
			ops = append(ops, op{kind: KindZero, off: rng.Int64N(vol / 2), len: rng.Int64N(vol / 2)})
		case 4:
			ops = append(ops, op{kind: KindFlush})
		}
	}
	ops = append(ops, op{kind: KindWrite, off: vol - 1, len: 1, data: []byte{7}}, op{kind: KindZero, off: vol, len: 0})

	// Goroutines reserve and write at once; the seq each op got says where the reader must put it.
	want := make([]Record, len(ops))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ops) {
					return
				}
				o := ops[i]
				tk, err := l.Reserve(context.Background(), o.kind, o.off, o.len, len(o.data))
				if !assert.NoError(t, err) {
					return
				}
				assert.NoError(t, l.Write(tk, o.data))
				want[tk.Seq-1] = o.record(tk.Seq)
			}
		})
	}
	wg.Wait()
	require.NoError(t, l.Sync())
	assert.Equal(t, uint64(len(ops)+1), l.Head().Seq)

	got := readAll(t, dev)
	assert.Equal(t, normalize(want), normalize(got))
}

func TestConcurrentWritesLandInAnyOrder(t *testing.T) {
	dev, l := newLog(t, minDev, 1<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	var tickets []Ticket
	var want []Record
	for range 64 {
		o := writeOp(rng, 1<<20, 8000)
		tk, err := l.Reserve(context.Background(), o.kind, o.off, o.len, len(o.data))
		require.NoError(t, err)
		tickets = append(tickets, tk)
		want = append(want, o.record(tk.Seq))
	}
	// Written backwards, from several goroutines at once.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := len(tickets) - 1 - g; i >= 0; i -= 4 {
				assert.NoError(t, l.Write(tickets[i], want[i].Data))
			}
		})
	}
	wg.Wait()
	assert.Equal(t, want, readAll(t, dev))
}

func TestReserveRefuses(t *testing.T) {
	_, l := newLog(t, minDev, 1<<20)
	calls := 0
	l.SetOnFull(func() { calls++ })
	for _, tc := range []struct {
		name            string
		kind            Kind
		off, len        int64
		dataLen         int
		wantErrContains string
	}{
		{"unknown kind", 0, 0, 0, 0, "unknown record kind"},
		{"kind 5", 5, 0, 0, 0, "unknown record kind"},
		{"negative offset", KindTrim, -1, 10, 0, "outside the volume"},
		{"past the volume", KindZero, 1 << 20, 1, 0, "outside the volume"},
		{"write data length", KindWrite, 0, 100, 99, "data length"},
		{"trim with data", KindTrim, 0, 100, 100, "data length"},
		{"bigger than the log", KindWrite, 0, minArea, minArea, "cannot fit"},
		{"just too big", KindWrite, 0, minArea - sector - hdrSize + 1, minArea - sector - hdrSize + 1, "cannot fit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.Reserve(context.Background(), tc.kind, tc.off, tc.len, tc.dataLen)
			require.ErrorContains(t, err, tc.wantErrContains)
		})
	}
	assert.Zero(t, calls, "a record that can never fit must not wait for room")
	assert.Equal(t, Position{Seq: 1, Pos: areaStart}, l.Head())

	// The largest record that fits does, in an empty log.
	n := minArea - sector - hdrSize
	tk, err := l.Reserve(context.Background(), KindWrite, 0, int64(n), n)
	require.NoError(t, err)
	assert.Equal(t, int64(areaStart), tk.Pos)
}

func TestWriteRefusesAMismatchedTicket(t *testing.T) {
	_, l := newLog(t, minDev, 1<<20)
	tk, err := l.Reserve(context.Background(), KindWrite, 0, 10, 10)
	require.NoError(t, err)
	require.ErrorContains(t, l.Write(tk, make([]byte, 9)), "9 bytes of data")
	require.ErrorContains(t, l.Write(Ticket{}, nil), "not reserved")
}

func TestTicketEndAtTheAreaEnd(t *testing.T) {
	dev, l := newLog(t, minDev, 1<<20)
	const n = 4096 - hdrSize // records of exactly 4 KiB
	var last Ticket
	for range 128 {
		last = put(t, l, op{kind: KindWrite, len: n, data: make([]byte, n)})
	}
	require.NoError(t, l.Release(last.End))
	assert.Zero(t, l.Used())
	var recs []Record
	for i := range 128 {
		o := op{kind: KindWrite, off: int64(i), len: n, data: bytes.Repeat([]byte{byte(i)}, n)}
		last = put(t, l, o)
		recs = append(recs, o.record(last.Seq))
	}
	assert.Equal(t, int64(areaStart+minArea-4096), last.Pos)
	assert.Equal(t, Position{Seq: 257, Pos: areaStart}, last.End, "a record ending at the area's end ends at its start")
	assert.Equal(t, last.End, l.Head())
	assert.Equal(t, int64(minArea/2), l.Used())
	assert.Equal(t, recs, readAll(t, dev))

	next := put(t, l, op{kind: KindFlush})
	assert.Equal(t, int64(areaStart), next.Pos)
	assert.Len(t, readAll(t, dev), 129)
}

// TestUsedCountsTheSkip: a record that does not fit before the end goes to the start, and the
// bytes it skipped stay used until the tail passes them.
func TestUsedCountsTheSkip(t *testing.T) {
	dev, l := newLog(t, minDev, 1<<20)
	const big = 300<<10 - hdrSize
	put(t, l, op{kind: KindWrite, len: big, data: make([]byte, big)})
	b := put(t, l, op{kind: KindWrite, len: big, data: make([]byte, big)})
	c := put(t, l, op{kind: KindWrite, len: big, data: make([]byte, big)})
	assert.Equal(t, int64(areaStart+600<<10), c.Pos)
	require.NoError(t, l.Release(b.End))
	// c ends at 900 KiB of 1 MiB: the next record of 300 KiB goes to the start, skipping 124 KiB.
	d, err := l.Reserve(context.Background(), KindWrite, 0, big, big)
	require.NoError(t, err)
	assert.Equal(t, int64(areaStart), d.Pos)
	assert.Equal(t, int64(300<<10+124<<10+300<<10), l.Used())
	require.NoError(t, l.Write(d, make([]byte, big)))

	recs := readAll(t, dev)
	require.Len(t, recs, 2)
	assert.Equal(t, []uint64{c.Seq, d.Seq}, []uint64{recs[0].Seq, recs[1].Seq})

	// With c released, the skip after it is still held: it lies between the tail and d.
	require.NoError(t, l.Release(c.End))
	assert.Equal(t, int64(124<<10+300<<10), l.Used())
	require.NoError(t, l.Release(d.End))
	assert.Zero(t, l.Used())
}

// TestEmptyLogStartsOver: an empty log whose head is too near the end for a large record starts
// the area over instead of waiting for room it can never get; the reader still finds the record
// from the superblock's old tail.
func TestEmptyLogStartsOver(t *testing.T) {
	dev, l := newLog(t, minDev, 1<<20)
	a := put(t, l, op{kind: KindWrite, len: 600 << 10, data: make([]byte, 600<<10)})
	require.NoError(t, l.Release(a.End))
	const n = 900 << 10
	o := op{kind: KindWrite, off: 5, len: n, data: bytes.Repeat([]byte{9}, n)}
	tk := put(t, l, o)
	assert.Equal(t, int64(areaStart), tk.Pos)
	assert.Equal(t, recordSize(n), l.Used())
	assert.Equal(t, []Record{o.record(tk.Seq)}, readAll(t, dev))
}

func TestReleaseRefuses(t *testing.T) {
	_, l := newLog(t, minDev, 1<<20)
	a := put(t, l, op{kind: KindFlush})
	put(t, l, op{kind: KindFlush})
	for _, tc := range []struct {
		name string
		p    Position
		want string
	}{
		{"beyond the head", Position{Seq: 10, Pos: areaStart}, "beyond the head"},
		{"outside the area", Position{Seq: 2, Pos: 0}, "not in the record area"},
		{"misaligned", Position{Seq: 2, Pos: areaStart + 100}, "not in the record area"},
		{"head seq elsewhere", Position{Seq: 3, Pos: areaStart}, "not the head's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, l.Release(tc.p), tc.want)
		})
	}
	require.NoError(t, l.Release(a.End))
	assert.Equal(t, a.End, l.Tail())
	// At or behind the tail: nothing.
	require.NoError(t, l.Release(Position{Seq: 1, Pos: areaStart}))
	require.NoError(t, l.Release(a.End))
	assert.Equal(t, a.End, l.Tail())
}

// TestWrapManyLaps runs many laps of random records and releases and checks, all along, that no
// record reserved overlaps one not released, that the reader returns exactly the records from the
// tail, and never one of an older lap.
func TestWrapManyLaps(t *testing.T) {
	const vol = 1 << 20
	dev, l := newLog(t, minDev, vol)
	const seed = 20240601
	rng := rand.New(rand.NewPCG(seed, 0))

	type live struct {
		tk  Ticket
		rec Record
	}
	var held []live
	var bytesWritten int64
	check := func() {
		t.Helper()
		var want []Record
		for _, h := range held {
			want = append(want, h.rec)
		}
		got := readAll(t, dev)
		require.Equal(t, normalize(want), normalize(got), "seed %d", seed)
	}
	for i := 0; bytesWritten < 20*minArea; i++ {
		var o op
		switch rng.IntN(6) {
		case 0:
			o = op{kind: KindTrim, off: 0, len: rng.Int64N(vol)}
		case 1:
			o = op{kind: KindFlush}
		default:
			o = writeOp(rng, vol, []int{100, 4096, 70000}[rng.IntN(3)])
		}
		size := recordSize(int64(len(o.data)))
		// A record that does not fit before the end skips less than its own size: twice its size
		// free is enough. Release random prefixes until there is that much, so Reserve never waits.
		for len(held) > 0 && l.Capacity()-sector-l.Used() < 2*size {
			k := 1 + rng.IntN(len(held))
			require.NoError(t, l.Release(held[k-1].tk.End), "seed %d", seed)
			held = held[k:]
			tail := l.Tail()
			if len(held) > 0 {
				require.Equal(t, held[0].tk.Seq, tail.Seq)
			} else {
				// Everything released: the area at the tail holds only older laps.
				require.Equal(t, l.Head(), tail)
			}
			if rng.IntN(4) == 0 {
				check()
			}
		}
		tk := put(t, l, o)
		bytesWritten += size
		for _, h := range held {
			hs := recordSize(int64(h.tk.DataLen))
			require.False(t, tk.Pos < h.tk.Pos+hs && h.tk.Pos < tk.Pos+size,
				"seed %d: seq %d at %d overlaps held seq %d at %d", seed, tk.Seq, tk.Pos, h.tk.Seq, h.tk.Pos)
		}
		require.LessOrEqual(t, tk.Pos+size, int64(areaStart)+l.Capacity())
		held = append(held, live{tk, o.record(tk.Seq)})

		head, tail, used := l.Head(), l.Tail(), l.Used()
		d := head.Pos - tail.Pos
		if d <= 0 && head.Seq != tail.Seq {
			d += l.Capacity()
		}
		require.Equal(t, d, used, "seed %d: used is the distance from tail to head", seed)
		require.LessOrEqual(t, used, l.Capacity()-sector)
		if i%50 == 0 {
			check()
		}
	}
	check()
	require.NoError(t, l.Release(l.Head()))
	held = nil
	check()
}

// TestOtherLogNeverReturned formats the device again over a log with the same record sizes: the
// old log's records sit where the new one's next records would, with the seqs expected.
func TestOtherLogNeverReturned(t *testing.T) {
	dev, old := newLog(t, minDev, 1<<20)
	for i := range 5 {
		put(t, old, op{kind: KindWrite, off: int64(i), len: 100, data: bytes.Repeat([]byte{1}, 100)})
	}
	require.NoError(t, old.Sync())
	require.Len(t, readAll(t, dev), 5)

	l, err := Create(dev, 1<<20)
	require.NoError(t, err)
	assert.Empty(t, readAll(t, dev))
	var want []Record
	for i := range 2 {
		o := op{kind: KindWrite, off: int64(i), len: 100, data: bytes.Repeat([]byte{2}, 100)}
		want = append(want, o.record(put(t, l, o).Seq))
	}
	assert.Equal(t, want, readAll(t, dev))
}

func TestUnwrittenRecordEndsTheLog(t *testing.T) {
	dev, l := newLog(t, minDev, 1<<20)
	var want []Record
	for i := range 5 {
		o := op{kind: KindWrite, off: int64(i), len: 1000, data: bytes.Repeat([]byte{byte(i)}, 1000)}
		tk, err := l.Reserve(context.Background(), o.kind, o.off, o.len, len(o.data))
		require.NoError(t, err)
		if i == 2 {
			continue // reserved, never written
		}
		require.NoError(t, l.Write(tk, o.data))
		if i < 2 {
			want = append(want, o.record(tk.Seq))
		}
	}
	require.NoError(t, l.Sync())
	assert.Equal(t, want, readAll(t, dev))
}

func TestCorruptionEndsTheLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int64 // offset into the second record
	}{
		{"record magic", rMagic},
		{"kind", rKind},
		{"log id", rID + 3},
		{"seq", rSeq},
		{"offset", rOff + 1},
		{"length", rLen},
		{"data length", rDataLen},
		{"data crc", rDataCRC},
		{"header crc", rHdrCRC},
		{"first data byte", hdrSize},
		{"last data byte", hdrSize + 999},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, l := newLog(t, minDev, 1<<20)
			var tks []Ticket
			var want []Record
			for i := range 3 {
				o := op{kind: KindWrite, off: int64(i), len: 1000, data: bytes.Repeat([]byte{byte(i)}, 1000)}
				tk := put(t, l, o)
				tks = append(tks, tk)
				want = append(want, o.record(tk.Seq))
			}
			b := make([]byte, 1)
			_, err := dev.ReadAt(b, tks[1].Pos+tc.at)
			require.NoError(t, err)
			b[0] ^= 0x10
			_, err = dev.WriteAt(b, tks[1].Pos+tc.at)
			require.NoError(t, err)
			assert.Equal(t, want[:1], readAll(t, dev))
		})
	}
}

// TestDamagedButValidRecordIsAnError: a record whose checksums hold but whose fields are
// impossible is not the end of the log but an error, so that a drain does not silently drop the
// records after it.
func TestDamagedButValidRecordIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(h []byte)
		want   string
	}{
		{"unknown kind", func(h []byte) { h[rKind] = 9 }, "unknown kind"},
		{"outside the volume", func(h []byte) { binary.LittleEndian.PutUint64(h[rOff:], 1<<40) }, "outside the volume"},
		{"data length", func(h []byte) { binary.LittleEndian.PutUint64(h[rDataLen:], 5) }, "bytes of data"},
		{"past the area", func(h []byte) {
			binary.LittleEndian.PutUint64(h[rLen:], 1<<20)
			binary.LittleEndian.PutUint64(h[rDataLen:], 1<<20)
		}, "past the end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, l := newLog(t, minDev, 1<<30)
			tk := put(t, l, op{kind: KindWrite, off: 0, len: 10, data: make([]byte, 10)})
			h := make([]byte, hdrSize)
			_, err := dev.ReadAt(h, tk.Pos)
			require.NoError(t, err)
			tc.modify(h)
			binary.LittleEndian.PutUint32(h[rHdrCRC:], crc32c.Checksum(h[:rHdrCRC]))
			_, err = dev.WriteAt(h, tk.Pos)
			require.NoError(t, err)
			r, err := Open(dev)
			require.NoError(t, err)
			_, err = r.Next()
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "log damaged")
		})
	}
}

func TestSuperblockCopies(t *testing.T) {
	// setup makes a log whose copy 0 holds generation 2 (tail at seq 2) and copy 1 generation 1
	// (tail at seq 1), as after Create and one Release.
	setup := func(t *testing.T) (*mem.Mem, *Log) {
		dev, l := newLog(t, minDev, 1<<20)
		a := put(t, l, op{kind: KindFlush})
		put(t, l, op{kind: KindFlush})
		require.NoError(t, l.Release(a.End))
		return dev, l
	}
	flip := func(dev *mem.Mem, off int64) {
		b := make([]byte, 1)
		_, _ = dev.ReadAt(b, off)
		b[0] ^= 1
		_, _ = dev.WriteAt(b, off)
	}
	rewrite := func(dev *mem.Mem, copyOff int64, f func(b []byte)) {
		b := make([]byte, sbSize)
		_, _ = dev.ReadAt(b, copyOff)
		f(b)
		binary.LittleEndian.PutUint32(b[sCRC:], crc32c.Checksum(b[:sbCRCOver]))
		_, _ = dev.WriteAt(b, copyOff)
	}
	for _, tc := range []struct {
		name     string
		damage   func(dev *mem.Mem)
		wantTail uint64 // with no error
		wantErr  string
		notLog   bool
	}{
		{"both good: the newer", func(*mem.Mem) {}, 2, "", false},
		{"newer torn: the older", func(dev *mem.Mem) { flip(dev, sTailPos) }, 1, "", false},
		{"older torn: the newer", func(dev *mem.Mem) { flip(dev, sbSize+sGen) }, 2, "", false},
		{"newer's crc torn", func(dev *mem.Mem) { flip(dev, sCRC) }, 1, "", false},
		{"newer zeroed", func(dev *mem.Mem) { _ = dev.WriteZeroes(0, sbSize, false) }, 1, "", false},
		{"both torn", func(dev *mem.Mem) { flip(dev, sID); flip(dev, sbSize+sVolume) }, 0, "both superblock copies are damaged", false},
		{"both zeroed", func(dev *mem.Mem) { _ = dev.WriteZeroes(0, 2*sbSize, false) }, 0, "not a tierblk replica log", true},
		{"one zeroed one torn", func(dev *mem.Mem) { _ = dev.WriteZeroes(0, sbSize, false); flip(dev, sbSize+sID) }, 0, "damaged", false},
		{"unsupported version", func(dev *mem.Mem) {
			for _, c := range []int64{0, sbSize} {
				rewrite(dev, c, func(b []byte) { binary.LittleEndian.PutUint32(b[sVersion:], 7) })
			}
		}, 0, "unsupported log format version 7", false},
		{"newer version, older good", func(dev *mem.Mem) {
			rewrite(dev, 0, func(b []byte) { binary.LittleEndian.PutUint32(b[sVersion:], 7) })
		}, 1, "", false},
		{"fields out of range", func(dev *mem.Mem) {
			for _, c := range []int64{0, sbSize} {
				rewrite(dev, c, func(b []byte) { binary.LittleEndian.PutUint64(b[sTailPos:], 3) })
			}
		}, 0, "out of range", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, _ := setup(t)
			tc.damage(dev)
			r, err := Open(dev)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.Equal(t, tc.notLog, errors.Is(err, ErrNotLog))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantTail, r.Tail().Seq)
		})
	}
}

func TestOpenRefusesAnotherDeviceSize(t *testing.T) {
	dev, _ := newLog(t, minDev, 1<<20)
	img := make([]byte, minDev)
	_, err := dev.ReadAt(img, 0)
	require.NoError(t, err)
	bigger := mem.New(minDev + sector)
	_, err = bigger.WriteAt(img, 0)
	require.NoError(t, err)
	_, err = Open(bigger)
	require.ErrorContains(t, err, "made on a device of")

	_, err = Open(mem.New(100))
	require.ErrorIs(t, err, ErrNotLog)
}

// TestReleaseTornKeepsTheOldTail: a Release whose superblock write fails leaves the tail where it
// was, in memory and on the device, and a later Release writes the same copy again.
func TestReleaseTornKeepsTheOldTail(t *testing.T) {
	dev := &failDev{Mem: mem.New(minDev)}
	l, err := Create(dev, 1<<20)
	require.NoError(t, err)
	a := put(t, l, op{kind: KindFlush})
	b := put(t, l, op{kind: KindFlush})
	dev.failWrites.Store(true)
	require.Error(t, l.Release(a.End))
	dev.failWrites.Store(false)
	assert.Equal(t, Position{Seq: 1, Pos: areaStart}, l.Tail())
	assert.Equal(t, 2*sector, int(l.Used()))
	require.NoError(t, l.Release(b.End))
	r, err := Open(dev)
	require.NoError(t, err)
	assert.Equal(t, b.End, r.Tail())
}

// failDev is a mem device whose writes fail while failWrites is set.
type failDev struct {
	*mem.Mem
	failWrites atomic.Bool
}

func (d *failDev) WriteAt(p []byte, off int64) (int, error) {
	if d.failWrites.Load() {
		return 0, errors.New("injected write failure")
	}
	return d.Mem.WriteAt(p, off)
}

// fillLog writes records until the next one of n bytes of data does not fit, and returns their
// tickets.
func fillLog(t *testing.T, l *Log, n int) []Ticket {
	t.Helper()
	var tks []Ticket
	for l.Capacity()-sector-l.Used() >= 2*recordSize(int64(n)) {
		tks = append(tks, put(t, l, op{kind: KindWrite, len: int64(n), data: make([]byte, n)}))
	}
	return tks
}

func TestReserveWaitsForRoom(t *testing.T) {
	const n = 64 << 10
	_, l := newLog(t, minDev, 1<<20)
	tks := fillLog(t, l, n)
	// One record of room is left, minus the slack: the second has to wait.
	put(t, l, op{kind: KindWrite, len: n, data: make([]byte, n)})

	var calls atomic.Int32
	called := make(chan struct{}, 10)
	l.SetOnFull(func() { calls.Add(1); called <- struct{}{} })
	done := make(chan error, 1)
	var got Ticket
	go func() {
		var err error
		got, err = l.Reserve(context.Background(), KindWrite, 0, n, n)
		done <- err
	}()
	<-called
	select {
	case err := <-done:
		t.Fatalf("Reserve returned (%v) with the log full", err)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, l.Release(tks[1].End))
	require.NoError(t, <-done)
	assert.Equal(t, int32(1), calls.Load(), "onFull once for one wait")
	assert.Equal(t, tks[0].Pos, got.Pos, "the record goes to the start of the area, where the first ones were")
}

// TestReserveCallsOnFullAgain: a Release that frees too little wakes the waiter, which asks for
// more room again before it waits again.
func TestReserveCallsOnFullAgain(t *testing.T) {
	const n = 64 << 10
	_, l := newLog(t, minDev, 1<<20)
	var tks []Ticket
	for range 14 {
		tks = append(tks, put(t, l, op{kind: KindWrite, len: n, data: make([]byte, n)}))
	}
	called := make(chan struct{}, 10)
	l.SetOnFull(func() { called <- struct{}{} })
	done := make(chan error, 1)
	go func() {
		// 2 records' worth: needs two records released, after the skip at the end.
		_, err := l.Reserve(context.Background(), KindWrite, 0, 2*n, 2*n)
		done <- err
	}()
	<-called
	require.NoError(t, l.Release(tks[0].End))
	<-called
	require.NoError(t, l.Release(tks[2].End))
	require.NoError(t, <-done)
}

// TestOnFullMayReleaseAtOnce: onFull runs without the log's locks, so it may release itself and
// Reserve goes on without waiting.
func TestOnFullMayReleaseAtOnce(t *testing.T) {
	const n = 64 << 10
	_, l := newLog(t, minDev, 1<<20)
	fillLog(t, l, n)
	put(t, l, op{kind: KindWrite, len: n, data: make([]byte, n)})
	calls := 0
	l.SetOnFull(func() {
		calls++
		require.NoError(t, l.Release(l.Head()))
	})
	put(t, l, op{kind: KindWrite, len: n, data: make([]byte, n)})
	assert.Equal(t, 1, calls)
}

func TestReserveWaitEnds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		end     func(l *Log, cancel context.CancelFunc)
		wantErr error
	}{
		{"ctx cancelled", func(_ *Log, cancel context.CancelFunc) { cancel() }, context.Canceled},
		{"log closed", func(l *Log, _ context.CancelFunc) { require.NoError(t, l.Close()) }, ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 64 << 10
			_, l := newLog(t, minDev, 1<<20)
			fillLog(t, l, n)
			put(t, l, op{kind: KindWrite, len: n, data: make([]byte, n)})
			called := make(chan struct{}, 10)
			l.SetOnFull(func() { called <- struct{}{} })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i := range errs {
				wg.Go(func() {
					_, errs[i] = l.Reserve(ctx, KindWrite, 0, n, n)
				})
			}
			for range errs {
				<-called
			}
			tc.end(l, cancel)
			wg.Wait()
			for _, err := range errs {
				require.ErrorIs(t, err, tc.wantErr)
			}
		})
	}
}

func TestClosedLogRefusesReserves(t *testing.T) {
	_, l := newLog(t, minDev, 1<<20)
	tk, err := l.Reserve(context.Background(), KindFlush, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
	_, err = l.Reserve(context.Background(), KindFlush, 0, 0, 0)
	require.ErrorIs(t, err, ErrClosed)
	// Nor is a record reserved before written: its writer learns at once that the log is out of
	// service, rather than wait for a device that may hang.
	require.ErrorIs(t, l.Write(tk, nil), ErrClosed)
}

// gatedDev holds every WriteAt until open is closed, and counts them.
type gatedDev struct {
	backend.Backend
	open    chan struct{}
	writes  atomic.Int64
	entered atomic.Int64 // bytes of the writes that reached the gate
}

func (g *gatedDev) WriteAt(p []byte, off int64) (int, error) {
	g.entered.Add(int64(len(p)))
	<-g.open
	g.writes.Add(1)
	return g.Backend.WriteAt(p, off)
}

// TestWritesAreGathered: records written while the device is busy with a batch go to it together
// in the next, one device write for the run of records that follow each other, and read back as
// written.
func TestWritesAreGathered(t *testing.T) {
	const vol = 1 << 20
	dev := mem.New(minDev)
	l, err := Create(dev, vol)
	require.NoError(t, err)
	g := &gatedDev{Backend: dev, open: make(chan struct{})}
	l.dev = g
	l.maxBatches = 1
	const n = 40
	tickets := make([]Ticket, n)
	for i := range tickets {
		tickets[i], err = l.Reserve(t.Context(), KindWrite, int64(i)*512, 512, 512)
		require.NoError(t, err)
	}
	write := func(i int) { assert.NoError(t, l.Write(tickets[i], bytes.Repeat([]byte{byte(i)}, 512))) }
	var wg sync.WaitGroup
	wg.Go(func() { write(0) })
	require.Eventually(t, func() bool { return g.entered.Load() > 0 }, 10*time.Second, time.Millisecond, "the first record's batch")
	for i := 1; i < n; i++ {
		wg.Go(func() { write(i) })
	}
	require.Eventually(t, func() bool {
		l.wmu.Lock()
		defer l.wmu.Unlock()
		return len(l.queue) == n-1
	}, 10*time.Second, time.Millisecond, "the other records queued behind it")
	close(g.open)
	wg.Wait()
	assert.EqualValues(t, 2, g.writes.Load(), "device writes for %d records", n)
	r, err := Open(dev)
	require.NoError(t, err)
	for i := range n {
		rec, err := r.Next()
		require.NoError(t, err)
		require.Equal(t, uint64(i+1), rec.Seq)
		require.Equal(t, bytes.Repeat([]byte{byte(i)}, 512), rec.Data)
	}
}
