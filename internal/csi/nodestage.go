package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/ublk"
)

// NodeStageVolume serves the volume from a daemon of its own, as a ublk or kernel NBD device,
// and mounts its file system (made if the device has none) on the staging path.
func (n *node) NodeStageVolume(_ context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	id, path, vc := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	unlock, err := n.lockWith(id, vc, field{"staging_target_path", path != ""})
	if err != nil {
		return nil, err
	}
	defer unlock()
	want := record{
		VolumeID: id, StagingPath: path, Block: vc.GetBlock() != nil,
		FsType: vc.GetMount().GetFsType(), MountFlags: vc.GetMount().GetMountFlags(),
		ReadOnly: vc.GetAccessMode().GetMode() == csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	}
	if v := n.volume(id); v != nil {
		if !v.rec.sameStage(want) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is staged at %s with another capability or path: unstage it first", id, v.rec.StagingPath)
		}
		// Staged already (a retry, or a plugin restarted since): make sure of every step.
		if err := n.ensureServing(v); err != nil {
			return nil, err
		}
		if err := stageFS(v.rec); err != nil {
			return nil, err
		}
		return &csipb.NodeStageVolumeResponse{}, nil
	}

	s, err := parseSettings(req.GetVolumeContext())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "volume_context: "+err.Error())
	}
	backendURL := s[keyBackend]
	if backendURL == "" {
		return nil, status.Errorf(codes.InvalidArgument, "volume_context has no %q: a static PV names its backend URL in its volume attributes", keyBackend)
	}
	want.PVName = s[keyPVName]
	name := want.PVName
	if name == "" {
		name = id
	}
	ssdDir := n.cacheDir(id)
	if _, err := os.Stat(ssdDir); err == nil {
		// No record holds it (its record was removed by hand, or could not be read at start):
		// what it caches may have been written on another node since; it must not be served.
		n.log.Warn("csi: removing an SSD tier that no staged volume records (stale)", "volume", id, "dir", ssdDir)
		if err := os.RemoveAll(ssdDir); err != nil {
			return nil, status.Errorf(codes.Internal, "remove stale SSD tier %s: %v", ssdDir, err)
		}
	}
	cfg := config.Defaults()
	cfg.Listen = nil // the kernel device only: no NBD listener
	cfg.RunDir = n.runDir()
	e := s.export(name, backendURL, ssdDir)

	v, err := n.reserve(&want, &e)
	if err != nil {
		return nil, err
	}
	cfg.Exports = []config.Export{e}
	want.cfg = cfg
	n.mu.Lock() // reserve, for another volume, reads the device of every volume
	v.rec = want
	n.mu.Unlock()
	forget := func() {
		n.mu.Lock()
		delete(n.vols, id)
		n.mu.Unlock()
		os.RemoveAll(n.recordDir(id))
		os.RemoveAll(ssdDir)
	}
	if err := cfg.Validate(n.o.Registry.Schemes()); err != nil {
		forget()
		return nil, status.Errorf(codes.InvalidArgument, "volume_context: %v", err)
	}
	// Recorded before the device exists: a plugin killed from here on finds the record and
	// serves the device again (or removes it at the unstage the CO retries).
	if err := writeRecord(n.recordDir(id), want); err != nil {
		forget()
		return nil, status.Errorf(codes.Internal, "record volume %q: %v", id, err)
	}
	if err := os.MkdirAll(ssdDir, 0o755); err != nil {
		forget()
		return nil, status.Errorf(codes.Internal, "SSD tier directory: %v", err)
	}
	if err := n.start(v); err != nil {
		forget()
		return nil, status.Error(codes.Internal, err.Error())
	}
	n.log.Info("csi: volume staged", "volume", id, "device", want.Device, "export", name, "staging_path", path)
	if err := stageFS(want); err != nil {
		// The device stays, recorded: the CO retries the stage, or unstages.
		return nil, err
	}
	return &csipb.NodeStageVolumeResponse{}, nil
}

