// Package fault wraps a backend.Backend to inject failures and delays on purpose, for the tests of
// what sits above a backend: the cache engine over its backend, and over the SSD tier's storage.
//
// Faults come from rules (fail the N-th write), from per-operation rates, and from a switch that
// makes every call fail (a dead disk or a backend outage). A random delay before each call shakes
// out races, and a failed write may first write a random prefix of whole sectors, as a real disk
// may when it fails mid-write.
//
// Every random choice comes from one source seeded by Options.Seed and drawn under a lock in the
// order calls arrive, so a test that makes the same calls in the same order sees the same faults.
// This package must never inject anything unseeded, and must never be used outside tests and chaos
// runs: it fails on purpose.
package fault

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	"github.com/tierblk/tierblk/pkg/backend"
)

// Op is a kind of backend call, as counted and failed.
type Op int

// The kinds of call. Size, ReadOnly and Close are never failed: a test must always be able to
// look at and release what it opened.
const (
	Read  Op = iota // ReadAt
	Write           // WriteAt and WriteAtFUA
	Flush           // Flush
	Trim            // Trim
	Zero            // WriteZeroes
	numOps
)

var opNames = [numOps]string{"read", "write", "flush", "trim", "write-zeroes"}

func (o Op) String() string {
	if o >= 0 && o < numOps {
		return opNames[o]
	}
	return fmt.Sprintf("fault.Op(%d)", int(o))
}

// SectorSize is the unit of a torn write: a failed write changes whole 512-byte sectors or none.
const SectorSize = 512

// Rule fails the Nth call of kind Op, counting from 1 since New; it fires at most once.
type Rule struct {
	Op  Op
	Nth int64
	Err error // what the fault wraps; nil means Options.Err
}

// Options says which faults to inject. The zero value injects nothing and delays nothing.
type Options struct {
	Seed int64
	// Rates gives each kind of call a probability in [0, 1] of failing.
	Rates map[Op]float64
	Rules []Rule
	// Err is what injected faults wrap (besides ErrInjected). nil means syscall.EIO, which
	// backend.IsRetryable treats as transient; give a permanent error such as backend.ErrClosed to
	// test that callers do not retry it.
	Err error
	// MaxDelay, if positive, delays each call by a random time in [0, MaxDelay).
	MaxDelay time.Duration
	// TornWrites makes a failed write (WriteAt or WriteAtFUA, failed by a rule or a rate) first
	// write a random prefix of itself that ends on a 512-byte device boundary: possibly nothing,
	// possibly all of it. A device that fails through SetFailing writes nothing.
	TornWrites bool
	// BadSectors makes a read failed by a rule or a rate mark the 512-byte sectors it covers bad,
	// as a disk's medium error: every later read of any of them fails too, until a write that
	// succeeds covers it (the disk remaps it). A caller that reads again after an error then
	// meets the error again, as it would on the disk.
	BadSectors bool
}

// ErrInjected is wrapped by every fault this package injects.
var ErrInjected = errors.New("fault injected")

// Error is an injected fault. It wraps ErrInjected and Err.
type Error struct {
	Op       Op
	Off, Len int64  // the call's range; zero for Flush
	Cause    string // which rule, rate or switch injected it
	Err      error
}

func (e *Error) Error() string {
	where := ""
	if e.Op != Flush {
		where = fmt.Sprintf(" at offset %d length %d", e.Off, e.Len)
	}
	return fmt.Sprintf("%s%s: %v (fault injected by %s)", e.Op, where, e.Err, e.Cause)
}

func (e *Error) Unwrap() []error { return []error{ErrInjected, e.Err} }

// Backend injects faults into the calls it passes to the backend it wraps. It is safe for
// concurrent use.
//
// It implements every optional interface, so that it can stand in for any backend: Trim and
// WriteZeroes fail with an error wrapping backend.ErrNotSupported when the wrapped backend lacks
// them (callers fall back, as they must for an NBD server that refuses); WriteAtFUA falls back to
// WriteAt then Flush, which is what FUA promises; ReadOnly reports false when the wrapped backend
// cannot tell.
type Backend struct {
	inner    backend.Backend
	errBase  error
	maxDelay time.Duration
	torn     bool
	badSecs  bool

	mu      sync.Mutex // guards everything below, and orders the draws from rng
	rng     *rand.Rand
	rates   [numOps]float64
	rules   []Rule
	failing bool
	bad     map[int64]bool // the bad sectors, with Options.BadSectors
	calls   [numOps]int64
	faults  [numOps]int64
}

