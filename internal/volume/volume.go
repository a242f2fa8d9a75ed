// Package volume is the single block API that every frontend (NBD, ublk) serves: read, write with
// optional FUA, flush, trim, write-zeroes, cache hints and the size, with the range and permission
// checks done once here rather than in each frontend.
//
// A Volume never reorders or merges requests and never holds data of its own: durability and
// caching belong to the backend beneath it (a plain backend, or later the cache engine, which is a
// backend too). It must never let a request outside the device reach the backend.
package volume

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/trace"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Errors a frontend maps onto its protocol's error codes. Backend errors pass through wrapped.
var (
	// ErrOutOfRange: the request reaches past the end of the device.
	ErrOutOfRange = backend.ErrOutOfRange
	// ErrReadOnly: a write-type request on a read-only volume.
	ErrReadOnly = backend.ErrReadOnly
	// ErrNotSupported: the backend cannot do this (for example a fast zero it cannot do fast).
	ErrNotSupported = backend.ErrNotSupported
	// ErrInvalid: a malformed request (negative offset, zero length where one is required).
	ErrInvalid = errors.New("volume: invalid request")
)

// Info describes what a volume can do; the NBD server turns it into transmission flags and the
// ublk driver into device parameters.
type Info struct {
	Size        int64
	ReadOnly    bool
	CanTrim     bool
	CanZero     bool // WriteZeroes is supported (emulated with writes when the backend lacks it)
	CanFastZero bool // WriteZeroes with Fast can be done without writing data
	CanFUA      bool
	MultiConn   bool // several connections see one consistent device (flush on one covers all)
	// Block sizes for clients: requests need not be aligned to Min; Preferred is the size below which
	// a read-modify-write may happen; Max is the largest request accepted.
	MinBlock, PreferredBlock, MaxBlock uint32
}

// ZeroFlags modify WriteZeroes.
type ZeroFlags struct {
	NoHole bool // the range must stay allocated (NBD_CMD_FLAG_NO_HOLE)
	Fast   bool // fail with ErrNotSupported rather than write data (NBD_CMD_FLAG_FAST_ZERO)
	FUA    bool
}

// Device is the block API both frontends serve. Concurrent calls are safe; calls on overlapping
// ranges complete in some order, as on a real disk.
type Device interface {
	Info() Info
	ReadAt(p []byte, off int64) error
	WriteAt(p []byte, off int64, fua bool) error
	Flush() error
	Trim(off, length int64, fua bool) error
	WriteZeroes(off, length int64, f ZeroFlags) error
	// Cache is a hint to bring a range into the cache; on an uncached volume it does nothing.
	Cache(off, length int64) error
}

// DefaultMaxBlock is the largest request a volume accepts unless told otherwise: 32 MiB, the
// limit NBD clients assume.
const DefaultMaxBlock = 32 << 20

// Volume serves a backend as a Device.
type Volume struct {
	b         backend.Backend
	info      Info
	trimmer   backend.Trimmer
	zeroer    backend.ZeroWriter
	fua       backend.FUAWriter
	cacher    cacher
	meter     Meter
	observers []Observer
}

// Meter records the requests of a volume served without a cache (cache.Meter), so that its
// export's statistics show its backend's traffic, errors and latency.
type Meter interface {
	Read(n int, d time.Duration, err error)
	Write(n int, d time.Duration, err error)
	// Failed records the error, if any, of another request: a flush, a trim, a write of zeroes.
	Failed(err error)
}

// cacher is a backend that can act on NBD_CMD_CACHE (the cache engine).
type cacher interface {
	Prefetch(off, length int64) error
}

// Options configure a Volume.
type Options struct {
	ReadOnly bool
	// MultiConn says the backend is safe for several connections (true for every backend tierblk
	// has: they share one device and one flush).
	MultiConn bool
	// Meter, if not nil, records every request that reaches the backend.
	Meter Meter
	// Observers hear of every read, write, trim and write-zeroes the volume takes (its range
	// checked), once, whichever path serves it: a trace recorder, the live miss-ratio curves.
	Observers []Observer
}

// Observer hears of the requests a volume serves, on the request's path: it must return at once
// and never fail or change a request.
type Observer interface {
	Observe(op trace.Op, off, length int64)
}

// New wraps b. The backend's optional abilities are detected once here.
func New(b backend.Backend, o Options) *Volume {
	v := &Volume{b: b, meter: o.Meter, observers: o.Observers}
	v.trimmer, _ = b.(backend.Trimmer)
	v.zeroer, _ = b.(backend.ZeroWriter)
	v.fua, _ = b.(backend.FUAWriter)
	v.cacher, _ = b.(cacher)
	ro := o.ReadOnly
	if r, ok := b.(backend.ReadOnlyReporter); ok && r.ReadOnly() {
		ro = true
	}
	v.info = Info{
		Size:           b.Size(),
		ReadOnly:       ro,
		CanTrim:        v.trimmer != nil && !ro,
		CanZero:        !ro,
		CanFastZero:    v.zeroer != nil && !ro,
		CanFUA:         !ro,
		MultiConn:      o.MultiConn,
		MinBlock:       1,
		PreferredBlock: 4096,
		MaxBlock:       DefaultMaxBlock,
	}
	return v
}

