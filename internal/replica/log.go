// Package replica keeps a write-back cache's unflushed changes on a second machine, so that they
// survive the death of the machine whose SSD holds the only other copy.
//
// The primary (the host whose cache acknowledges writes before the backend has them) appends a
// record for every change it acknowledges (a write with its data, a trim, a write-zeroes, a FLUSH
// marker) to a circular log on the replica's block device, reached as an NBD export but here just a
// backend.Backend. Once the cache has written changes back to the backend itself, the primary
// releases the log's prefix that holds them and the writer reuses the room. If the primary dies,
// Drain reads the log from its tail and applies the records to the backend in order, so the backend
// ends up with every write the primary acknowledged.
//
// On the device: two copies of a superblock (offsets 0 and 4096), written in turn so that a write
// torn by a crash leaves the other, then the record area from 8192 to the device's size rounded down
// to 512. Each record is a 64-byte header and its data, padded to a multiple of 512, written with
// one WriteAt. The superblock says where the oldest record still needed (the tail) is and which
// sequence number it has; the log ends at the first place whose record is missing, torn, or not
// the one expected, which is how the reader finds the head without the writer ever recording it.
//
// What it must never do:
//   - hand out a record that failed its checksum, belongs to another log (a device formatted
//     again), or to an earlier lap of this one: a stale record applied would put old data over new;
//   - apply a record twice out of order, or skip one and apply a later one: the backend must end in
//     a state the client could have seen, so the log is applied strictly in sequence and stops at
//     the first gap;
//   - let the writer reuse room of a record not yet released, nor move the tail in memory before
//     the superblock that moves it is durable: either would lose acknowledged writes on a crash.
package replica

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Kind is what a record stands for.
type Kind uint8

// The kinds of record.
const (
	KindWrite Kind = 1 // Data holds the bytes written at Off (Len == len(Data))
	KindTrim  Kind = 2 // Off, Len: a discarded range
	KindZero  Kind = 3 // Off, Len: a range written with zeroes
	KindFlush Kind = 4 // a FLUSH the client sent: everything before it was made durable together
)

