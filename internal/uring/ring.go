// Package uring is tierblk's one io_uring (include/uapi/linux/io_uring.h), over the raw
// io_uring_setup and io_uring_enter system calls: the ring itself, which ublk drives with URING_CMD
// and POLL_ADD, and File, which reads and writes a file through a ring from many goroutines at
// once. It must never be used where the kernel refuses io_uring without a fallback: callers keep
// a path of plain system calls.
package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// io_uring opcodes, setup flags and mmap offsets.
const (
	OpNop      = 0
	OpPollAdd  = 6
	OpRead     = 22
	OpWrite    = 23
	OpURingCmd = 46

	SetupSQE128 = 1 << 10

	featSingleMmap = 1 << 0
	enterGetEvents = 1 << 0

	registerEventfd = 4 // IORING_REGISTER_EVENTFD

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

// Params is struct io_uring_params.
type Params struct {
	SQEntries    uint32
	CQEntries    uint32
	Flags        uint32
	SQThreadCPU  uint32
	SQThreadIdle uint32
	Features     uint32
	WQFd         uint32
	Resv         [3]uint32
	SQOff        SQRingOffsets
	CQOff        CQRingOffsets
}

// SQRingOffsets is struct io_sqring_offsets.
type SQRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

// CQRingOffsets is struct io_cqring_offsets.
type CQRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

// SQE is the first 64 bytes of struct io_uring_sqe; the command area of URING_CMD starts at
// Addr3 (offset 48) and runs to the end of the entry (16 bytes, or 80 with IORING_SETUP_SQE128).
type SQE struct {
	Opcode      uint8
	Flags       uint8
	IOPrio      uint16
	FD          int32
	Off         uint64 // for URING_CMD: cmd_op in the low 32 bits
	Addr        uint64
	Len         uint32
	OpFlags     uint32 // poll32_events for POLL_ADD
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFDIn  int32
	Addr3       uint64
	Pad2        uint64
}

// SQECmdOffset is where the command area of a URING_CMD entry starts.
const SQECmdOffset = 48

// CQE is struct io_uring_cqe (without IORING_SETUP_CQE32).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// Ring is an io_uring's submission and completion queues, mapped. It is not safe for concurrent
// use: one goroutine prepares, submits and reaps, except that the submission side (under a lock
// of the caller's) and the completion side (WaitCQ, Reap) may each have their own, the two sides
// the kernel keeps apart (File does so).
type Ring struct {
	fd      int
	sqeSize int
	mems    [][]byte // every mapping, for Close

	sqHead, sqTail *uint32
	sqMask         uint32
	sqEntries      uint32
	sqArray        []uint32
	sqes           []byte
	tail           uint32 // SQEs prepared; the kernel sees them at the next submit

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []CQE
}

// New sets up an io_uring with at least entries submission entries; flags are
// IORING_SETUP_* (SetupSQE128 for ublk's control commands).
func New(entries uint32, flags uint32) (*Ring, error) {
	var p Params
	p.Flags = flags
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), sqeSize: 64}
	if flags&SetupSQE128 != 0 {
		r.sqeSize = 128
	}
	if err := r.mapRings(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mmap(off int64, size int) ([]byte, error) {
	b, err := unix.Mmap(r.fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap io_uring at %#x: %w", off, err)
	}
	r.mems = append(r.mems, b)
	return b, nil
}

func (r *Ring) mapRings(p *Params) error {
	sqSize := int(p.SQOff.Array + p.SQEntries*4)
	cqSize := int(p.CQOff.CQEs + p.CQEntries*uint32(unsafe.Sizeof(CQE{})))
	if p.Features&featSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	sq, err := r.mmap(offSQRing, sqSize)
	if err != nil {
		return err
	}
	cq := sq
	if p.Features&featSingleMmap == 0 {
		if cq, err = r.mmap(offCQRing, cqSize); err != nil {
			return err
		}
	}
	if r.sqes, err = r.mmap(offSQEs, int(p.SQEntries)*r.sqeSize); err != nil {
		return err
	}
	r.sqHead = (*uint32)(unsafe.Pointer(&sq[p.SQOff.Head]))
	r.sqTail = (*uint32)(unsafe.Pointer(&sq[p.SQOff.Tail]))
	r.sqMask = *(*uint32)(unsafe.Pointer(&sq[p.SQOff.RingMask]))
	r.sqEntries = p.SQEntries
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Pointer(&sq[p.SQOff.Array])), p.SQEntries)
	r.tail = *r.sqTail
	r.cqHead = (*uint32)(unsafe.Pointer(&cq[p.CQOff.Head]))
	r.cqTail = (*uint32)(unsafe.Pointer(&cq[p.CQOff.Tail]))
	r.cqMask = *(*uint32)(unsafe.Pointer(&cq[p.CQOff.RingMask]))
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&cq[p.CQOff.CQEs])), p.CQEntries)
	return nil
}

