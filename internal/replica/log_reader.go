package replica

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/pkg/backend"
)

// The reader fetches the device in windows that start small and double as it reads on, up to
// maxReadAhead: the device is a peer's export, and a round trip per record would make a drain of
// small records crawl, but a check of a log that holds a few records should not read megabytes.
const (
	minReadAhead = 64 << 10
	maxReadAhead = 1 << 20
)

// Reader reads a log from its tail (the drain's side, or a check).
type Reader struct {
	dev backend.Backend
	sb  super
	end int64 // the record area's end
	at  Position

	// win holds the device's bytes [winOff, winOff+len(win)): what the last read fetched.
	win    []byte
	winOff int64
	ahead  int64 // the size of the next window
}

// Open reads the superblock (the valid copy with the highest generation). It refuses a device that
// holds no replica log, a log of a format version it does not know, and a device whose size is not
// the one the log was made on (a record area of another size would wrap elsewhere).
func Open(dev backend.Backend) (*Reader, error) {
	sb, err := readSuper(dev)
	if err != nil {
		return nil, err
	}
	if size := dev.Size(); size != sb.deviceSize {
		return nil, fmt.Errorf("replica: device is %d bytes but its log was made on a device of %d bytes", size, sb.deviceSize)
	}
	return &Reader{dev: dev, sb: sb, end: sb.deviceSize &^ (sector - 1), at: sb.tail}, nil
}

// ID is the id of the log the reader reads.
func (r *Reader) ID() uint64 { return r.sb.id }

// VolumeSize is the size of the volume whose changes the log holds.
func (r *Reader) VolumeSize() int64 { return r.sb.volumeSize }

// Tail is where the superblock says the log starts.
func (r *Reader) Tail() Position { return r.sb.tail }

// Drained reports whether Drain applied the log without its primary (and nothing has written it
// since): the backend may hold changes newer than any cache the primary had.
func (r *Reader) Drained() bool { return r.sb.drained }

// End is the position after the last record Next returned (the tail before any).
func (r *Reader) End() Position { return r.at }

// Next returns the next record in order. It returns io.EOF at the end of the valid log: the first
// place whose record is missing, torn (a checksum fails), of another log id, or whose seq is not
// the one expected. A record never straddles the end of the record area: where the record at the
// current position is not the expected one, Next tries the start of the record area with the same
// expected seq before it says io.EOF. A record whose checksums hold but whose fields make no sense
// is an error, not the end: the log is damaged, and silently stopping there would drop what
// follows.
func (r *Reader) Next() (Record, error) {
	rec, err := r.next()
	if err != nil {
		return Record{}, err
	}
	// The data is a view of the read-ahead window, which the next read reuses.
	rec.Data = append([]byte(nil), rec.Data...)
	return rec, nil
}

// next is Next with Data a view of the read-ahead window, valid until the next call: Drain applies
// each record before it reads the next, and need not copy.
func (r *Reader) next() (Record, error) {
	rec, ok, err := r.readAt(r.at.Pos, r.at.Seq)
	if err == nil && !ok && r.at.Pos != areaStart {
		rec, ok, err = r.readAt(areaStart, r.at.Seq)
	}
	if err != nil {
		return Record{}, err
	}
	if !ok {
		return Record{}, io.EOF
	}
	return rec, nil
}

// readAt reads the record at pos and reports whether it is the one expected: this log's, of seq,
// and whole. On success it moves r.at past it.
func (r *Reader) readAt(pos int64, seq uint64) (Record, bool, error) {
	h, err := r.bytes(pos, hdrSize)
	if err != nil {
		return Record{}, false, err
	}
	if binary.LittleEndian.Uint32(h[rMagic:]) != recMagic ||
		binary.LittleEndian.Uint32(h[rHdrCRC:]) != crc32c.Checksum(h[:rHdrCRC]) ||
		binary.LittleEndian.Uint64(h[rID:]) != r.sb.id ||
		binary.LittleEndian.Uint64(h[rSeq:]) != seq {
		return Record{}, false, nil
	}
	rec := Record{
		Seq:  seq,
		Kind: Kind(h[rKind]),
		Off:  int64(binary.LittleEndian.Uint64(h[rOff:])),
		Len:  int64(binary.LittleEndian.Uint64(h[rLen:])),
	}
	dataLen := binary.LittleEndian.Uint64(h[rDataLen:])
	dataCRC := binary.LittleEndian.Uint32(h[rDataCRC:])
	damaged := func(why string, args ...any) (Record, bool, error) {
		return Record{}, false, fmt.Errorf("replica: log damaged: record seq %d at %d: %s", seq, pos, fmt.Sprintf(why, args...))
	}
	switch {
	case !rec.Kind.valid():
		return damaged("unknown kind %d", uint8(rec.Kind))
	case rec.Off < 0 || rec.Len < 0 || rec.Len > r.sb.volumeSize || rec.Off > r.sb.volumeSize-rec.Len:
		return damaged("range %d+%d outside the volume of %d bytes", rec.Off, rec.Len, r.sb.volumeSize)
	case rec.Kind == KindWrite && dataLen != uint64(rec.Len), rec.Kind != KindWrite && dataLen != 0:
		return damaged("%s of %d bytes with %d bytes of data", rec.Kind, rec.Len, dataLen)
	case dataLen > uint64(r.end-pos-hdrSize):
		return damaged("%d bytes of data run past the end of the record area", dataLen)
	}
	data, err := r.bytes(pos+hdrSize, int(dataLen))
	if err != nil {
		return Record{}, false, err
	}
	if crc32c.Checksum(data) != dataCRC {
		return Record{}, false, nil // torn: its write did not complete
	}
	rec.Data = data
	endPos := pos + recordSize(int64(dataLen))
	if endPos == r.end {
		endPos = areaStart
	}
	r.at = Position{Seq: seq + 1, Pos: endPos}
	return rec, true, nil
}

// bytes returns the device's n bytes at off, which lie within the record area, as a view of the
// read-ahead window.
func (r *Reader) bytes(off int64, n int) ([]byte, error) {
	if off >= r.winOff && off+int64(n) <= r.winOff+int64(len(r.win)) {
		i := off - r.winOff
		return r.win[i : i+int64(n)], nil
	}
	r.ahead = min(max(r.ahead*2, minReadAhead), maxReadAhead)
	want := min(max(int64(n), r.ahead), r.end-off)
	if int64(cap(r.win)) < want {
		r.win = make([]byte, want)
	}
	r.win = r.win[:want]
	if _, err := r.dev.ReadAt(r.win, off); err != nil {
		r.win = r.win[:0]
		return nil, fmt.Errorf("replica: read log at %d: %w", off, err)
	}
	r.winOff = off
	return r.win[:n], nil
}

// ReadRecord reads back the record of t, written, from the device, checked as a reader checks it.
func (l *Log) ReadRecord(t Ticket) (Record, error) {
	r := &Reader{dev: l.dev, sb: super{id: l.id, volumeSize: l.volumeSize}, end: l.end}
	rec, ok, err := r.readAt(t.Pos, t.Seq)
	if err != nil {
		return Record{}, err
	}
	if !ok || rec.Kind != t.Kind || rec.Off != t.Off || rec.Len != t.Len {
		return Record{}, fmt.Errorf("replica: record seq %d at %d is not on the device as written", t.Seq, t.Pos)
	}
	return rec, nil
}

// grew reports whether a record follows the last one Next returned now, read from the device
// again: whether a primary wrote the log since.
func (r *Reader) grew() bool {
	r.win = r.win[:0]
	at := r.at
	_, err := r.Next()
	r.at = at
	return err == nil
}
