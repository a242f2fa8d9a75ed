// Package trace reads block I/O traces (vscsi, oracleGeneral, ARC, MSR Cambridge, blkparse, fio
// iolog, CSV) into one Request stream, transparently decompressing .gz, .zst and .xz files.
//
// Open picks a reader by format name or, with "auto", by the file's content; Formats lists the
// names. Readers parse in place in a large read buffer and allocate nothing per request, so a
// simulation is never waiting on them. FioLogWriter records live I/O in a format that both fio
// and this package replay; WriteOracleGeneral writes libCacheSim's binary format.
//
// A reader must never guess silently: a truncated or foreign file is an error that names the file,
// the record number and the format.
package trace

// Op is a request's direction.
type Op uint8

// Request operations.
const (
	OpRead Op = iota
	OpWrite
	OpOther // anything else a trace records (trim, flush, unknown SCSI commands)
)

// Request is one traced I/O.
type Request struct {
	// Time is the request's timestamp in the trace's own unit (kept for ordering and warm-up).
	Time int64
	// ID is the key libCacheSim uses for one key per request: the lbn for vscsi, the object id for
	// oracleGeneral, the first page for arc, the offset in bytes for the others.
	ID uint64
	// Offset and Length are the byte range the request touches (used to split into blocks).
	Offset int64
	Length int64
	Op     Op
	// Volume tells apart the disks of a multi-volume trace (MSR: host and disk number); 0 otherwise.
	Volume uint32
}

// Reader yields requests in trace order. Next returns io.EOF after the last request.
type Reader interface {
	Next() (Request, error)
	Close() error
}

// VolumeNamer is implemented by the readers of traces that name several volumes (msr: host and
// disk, blkparse: major,minor, fio: the file name, csv with a volume column). Volumes are
// numbered from 0 in the order the trace first names them; VolumeName returns the name of a
// number a request carried ("" for any other).
type VolumeNamer interface {
	VolumeName(volume uint32) string
}
