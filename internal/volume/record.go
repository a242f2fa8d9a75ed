package volume

import (
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/trace"
)

// Recorder receives the requests a recording observer hears (trace.FioLogWriter is one).
type Recorder interface {
	Write(trace.Request) error
}

// Recording is an Observer that writes every request a volume takes to rec, in the order they
// arrive, for replay in the simulator. It never fails a request: the first recording error goes to
// onErr and recording stops.
func Recording(rec Recorder, onErr func(error)) Observer {
	return &recording{rec: rec, onErr: onErr}
}

type recording struct {
	rec     Recorder
	onErr   func(error)
	stopped atomic.Bool
}

func (r *recording) Observe(op trace.Op, off, length int64) {
	if r.stopped.Load() {
		return
	}
	if err := r.rec.Write(trace.Request{Offset: off, Length: length, ID: uint64(off), Op: op}); err != nil {
		if !r.stopped.Swap(true) && r.onErr != nil {
			r.onErr(err)
		}
	}
}