// Info implements Device.
func (v *Volume) Info() Info { return v.info }

// Waits counts the requests that waited on the backend's storage or network (backend.Waiter).
func (v *Volume) Waits() uint64 { return backend.WaitsOf(v.b) }

func (v *Volume) check(off, length int64, write bool) error {
	if write && v.info.ReadOnly {
		return ErrReadOnly
	}
	if off < 0 || length < 0 {
		return fmt.Errorf("%w: offset %d length %d", ErrInvalid, off, length)
	}
	return backend.CheckRange(off, length, v.info.Size)
}

// ReadAt implements Device.
func (v *Volume) ReadAt(p []byte, off int64) error {
	if err := v.check(off, int64(len(p)), false); err != nil {
		return err
	}
	v.observe(trace.OpRead, off, int64(len(p)))
	if v.meter == nil {
		_, err := v.b.ReadAt(p, off)
		return err
	}
	t0 := time.Now()
	_, err := v.b.ReadAt(p, off)
	v.meter.Read(len(p), time.Since(t0), err)
	return err
}

// metered is done, recording the request of n bytes that starts now when the volume has a meter.
// The ublk queue's ring requests come this way: the op that records one is pooled, so that it
// costs no allocation.
func (v *Volume) metered(write bool, n int, done func(error)) func(error) {
	if v.meter == nil {
		return done
	}
	op := meteredOps.Get().(*meteredOp)
	op.v, op.write, op.n, op.done, op.t0 = v, write, n, done, time.Now()
	return op.endFn
}

// meteredOp is a request in flight on a metered volume; endFn is its end, bound once.
type meteredOp struct {
	v     *Volume
	write bool
	n     int
	done  func(error)
	t0    time.Time
	endFn func(error)
}

var meteredOps sync.Pool

func init() {
	// Set here: the op's end puts it back in the pool, which its initializer would refer to.
	meteredOps.New = func() any {
		op := &meteredOp{}
		op.endFn = op.end
		return op
	}
}

// end records the request and calls its done, the op back in the pool first: done may start
// another request.
func (op *meteredOp) end(err error) {
	v, write, n, done, d := op.v, op.write, op.n, op.done, time.Since(op.t0)
	*op = meteredOp{endFn: op.endFn}
	meteredOps.Put(op)
	if write {
		v.meter.Write(n, d, err)
	} else {
		v.meter.Read(n, d, err)
	}
	done(err)
}

// ReadAtAsync implements backend.AsyncReader where the backend does (a cache whose SSD tier
// reads through io_uring); it leaves a request it would refuse to ReadAt.
func (v *Volume) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	a, ok := v.b.(backend.AsyncReader)
	if !ok || v.check(off, int64(len(p)), false) != nil {
		return false
	}
	return v.started(a.ReadAtAsync(p, off, v.metered(false, len(p), done)), trace.OpRead, off, len(p))
}

// WriteAtAsync implements backend.AsyncWriter where the backend does (an iSCSI LUN); it leaves a
// request it would refuse to WriteAt.
func (v *Volume) WriteAtAsync(p []byte, off int64, fua bool, done func(error)) bool {
	a, ok := v.b.(backend.AsyncWriter)
	if !ok || v.check(off, int64(len(p)), true) != nil {
		return false
	}
	return v.started(a.WriteAtAsync(p, off, fua, v.metered(true, len(p), done)), trace.OpWrite, off, len(p))
}

// ReadAtOn implements backend.RingReader where the backend does (a file read direct, a cache's
// SSD-tier hits); it leaves a request it would refuse to ReadAt.
func (v *Volume) ReadAtOn(r backend.Ring, p []byte, off int64, done func(error)) bool {
	rr, ok := v.b.(backend.RingReader)
	if !ok || v.check(off, int64(len(p)), false) != nil {
		return false
	}
	return v.started(rr.ReadAtOn(r, p, off, v.metered(false, len(p), done)), trace.OpRead, off, len(p))
}

// WriteAtOn implements backend.RingWriter where the backend does (a file written direct); it
// leaves a request it would refuse to WriteAt.
func (v *Volume) WriteAtOn(r backend.Ring, p []byte, off int64, fua bool, done func(error)) bool {
	rw, ok := v.b.(backend.RingWriter)
	if !ok || v.check(off, int64(len(p)), true) != nil {
		return false
	}
	return v.started(rw.WriteAtOn(r, p, off, fua, v.metered(true, len(p), done)), trace.OpWrite, off, len(p))
}

// observe tells the observers of a request the volume takes.
func (v *Volume) observe(op trace.Op, off, length int64) {
	for _, o := range v.observers {
		o.Observe(op, off, length)
	}
}