func (k Kind) String() string {
	switch k {
	case KindWrite:
		return "write"
	case KindTrim:
		return "trim"
	case KindZero:
		return "zero"
	case KindFlush:
		return "flush"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

func (k Kind) valid() bool { return k >= KindWrite && k <= KindFlush }

// Record is one change, as the reader returns it.
type Record struct {
	Seq      uint64
	Kind     Kind
	Off, Len int64
	Data     []byte
}

// Position is a place in the log: the seq the next record there has, and its byte offset on the
// device.
type Position struct {
	Seq uint64
	Pos int64
}

// Ticket is room reserved for one record.
type Ticket struct {
	Seq      uint64
	Pos      int64    // where the record goes on the device
	End      Position // the position right after it
	Kind     Kind
	Off, Len int64
	DataLen  int
}

// The device's layout.
const (
	sector    = 512
	sbSize    = 4096
	areaStart = 2 * sbSize
	// minArea keeps a log from being so small that ordinary writes cannot fit in it.
	minArea = 1 << 20

	sbMagic   = "TBRLOG01"
	version   = 1
	recMagic  = 0x52524254 // "TBRR" little-endian
	hdrSize   = 64
	sbCRCOver = 64 // the superblock's fields, which its CRC covers; the rest of the 4 KiB is zero
)

// Superblock fields (byte offsets).
const (
	sMagic   = 0
	sVersion = 8
	sFlags   = 12
	sGen     = 16
	sID      = 24
	sVolume  = 32
	sDevice  = 40
	sTailPos = 48
	sTailSeq = 56
	sCRC     = sbCRCOver
)

// Record header fields (byte offsets).
const (
	rMagic   = 0
	rKind    = 4
	rID      = 8
	rSeq     = 16
	rOff     = 24
	rLen     = 32
	rDataLen = 40
	rDataCRC = 48
	rHdrCRC  = 60 // over [0, rHdrCRC)
)

// Errors a caller may test for.
var (
	// ErrClosed is returned by Reserve once the log is closed.
	ErrClosed = errors.New("replica: log closed")
	// ErrNotLog is wrapped by Open's error for a device that holds no replica log.
	ErrNotLog = errors.New("not a tierblk replica log")
)

// super is the superblock's content.
type super struct {
	gen        uint64
	id         uint64
	volumeSize int64
	deviceSize int64
	tail       Position
	// drained is set by Drain: the log's changes went to the backend without the primary, which
	// must not come back with the cache it had (its data may be older than the backend's now).
	drained bool
}

// flagDrained is the superblock flag of super.drained.
const flagDrained = 1

func (s *super) encode() []byte {
	b := make([]byte, sbSize)
	copy(b[sMagic:], sbMagic)
	binary.LittleEndian.PutUint32(b[sVersion:], version)
	if s.drained {
		binary.LittleEndian.PutUint32(b[sFlags:], flagDrained)
	}
	binary.LittleEndian.PutUint64(b[sGen:], s.gen)
	binary.LittleEndian.PutUint64(b[sID:], s.id)
	binary.LittleEndian.PutUint64(b[sVolume:], uint64(s.volumeSize))
	binary.LittleEndian.PutUint64(b[sDevice:], uint64(s.deviceSize))
	binary.LittleEndian.PutUint64(b[sTailPos:], uint64(s.tail.Pos))
	binary.LittleEndian.PutUint64(b[sTailSeq:], s.tail.Seq)
	binary.LittleEndian.PutUint32(b[sCRC:], crc32c.Checksum(b[:sbCRCOver]))
	return b
}

// superState is what decodeSuper makes of one copy, worst first, so that Open can report the best
// of the two copies' states when neither is usable.
type superState int

const (
	sbNoMagic superState = iota
	sbBadCRC
	sbBadVersion
	sbBadFields
	sbOK
)

func decodeSuper(b []byte) (super, superState, uint32) {
	if string(b[sMagic:sMagic+len(sbMagic)]) != sbMagic {
		return super{}, sbNoMagic, 0
	}
	if binary.LittleEndian.Uint32(b[sCRC:]) != crc32c.Checksum(b[:sbCRCOver]) {
		return super{}, sbBadCRC, 0
	}
	v := binary.LittleEndian.Uint32(b[sVersion:])
	if v != version {
		return super{}, sbBadVersion, v
	}
	s := super{
		drained:    binary.LittleEndian.Uint32(b[sFlags:])&flagDrained != 0,
		gen:        binary.LittleEndian.Uint64(b[sGen:]),
		id:         binary.LittleEndian.Uint64(b[sID:]),
		volumeSize: int64(binary.LittleEndian.Uint64(b[sVolume:])),
		deviceSize: int64(binary.LittleEndian.Uint64(b[sDevice:])),
		tail: Position{
			Seq: binary.LittleEndian.Uint64(b[sTailSeq:]),
			Pos: int64(binary.LittleEndian.Uint64(b[sTailPos:])),
		},
	}
	end := s.deviceSize &^ (sector - 1)
	if s.volumeSize <= 0 || s.deviceSize < areaStart+minArea || s.tail.Seq == 0 ||
		s.tail.Pos < areaStart || s.tail.Pos >= end || s.tail.Pos%sector != 0 {
		return super{}, sbBadFields, v
	}
	return s, sbOK, v
}

// writeSuper writes s to the copy its generation picks, so that consecutive generations alternate
// and a torn write leaves the other copy, one generation older, intact; then it flushes dev.
func writeSuper(dev backend.Backend, s *super) error {
	off := int64(s.gen%2) * sbSize
	if _, err := dev.WriteAt(s.encode(), off); err != nil {
		return fmt.Errorf("replica: write superblock (generation %d): %w", s.gen, err)
	}
	if err := dev.Flush(); err != nil {
		return fmt.Errorf("replica: flush superblock (generation %d): %w", s.gen, err)
	}
	return nil
}

// readSuper reads both copies and returns the valid one with the highest generation.
func readSuper(dev backend.Backend) (super, error) {
	if dev.Size() < sbSize*2 {
		return super{}, fmt.Errorf("replica: %w: device of %d bytes is smaller than its superblocks", ErrNotLog, dev.Size())
	}
	var best super
	found := false
	worst := sbNoMagic
	var badVersion uint32
	buf := make([]byte, sbSize)
	for i := range int64(2) {
		if _, err := dev.ReadAt(buf, i*sbSize); err != nil {
			return super{}, fmt.Errorf("replica: read superblock copy %d: %w", i, err)
		}
		s, st, v := decodeSuper(buf)
		if st == sbOK {
			if !found || s.gen > best.gen {
				best, found = s, true
			}
			continue
		}
		if st > worst {
			worst = st
			if st == sbBadVersion {
				badVersion = v
			}
		}
	}
	if found {
		return best, nil
	}
	switch worst {
	case sbNoMagic:
		return super{}, fmt.Errorf("replica: %w: neither superblock copy has the magic %q", ErrNotLog, sbMagic)
	case sbBadVersion:
		return super{}, fmt.Errorf("replica: unsupported log format version %d (this build reads version %d)", badVersion, version)
	case sbBadFields:
		return super{}, errors.New("replica: both superblock copies are damaged: their fields are out of range")
	default:
		return super{}, errors.New("replica: both superblock copies are damaged: checksum mismatch")
	}
}

// recordSize is the room a record with dataLen bytes of data takes on the device.
func recordSize(dataLen int64) int64 {
	return (hdrSize + dataLen + sector - 1) &^ (sector - 1)
}

// Log is the writer (the primary's side). Safe for concurrent use.
type Log struct {
	dev        backend.Backend
	id         uint64
	volumeSize int64
	deviceSize int64
	end        int64 // the record area's end: [areaStart, end)

	// sbMu serializes superblock writes (Release); it is taken before mu, never after.
	sbMu sync.Mutex
	gen  uint64 // the generation of the superblock last made durable

	mu     sync.Mutex
	head   Position
	tail   Position
	used   int64
	closed bool
	// changed is closed, and replaced, whenever room is freed or the log closes: Reserve's
	// waiters select on it alongside their contexts.
	changed chan struct{}
	onFull  func()
	// gone is closed by Close: Write and Sync stop waiting for a device that may never answer.
	gone chan struct{}

	// Group commit: Writes queue their encoded records, and up to maxBatches of them at a time
	// (batches) take the queue and write each run of records that follow each other on the device
	// in one device write. Over a network the peer then handles a request per batch, not per
	// record (`tierblk bench replica` measures it). Guarded by wmu.
	wmu        sync.Mutex
	queue      []*queued
	batches    int
	maxBatches int // maxBatches; a test sets 1
	// pending is the bytes of the records queued or being written; WriteAsync waits while it is
	// over maxPending (roomy is signalled as it falls), so that a peer slower than the writers
	// holds them back rather than growing the queue without bound.
	pending int64
	roomy   *sync.Cond
	// wclosed is set by Close, after which WriteAsync queues nothing and no batch starts;
	// writing counts the batches being written to the device.
	wclosed bool
	writing int
	// watch is dev as Create gave it, timing its calls (Stalled).
	watch *watched
}

// queued is a record encoded and waiting for its batch; done is called once it is written.
type queued struct {
	t    Ticket
	buf  *[]byte
	size int64
	done func(error)
}

// maxBatches bounds the device writes of batches in flight at once; maxBatch the bytes of one;
// maxPending the bytes of records queued or in flight (WriteAsync).
const (
	maxBatches = 4
	maxBatch   = 1 << 20
	maxPending = 8 << 20
)

// Create formats dev as a new, empty log for a volume of volumeSize bytes: a fresh random 64-bit
// log id, tail = head = the start of the record area, seq starting at 1; both superblock copies
// written, then dev.Flush(). Errors if dev is too small (less than the superblocks plus 1 MiB) or
// volumeSize <= 0.
func Create(dev backend.Backend, volumeSize int64) (*Log, error) {
	if volumeSize <= 0 {
		return nil, fmt.Errorf("replica: volume size %d must be positive", volumeSize)
	}
	size := dev.Size()
	end := size &^ (sector - 1)
	if end-areaStart < minArea {
		return nil, fmt.Errorf("replica: device of %d bytes is too small for a log: it needs at least %d (superblocks plus 1 MiB)",
			size, areaStart+minArea)
	}
	// The new superblocks must outrank whatever an earlier log left, so that a crash that tears
	// one of the two writes below cannot bring the old log back as the newest.
	var gen uint64 = 1
	if old, err := readSuper(dev); err == nil {
		gen = old.gen + 1
	}
	var idb [8]byte
	var id uint64
	for id == 0 {
		if _, err := rand.Read(idb[:]); err != nil {
			return nil, fmt.Errorf("replica: log id: %w", err)
		}
		id = binary.LittleEndian.Uint64(idb[:])
	}
	start := Position{Seq: 1, Pos: areaStart}
	s := super{gen: gen, id: id, volumeSize: volumeSize, deviceSize: size, tail: start}
	b := s.encode()
	for i := range int64(2) {
		if _, err := dev.WriteAt(b, i*sbSize); err != nil {
			return nil, fmt.Errorf("replica: write superblock copy %d: %w", i, err)
		}
	}
	if err := dev.Flush(); err != nil {
		return nil, fmt.Errorf("replica: flush new log: %w", err)
	}
	// A device that acknowledges writes it does not keep (a null export, a peer serving another
	// file) would take every change and give none back to a drain: read the superblock back.
	if got, err := readSuper(dev); err != nil || got.id != id || got.gen != gen {
		if err == nil {
			err = fmt.Errorf("it reads back log %016x generation %d", got.id, got.gen)
		}
		return nil, fmt.Errorf("replica: the device did not keep the new log's superblock (log %016x generation %d): %w; refusing it", id, gen, err)
	}
	w := &watched{Backend: dev, since: map[uint64]time.Time{}}
	l := &Log{
		dev:        w,
		watch:      w,
		id:         id,
		volumeSize: volumeSize,
		deviceSize: size,
		end:        end,
		gen:        gen,
		head:       start,
		tail:       start,
		changed:    make(chan struct{}),
		gone:       make(chan struct{}),
		maxBatches: maxBatches,
	}
	l.roomy = sync.NewCond(&l.wmu)
	return l, nil
}

// ID is the log's random id, which every record carries.
func (l *Log) ID() uint64 { return l.id }

// Capacity is the size in bytes of the record area.
func (l *Log) Capacity() int64 { return l.end - areaStart }

// Used is the bytes between tail and head: records reserved and not released, and the room
// skipped at the end of the area where a record did not fit and went to its start.
func (l *Log) Used() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}

// Head is the position after the last reserved record.
func (l *Log) Head() Position {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

// Tail is the position of the oldest record not released; in an empty log, where the next record
// goes.
func (l *Log) Tail() Position {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tail
}

// SetOnFull sets a function Reserve calls (from its own goroutine, without holding l's locks)
// when it has to wait for room; the caller uses it to make the cache write back and then Release.
func (l *Log) SetOnFull(f func()) {
	l.mu.Lock()
	l.onFull = f
	l.mu.Unlock()
}

// place reports where a record of size bytes would go and how many bytes it would add to used
// (its size plus any room skipped at the end), or ok false when it does not fit now. l.mu is held.
// It may rewind an empty log, which is why it needs the lock and not only a read of the fields.
func (l *Log) place(size int64) (pos, added int64, ok bool) {
	// A sector of slack keeps the head off the tail's position while anything is held, so that
	// equal positions mean an empty log to whoever has only positions (Head and Tail).
	room := l.Capacity() - sector - l.used
	pos = l.head.Pos
	if pos+size > l.end {
		if l.used == 0 {
			// Nothing is held: rather than skip to the start and count the skipped bytes against
			// a record that may need nearly the whole area, start the area over. The superblock's
			// tail still names the old position; a reader finds nothing of the expected seq there
			// and tries the start of the area, where the next record goes.
			l.tail.Pos = areaStart
			l.head.Pos = areaStart
			return areaStart, size, size <= room
		}
		skip := l.end - pos
		return areaStart, skip + size, skip+size <= room
	}
	return pos, size, size <= room
}

// Reserve allocates the next seq and room for a record of kind with dataLen bytes of data (dataLen
// must be Len for KindWrite, 0 otherwise). Seqs and positions are handed out in the same order. If
// the room is short it calls onFull and waits until a Release makes room, ctx ends, or the log is
// closed (then an error); woken by a Release that freed too little, it calls onFull again before it
// waits again. A record larger than the whole capacity is an error at once.
func (l *Log) Reserve(ctx context.Context, kind Kind, off, length int64, dataLen int) (Ticket, error) {
	if !kind.valid() {
		return Ticket{}, fmt.Errorf("replica: reserve: unknown record kind %d", uint8(kind))
	}
	if off < 0 || length < 0 || length > l.volumeSize || off > l.volumeSize-length {
		return Ticket{}, fmt.Errorf("replica: reserve %s: range %d+%d outside the volume of %d bytes", kind, off, length, l.volumeSize)
	}
	if (kind == KindWrite && int64(dataLen) != length) || (kind != KindWrite && dataLen != 0) {
		return Ticket{}, fmt.Errorf("replica: reserve %s of %d bytes: data length %d is wrong for it", kind, length, dataLen)
	}
	// Compared before it is rounded up, so that a length near the int64 limit cannot wrap round.
	if int64(dataLen) > l.Capacity() || recordSize(int64(dataLen)) > l.Capacity()-sector {
		return Ticket{}, fmt.Errorf("replica: reserve %s: a record of %d bytes of data cannot fit in a log of %d bytes", kind, dataLen, l.Capacity())
	}
	size := recordSize(int64(dataLen))
	// onFull is called before each sleep, not once per Reserve: a Release that frees less than
	// this record needs wakes it with the log still full, and the write-back that would free the
	// rest may need the nudge again.
	calledOnFull := false
	l.mu.Lock()
	for {
		if l.closed {
			l.mu.Unlock()
			return Ticket{}, ErrClosed
		}
		pos, added, ok := l.place(size)
		if ok {
			t := Ticket{Seq: l.head.Seq, Pos: pos, Kind: kind, Off: off, Len: length, DataLen: dataLen}
			endPos := pos + size
			if endPos == l.end {
				endPos = areaStart
			}
			t.End = Position{Seq: t.Seq + 1, Pos: endPos}
			l.head = t.End
			l.used += added
			l.mu.Unlock()
			return t, nil
		}
		if f := l.onFull; f != nil && !calledOnFull {
			calledOnFull = true
			l.mu.Unlock()
			f()
			l.mu.Lock()
			continue // it may have made room already
		}
		calledOnFull = false
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Ticket{}, fmt.Errorf("replica: reserve %s: waiting for room: %w", kind, ctx.Err())
		}
		l.mu.Lock()
	}
}

// Write encodes the reserved record (header + data, padded), writes it to dev at t.Pos and
// returns once it is written: WriteAsync, waited for. Once the log is closed it returns
// ErrClosed without waiting for a device write under way, which a hung peer may never end.
func (l *Log) Write(t Ticket, data []byte) error {
	done := make(chan error, 1)
	l.WriteAsync(t, data, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-l.gone:
		return fmt.Errorf("replica: write seq %d: %w", t.Seq, ErrClosed)
	}
}

// WriteAsync encodes the reserved record (header + data, padded) and queues it for dev at t.Pos;
// done is called, on another goroutine, once it is written or failed. data may be reused once
// WriteAsync returns. It waits only while the records queued are over maxPending bytes.
// Concurrent writes of different tickets are fine and may land in any order; those of records
// that follow each other go to dev in one write when they meet in the queue (group commit). If
// one fails, the log as a reader sees it ends before t until the records up to t.End are
// released: the caller must not count on the records after it.
func (l *Log) WriteAsync(t Ticket, data []byte, done func(error)) {
	if len(data) != t.DataLen {
		done(fmt.Errorf("replica: write seq %d: %d bytes of data for a ticket of %d", t.Seq, len(data), t.DataLen))
		return
	}
	if t.Seq == 0 || !t.Kind.valid() || t.Pos < areaStart || t.Pos%sector != 0 {
		done(fmt.Errorf("replica: write: ticket %+v was not reserved by this log", t))
		return
	}
	size := recordSize(int64(len(data)))
	if t.Pos+size > l.end {
		done(fmt.Errorf("replica: write: ticket %+v was not reserved by this log", t))
		return
	}
	bp := bufpool.Get(int(size))
	encodeRecord(*bp, l.id, t.Seq, t.Kind, t.Off, t.Len, data)
	l.wmu.Lock()
	for l.pending > maxPending && !l.wclosed {
		l.roomy.Wait()
	}
	if l.wclosed {
		l.wmu.Unlock()
		bufpool.Put(bp)
		done(fmt.Errorf("replica: write seq %d: %w", t.Seq, ErrClosed))
		return
	}
	l.pending += size
	l.queue = append(l.queue, &queued{t: t, buf: bp, size: size, done: done})
	lead := l.batches < l.maxBatches
	if lead {
		l.batches++
	}
	l.wmu.Unlock()
	if lead {
		go l.writeBatches()
	}
}

// writeBatches writes what is queued, batch after batch, until the queue is empty.
func (l *Log) writeBatches() {
	for {
		l.wmu.Lock()
		q := l.queue
		l.queue = nil
		if len(q) == 0 {
			l.batches--
			l.wmu.Unlock()
			return
		}
		l.wmu.Unlock()
		slices.SortFunc(q, func(a, b *queued) int { return cmp.Compare(a.t.Seq, b.t.Seq) })
		for i := 0; i < len(q); {
			j, n := i+1, q[i].size
			for j < len(q) && q[j].t.Seq == q[j-1].t.Seq+1 && q[j].t.Pos == q[j-1].t.Pos+q[j-1].size && n+q[j].size <= maxBatch {
				n += q[j].size
				j++
			}
			// A closed log starts no device write: a fresh log may be made on the same device
			// once Writing says none is under way, and a record of this one must not land on it.
			l.wmu.Lock()
			if l.wclosed {
				for _, r := range q[i:] {
					l.pending -= r.size
				}
				l.roomy.Broadcast()
				l.wmu.Unlock()
				for _, r := range q[i:] {
					bufpool.Put(r.buf)
					r.done(fmt.Errorf("replica: write seq %d: %w", r.t.Seq, ErrClosed))
				}
				break
			}
			l.writing++
			l.wmu.Unlock()
			l.writeRun(q[i:j], n)
			l.wmu.Lock()
			l.writing--
			l.wmu.Unlock()
			i = j
		}
	}
}

// Writing reports whether a batch is being written to the device. Once the log is closed it can
// only turn false, and then stays so.
func (l *Log) Writing() bool {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.writing > 0
}

// writeRun writes records that follow each other on the device, n bytes in all, in one write,
// then ends them.
func (l *Log) writeRun(run []*queued, n int64) {
	buf := *run[0].buf
	var bp *[]byte
	if len(run) > 1 {
		bp = bufpool.Get(int(n))
		buf = (*bp)[:0]
		for _, q := range run {
			buf = append(buf, (*q.buf)[:q.size]...)
		}
	}
	_, err := l.dev.WriteAt(buf[:n], run[0].t.Pos)
	if bp != nil {
		bufpool.Put(bp)
	}
	l.wmu.Lock()
	l.pending -= n
	l.roomy.Broadcast()
	l.wmu.Unlock()
	for _, q := range run {
		bufpool.Put(q.buf)
		if err != nil {
			q.done(fmt.Errorf("replica: write seq %d at %d (with %d records from seq %d): %w", q.t.Seq, q.t.Pos, len(run), run[0].t.Seq, err))
		} else {
			q.done(nil)
		}
	}
}

// encodeRecord fills buf, recordSize(len(data)) bytes, with the record: header, data, and zeroes
// (pooled buffers hold whatever their last user left).
func encodeRecord(buf []byte, id, seq uint64, kind Kind, off, length int64, data []byte) {
	h := buf[:hdrSize]
	clear(h)
	binary.LittleEndian.PutUint32(h[rMagic:], recMagic)
	h[rKind] = byte(kind)
	binary.LittleEndian.PutUint64(h[rID:], id)
	binary.LittleEndian.PutUint64(h[rSeq:], seq)
	binary.LittleEndian.PutUint64(h[rOff:], uint64(off))
	binary.LittleEndian.PutUint64(h[rLen:], uint64(length))
	binary.LittleEndian.PutUint64(h[rDataLen:], uint64(len(data)))
	binary.LittleEndian.PutUint32(h[rDataCRC:], crc32c.Checksum(data))
	binary.LittleEndian.PutUint32(h[rHdrCRC:], crc32c.Checksum(h[:rHdrCRC]))
	n := copy(buf[hdrSize:], data)
	clear(buf[hdrSize+n:])
}

// Sync flushes dev: every Write that returned before is durable. Once the log is closed it
// returns ErrClosed without waiting for the flush, as Write does.
func (l *Log) Sync() error {
	done := make(chan error, 1)
	go func() { done <- l.dev.Flush() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("replica: sync: %w", err)
		}
		return nil
	case <-l.gone:
		return fmt.Errorf("replica: sync: %w", ErrClosed)
	}
}

