// Package runlog keeps the changes to the SSD tier's index made since the last checkpoint in a
// file on tmpfs (under /run), so that they survive a kill of the process: the file's pages stay in
// the page cache when the process dies, and the next process replays them before it serves
// anything. They do not survive a power cut or a reboot, and need not: neither does the kernel
// block device whose acknowledged writes they stand for.
//
// The log is a ring of fixed-size records in a MAP_SHARED mapping: an append is a copy to memory,
// no system call, so it can be done on every write before its acknowledgement. Each record
// carries its sequence number and a CRC, so a record torn by a kill in the middle of its copy, and
// whatever the ring held before, end the replay. A header ties the log to one SSD tier (its
// identity), one run of it (an epoch the metadata store bumps at every start) and one boot of the
// machine (the kernel's boot ID, so that a log kept on a file system that outlives a reboot is
// refused after one), and says up to which record the metadata store holds everything (the
// watermark, moved by each checkpoint).
//
// The log must never be replayed on a store it was not written for, nor replayed when a record of
// it was not written (a full ring): Open refuses both.
package runlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/internal/meta"
)

// Identity ties a log to what it is for: the SSD tier's ID and the epoch of the run that wrote it.
type Identity struct {
	Tier  string
	Epoch uint64
}

// The file's layout: a header page, then the ring.
const (
	magic = "TIERBLKL"
	// version 2 records carry a third bitmap, the zero blocks; version 3 records carry after it
	// the line's location words (as many as the header's hLocs says, none in the slot layout);
	// version 4 records carry after those the line's block checksums (as many as the header's
	// hSums says); version 5 records carry between the location words and the checksums the
	// epochs of the line's dirty blocks (as many as the header's hEpochs says: none in address
	// order). A log of version 1 (Valid and Dirty only), 2 or 3, which a kill of an earlier
	// tierblk left, still replays, its records without checksums, and one of version 4 without
	// epochs.
	version    = 5
	headerSize = 4096
	maxTierID  = 64

	// header fields (byte offsets)
	hMagic     = 0
	hVersion   = 8
	hRecSize   = 12
	hCap       = 16
	hEpoch     = 24
	hWords     = 32
	hBoot      = 36 // the boot's ID (bootIDLen bytes)
	hTierLen   = hBoot + bootIDLen
	hTier      = hTierLen + 4
	hCRC       = hTier + maxTierID // over [0, hCRC), hLocs's 4 bytes from version 3 on, hSums's from 4 on, hEpochs's from 5 on
	hLocs      = 144               // location words per record (uint32), from version 3 on
	hSums      = 148               // checksums per record (uint32), from version 4 on
	hWatermark = 152               // every record up to it is in the metadata store
	hLost      = 160               // the last record the ring had no room for
	hEpochs    = 168               // epochs per record (uint32), from version 5 on
	bootIDLen  = 36

	// record fields
	rSeq   = 0
	rLine  = 8
	rSlot  = 16
	rFlags = 20
	rBits  = 24 // Valid, Dirty, Zero, Loc and Epoch words, checksums (4 bytes each), then the CRC of all before it

	flagDelete = 1
)

// DefaultSize is the log file's size: with 64 KiB lines a record takes 120 bytes, 64 of them the
// 16 block checksums, so it holds about 140,000 changes, some fifty times what a checkpoint every
// second lets pile up. In the packed layout the 16 location words make it 248 bytes, and the log
// holds about 68,000; with 1 MiB lines' 256 locations and 256 checksums, 3,200 bytes, about 5,200.
const DefaultSize = 16 << 20

// ErrUnusable wraps the reasons Replay cannot use a log: another tier's or run's, records lost
// to a full ring, a header that does not parse.
var ErrUnusable = errors.New("run log unusable")

// bitmaps is how many bitmaps a record of version v carries.
func bitmaps(v uint32) int {
	if v == 1 {
		return 2
	}
	return 3
}

// Shape is what a record holds for a line: Words 64-bit words of each bitmap, Locs location
// words (0 in the slot layout), Sums block checksums and Epochs block epochs (0 in address order).
type Shape struct {
	Words, Locs, Sums, Epochs int
}