// New wraps b. It panics on options that make no sense (a rate outside [0, 1], a rule for the
// 0th call, a negative delay): they are test code's mistakes.
func New(b backend.Backend, o Options) *Backend {
	if o.MaxDelay < 0 {
		panic(fmt.Sprintf("fault: negative MaxDelay %v", o.MaxDelay))
	}
	f := &Backend{
		inner:    b,
		errBase:  o.Err,
		maxDelay: o.MaxDelay,
		torn:     o.TornWrites,
		badSecs:  o.BadSectors,
		bad:      map[int64]bool{},
		rng:      rand.New(rand.NewPCG(uint64(o.Seed), 0x6661756c74)), // "fault"
	}
	if f.errBase == nil {
		f.errBase = syscall.EIO
	}
	for op, r := range o.Rates {
		checkOp(op)
		if !(r >= 0 && r <= 1) {
			panic(fmt.Sprintf("fault: %s rate %v is not a probability in [0, 1]", op, r))
		}
		f.rates[op] = r
	}
	for _, r := range o.Rules {
		f.AddRule(r)
	}
	return f
}

func checkOp(op Op) {
	if op < 0 || op >= numOps {
		panic(fmt.Sprintf("fault: unknown operation %v", op))
	}
}

// AddRule adds a rule while the backend is in use; Nth counts from New, so a rule for a call
// already made never fires.
func (f *Backend) AddRule(r Rule) {
	checkOp(r.Op)
	if r.Nth < 1 {
		panic(fmt.Sprintf("fault: rule for %s call %d: calls count from 1", r.Op, r.Nth))
	}
	f.mu.Lock()
	f.rules = append(f.rules, r)
	f.mu.Unlock()
}

// SetFailing makes every later call fail (true) or stops doing so (false).
func (f *Backend) SetFailing(failing bool) {
	f.mu.Lock()
	f.failing = failing
	f.mu.Unlock()
}

// Counts returns how many calls of each kind were made, failed or not.
func (f *Backend) Counts() map[Op]int64 { return f.snapshot(&f.calls) }

// Faults returns how many calls of each kind were failed on purpose.
func (f *Backend) Faults() map[Op]int64 { return f.snapshot(&f.faults) }

func (f *Backend) snapshot(a *[numOps]int64) map[Op]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[Op]int64, numOps)
	for op := range numOps {
		m[op] = a[op]
	}
	return m
}

// verdict is what one call is to do.
type verdict struct {
	delay time.Duration
	err   error // nil: pass the call through
	torn  int64 // with err on a write: how many bytes to write anyway
}

// decide counts a call and draws its fate. The draws are made under the lock and do not depend on
// the outcome of other draws (a rate is drawn even when a rule fires), so that adding a rule or
// switching failing on does not change which calls a rate fails.
func (f *Backend) decide(op Op, off, n int64) verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	nth := f.calls[op]
	var v verdict
	if f.maxDelay > 0 {
		v.delay = time.Duration(f.rng.Int64N(int64(f.maxDelay)))
	}
	cause, base := "", f.errBase
	if r := f.rates[op]; r > 0 && f.rng.Float64() < r {
		cause = fmt.Sprintf("%s rate %v", op, r)
	}
	for _, r := range f.rules {
		if r.Op == op && r.Nth == nth {
			cause = fmt.Sprintf("rule: %s call #%d", op, nth)
			if r.Err != nil {
				base = r.Err
			}
			break
		}
	}
	if f.badSecs && op == Read {
		drawn := cause != "" // by a rate or a rule: the sectors go bad
		for sec := off / SectorSize; sec*SectorSize < off+n; sec++ {
			if drawn {
				f.bad[sec] = true
			} else if f.bad[sec] {
				cause = fmt.Sprintf("bad sector %d", sec)
				break
			}
		}
	}
	switch {
	case f.failing:
		cause = "SetFailing"
	case cause != "" && op == Write && f.torn && backend.CheckRange(off, n, f.inner.Size()) == nil:
		v.torn = f.tornPrefix(off, n)
	}
	if cause == "" {
		return v
	}
	f.faults[op]++
	if op == Flush {
		off, n = 0, 0
	}
	v.err = &Error{Op: op, Off: off, Len: n, Cause: cause, Err: base}
	return v
}

// tornPrefix picks how much of a failing write at off of n bytes lands: nothing, or up to one of
// the sector boundaries in (off, off+n]. The caller holds f.mu.
func (f *Backend) tornPrefix(off, n int64) int64 {
	first := (off/SectorSize + 1) * SectorSize
	var ends int64 // sector boundaries in [first, off+n]
	if first <= off+n {
		ends = (off+n-first)/SectorSize + 1
	}
	k := f.rng.Int64N(ends + 1)
	if k == 0 {
		return 0
	}
	return first + (k-1)*SectorSize - off
}

// inject counts and delays a call and returns its injected fault, if any. For a write, p is the
// data, of which a torn prefix may be written before the fault is returned.
func (f *Backend) inject(op Op, off, n int64, p []byte) error {
	v := f.decide(op, off, n)
	if v.delay > 0 {
		time.Sleep(v.delay)
	}
	if v.torn > 0 {
		_, _ = f.inner.WriteAt(p[:v.torn], off) // the fault is reported either way
	}
	return v.err
}