// started tells the observers of a request an asynchronous path took, if it did (ok), and returns
// ok: one it leaves to ReadAt or WriteAt is observed there.
func (v *Volume) started(ok bool, op trace.Op, off int64, n int) bool {
	if ok {
		v.observe(op, off, int64(n))
	}
	return ok
}

// Plug implements backend.Plugger where the backend does (an iSCSI LUN); elsewhere it does nothing.
func (v *Volume) Plug() {
	if p, ok := v.b.(backend.Plugger); ok {
		p.Plug()
	}
}

// Unplug implements backend.Plugger, as Plug does.
func (v *Volume) Unplug() {
	if p, ok := v.b.(backend.Plugger); ok {
		p.Unplug()
	}
}

// AtRunEnd implements backend.RunDeferrer where the backend does (an iSCSI LUN); elsewhere it
// reports false.
func (v *Volume) AtRunEnd(f func()) bool {
	r, ok := v.b.(backend.RunDeferrer)
	return ok && r.AtRunEnd(f)
}

// WriteAt implements Device. With fua the write is durable when WriteAt returns.
func (v *Volume) WriteAt(p []byte, off int64, fua bool) error {
	if err := v.check(off, int64(len(p)), true); err != nil {
		return err
	}
	v.observe(trace.OpWrite, off, int64(len(p)))
	if v.meter == nil {
		return v.writeAt(p, off, fua)
	}
	t0 := time.Now()
	err := v.writeAt(p, off, fua)
	v.meter.Write(len(p), time.Since(t0), err)
	return err
}

func (v *Volume) writeAt(p []byte, off int64, fua bool) error {
	if fua && v.fua != nil {
		_, err := v.fua.WriteAtFUA(p, off)
		return err
	}
	if _, err := v.b.WriteAt(p, off); err != nil {
		return err
	}
	if fua {
		return v.b.Flush()
	}
	return nil
}

// Flush implements Device.
func (v *Volume) Flush() error {
	if v.info.ReadOnly {
		return nil
	}
	return v.failed(v.b.Flush())
}

// failed records err, if the volume has a meter, and returns it.
func (v *Volume) failed(err error) error {
	if v.meter != nil {
		v.meter.Failed(err)
	}
	return err
}

// Trim implements Device. Trim is advisory: a backend without it ignores the request.
func (v *Volume) Trim(off, length int64, fua bool) error {
	if err := v.check(off, length, true); err != nil {
		return err
	}
	v.observe(trace.OpOther, off, length)
	return v.failed(v.trim(off, length, fua))
}

func (v *Volume) trim(off, length int64, fua bool) error {
	if v.trimmer == nil || length == 0 {
		return nil
	}
	// A backend that turns out not to trim (a remote server without TRIM) is ignored likewise.
	if err := v.trimmer.Trim(off, length); err != nil && !errors.Is(err, ErrNotSupported) {
		return err
	}
	if fua {
		return v.b.Flush()
	}
	return nil
}

// zeroChunk bounds the buffer used to emulate write-zeroes with plain writes.
const zeroChunk = 1 << 20

// zeroPage is shared by every volume and never written: WriteAt does not modify its argument.
var zeroPage = make([]byte, zeroChunk)

// WriteZeroes implements Device. Without a ZeroWriter backend the zeroes are written as data, unless
// f.Fast asks for a quick failure instead.
func (v *Volume) WriteZeroes(off, length int64, f ZeroFlags) error {
	if err := v.check(off, length, true); err != nil {
		return err
	}
	err := v.writeZeroes(off, length, f)
	if errors.Is(err, ErrNotSupported) { // the client's fast zero refused: nothing changed, nothing failed
		return err
	}
	// A write for a cache: it replaces the range's contents like one.
	v.observe(trace.OpWrite, off, length)
	return v.failed(err)
}

func (v *Volume) writeZeroes(off, length int64, f ZeroFlags) error {
	if length == 0 {
		return nil
	}
	err := ErrNotSupported
	if v.zeroer != nil {
		err = v.zeroer.WriteZeroes(off, length, !f.NoHole)
	}
	if errors.Is(err, ErrNotSupported) {
		// No ZeroWriter, or one that cannot do it after all (a remote server without
		// WRITE_ZEROES): write the zeroes as data, unless the client asked for fast or nothing.
		if f.Fast {
			return ErrNotSupported
		}
		err = v.writeZeroData(off, length)
	}
	if err == nil && f.FUA {
		err = v.b.Flush()
	}
	return err
}

func (v *Volume) writeZeroData(off, length int64) error {
	for length > 0 {
		n := min(length, zeroChunk)
		if _, err := v.b.WriteAt(zeroPage[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// Cache implements Device.
func (v *Volume) Cache(off, length int64) error {
	if err := v.check(off, length, false); err != nil {
		return err
	}
	if v.cacher == nil {
		return nil
	}
	return v.cacher.Prefetch(off, length)
}