// RecordSize is the size of a record of shape s.
func RecordSize(s Shape) int { return recordSize(s, bitmaps(version)) }

// recordSize is the size of a record, a multiple of 8 so that every record's words are aligned.
func recordSize(s Shape, bitmaps int) int {
	return (rBits + 8*(bitmaps*s.Words+s.Locs+s.Epochs) + 4*s.Sums + 4 + 7) &^ 7
}

// headerCRC is the CRC of the header of a log of version v. The location word and checksum counts
// were added at hLocs and hSums, past hCRC, where the header had room: they are covered too, so
// that a damaged count is refused rather than read as another record layout.
func headerCRC(b []byte, v uint32) uint32 {
	c := crc32c.Checksum(b[:hCRC])
	if v >= 3 {
		c = crc32c.Update(c, b[hLocs:hLocs+4])
	}
	if v >= 4 {
		c = crc32c.Update(c, b[hSums:hSums+4])
	}
	if v >= 5 {
		c = crc32c.Update(c, b[hEpochs:hEpochs+4])
	}
	return c
}

// Log is an open log, appended to by one writer at a time (the tier's mutex orders them).
type Log struct {
	f       *os.File
	m       []byte
	shape   Shape
	recSize int
	cap     uint64 // records in the ring
	next    uint64 // the next record's sequence number
	// committed is the watermark as last set: a copy, so that Append reads no shared page.
	committed uint64
}

// Create makes a new, empty log at path for id (replacing what was there), of size bytes
// (DefaultSize if 0), for records of shape s.
func Create(path string, id Identity, s Shape, size int64) (*Log, error) {
	if size == 0 {
		size = DefaultSize
	}
	if len(id.Tier) > maxTierID {
		return nil, fmt.Errorf("run log: tier ID %q is longer than %d bytes", id.Tier, maxTierID)
	}
	rs := RecordSize(s)
	n := (size - headerSize) / int64(rs)
	if n < 16 {
		return nil, fmt.Errorf("run log: %d bytes hold fewer than 16 records", size)
	}
	size = headerSize + n*int64(rs)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("run log: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("run log: %w", err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("run log: mmap %s: %w", path, err)
	}
	l := &Log{f: f, m: m, shape: s, recSize: rs, cap: uint64(n), next: 1}
	copy(m[hMagic:], magic)
	le := binary.LittleEndian
	le.PutUint32(m[hVersion:], version)
	le.PutUint32(m[hRecSize:], uint32(rs))
	le.PutUint64(m[hCap:], uint64(n))
	le.PutUint64(m[hEpoch:], id.Epoch)
	le.PutUint32(m[hWords:], uint32(s.Words))
	le.PutUint32(m[hLocs:], uint32(s.Locs))
	le.PutUint32(m[hSums:], uint32(s.Sums))
	le.PutUint32(m[hEpochs:], uint32(s.Epochs))
	le.PutUint32(m[hTierLen:], uint32(len(id.Tier)))
	copy(m[hTier:], id.Tier)
	copy(m[hBoot:hBoot+bootIDLen], bootID())
	le.PutUint32(m[hCRC:], headerCRC(m, version))
	return l, nil
}

// word is the 64-bit header field at off, for stores that a kill cannot tear.
func (l *Log) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&l.m[off])) }