// ReadAt implements backend.Backend.
func (f *Backend) ReadAt(p []byte, off int64) (int, error) {
	if err := f.inject(Read, off, int64(len(p)), nil); err != nil {
		return 0, err
	}
	return f.inner.ReadAt(p, off)
}

// ReadAtAsync implements backend.AsyncReader where the wrapped backend does; it counts, delays and
// fails as a Read. The delay and the fault are served on a goroutine of its own, so that the call
// returns at once as the wrapped one would, and a read the wrapped backend will not start is read
// with its ReadAt there.
func (f *Backend) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	a, ok := f.inner.(backend.AsyncReader)
	if !ok {
		return false
	}
	v := f.decide(Read, off, int64(len(p)))
	go func() {
		time.Sleep(v.delay)
		switch {
		case v.err != nil:
			done(v.err)
		case !a.ReadAtAsync(p, off, done):
			_, err := f.inner.ReadAt(p, off)
			done(err)
		}
	}()
	return true
}

// ReadAtOn implements backend.RingReader where the wrapped backend does; it counts, delays and
// fails as a Read. A read without a fault or a delay goes to the wrapped backend on the caller's
// ring; the others are served on a goroutine of its own (the ring is its owner's alone), as
// ReadAtAsync serves them.
func (f *Backend) ReadAtOn(r backend.Ring, p []byte, off int64, done func(error)) bool {
	rr, ok := f.inner.(backend.RingReader)
	if !ok {
		return false
	}
	v := f.decide(Read, off, int64(len(p)))
	if v.err == nil && v.delay == 0 && rr.ReadAtOn(r, p, off, done) {
		return true
	}
	go func() {
		time.Sleep(v.delay)
		if v.err != nil {
			done(v.err)
			return
		}
		_, err := f.inner.ReadAt(p, off)
		done(err)
	}()
	return true
}

// WriteAt implements backend.Backend. A failed write reports 0 bytes written, even if torn.
func (f *Backend) WriteAt(p []byte, off int64) (int, error) {
	if err := f.inject(Write, off, int64(len(p)), p); err != nil {
		return 0, err
	}
	n, err := f.inner.WriteAt(p, off)
	f.remap(off, int64(n), err)
	return n, err
}

// remap clears the bad sectors that a write of n bytes at off covered whole, if it succeeded.
func (f *Backend) remap(off, n int64, err error) {
	if !f.badSecs || err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for sec := (off + SectorSize - 1) / SectorSize; (sec+1)*SectorSize <= off+n; sec++ {
		delete(f.bad, sec)
	}
}

// WriteAtFUA implements backend.FUAWriter; it counts and fails as a Write.
func (f *Backend) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := f.inject(Write, off, int64(len(p)), p); err != nil {
		return 0, err
	}
	n, err := backend.WriteFUA(f.inner, p, off)
	f.remap(off, int64(n), err)
	return n, err
}

// Size implements backend.Backend.
func (f *Backend) Size() int64 { return f.inner.Size() }

// Waits implements backend.Waiter for the wrapped backend.
func (f *Backend) Waits() uint64 { return backend.WaitsOf(f.inner) }

// Flush implements backend.Backend.
func (f *Backend) Flush() error {
	if err := f.inject(Flush, 0, 0, nil); err != nil {
		return err
	}
	return f.inner.Flush()
}

// Trim implements backend.Trimmer.
func (f *Backend) Trim(off, length int64) error {
	if err := f.inject(Trim, off, length, nil); err != nil {
		return err
	}
	if t, ok := f.inner.(backend.Trimmer); ok {
		return t.Trim(off, length)
	}
	return fmt.Errorf("trim: wrapped backend %T: %w", f.inner, backend.ErrNotSupported)
}

// WriteZeroes implements backend.ZeroWriter.
func (f *Backend) WriteZeroes(off, length int64, mayUnmap bool) error {
	if err := f.inject(Zero, off, length, nil); err != nil {
		return err
	}
	if z, ok := f.inner.(backend.ZeroWriter); ok {
		return z.WriteZeroes(off, length, mayUnmap)
	}
	return fmt.Errorf("write-zeroes: wrapped backend %T: %w", f.inner, backend.ErrNotSupported)
}

// ReadOnly implements backend.ReadOnlyReporter.
func (f *Backend) ReadOnly() bool {
	r, ok := f.inner.(backend.ReadOnlyReporter)
	return ok && r.ReadOnly()
}

// Close implements backend.Backend. It is never failed.
func (f *Backend) Close() error { return f.inner.Close() }

// The optional interfaces Backend promises.
var (
	_ backend.Trimmer          = (*Backend)(nil)
	_ backend.ZeroWriter       = (*Backend)(nil)
	_ backend.FUAWriter        = (*Backend)(nil)
	_ backend.ReadOnlyReporter = (*Backend)(nil)
)
