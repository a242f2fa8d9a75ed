package ublk

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/uring"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
)

// queue serves one hardware queue of a device. Its loop owns the queue's io_uring and runs
// locked to one OS thread, because the kernel takes the task that fetched a queue's tags as that
// queue's daemon and accepts its commands from that task only. A read or write the volume can do
// as file I/O (a file backend read or written direct, a cache's SSD-tier hit) runs on that same
// ring: the loop starts it, reaps it and commits it, and no other thread wakes for it. Every other
// request is served by a worker goroutine of its own, so that a slow backend read never holds up
// the others; those come back to the loop through a list and an eventfd that the ring polls.
type queue struct {
	id    uint16
	depth int
	maxIO int
	dev   volume.Device
	// rr and rw are dev where it can serve reads and writes on the loop's ring (ops).
	rr  backend.RingReader
	rw  backend.RingWriter
	ops *uring.Ops
	// onRingDone[tag] ends the tag's request served on the ring, whose descriptor is
	// onRingDesc[tag]: made once, so that a request the volume declines costs no closure.
	onRingDone []func(error)
	onRingDesc []ioDesc

	log *slog.Logger

	charFD int
	iods   []byte // the kernel's request descriptors, mmapped read-only from /dev/ublkcN
	bufs   []byte // maxIO bytes of data per tag; the kernel copies request data to and from them
	efd    int    // an eventfd, written when done gets its first entry

	mu   sync.Mutex
	done []completion
	// reaping is set while the loop handles a batch of completions, after which it takes done
	// itself: a request finished meanwhile (on the ring, or by a goroutine) needs no wake-up.
	reaping bool
	quit    bool // abandon asked the loop to leave

	// work hands a request to an idle worker. A worker serves requests until the loop has left
	// and closed work: at most depth of them (started, the loop's count), started as requests find
	// none idle, so that a request costs no new goroutine, nor the growth of a new goroutine's
	// stack to what the volume's path needs (bench kernel --profile).
	work    chan request
	started int
	workers sync.WaitGroup
}

// request is a request for a worker: its tag and descriptor.
type request struct {
	tag uint16
	d   ioDesc
}

type completion struct {
	tag uint16
	res int32
}

// pollTag is the user data of the eventfd poll; tags are below 65536.
const pollTag = 1 << 32

// maxCmdBufSize is the stride of the queues' descriptor arrays in /dev/ublkcN's mmap offsets.
func maxCmdBufSize() int { return roundUp(maxQueueDepth*sizeofIODesc, unix.Getpagesize()) }

func roundUp(n, to int) int { return (n + to - 1) / to * to }

func newQueue(charFD int, id uint16, depth, maxIO int, dev volume.Device, log *slog.Logger) (*queue, error) {
	q := &queue{id: id, depth: depth, maxIO: maxIO, dev: dev, log: log, charFD: charFD, efd: -1, work: make(chan request)}
	q.rr, _ = dev.(backend.RingReader)
	q.rw, _ = dev.(backend.RingWriter)
	if q.rr != nil || q.rw != nil {
		q.onRingDesc = make([]ioDesc, depth)
		q.onRingDone = make([]func(error), depth)
		for tag := range q.onRingDone {
			q.onRingDone[tag] = func(err error) {
				d := q.onRingDesc[tag]
				res := int32(d.NrSectors) << sectorShift
				if err != nil {
					res = errnoOf(err)
				}
				q.finish(uint16(tag), d, res, err)
			}
		}
	}
	var err error
	q.iods, err = unix.Mmap(charFD, int64(id)*int64(maxCmdBufSize()), roundUp(depth*sizeofIODesc, unix.Getpagesize()),
		unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap the descriptors of queue %d: %w", id, err)
	}
	q.bufs, err = unix.Mmap(-1, 0, depth*maxIO, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		q.unmap()
		return nil, fmt.Errorf("mmap the buffers of queue %d: %w", id, err)
	}
	if q.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		q.unmap()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return q, nil
}

// unmap releases the queue's memory and eventfd once its loop has returned.
func (q *queue) unmap() {
	for _, m := range [][]byte{q.iods, q.bufs} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	q.iods, q.bufs = nil, nil
	if q.efd >= 0 {
		unix.Close(q.efd)
		q.efd = -1
	}
}

func (q *queue) buf(tag uint16) []byte {
	return q.bufs[int(tag)*q.maxIO : int(tag+1)*q.maxIO]
}

// run fetches every tag, reports on ready whether that worked, then serves requests until the
// kernel aborts every tag (the device stopped) or abandon is called. The thread stays locked and
// exits with the goroutine: once a ring's thread is gone, the kernel fails what it still held.
func (q *queue) run(ready chan<- error) {
	runtime.LockOSThread()
	r, err := q.fetchAll()
	ready <- err
	if err != nil {
		return
	}
	if err := q.serve(r); err != nil && !errors.Is(err, errAbandoned) {
		q.log.Error("ublk queue stopped", "queue", q.id, "err", err)
	}
	r.Close()
	close(q.work)
	q.workers.Wait()
}