// Append adds the record of a change to a line. It reports whether the ring is half full: time for
// a checkpoint, whose Committed makes room. A record the ring has no room for is not written, and
// the log is unusable until a checkpoint commits past it.
func (l *Log) Append(op meta.Op) (half bool) {
	seq := l.next
	l.next++
	if seq-l.committed > l.cap {
		atomic.StoreUint64(l.word(hLost), seq)
		return true
	}
	r := l.m[headerSize+int(seq%l.cap)*l.recSize:][:l.recSize]
	le := binary.LittleEndian
	le.PutUint64(r[rSeq:], seq)
	le.PutUint64(r[rLine:], op.Rec.Line)
	le.PutUint32(r[rSlot:], op.Rec.Slot)
	var flags uint32
	if op.Delete {
		flags = flagDelete
	}
	le.PutUint32(r[rFlags:], flags)
	s := l.shape
	words := r[rBits:]
	for _, w := range []struct {
		n    int
		from []uint64
	}{{s.Words, op.Rec.Valid}, {s.Words, op.Rec.Dirty}, {s.Words, op.Rec.Zero}, {s.Locs, op.Rec.Loc}, {s.Epochs, op.Rec.Epoch}} {
		for k := range w.n {
			var x uint64
			if !op.Delete && k < len(w.from) {
				x = w.from[k]
			}
			le.PutUint64(words[8*k:], x)
		}
		words = words[8*w.n:]
	}
	for k := range s.Sums {
		var x uint32
		if !op.Delete && k < len(op.Rec.Sum) {
			x = op.Rec.Sum[k]
		}
		le.PutUint32(words[4*k:], x)
	}
	end := rBits + 8*(3*s.Words+s.Locs+s.Epochs) + 4*s.Sums
	le.PutUint32(r[end:], crc32c.Checksum(r[:end]))
	return seq-l.committed == l.cap/2
}

// Last returns the sequence number of the last record appended (0 if none): a checkpoint notes it
// when it takes its snapshot, and passes it to Committed once the store holds the snapshot.
func (l *Log) Last() uint64 { return l.next - 1 }

// Committed records that the metadata store holds every change up to record seq: a replay starts
// after it, and the ring may reuse its room.
func (l *Log) Committed(seq uint64) {
	if seq > l.committed {
		l.committed = seq
		atomic.StoreUint64(l.word(hWatermark), seq)
	}
}

// Close unmaps the log and closes its file, leaving its content as it is.
func (l *Log) Close() error {
	if l == nil || l.m == nil {
		return nil
	}
	err := unix.Munmap(l.m)
	l.m = nil
	return errors.Join(err, l.f.Close())
}