// ErrRingFull: every submission entry is taken by SQEs not yet submitted.
var ErrRingFull = errors.New("io_uring submission queue full")

// Get returns a zeroed SQE and its command area; the kernel sees it at the next submit.
func (r *Ring) Get() (*SQE, []byte, error) {
	if r.tail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		return nil, nil, ErrRingFull
	}
	idx := r.tail & r.sqMask
	b := r.sqes[int(idx)*r.sqeSize : int(idx+1)*r.sqeSize]
	clear(b)
	r.sqArray[idx] = idx
	r.tail++
	return (*SQE)(unsafe.Pointer(&b[0])), b[SQECmdOffset:], nil
}

// Submit hands the prepared SQEs to the kernel and, with wait > 0, blocks until at least
// wait completions are in the completion queue. A signal (the Go runtime's preemption) only
// makes it try again.
func (r *Ring) Submit(wait uint32) error {
	for {
		toSubmit := r.publish()
		if toSubmit == 0 && (wait == 0 || r.Ready() >= wait) {
			return nil
		}
		var flags uint32
		if wait > 0 {
			flags = enterGetEvents
		}
		if err := r.enter(toSubmit, wait, flags); err != nil {
			return err
		}
	}
}

// publish makes the prepared SQEs visible to the kernel and returns how many it has not taken.
func (r *Ring) publish() uint32 {
	atomic.StoreUint32(r.sqTail, r.tail)
	return r.tail - atomic.LoadUint32(r.sqHead)
}

// enter is one io_uring_enter; EINTR (the Go runtime's preemption signal) is no error, the caller
// looks at the queues again.
func (r *Ring) enter(toSubmit, wait, flags uint32) error {
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(wait), uintptr(flags), 0, 0)
	if errno != 0 && errno != unix.EINTR {
		return fmt.Errorf("io_uring_enter: %w", errno)
	}
	return nil
}

// Drop takes back the entries prepared but not consumed by the kernel (after Submit failed),
// calling fn on each, oldest first.
func (r *Ring) Drop(fn func(*SQE)) {
	head := atomic.LoadUint32(r.sqHead)
	for i := head; i != r.tail; i++ {
		idx := r.sqArray[i&r.sqMask]
		fn((*SQE)(unsafe.Pointer(&r.sqes[int(idx)*r.sqeSize])))
	}
	r.tail = head
	atomic.StoreUint32(r.sqTail, head)
}

// RegisterEventfd has the kernel signal the eventfd fd each time it posts a completion
// (IORING_REGISTER_EVENTFD), so that a reaper may wait for completions in Go's netpoller.
func (r *Ring) RegisterEventfd(fd int) error {
	fd32 := int32(fd)
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerEventfd, uintptr(unsafe.Pointer(&fd32)), 1, 0, 0)
	if errno != 0 {
		return fmt.Errorf("io_uring_register eventfd: %w", errno)
	}
	return nil
}

// WaitCQ blocks until at least n completions wait to be reaped, submitting nothing.
func (r *Ring) WaitCQ(n uint32) error {
	for r.Ready() < n {
		if err := r.enter(0, n, enterGetEvents); err != nil {
			return err
		}
	}
	return nil
}

// Ready is the number of completions waiting to be reaped.
func (r *Ring) Ready() uint32 {
	return atomic.LoadUint32(r.cqTail) - *r.cqHead
}

// Reap calls fn on every waiting completion, oldest first, and frees their slots.
func (r *Ring) Reap(fn func(c CQE)) {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		fn(r.cqes[head&r.cqMask])
	}
	atomic.StoreUint32(r.cqHead, head)
}

// Close unmaps the ring and closes it; the kernel cancels what is still pending.
func (r *Ring) Close() error {
	for _, m := range r.mems {
		_ = unix.Munmap(m)
	}
	r.mems = nil
	return unix.Close(r.fd)
}

// Unavailable reports whether err, from New, says that this kernel or its settings refuse
// io_uring (kernel.io_uring_disabled, seccomp in containers, kernels before 5.1), where a caller
// falls back to plain system calls.
func Unavailable(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)
}
