// Package ublk is tierblk's ublk server: it creates /dev/ublkbN through /dev/ublk-control and
// serves its requests from a volume.Device over one io_uring per queue, using raw system calls
// (io_uring_setup, io_uring_enter, mmap) and nothing but golang.org/x/sys/unix.
//
// Device lifetime:
//   - Start with Options.ID -1 creates a device with the first free number. If the daemon is
//     killed, the kernel fails the requests in flight and every later one, and removes
//     /dev/ublkbN; the stopped device's number stays taken until someone deletes it.
//   - Start with a fixed ID creates the device with user recovery: once its daemon is gone
//     (Leave, or a kill), /dev/ublkbN stays, so a mounted file system survives, and a later
//     Start with the same ID takes the device back when its size matches. Meanwhile requests
//     wait for the next daemon, and those it had been given but not answered are sent to the
//     next one again (UBLK_F_USER_RECOVERY_REISSUE: a block request can run twice with the same
//     result), so the file system sees no error at all. A stopped device of that number whose
//     daemon is gone is deleted and created anew; a device with a live daemon is an error.
//   - Stop removes the device (STOP_DEV, then DEL_DEV) after the kernel's last requests.
//   - Leave stops serving a device with a fixed ID and leaves it for the next Start.
//   - Without CAP_SYS_ADMIN (a container that is not privileged), Start makes an unprivileged
//     device (UBLK_F_UNPRIVILEGED_DEV, Linux 6.5+): the kernel lets anyone who may open
//     /dev/ublk-control make one, owned by the caller, whose commands name its /dev/ublkcN
//     (which the caller must be able to open: a udev rule gives its nodes to their owner, as
//     ublksrv's does), and only its owner may open /dev/ublkbN. The kernel gives such a device
//     no user recovery, so it is never taken back: a stop or a kill removes it.
//
// A known Linux 6.12 limit: a daemon killed while START_DEV is still scanning the new disk for
// partitions (the first moments of Start, longer if reading sector 0 is a slow backend miss)
// can hang in its exit, its START_DEV waiting for a read that the kernel never fails.
//
// The package must never hand the kernel Go heap memory to keep (request buffers, descriptor
// arrays and control payloads are all mmapped), and must never issue a queue's commands from
// any thread but that queue's own.
package ublk

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/volume"
)

// Options configure a device.
type Options struct {
	ID     int // device number, -1 for any; a fixed ID also enables user recovery (see above)
	Queues int // 0: one per CPU
	Depth  int // 0: 128
	// BufferBytes bounds the I/O buffers of all the device's queues (a buffer the size of the
	// largest request for each tag of each queue): requests, then depth, are made smaller to fit.
	// 0: DefaultBufferBytes.
	BufferBytes int
	Logger      *slog.Logger
	// BeforeRecover, if set, is called when Start finds a device a previous daemon left (by
	// Leave or by dying) to take back, before the requests the kernel held reach the volume; an
	// error refuses the device, which stays as it is, and Start returns that error.
	BeforeRecover func() error
}

// Defaults and limits of a device.
const (
	defaultDepth = 128
	// maxIOBytes is the largest request the kernel sends (each tag has a buffer this big).
	maxIOBytes = 512 << 10
	// settleTimeout bounds the wait for a killed daemon's device to reach a state Start can
	// act on (the kernel quiesces or stops it asynchronously after the daemon's exit).
	settleTimeout = 30 * time.Second
	// releaseTimeout bounds the wait for a deleted device's last opener to close it.
	releaseTimeout = 5 * time.Second
)

// Device is a running ublk device.
type Device struct {
	id     uint32
	vol    volume.Device
	log    *slog.Logger
	ctrl   *control
	charFD int
	queues []*queue
	wg     sync.WaitGroup // queue loops
	// beforeRecover is Options.BeforeRecover.
	beforeRecover func() error
	// recoverable: made with a fixed ID, and so with user recovery (Leave needs it).
	recoverable bool

	stopOnce sync.Once
	stopErr  error
}