// fetchAll sets up the ring and submits FETCH_REQ for every tag, which makes the queue ready.
// The ring has room for a command of every tag, the eventfd's poll and a file op of every tag:
// what one pass of the loop can queue, and (twice that, the completion queue) all that can be
// in flight.
func (q *queue) fetchAll() (*uring.Ring, error) {
	r, err := uring.New(uint32(2*q.depth+1), 0)
	if err != nil {
		return nil, err
	}
	q.ops = uring.NewOps(r, q.depth)
	for tag := range q.depth {
		if err == nil {
			err = q.prepIO(r, ioFetchReq, completion{tag: uint16(tag)})
		}
	}
	if err == nil {
		err = q.armPoll(r)
	}
	if err == nil {
		err = r.Submit(0)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("queue %d: %w", q.id, err)
	}
	return r, nil
}

func (q *queue) prepIO(r *uring.Ring, op uint32, c completion) error {
	s, cmd, err := r.Get()
	if err != nil {
		return err
	}
	s.Opcode = uring.OpURingCmd
	s.FD = int32(q.charFD)
	s.Off = uint64(op)
	s.UserData = uint64(c.tag)
	*(*ioCmd)(unsafe.Pointer(&cmd[0])) = ioCmd{
		QID: q.id, Tag: c.tag, Result: c.res, Addr: uint64(uintptr(unsafe.Pointer(&q.buf(c.tag)[0]))),
	}
	return nil
}

// armPoll asks the ring for one completion when the eventfd becomes readable.
func (q *queue) armPoll(r *uring.Ring) error {
	s, _, err := r.Get()
	if err != nil {
		return err
	}
	s.Opcode = uring.OpPollAdd
	s.FD = int32(q.efd)
	s.OpFlags = unix.POLLIN
	s.UserData = pollTag
	return nil
}

func (q *queue) serve(r *uring.Ring) error {
	live := q.depth // tags not aborted: with the kernel, or being served
	for live > 0 {
		if err := r.Submit(1); err != nil {
			q.drain(r)
			return err
		}
		q.setReaping()
		woken := false
		r.Reap(func(e uring.CQE) {
			switch {
			case q.ops.Complete(e):
			case e.UserData == pollTag:
				woken = true
			case e.Res == ioResOK:
				q.dispatch(uint16(e.UserData))
			case e.Res == ioResAbort:
				live--
			default:
				q.log.Error("ublk command failed", "queue", q.id, "tag", e.UserData, "err", unix.Errno(-e.Res))
				live--
			}
		})
		done, quit := q.takeDone(woken)
		if quit {
			q.drain(r)
			return errAbandoned
		}
		for _, c := range done {
			if err := q.prepIO(r, ioCommitAndFetchRq, c); err != nil {
				q.drain(r)
				return err
			}
		}
		if woken {
			if err := q.armPoll(r); err != nil {
				q.drain(r)
				return err
			}
		}
	}
	return nil
}

// drain reaps until no file op is in flight on the ring: their done release what the volume
// holds for them (a cache's line locks), so none may be left to the ring's close.
func (q *queue) drain(r *uring.Ring) {
	for q.ops.InFlight() > 0 {
		if err := r.Submit(1); err != nil {
			q.log.Error("ublk queue: file I/O left in flight", "queue", q.id, "ops", q.ops.InFlight(), "err", err)
			return
		}
		r.Reap(func(e uring.CQE) { q.ops.Complete(e) })
	}
}

// errAbandoned ends a queue loop that abandon asked to leave.
var errAbandoned = errors.New("abandoned")

// setReaping tells complete that the loop takes the finished requests after this batch.
func (q *queue) setReaping() {
	q.mu.Lock()
	q.reaping = true
	q.mu.Unlock()
}

