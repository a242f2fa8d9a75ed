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
	"os"
	"runtime"
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
	// settleTimeout bounds the wait for the device of a daemon that left or was killed to reach a
	// state Start can act on (the kernel quiesces or stops it asynchronously after the daemon's
	// exit); awaitLogEvery is how often the log says that Start waits for it.
	settleTimeout = 2 * time.Minute
	awaitLogEvery = 5 * time.Second
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
