package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FioLogWriter records requests as a fio version 3 iolog, the format `fio --read_iolog` replays
// and the "fio" format here reads: a user records a live workload once (tierblk serve
// --record-trace), then replays it against every policy and cache size. It is safe for
// concurrent use, and buffered: call Flush to push what is recorded so far to the writer.
type FioLogWriter struct {
	mu       sync.Mutex
	bw       *bufio.Writer
	filename string
	start    time.Time
	buf      []byte
	closed   bool
}

// NewFioLogWriter starts a log on w for requests to one file (or device) name, which fio opens
// on replay (override it there with --replay_redirect). The name must be non-empty, without
// blanks, and at most 256 bytes, as fio reads it.
func NewFioLogWriter(w io.Writer, filename string) (*FioLogWriter, error) {
	if filename == "" || len(filename) > 256 || strings.ContainsAny(filename, " \t\r\n") {
		return nil, fmt.Errorf("fio iolog: file name %q must be 1 to 256 bytes without blanks", filename)
	}
	l := &FioLogWriter{bw: bufio.NewWriterSize(w, 256<<10), filename: filename, start: time.Now()}
	l.bw.WriteString(fioV3Header + "\n")
	l.fileAction("add")
	l.fileAction("open")
	return l, nil
}

// prefix starts a line in l.buf: "timestamp filename action"; l.mu is held or l is not shared yet.
func (l *FioLogWriter) prefix(act string) []byte {
	b := strconv.AppendInt(l.buf[:0], time.Since(l.start).Microseconds(), 10)
	b = append(b, ' ')
	b = append(b, l.filename...)
	b = append(b, ' ')
	return append(b, act...)
}

// fileAction writes a file management line. Errors stick in bw and surface at Flush or Close.
func (l *FioLogWriter) fileAction(act string) {
	l.buf = append(l.prefix(act), '\n')
	l.bw.Write(l.buf)
}

// Write records one request, stamped with the microseconds since the writer was created (fio's
// unit for version 3 timestamps; r.Time is not used). Reads and writes keep their direction;
// OpOther with a length is recorded as a trim, without one as a sync (a flush).
func (l *FioLogWriter) Write(r Request) error {
	act := "read"
	switch {
	case r.Op == OpWrite:
		act = "write"
	case r.Op == OpOther && r.Length > 0:
		act = "trim"
	case r.Op == OpOther:
		act = "sync"
	}
	if r.Offset < 0 || r.Length < 0 || r.Length > math.MaxUint32 {
		return fmt.Errorf("fio iolog: range %d+%d: fio takes offsets from 0 and 32-bit lengths", r.Offset, r.Length)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("fio iolog: write after close")
	}
	b := append(l.prefix(act), ' ')
	b = strconv.AppendInt(b, r.Offset, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, r.Length, 10)
	b = append(b, '\n')
	l.buf = b
	_, err := l.bw.Write(b)
	return err
}

// Flush writes the buffered records to the underlying writer.
func (l *FioLogWriter) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bw.Flush()
}

// Close ends the log with the file's close action and flushes it; it does not close the
// underlying writer.
func (l *FioLogWriter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.fileAction("close")
	return l.bw.Flush()
}