// takeDone ends a batch: it empties the list of finished requests. When the eventfd's poll fired
// (woken) the eventfd is read first: a completion added after the read writes it again, so none
// is left waiting without a wake-up.
func (q *queue) takeDone(woken bool) ([]completion, bool) {
	if woken {
		var b [8]byte
		_, _ = unix.Read(q.efd, b[:])
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	done := q.done
	q.done = nil
	q.reaping = false
	return done, q.quit
}

func (q *queue) wake() {
	one := [8]byte{1}
	_, _ = unix.Write(q.efd, one[:])
}

// complete hands a finished request back to the loop: the list is taken at the end of the
// loop's batch, or, if the loop is not in one, after the wake-up of the first request put in it.
func (q *queue) complete(c completion) {
	q.mu.Lock()
	wake := len(q.done) == 0 && !q.reaping
	q.done = append(q.done, c)
	q.mu.Unlock()
	if wake {
		q.wake()
	}
}

// abandon makes the loop return without waiting for the kernel; its thread's exit then makes
// the kernel cancel the queue's fetches: it fails the queue's requests, or with user recovery
// holds them for the next daemon. For a start that failed half-way, and Device.Leave.
func (q *queue) abandon() {
	q.mu.Lock()
	q.quit = true
	q.mu.Unlock()
	q.wake()
}

// dispatch serves the request of tag, on the loop's ring if the volume can, else by an idle
// worker or a new one. The descriptor is copied now: the kernel rewrites it only for the tag's
// next request, after our commit.
func (q *queue) dispatch(tag uint16) {
	w := request{tag: tag, d: *(*ioDesc)(unsafe.Pointer(&q.iods[int(tag)*sizeofIODesc]))}
	if q.onRing(tag, w.d) {
		return
	}
	if q.started == q.depth {
		// Fewer than depth other requests are being served: a worker is idle, or about to be.
		q.work <- w
		return
	}
	select {
	case q.work <- w:
	default:
		q.started++
		q.workers.Add(1)
		go q.worker(w)
	}
}

// worker serves w, then the requests handed to it, until the loop closes work.
func (q *queue) worker(w request) {
	defer q.workers.Done()
	for ok := true; ok; w, ok = <-q.work {
		res, err := handle(q.dev, w.d, q.buf(w.tag))
		q.finish(w.tag, w.d, res, err)
	}
}

// onRing starts a read or write on the loop's ring where the volume can serve it so, and
// reports whether it did.
func (q *queue) onRing(tag uint16, d ioDesc) bool {
	off := int64(d.StartSector) << sectorShift
	n := int64(d.NrSectors) << sectorShift
	if q.onRingDone == nil || n == 0 || n > int64(q.maxIO) {
		return false // nothing serves on the ring, or handle refuses it
	}
	buf := q.buf(tag)[:n]
	// The tag's descriptor stays until its request is committed, so the one done reads is this.
	q.onRingDesc[tag] = d
	switch d.OpFlags & 0xff {
	case opRead:
		return q.rr != nil && q.rr.ReadAtOn(q.ops, buf, off, q.onRingDone[tag])
	case opWrite:
		return q.rw != nil && q.rw.WriteAtOn(q.ops, buf, off, d.OpFlags&ioFlagFUA != 0, q.onRingDone[tag])
	}
	return false
}

// finish logs a request that failed and hands it back to the loop.
func (q *queue) finish(tag uint16, d ioDesc, res int32, err error) {
	if err != nil {
		q.log.Warn("ublk request failed", "queue", q.id, "op", opName(d.OpFlags),
			"offset", int64(d.StartSector)<<sectorShift, "length", int64(d.NrSectors)<<sectorShift, "err", err)
	}
	q.complete(completion{tag: tag, res: res})
}

// handle runs one request on the volume and returns the result the kernel expects: the byte
// count for reads and writes (the kernel fails a read that returns 0), 0 for the others, or a
// negative errno.
func handle(dev volume.Device, d ioDesc, buf []byte) (int32, error) {
	off := int64(d.StartSector) << sectorShift
	n := int64(d.NrSectors) << sectorShift
	fua := d.OpFlags&ioFlagFUA != 0
	var err error
	switch d.OpFlags & 0xff {
	case opRead, opWrite:
		if n > int64(len(buf)) {
			return -int32(unix.EINVAL), fmt.Errorf("%d bytes, more than the %d-byte buffer", n, len(buf))
		}
		if d.OpFlags&0xff == opRead {
			err = dev.ReadAt(buf[:n], off)
		} else {
			err = dev.WriteAt(buf[:n], off, fua)
		}
		if err == nil {
			return int32(n), nil
		}
	case opFlush:
		err = dev.Flush()
	case opDiscard:
		err = dev.Trim(off, n, fua)
	case opWriteZeroes:
		err = dev.WriteZeroes(off, n, volume.ZeroFlags{NoHole: d.OpFlags&ioFlagNoUnmap != 0, FUA: fua})
	default:
		return -int32(unix.EOPNOTSUPP), nil
	}
	return errnoOf(err), err
}

// errnoOf is the negative errno the kernel turns into a block status: EOPNOTSUPP for what the
// volume cannot do, EIO for every other failure.
func errnoOf(err error) int32 {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, volume.ErrNotSupported):
		return -int32(unix.EOPNOTSUPP)
	default:
		return -int32(unix.EIO)
	}
}

func opName(opFlags uint32) string {
	switch opFlags & 0xff {
	case opRead:
		return "read"
	case opWrite:
		return "write"
	case opFlush:
		return "flush"
	case opDiscard:
		return "discard"
	case opWriteZeroes:
		return "write-zeroes"
	}
	return fmt.Sprintf("op %d", opFlags&0xff)
}
