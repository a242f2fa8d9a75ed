package volume

import (
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/trace"
)

// Recorder receives the requests a recording device serves (trace.FioLogWriter is one).
type Recorder interface {
	Write(trace.Request) error
}

// Recording wraps d so that every read, write, trim and write-zeroes is also written to rec, in the
// order requests arrive, for replay in the simulator. Recording never fails a request: the first
// recording error goes to onErr and recording stops.
func Recording(d Device, rec Recorder, onErr func(error)) Device {
	return &recording{Device: d, rec: rec, onErr: onErr}
}

type recording struct {
	Device
	rec     Recorder
	onErr   func(error)
	stopped atomic.Bool
}

func (r *recording) record(op trace.Op, off, length int64) {
	if r.stopped.Load() {
		return
	}
	if err := r.rec.Write(trace.Request{Offset: off, Length: length, ID: uint64(off), Op: op}); err != nil {
		if !r.stopped.Swap(true) && r.onErr != nil {
			r.onErr(err)
		}
	}
}

func (r *recording) ReadAt(p []byte, off int64) error {
	r.record(trace.OpRead, off, int64(len(p)))
	return r.Device.ReadAt(p, off)
}

func (r *recording) WriteAt(p []byte, off int64, fua bool) error {
	r.record(trace.OpWrite, off, int64(len(p)))
	return r.Device.WriteAt(p, off, fua)
}

func (r *recording) Trim(off, length int64, fua bool) error {
	r.record(trace.OpOther, off, length)
	return r.Device.Trim(off, length, fua)
}

// WriteZeroes is recorded as a write: for a cache it replaces the range's contents like one.
func (r *recording) WriteZeroes(off, length int64, f ZeroFlags) error {
	r.record(trace.OpWrite, off, length)
	return r.Device.WriteZeroes(off, length, f)
}
