package trace

import (
	"errors"
	"fmt"
)

// Error is a failure to read a trace: it names the file, where in it the reader stopped (a record
// number for binary formats, a line number for text ones, both 1-based; 0 when the problem is the
// file as a whole) and the format the reader expected, so a user can look at the bad spot.
type Error struct {
	File   string
	Format string
	// Record is the 1-based record (binary formats) or line (text formats) number; 0 for the file.
	Record int64
	// Line reports whether Record counts lines.
	Line bool
	Err  error
}

func (e *Error) Error() string {
	where := ""
	switch {
	case e.Record > 0 && e.Line:
		where = fmt.Sprintf("line %d: ", e.Record)
	case e.Record > 0:
		where = fmt.Sprintf("record %d: ", e.Record)
	}
	format := ""
	if e.Format != "" {
		format = e.Format + ": "
	}
	return fmt.Sprintf("trace %s: %s%s%v", e.File, where, format, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrTruncated is wrapped by every error about a file that ends in the middle of a record, so
// callers can tell a cut-off download from a foreign file with errors.Is.
var ErrTruncated = errors.New("truncated record")
