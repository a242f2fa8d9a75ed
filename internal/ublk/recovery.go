package ublk

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// recoveryFlags are the user recovery flags of a device with a fixed ID: while no daemon runs,
// the kernel queues requests, and those the last daemon had been given but not answered are
// requeued and sent to the next one; so a restart is a pause, never an error (TestUBLKRestart).
// UBLK_F_USER_RECOVERY_FAIL_IO would fail them all instead, and recovery without REISSUE fails
// the ones in flight.
const recoveryFlags = flagUserRecovery | flagUserRecoveryReissue

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
// quiesces (recovery) or stops the device of a daemon that left, shortly after the daemon exits,
// sooner on an idle machine than on a loaded one.
func (d *Device) settle(id uint32) (devInfo, error) {
	var info devInfo
	err := d.await(fmt.Sprintf("the kernel to quiesce ublk device %d, whose daemon exited", id), func() (bool, error) {
		var err error
		info, err = d.ctrl.devInfo(id)
		return err != nil || info.State != stateLive || alive(int(info.UblksrvPID)), err
	})
	if errors.Is(err, errAwait) {
		return info, fmt.Errorf("ublk device %d is still live after its daemon (process %d) exited: %w", id, info.UblksrvPID, err)
	}
	return info, err
}

// errAwait is what await returns when what it waits for does not happen within settleTimeout.
var errAwait = fmt.Errorf("the kernel did not get there within %v", settleTimeout)

// await calls done until it says so (or fails), for at most settleTimeout, saying in the log what
// it waits for when that takes more than a moment: the kernel's part of a take-back runs in its
// work queues, which a loaded machine (or an emulated one) runs late (TestUBLKRestart).
func (d *Device) await(what string, done func() (bool, error)) error {
	start := time.Now()
	said := start
	for {
		if ok, err := done(); ok || err != nil {
			return err
		}
		if time.Since(said) >= awaitLogEvery {
			d.log.Info("ublk: waiting for "+what, "waited", time.Since(start).Round(time.Second))
			said = time.Now()
		}
		if time.Since(start) > settleTimeout {
			return errAwait
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
	// EBUSY until the kernel has quiesced the device and released the previous daemon's files.
	err = d.await(fmt.Sprintf("the kernel to release ublk device %d from its previous daemon", d.id), func() (bool, error) {
		if err := d.ctrl.startRecovery(d.id); !errors.Is(err, unix.EBUSY) {
			return err == nil, err
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("ublk device %d: starting its recovery: %w", d.id, err)
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