// Release moves the tail to p: the records before p are no longer needed. It writes the
// superblock (the other of the two copies, generation+1, with the new tail position and tail
// seq), flushes dev, and wakes Reserve waiters. A p at or behind the tail does nothing. p must be a
// position returned by Head() or a Ticket's End (not beyond Head), and every record before it must
// have been written (its Write returned): the room is reused at once, and a Write still in flight
// there could land over a newer record.
func (l *Log) Release(p Position) error {
	l.sbMu.Lock()
	defer l.sbMu.Unlock()

	l.mu.Lock()
	tail, head := l.tail, l.head
	l.mu.Unlock()
	if p.Seq <= tail.Seq {
		return nil
	}
	if p.Seq > head.Seq {
		return fmt.Errorf("replica: release to seq %d: beyond the head (seq %d)", p.Seq, head.Seq)
	}
	if p.Pos < areaStart || p.Pos >= l.end || p.Pos%sector != 0 {
		return fmt.Errorf("replica: release to seq %d: position %d is not in the record area [%d, %d)", p.Seq, p.Pos, int64(areaStart), l.end)
	}
	if p.Seq == head.Seq && p.Pos != head.Pos {
		return fmt.Errorf("replica: release to seq %d: position %d is not the head's (%d)", p.Seq, p.Pos, head.Pos)
	}

	// Durable first: the writer may overwrite what it frees only once a crash can no longer bring
	// back a superblock that points into it.
	s := super{gen: l.gen + 1, id: l.id, volumeSize: l.volumeSize, deviceSize: l.deviceSize, tail: p}
	if err := writeSuper(l.dev, &s); err != nil {
		return err
	}
	l.gen = s.gen

	l.mu.Lock()
	defer l.mu.Unlock()
	l.tail = p
	if p.Seq == l.head.Seq {
		l.used = 0
	} else {
		// The head cannot have lapped p: p's records are held until now.
		d := l.head.Pos - p.Pos
		if d <= 0 {
			d += l.Capacity()
		}
		l.used = d
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

// Close wakes every waiter with an error and makes later Reserves fail; it does not close dev.
func (l *Log) Close() error {
	// The records queued and not yet being written end now: their writers may be waiting for
	// them (a FLUSH), and the device may never take the batches before them.
	l.wmu.Lock()
	l.wclosed = true
	q := l.queue
	l.queue = nil
	for _, r := range q {
		l.pending -= r.size
	}
	l.roomy.Broadcast()
	l.wmu.Unlock()
	for _, r := range q {
		bufpool.Put(r.buf)
		r.done(fmt.Errorf("replica: write seq %d: %w", r.t.Seq, ErrClosed))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.gone)
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return nil
}

// Stalled is how long the oldest call to the device under way (a write, a flush, a read) has
// waited; 0 when none is.
func (l *Log) Stalled() time.Duration {
	return l.watch.stalled()
}

// watched is a device that knows when each of its calls under way started.
type watched struct {
	backend.Backend
	mu    sync.Mutex
	next  uint64
	since map[uint64]time.Time
}

func (w *watched) begin() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	w.since[w.next] = time.Now()
	return w.next
}

func (w *watched) end(id uint64) {
	w.mu.Lock()
	delete(w.since, id)
	w.mu.Unlock()
}

func (w *watched) stalled() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var d time.Duration
	for _, at := range w.since {
		d = max(d, time.Since(at))
	}
	return d
}

func (w *watched) WriteAt(p []byte, off int64) (int, error) {
	defer w.end(w.begin())
	return w.Backend.WriteAt(p, off)
}

func (w *watched) ReadAt(p []byte, off int64) (int, error) {
	defer w.end(w.begin())
	return w.Backend.ReadAt(p, off)
}

func (w *watched) Flush() error {
	defer w.end(w.begin())
	return w.Backend.Flush()
}