// Replay reads the log at path and calls fn with each change recorded after the watermark, in
// order, up to the first record that is missing or torn. found is false, with no error, when there
// is no file. A log of another tier or run, one for other lines (s's words of bits, location words,
// checksums), or one that lost records, is refused with an error wrapping ErrUnusable, before fn
// is called. A record's Loc is nil when its location words are all 0, as in the slot layout, its
// Sum nil when its checksums are all 0, and its Epoch nil when its epochs are all 0. A log from
// before checksums (version 3 or older) replays whatever s.Sums is, its records without
// checksums: a record may have none, where one without the locations its layout needs could not
// be read. A log's epochs need not be s.Epochs: records without them (a log written in address
// order, or before epochs) replay without, and records with them as they are, for the caller to
// use or not.
func Replay(path string, id Identity, s Shape, fn func(meta.Op) error) (found bool, err error) {
	words, locs, sums := s.Words, s.Locs, s.Sums
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("run log: %w", err)
	}
	unusable := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrUnusable, path, fmt.Sprintf(format, args...))
	}
	le := binary.LittleEndian
	if len(b) < headerSize || string(b[hMagic:hMagic+len(magic)]) != magic {
		return true, unusable("not a run log")
	}
	// The version says what the CRC covers; a damaged version fails the CRC all the same.
	v := le.Uint32(b[hVersion:])
	if headerCRC(b, v) != le.Uint32(b[hCRC:]) {
		return true, unusable("its header is damaged")
	}
	if v < 1 || v > version {
		return true, unusable("format version %d, this tierblk reads 1 to %d", v, version)
	}
	tierLen := min(int(le.Uint32(b[hTierLen:])), maxTierID)
	if tier := string(b[hTier : hTier+tierLen]); tier != id.Tier {
		return true, unusable("written for SSD tier %q, this one is %q", tier, id.Tier)
	}
	if boot := string(b[hBoot : hBoot+bootIDLen]); boot != string(bootID()) {
		// The SSD's page cache, which held the data that the records find, did not survive the
		// reboot: a log kept on a file system that does is refused.
		return true, unusable("written before the machine last booted (boot %q)", strings.TrimRight(boot, "\x00"))
	}
	if e := le.Uint64(b[hEpoch:]); e != id.Epoch {
		return true, unusable("written by run %d of this SSD tier, the last was %d", e, id.Epoch)
	}
	if w := int(le.Uint32(b[hWords:])); w != words {
		return true, unusable("records of %d-word bitmaps, this tier's lines need %d", w, words)
	}
	var logLocs int // none before version 3
	if v >= 3 {
		logLocs = int(le.Uint32(b[hLocs:]))
	}
	if logLocs != locs {
		return true, unusable("records of %d location words, this tier's lines need %d", logLocs, locs)
	}
	// None before version 4: such a log replays whatever sums is, its records without checksums.
	var logSums int
	if v >= 4 {
		logSums = int(le.Uint32(b[hSums:]))
		if logSums != sums {
			return true, unusable("records of %d checksums, this tier's lines need %d", logSums, sums)
		}
	}
	var logEpochs int // none before version 5
	if v >= 5 {
		logEpochs = int(le.Uint32(b[hEpochs:]))
	}
	rs, n := int(le.Uint32(b[hRecSize:])), le.Uint64(b[hCap:])
	if rs != recordSize(Shape{words, locs, logSums, logEpochs}, bitmaps(v)) || n == 0 || uint64(len(b)) < headerSize+n*uint64(rs) {
		return true, unusable("its ring does not fit the file")
	}
	committed, lost := le.Uint64(b[hWatermark:]), le.Uint64(b[hLost:])
	if lost > committed {
		return true, unusable("the ring was full: change %d and others were not logged", lost)
	}
	rLocs := rBits + 8*bitmaps(v)*words
	rEpochs := rLocs + 8*locs
	rSums := rEpochs + 8*logEpochs
	end := rSums + 4*logSums
	for seq := committed + 1; seq-committed <= n; seq++ {
		r := b[headerSize+int(seq%n)*rs:][:rs]
		if le.Uint64(r[rSeq:]) != seq || crc32c.Checksum(r[:end]) != le.Uint32(r[end:]) {
			break // the tail: never written, or torn by the kill
		}
		op := meta.Op{Rec: meta.Line{Line: le.Uint64(r[rLine:]), Slot: le.Uint32(r[rSlot:])}}
		if le.Uint32(r[rFlags:])&flagDelete != 0 {
			op = meta.Op{Delete: true, Rec: meta.Line{Line: op.Rec.Line}}
		} else {
			op.Rec.Valid, op.Rec.Dirty = words64(r[rBits:], words), words64(r[rBits+8*words:], words)
			if bitmaps(v) > 2 {
				op.Rec.Zero = words64(r[rBits+16*words:], words)
			}
			op.Rec.Loc = words64(r[rLocs:], locs)
			op.Rec.Epoch = words64(r[rEpochs:], logEpochs)
			op.Rec.Sum = words32(r[rSums:], logSums)
		}
		if err := fn(op); err != nil {
			return true, err
		}
	}
	return true, nil
}

// bootID returns the ID the kernel gave this boot, padded to bootIDLen bytes (zeros where the
// kernel does not say).
func bootID() []byte {
	id := make([]byte, bootIDLen)
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	copy(id, strings.TrimSpace(string(b)))
	return id
}

// words64 decodes n little-endian words, nil if all are zero (as the store reads empty bitmaps)
// or n is 0.
func words64(b []byte, n int) []uint64 { return decodeLE(b, n, 8, binary.LittleEndian.Uint64) }

// words32 is words64 for n 32-bit words: the checksums.
func words32(b []byte, n int) []uint32 { return decodeLE(b, n, 4, binary.LittleEndian.Uint32) }

func decodeLE[T uint32 | uint64](b []byte, n, size int, get func([]byte) T) []T {
	w := make([]T, n)
	zero := true
	for i := range w {
		w[i] = get(b[size*i:])
		zero = zero && w[i] == 0
	}
	if zero {
		return nil
	}
	return w
}
