package volume

import (
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/trace"
)

// Recorder receives the requests a recording device serves (trace.FioLogWriter is one).
type Recorder interface {
	Write(trace.Request) error
}

// Recording wraps v so that every read, write, trim and write-zeroes is also written to rec, in the
// order requests arrive, for replay in the simulator. Recording never fails a request: the first
// recording error goes to onErr and recording stops. The wrapper has all of v's methods, its
// asynchronous reads and writes (recorded as well), plugging and run ends included: a frontend
// serves a recorded export as it serves any other.
func Recording(v *Volume, rec Recorder, onErr func(error)) Device {
	return &recording{Volume: v, rec: rec, onErr: onErr}
}

type recording struct {
	*Volume
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
	return r.Volume.ReadAt(p, off)
}

// ReadAtAsync records a read the volume starts; one it leaves to ReadAt is recorded there.
func (r *recording) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	if !r.Volume.ReadAtAsync(p, off, done) {
		return false
	}
	r.record(trace.OpRead, off, int64(len(p)))
	return true
}

// WriteAtAsync records a write the volume starts, as ReadAtAsync does.
func (r *recording) WriteAtAsync(p []byte, off int64, fua bool, done func(error)) bool {
	if !r.Volume.WriteAtAsync(p, off, fua, done) {
		return false
	}
	r.record(trace.OpWrite, off, int64(len(p)))
	return true
}

func (r *recording) WriteAt(p []byte, off int64, fua bool) error {
	r.record(trace.OpWrite, off, int64(len(p)))
	return r.Volume.WriteAt(p, off, fua)
}

func (r *recording) Trim(off, length int64, fua bool) error {
	r.record(trace.OpOther, off, length)
	return r.Volume.Trim(off, length, fua)
}

// WriteZeroes is recorded as a write: for a cache it replaces the range's contents like one.
func (r *recording) WriteZeroes(off, length int64, f ZeroFlags) error {
	r.record(trace.OpWrite, off, length)
	return r.Volume.WriteZeroes(off, length, f)
}
