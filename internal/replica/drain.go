package replica

import (
	"errors"
	"fmt"
	"io"

	"github.com/tierblk/tierblk/pkg/backend"
)

// DrainStats counts what Drain applied.
type DrainStats struct {
	Records, Writes, Trims, Zeroes, Flushes int64
	Bytes                                   int64 // bytes written to the backend by write records
}

// zeroChunk bounds the buffer of zeroes Drain writes where the backend cannot write zeroes itself.
const zeroChunk = 1 << 20

// Drain applies the log on dev to b from its tail, in order: each write record with b.WriteAt,
// trims with b's Trim where b is a backend.Trimmer (skipped otherwise: a trimmed range may read as
// its old data), zeroes with b's WriteZeroes(off, len, false) where b is a backend.ZeroWriter, else
// by writing zero bytes in chunks of at most 1 MiB; b.Flush() at every flush record and at the
// end. Then it marks the log empty (the superblock's tail moved to the end of what was applied,
// dev flushed), so that a second Drain applies nothing. It refuses, before it writes anything, a
// log whose volume size differs from b.Size(). progress, if not nil, is called after each record.
//
// It must not run while a primary still writes the log. A drain cut short (an error, a crash)
// leaves the log as it was, and the next one applies it again from the same tail: records applied
// again in the same order leave the same result.
func Drain(dev, b backend.Backend, progress func(DrainStats)) (DrainStats, error) {
	var st DrainStats
	r, err := Open(dev)
	if err != nil {
		return st, err
	}
	if r.VolumeSize() != b.Size() {
		return st, fmt.Errorf("replica: drain: the log is of a volume of %d bytes but the backend is %d bytes; refusing to apply it",
			r.VolumeSize(), b.Size())
	}
	var zeroes []byte
	for {
		rec, err := r.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("replica: drain: %w", err)
		}
		if err := apply(b, &rec, &zeroes); err != nil {
			return st, fmt.Errorf("replica: drain: record seq %d (%s %d+%d): %w", rec.Seq, rec.Kind, rec.Off, rec.Len, err)
		}
		st.Records++
		switch rec.Kind {
		case KindWrite:
			st.Writes++
			st.Bytes += int64(len(rec.Data))
		case KindTrim:
			st.Trims++
		case KindZero:
			st.Zeroes++
		case KindFlush:
			st.Flushes++
		}
		if progress != nil {
			progress(st)
		}
	}
	if err := b.Flush(); err != nil {
		return st, fmt.Errorf("replica: drain: flush backend: %w", err)
	}
	end := r.End()
	if end.Seq == r.Tail().Seq && r.sb.drained {
		return st, nil // nothing applied: the superblock says so already
	}
	// Only now that the backend holds every record durably may the log forget them. The flag
	// tells the primary, should it come back, that the backend moved on without it.
	s := r.sb
	s.gen++
	s.tail = end
	s.drained = true
	if err := writeSuper(dev, &s); err != nil {
		return st, fmt.Errorf("replica: drain: applied %d records but could not mark the log empty: %w", st.Records, err)
	}
	return st, nil
}

// apply makes one record's change to b. zeroes holds the zero buffer once one was needed.
func apply(b backend.Backend, rec *Record, zeroes *[]byte) error {
	switch rec.Kind {
	case KindWrite:
		_, err := b.WriteAt(rec.Data, rec.Off)
		return err
	case KindTrim:
		if t, ok := b.(backend.Trimmer); ok && rec.Len > 0 {
			return t.Trim(rec.Off, rec.Len)
		}
		return nil
	case KindZero:
		if rec.Len == 0 {
			return nil
		}
		if z, ok := b.(backend.ZeroWriter); ok {
			return z.WriteZeroes(rec.Off, rec.Len, false)
		}
		if want := min(rec.Len, zeroChunk); int64(len(*zeroes)) < want {
			*zeroes = make([]byte, want)
		}
		for off, end := rec.Off, rec.Off+rec.Len; off < end; {
			n := min(int64(len(*zeroes)), end-off)
			if _, err := b.WriteAt((*zeroes)[:n], off); err != nil {
				return err
			}
			off += n
		}
		return nil
	case KindFlush:
		return b.Flush()
	}
	return fmt.Errorf("unknown record kind %d", uint8(rec.Kind))
}
