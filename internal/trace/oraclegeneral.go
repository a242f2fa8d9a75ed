package trace

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// oracleGeneral is libCacheSim's binary object trace: 24-byte little-endian records
//
//	u32 clock_time, u64 obj_id, u32 obj_size, i64 next_access_vtime
//
// where next_access_vtime is the index of the object's next request (-1 or INT64_MAX: none).
// It has no magic number: auto-detection needs the .oracleGeneral extension or records whose
// clock never goes back and whose next accesses all lie ahead.
const oracleGeneralSize = 24

// OracleGeneralStride is the byte distance between consecutive object ids in the byte ranges an
// oracleGeneral reader returns: a request's Offset is obj_id*OracleGeneralStride (wrapped to a
// non-negative int64) and its Length obj_size. An object trace has no addresses, so this only
// lets --block-size cut big objects into blocks; simulate object traces with block size 0, where
// the key is the object id, as in libCacheSim.
const OracleGeneralStride = 4096

type oracleGeneralRecord struct {
	clock, size uint32
	id          uint64
	next        int64
}

func decodeOracleGeneral(b []byte) oracleGeneralRecord {
	le := binary.LittleEndian
	return oracleGeneralRecord{clock: le.Uint32(b), id: le.Uint64(b[4:]), size: le.Uint32(b[12:]), next: int64(le.Uint64(b[16:]))}
}

// looksOracleGeneral checks the records in head: the clock never goes back and every next access
// is none or later than the record itself. With the extension as a hint one record suffices;
// without, the first 8 (or the whole file if shorter, at least 2) must pass.
func looksOracleGeneral(head []byte, hinted bool) bool {
	n := min(len(head)/oracleGeneralSize, 64)
	whole := len(head) < detectSize && len(head)%oracleGeneralSize == 0
	if n < 1 || !hinted && n < 8 && !(whole && n >= 2) {
		return false
	}
	var prev uint32
	for i := range n {
		rec := decodeOracleGeneral(head[i*oracleGeneralSize:])
		if rec.clock < prev || rec.next != -1 && rec.next <= int64(i) {
			return false
		}
		prev = rec.clock
	}
	return true
}

type oracleGeneralReader struct {
	in *input
	n  int64
}

// Next decodes one record: Time is clock_time, ID obj_id, Length obj_size, Op OpRead (the format
// has no direction). Records of size 0 are returned as they are (libCacheSim skips them by
// default; with block size 0 they still count as requests for their key).
func (r *oracleGeneralReader) Next() (Request, error) {
	b, err := readRecord(r.in.br, oracleGeneralSize)
	if err != nil {
		if err == io.EOF {
			return Request{}, err
		}
		return Request{}, &Error{File: r.in.name, Format: "oraclegeneral", Record: r.n + 1, Err: err}
	}
	r.n++
	rec := decodeOracleGeneral(b)
	return Request{
		Time:   int64(rec.clock),
		ID:     rec.id,
		Offset: int64(rec.id * OracleGeneralStride & math.MaxInt64),
		Length: int64(rec.size),
		Op:     OpRead,
	}, nil
}

func (r *oracleGeneralReader) Close() error { return r.in.Close() }

// WriteOracleGeneral writes reqs as an oracleGeneral trace that libCacheSim's cachesim reads:
// clock_time is Time (which must fit a u32), obj_id ID, obj_size Length (which must fit a u32),
// and next_access_vtime the index of the next request for the same ID, or -1, computed here so
// that oracle policies (Belady) work on the file too.
func WriteOracleGeneral(w io.Writer, reqs []Request) error {
	next := make([]int64, len(reqs))
	last := make(map[uint64]int64, len(reqs)/4)
	for i := len(reqs) - 1; i >= 0; i-- {
		id := reqs[i].ID
		if j, ok := last[id]; ok {
			next[i] = j
		} else {
			next[i] = -1
		}
		last[id] = int64(i)
	}
	ow := NewOracleGeneralWriter(w)
	for i, r := range reqs {
		if err := ow.Write(r, next[i]); err != nil {
			return err
		}
	}
	return ow.Flush()
}

// OracleGeneralWriter writes an oracleGeneral trace one record at a time, for traces too long to
// hold: the caller gives each record's next access, or -1 where it is none or not known (only
// oracle policies such as Belady read it).
type OracleGeneralWriter struct {
	bw  *bufio.Writer
	n   int64
	rec [oracleGeneralSize]byte
}

// NewOracleGeneralWriter writes to w through a large buffer; Flush writes out the rest.
func NewOracleGeneralWriter(w io.Writer) *OracleGeneralWriter {
	return &OracleGeneralWriter{bw: bufio.NewWriterSize(w, bufSize)}
}

// Write writes r: clock_time is Time (which must fit a u32), obj_id ID, obj_size Length (which
// must fit a u32), and next_access_vtime next.
func (w *OracleGeneralWriter) Write(r Request, next int64) error {
	w.n++
	if r.Time < 0 || r.Time > math.MaxUint32 || r.Length < 0 || r.Length > math.MaxUint32 {
		return fmt.Errorf("oraclegeneral: request %d: time %d or length %d does not fit 32 bits", w.n, r.Time, r.Length)
	}
	le := binary.LittleEndian
	le.PutUint32(w.rec[0:], uint32(r.Time))
	le.PutUint64(w.rec[4:], r.ID)
	le.PutUint32(w.rec[12:], uint32(r.Length))
	le.PutUint64(w.rec[16:], uint64(next))
	_, err := w.bw.Write(w.rec[:])
	return err
}

// Flush writes out the buffered records.
func (w *OracleGeneralWriter) Flush() error { return w.bw.Flush() }