// Start creates (or takes back) the device and serves dev on it.
func Start(dev volume.Device, o Options) (*Device, error) {
	if o.Queues <= 0 {
		o.Queues = runtime.NumCPU()
	}
	if o.Depth <= 0 {
		o.Depth = defaultDepth
	}
	if o.BufferBytes <= 0 {
		o.BufferBytes = DefaultBufferBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	c, err := openControl()
	if err != nil {
		return nil, err
	}
	d := &Device{vol: dev, log: o.Logger, ctrl: c, charFD: -1, beforeRecover: o.BeforeRecover, recoverable: o.ID >= 0}
	if err := d.start(o); err != nil {
		c.Close()
		return nil, err
	}
	return d, nil
}

// Path is the block device's path, /dev/ublkbN.
func (d *Device) Path() string { return PathOf(int(d.id)) }

// PathOf is the path of block device id, /dev/ublkbN.
func PathOf(id int) string { return fmt.Sprintf("/dev/ublkb%d", id) }

// Stop removes the device: the kernel finishes the requests in flight, fails every fetch, and
// /dev/ublkbN and /dev/ublkcN go away.
//
// A device that something still holds open (a mounted file system) is removed all the same, so
// that the daemon can exit; Stop then says so in its error: that file system's I/O fails from
// then on, and the device number stays taken until it lets go.
func (d *Device) Stop() error {
	d.stopOnce.Do(func() {
		d.stopErr = errors.Join(d.teardown(d.ctrl.stopDev(d.id)), d.ctrl.Close())
		if d.stopErr == nil {
			d.log.Info("ublk device removed", "path", d.Path())
		}
	})
	return d.stopErr
}

// Leave stops serving the device and leaves it, with the requests the kernel holds, for the next
// Start with its ID to take back (user recovery): the requests being served finish on the
// volume, the queues' threads exit, and the kernel holds what comes next. Requests served but
// not yet answered are sent to the next daemon again. A device without a fixed ID cannot be
// taken back: Leave removes it, as Stop does.
func (d *Device) Leave() error {
	if !d.recoverable {
		return d.Stop()
	}
	d.stopOnce.Do(func() {
		d.abandon()
		d.stopErr = d.ctrl.Close()
		if d.stopErr == nil {
			d.log.Info("ublk device left for the next tierblk to take back", "path", d.Path())
		}
	})
	return d.stopErr
}

// teardown waits for the queue loops (stopErr being the result of what made them end), closes
// the character device and deletes the device.
func (d *Device) teardown(stopErr error) error {
	if stopErr != nil {
		// The queues may still wait for the kernel: make them leave.
		d.abandon()
	}
	d.wg.Wait()
	d.closeQueues()
	return errors.Join(stopErr, d.deleteDev(d.id))
}

// deleteDev deletes device id and waits, at most releaseTimeout, for its number to be free.
// DEL_DEV would wait for that as long as anything holds the stopped /dev/ublkbN open (a file
// system still mounted on it), and a daemon must not hang on it.
func (d *Device) deleteDev(id uint32) error {
	if d.ctrl.unprivileged {
		// The kernel takes no DEL_DEV_ASYNC for an unprivileged device.
		return d.ctrl.delDev(id)
	}
	err := d.ctrl.delDevAsync(id)
	if errors.Is(err, unix.EOPNOTSUPP) {
		// A kernel without DEL_DEV_ASYNC.
		return d.ctrl.delDev(id)
	}
	if err != nil {
		return err
	}
	deadline := time.Now().Add(releaseTimeout)
	for {
		_, err := d.ctrl.devInfo(id)
		switch {
		case errors.Is(err, unix.ENODEV):
			return nil
		case err != nil:
			return err
		case time.Now().After(deadline):
			return fmt.Errorf("ublk device %d is removed, but something still holds /dev/ublkb%d open (a mounted file system?): "+
				"its I/O fails, and the number stays taken until it is closed", id, id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *Device) closeQueues() {
	for _, q := range d.queues {
		q.unmap()
	}
	d.queues = nil
	if d.charFD >= 0 {
		unix.Close(d.charFD)
		d.charFD = -1
	}
}

func (d *Device) start(o Options) error {
	features := d.ctrl.features()
	unprivileged := !hasSysAdmin()
	if unprivileged && features&flagUnprivilegedDev == 0 {
		return errors.New("ublk needs CAP_SYS_ADMIN (root, or a privileged container), or a kernel that makes unprivileged ublk devices (Linux 6.5+)")
	}
	if unprivileged {
		d.recoverable = false
		if o.ID >= 0 {
			d.log.Warn("ublk: without CAP_SYS_ADMIN the device is unprivileged, and the kernel gives those no user recovery: "+
				"it is removed when tierblk stops, not left for the next one", "id", o.ID)
		}
	} else if o.ID >= 0 {
		recovered, err := d.takeBack(uint32(o.ID))
		if recovered || err != nil {
			return err
		}
	}
	depth, most := fitBuffers(o.Queues, o.Depth, maxIO(d.vol.Info()), o.BufferBytes)
	info := devInfo{
		NrHWQueues:    uint16(o.Queues),
		QueueDepth:    uint16(depth),
		MaxIOBufBytes: uint32(most),
		DevID:         anyDevice,
		UblksrvPID:    int32(os.Getpid()),
		Flags:         flagCmdIoctlEncode,
	}
	if o.ID >= 0 {
		info.DevID = uint32(o.ID)
	}
	if unprivileged {
		info.Flags |= flagUnprivilegedDev
	} else if o.ID >= 0 {
		info.Flags |= recoveryFlags
	}
	if err := d.ctrl.addDev(&info); err != nil {
		if unprivileged && errors.Is(err, unix.EACCES) {
			return fmt.Errorf("%w: the kernel allows no more unprivileged ublk devices (ublk_drv's ublks_max parameter)", err)
		}
		return err
	}
	d.id = info.DevID
	d.ctrl.unprivileged = unprivileged
	if unprivileged {
		// Every later command names /dev/ublkcN, which the kernel checks this user may open.
		if err := waitForOwner(charPath(d.id)); err != nil {
			return err
		}
	}
	d.log.Info("ublk device added", "id", d.id, "queues", info.NrHWQueues, "depth", info.QueueDepth,
		"max_io", info.MaxIOBufBytes, "flags", fmt.Sprintf("%#x", info.Flags), "kernel_features", fmt.Sprintf("%#x", features))
	if size := d.vol.Info().Size; size%(1<<sectorShift) != 0 {
		d.log.Warn("the export's size is not a whole number of 512-byte sectors; the device leaves out the last bytes",
			"size", size, "device_size", size>>sectorShift<<sectorShift)
	}
	p := deviceParams(d.vol.Info(), info.MaxIOBufBytes)
	err := d.ctrl.setParams(d.id, &p)
	if err == nil {
		err = d.startQueues(info)
	}
	if err == nil {
		err = d.ctrl.startDev(d.id, os.Getpid())
	}
	if err != nil {
		// STOP_DEV fails every fetch, which ends the queue loops; DEL_DEV then frees the number.
		return errors.Join(err, d.teardown(d.ctrl.stopDev(d.id)))
	}
	return nil
}

// recoveryFlags are the user recovery flags of a device with a fixed ID: while no daemon runs,
// the kernel queues requests, and those the last daemon had been given but not answered are
// requeued and sent to the next one; so a restart is a pause, never an error (TestUBLKRestart).
// UBLK_F_USER_RECOVERY_FAIL_IO would fail them all instead, and recovery without REISSUE fails
// the ones in flight.
const recoveryFlags = flagUserRecovery | flagUserRecoveryReissue

// maxIO is the largest request to ask of the kernel: maxIOBytes, or less if the volume takes
// less, in whole pages.
func maxIO(info volume.Info) int {
	n := maxIOBytes
	if info.MaxBlock > 0 {
		n = min(n, int(info.MaxBlock))
	}
	return max(n/unix.Getpagesize()*unix.Getpagesize(), unix.Getpagesize())
}

// DefaultBufferBytes is the default of Options.BufferBytes: 2 queues of 32 tags with requests of
// up to 128 KiB, or 16 queues of 16 with 32 KiB. The buffers are the daemon's memory (RSS) once
// touched, whatever the load; docs/operations.md, "How much RAM", counts them.
const DefaultBufferBytes = 8 << 20

// The smallest the buffers' fitting makes a request and a queue; below them, a request of the
// kernel's goes in many parts and a queue holds few.
const (
	minFitIO    = 128 << 10
	minFitDepth = 16
)

// fitBuffers returns the depth and largest request that keep queues x depth x maxIO within
// budget: the requests are made smaller first, to minFitIO, then the queues shallower, to
// minFitDepth, then the requests smaller again, to a page; requests stay whole pages.
func fitBuffers(queues, depth, maxIO, budget int) (int, int) {
	page := unix.Getpagesize()
	fits := func() bool { return queues*depth*maxIO <= budget }
	if !fits() && maxIO > minFitIO {
		maxIO = max(budget/(queues*depth)/page*page, minFitIO)
	}
	if !fits() && depth > minFitDepth {
		depth = max(budget/(queues*maxIO), minFitDepth)
	}
	if !fits() {
		maxIO = max(budget/(queues*depth)/page*page, page)
	}
	return depth, maxIO
}

// Discard and write-zeroes requests are split by the kernel at these sizes (in sectors), which
// bounds how long one request holds the volume.
const (
	maxDiscardSectors     = 1 << 17 // 64 MiB
	maxWriteZeroesSectors = 1 << 17
	discardGranularity    = 4096
)

// deviceParams describes the volume to the kernel: 512-byte logical blocks, a volatile write
// cache (so that the kernel sends flushes) with FUA, and discard and write-zeroes when the
// volume has them.
func deviceParams(info volume.Info, maxIO uint32) params {
	p := params{Len: sizeofParams, Types: paramTypeBasic}
	phys := uint8(12)
	if pb := info.PreferredBlock; pb >= 512 && pb <= 4096 && pb&(pb-1) == 0 {
		phys = uint8(bits.TrailingZeros32(pb))
	}
	p.Basic = paramBasic{
		LogicalBSShift:  sectorShift,
		PhysicalBSShift: phys,
		IOOptShift:      phys,
		IOMinShift:      sectorShift,
		MaxSectors:      maxIO >> sectorShift,
		DevSectors:      uint64(info.Size) >> sectorShift,
	}
	if info.ReadOnly {
		p.Basic.Attrs = attrReadOnly
		return p
	}
	p.Basic.Attrs = attrVolatileCache
	if info.CanFUA {
		p.Basic.Attrs |= attrFUA
	}
	// The kernel (6.12) takes the write-zeroes limit from the discard parameters only.
	if info.CanTrim || info.CanZero {
		p.Types |= paramTypeDiscard
		p.Discard = paramDiscard{DiscardGranularity: discardGranularity, MaxDiscardSegments: 1}
		if info.CanTrim {
			p.Discard.MaxDiscardSectors = maxDiscardSectors
		}
		if info.CanZero {
			p.Discard.MaxWriteZeroesSectors = maxWriteZeroesSectors
		}
	}
	return p
}

// startQueues opens /dev/ublkcN and starts a loop per queue; it returns once every queue has
// fetched all its tags.
func (d *Device) startQueues(info devInfo) error {
	fd, err := openRetry(charPath(d.id))
	if err != nil {
		return err
	}
	d.charFD = fd
	ready := make(chan error, info.NrHWQueues)
	for i := range info.NrHWQueues {
		q, err := newQueue(fd, i, int(info.QueueDepth), int(info.MaxIOBufBytes), d.vol, d.log)
		if err != nil {
			return err
		}
		d.queues = append(d.queues, q)
		d.wg.Go(func() { q.run(ready) })
		if err := <-ready; err != nil {
			return err
		}
	}
	return nil
}

// openRetry opens a device node that devtmpfs may not have created yet, or that a killed
// predecessor's exit has not released yet.
func openRetry(path string) (int, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			return fd, nil
		}
		if (err != unix.ENOENT && err != unix.EBUSY) || time.Now().After(deadline) {
			return -1, fmt.Errorf("open %s: %w", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// udevTimeout bounds the wait for udev to give an unprivileged device's nodes to their owner.
const udevTimeout = 10 * time.Second

// waitForOwner waits until this user may read and write the new unprivileged device's
// /dev/ublkcN: devtmpfs makes it root's, and a udev rule gives it to the device's owner.
func waitForOwner(path string) error {
	deadline := time.Now().Add(udevTimeout)
	for {
		err := unix.Access(path, unix.R_OK|unix.W_OK)
		if err == nil {
			return nil
		}
		if err != unix.ENOENT && err != unix.EACCES || time.Now().After(deadline) {
			return fmt.Errorf("%s: %w: an unprivileged ublk device's nodes are root's until a udev rule gives them to the device's owner "+
				"(uid %d here), and without them this user cannot even delete the device: root must (docs/operations.md#unprivileged-ublk)",
				path, err, os.Getuid())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hasSysAdmin reports whether the process has CAP_SYS_ADMIN, which a privileged ublk device's
// control commands need.
func hasSysAdmin() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return os.Geteuid() == 0
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0
}

// takeBack deals with an existing device numbered id: it recovers one left quiesced by a previous
// daemon (true) unless beforeRecover refuses it, deletes one that is stopped with no daemon (false: create it anew), and
// refuses one that a live process serves.
func (d *Device) takeBack(id uint32) (bool, error) {
	info, err := d.settle(id)
	if errors.Is(err, unix.ENODEV) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch {
	case info.State == stateQuiesced || info.State == stateFailIO:
		if d.beforeRecover != nil {
			if err := d.beforeRecover(); err != nil {
				return true, err
			}
		}
		return true, d.recover(info)
	case info.State == stateDead && !alive(int(info.UblksrvPID)):
		d.log.Info("deleting a stopped ublk device left by a previous daemon", "id", id)
		return false, d.deleteDev(id)
	default:
		return false, fmt.Errorf("ublk device %d exists and is served by process %d", id, info.UblksrvPID)
	}
}

// settle returns device id's state once it is no longer live with a dead daemon: the kernel
// quiesces (recovery) or stops the device of a killed daemon shortly after it exits.
func (d *Device) settle(id uint32) (devInfo, error) {
	deadline := time.Now().Add(settleTimeout)
	for {
		info, err := d.ctrl.devInfo(id)
		if err != nil || info.State != stateLive || alive(int(info.UblksrvPID)) || time.Now().After(deadline) {
			return info, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive tells whether process pid exists and is not a zombie (a killed daemon that its parent
// has not reaped yet is gone for the kernel's purposes).
func alive(pid int) bool {
	if pid <= 0 || pid == os.Getpid() {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold anything.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// recover takes back a device whose daemon is gone: START_USER_RECOVERY (once the old
// daemon's files are closed), fetch on new queues, END_USER_RECOVERY, which lets the requests
// that waited go.
func (d *Device) recover(info devInfo) error {
	d.id = info.DevID
	p, err := d.ctrl.params(d.id)
	if err != nil {
		return err
	}
	size := d.vol.Info().Size
	if p.Basic.DevSectors != uint64(size)>>sectorShift || p.Basic.LogicalBSShift != sectorShift {
		return fmt.Errorf("ublk device %d has %d sectors of %d bytes, not the export's %d bytes: delete it or use another --ublk-id",
			d.id, p.Basic.DevSectors, 1<<p.Basic.LogicalBSShift, size)
	}
	deadline := time.Now().Add(settleTimeout)
	for {
		err = d.ctrl.startRecovery(d.id)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	err = d.startQueues(info)
	if err == nil {
		err = d.ctrl.endRecovery(d.id, os.Getpid())
	}
	if err != nil {
		d.abandon()
		return err
	}
	d.log.Info("ublk device taken back from a previous daemon", "id", d.id, "queues", info.NrHWQueues,
		"depth", info.QueueDepth, "flags", fmt.Sprintf("%#x", info.Flags))
	return nil
}

// abandon leaves a device for another daemon: the queue loops exit once the requests they serve
// are done, and their threads' exit makes the kernel cancel their fetches (with recovery, it
// then holds the device's requests for the next daemon). For a recovery that failed half-way,
// and Leave.
func (d *Device) abandon() {
	for _, q := range d.queues {
		q.abandon()
	}
	d.wg.Wait()
	d.closeQueues()
}
