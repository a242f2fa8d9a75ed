package ublk

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/uring"
)

const controlPath = "/dev/ublk-control"

// control is an open /dev/ublk-control: control commands go to it as URING_CMD on a ring of
// 128-byte SQEs (the command does not fit in 64), one command at a time.
type control struct {
	mu   sync.Mutex
	fd   int
	ring *uring.Ring
	// buf holds a command's payload. The kernel runs control commands from an io_uring worker
	// thread while the caller waits, so the payload lives outside the Go heap.
	buf []byte
	// unprivileged: the device was made with UBLK_F_UNPRIVILEGED_DEV, so every command on it
	// but ADD_DEV starts its payload with the path of its /dev/ublkcN, which the kernel checks
	// the caller may open.
	unprivileged bool
}

func openControl() (*control, error) {
	fd, err := unix.Open(controlPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EACCES) {
		return nil, fmt.Errorf("open %s: %w: run as root, or let this user make unprivileged ublk devices (docs/operations.md#unprivileged-ublk)", controlPath, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s (is the ublk_drv module loaded?): %w", controlPath, err)
	}
	c := &control{fd: fd}
	if c.ring, err = uring.New(4, uring.SetupSQE128); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if c.buf, err = unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		c.ring.Close()
		unix.Close(fd)
		return nil, fmt.Errorf("mmap control buffer: %w", err)
	}
	return c, nil
}

func (c *control) Close() error {
	_ = unix.Munmap(c.buf)
	return errors.Join(c.ring.Close(), unix.Close(c.fd))
}

// cmdNames names the control commands in errors.
var cmdNames = map[uint32]string{
	cmdGetDevInfo: "GET_DEV_INFO", cmdAddDev: "ADD_DEV", cmdDelDev: "DEL_DEV", cmdStartDev: "START_DEV",
	cmdStopDev: "STOP_DEV", cmdSetParams: "SET_PARAMS", cmdGetParams: "GET_PARAMS",
	cmdStartUserRecovery: "START_USER_RECOVERY", cmdEndUserRecovery: "END_USER_RECOVERY",
	cmdGetFeatures: "GET_FEATURES", cmdDelDevAsync: "DEL_DEV_ASYNC",
}

// do runs control command op on device id. payload, if any, is copied to the kernel and back
// (the command may read it, write it or both); data goes in the command's inline data field.
// A command the kernel fails returns its errno, wrapped.
func (c *control) do(op, id uint32, data uint64, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, cmd, err := c.ring.Get()
	if err != nil {
		return err
	}
	s.Opcode = uring.OpURingCmd
	s.FD = int32(c.fd)
	s.Off = uint64(op)
	hdr := (*ctrlCmd)(unsafe.Pointer(&cmd[0]))
	*hdr = ctrlCmd{DevID: id, QueueID: 0xffff, Data: data}
	var path string
	if c.unprivileged && op != cmdAddDev && op != cmdGetFeatures {
		path = charPath(id)
		hdr.DevPathLen = uint16(len(path))
	}
	if len(path)+len(payload) > len(c.buf) {
		return fmt.Errorf("ublk %s: payload of %d bytes", cmdNames[op], len(payload))
	}
	if n := copy(c.buf, path) + copy(c.buf[len(path):], payload); n > 0 {
		hdr.Addr = uint64(uintptr(unsafe.Pointer(&c.buf[0])))
		hdr.Len = uint16(n)
	}
	if err := c.ring.Submit(1); err != nil {
		return fmt.Errorf("ublk %s: %w", cmdNames[op], err)
	}
	var res int32
	c.ring.Reap(func(e uring.CQE) { res = e.Res })
	copy(payload, c.buf[len(path):])
	if res < 0 {
		return fmt.Errorf("ublk %s of device %d: %w", cmdNames[op], int32(id), unix.Errno(-res))
	}
	return nil
}

// charPath is the path of device id's character device, /dev/ublkcN.
func charPath(id uint32) string { return fmt.Sprintf("/dev/ublkc%d", id) }

// bytesOf is the memory of *v, for payloads.
func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// anyDevice asks ADD_DEV for the first free device number.
const anyDevice = ^uint32(0)

// features returns the UBLK_F_* flags the driver supports (0 on a kernel without GET_FEATURES).
func (c *control) features() uint64 {
	var f uint64
	if c.do(cmdGetFeatures, anyDevice, 0, bytesOf(&f)) != nil {
		return 0
	}
	return f
}

// addDev creates a device from info and updates info with what the kernel made of it.
func (c *control) addDev(info *devInfo) error {
	return c.do(cmdAddDev, info.DevID, 0, bytesOf(info))
}

func (c *control) devInfo(id uint32) (devInfo, error) {
	var info devInfo
	err := c.do(cmdGetDevInfo, id, 0, bytesOf(&info))
	return info, err
}

func (c *control) setParams(id uint32, p *params) error {
	return c.do(cmdSetParams, id, 0, bytesOf(p))
}

func (c *control) params(id uint32) (params, error) {
	p := params{Len: sizeofParams}
	err := c.do(cmdGetParams, id, 0, bytesOf(&p))
	return p, err
}

// startDev waits until every queue has fetched its tags, then adds /dev/ublkbN.
func (c *control) startDev(id uint32, pid int) error {
	return c.waiting(cmdStartDev, id, uint64(pid))
}

// waiting runs a command that first waits for the queues' fetches: the kernel's wait is
// interruptible, and an interrupted one (EINTR) has changed nothing, so it is tried again.
func (c *control) waiting(op, id uint32, data uint64) (err error) {
	for range 100 {
		if err = c.do(op, id, data, nil); !errors.Is(err, unix.EINTR) {
			break
		}
	}
	return err
}

// stopDev removes /dev/ublkbN once the requests in flight are done, and fails every fetch.
func (c *control) stopDev(id uint32) error { return c.do(cmdStopDev, id, 0, nil) }

// delDev removes /dev/ublkcN; it returns once the device number is free, which is when the
// last opener of /dev/ublkcN and of the stopped /dev/ublkbN has closed it.
func (c *control) delDev(id uint32) error { return c.do(cmdDelDev, id, 0, nil) }

// delDevAsync removes /dev/ublkcN like delDev but returns at once; the number is freed later.
func (c *control) delDevAsync(id uint32) error { return c.do(cmdDelDevAsync, id, 0, nil) }

func (c *control) startRecovery(id uint32) error { return c.do(cmdStartUserRecovery, id, 0, nil) }

// endRecovery waits until every queue has fetched its tags, then lets the queued requests go.
func (c *control) endRecovery(id uint32, pid int) error {
	return c.waiting(cmdEndUserRecovery, id, uint64(pid))
}