// reserve chooses the kernel device of the volume r is staging, sets it in r and e, and adds
// the volume to the staged ones, so that no other stage chooses the same device.
func (n *node) reserve(r *record, e *config.Export) (*volume, error) {
	kind, err := n.devs.kind(n.o.Attach)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var used []string
	for _, v := range n.vols {
		used = append(used, v.rec.Device)
	}
	if kind == AttachUBLK {
		id := n.devs.freeUBLK(used)
		// keep: a restarted plugin's daemon takes the device back, its I/O held meanwhile.
		e.UBLK = &config.UBLK{ID: &id, OnStop: "keep"}
		r.Device = ublk.PathOf(id)
	} else {
		dev, err := n.devs.freeNBD(used)
		if err != nil {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		e.NBDDevice, e.NBDDeviceOnStop = dev, "keep"
		r.Device = dev
	}
	v := &volume{rec: *r}
	n.vols[r.VolumeID] = v
	return v, nil
}

// stageFS mounts a file system volume's device on its staging path, making the file system
// first if the device has none, and growing it to the device (an offline expansion completes
// so). It does what is not done yet: a retried stage finds the mount there.
func stageFS(r record) error {
	if r.Block {
		return nil
	}
	if mounted, err := isMountPoint(r.StagingPath); err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if mounted {
		return nil
	}
	kind, _, err := fsOn(r.Device)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if kind == "" {
		if r.ReadOnly {
			return status.Errorf(codes.FailedPrecondition, "volume %q has no file system, and its access mode is read-only: nothing can be made on it", r.VolumeID)
		}
		if err := mkfs(r.FsType, r.Device); err != nil {
			return status.Errorf(codes.Internal, "make a file system on volume %q: %v", r.VolumeID, err)
		}
	}
	flags, data := mountOptions(r.MountFlags)
	if r.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(r.Device, r.StagingPath, fsTypeOf(r.FsType), flags, data); err != nil {
		return status.Errorf(codes.Internal, "mount %s (%s) on %s: %v", r.Device, fsTypeOf(r.FsType), r.StagingPath, err)
	}
	if flags&unix.MS_RDONLY == 0 {
		if err := growFS(r.Device, r.StagingPath); err != nil {
			return status.Errorf(codes.Internal, "grow the file system of volume %q to its device: %v", r.VolumeID, err)
		}
	}
	return nil
}

// NodeUnstageVolume unmounts the staging path, stops the volume's daemon finally (its device
// removed, its dirty data written back to the backend), and deletes its SSD tier and record. A
// failed write-back fails the call and keeps both, for the CO's retry.
func (n *node) NodeUnstageVolume(_ context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := required(field{"volume_id", id != ""}, field{"staging_target_path", path != ""}); err != nil {
		return nil, err
	}
	unlock, err := n.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v := n.volume(id)
	if v == nil {
		return &csipb.NodeUnstageVolumeResponse{}, nil
	}
	// A publish (a bind mount of the staging path, or of the device node) outlives the unmount of
	// the staging path: the final stop would pull the device from under it.
	if v.serving() == nil {
		if others, err := mountedElsewhere(v.rec.Device, v.rec.StagingPath, v.rec.Block); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		} else if len(others) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still mounted at %s: unpublish it first", id, strings.Join(others, ", "))
		}
	}
	if !v.rec.Block {
		if err := unmount(v.rec.StagingPath); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %q: %v: unpublish it first", id, err)
			}
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	// A volume without a daemon (its start or last final stop failed) gets one: only a daemon
	// can write its dirty data back.
	if err := n.ensureServing(v); err != nil {
		return nil, err
	}
	if err := n.stop(v, true); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %q stays staged (its cache and record kept): %v", id, err)
	}
	if err := os.RemoveAll(n.cacheDir(id)); err != nil {
		return nil, status.Errorf(codes.Internal, "delete the SSD tier of volume %q: %v", id, err)
	}
	if err := os.RemoveAll(n.recordDir(id)); err != nil {
		return nil, status.Errorf(codes.Internal, "delete the record of volume %q: %v", id, err)
	}
	n.mu.Lock()
	delete(n.vols, id)
	n.mu.Unlock()
	n.log.Info("csi: volume unstaged: dirty data written back, device removed, SSD tier deleted", "volume", id)
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

// onVolume reports whether path shows volume r: a file on its file system, or its device node.
func onVolume(r record, path string) (bool, error) {
	var dev, st unix.Stat_t
	if err := unix.Stat(r.Device, &dev); err != nil {
		return false, fmt.Errorf("volume %q: device %s: %w", r.VolumeID, r.Device, err)
	}
	if err := unix.Stat(path, &st); err != nil {
		return false, err
	}
	if r.Block {
		return st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == dev.Rdev, nil
	}
	return st.Dev == dev.Rdev, nil
}
