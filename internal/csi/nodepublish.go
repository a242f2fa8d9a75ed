package csi

import (
	"context"
	"errors"
	"os"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NodePublishVolume bind-mounts the staged volume onto the target path: its file system's mount
// at the staging path, or its device node onto a file.
func (n *node) NodePublishVolume(_ context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	id, target, staging, vc := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	unlock, err := n.lockWith(id, vc, field{"target_path", target != ""}, field{"staging_target_path", staging != ""})
	if err != nil {
		return nil, err
	}
	defer unlock()
	v := n.volume(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q is not staged on this node", id)
	}
	r := v.rec
	switch {
	case r.StagingPath != staging:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is staged at %s, not %s", id, r.StagingPath, staging)
	case r.Block != (vc.GetBlock() != nil):
		return nil, status.Errorf(codes.InvalidArgument, "volume %q was staged with another access type (block: %v)", id, r.Block)
	}
	if err := v.serving(); err != nil {
		return nil, err
	}
	mounted, err := isMountPoint(target)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if mounted {
		if ok, err := onVolume(r, target); err != nil || !ok {
			return nil, status.Errorf(codes.AlreadyExists, "%s is a mount point of something other than volume %q", target, id)
		}
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	ro := req.GetReadonly() || r.ReadOnly
	src := r.StagingPath
	if r.Block {
		src = r.Device
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o600)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "create the target file: %v", err)
		}
		f.Close()
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "create the target directory: %v", err)
	}
	if err := bindMount(src, target, ro); err != nil {
		os.Remove(target)
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target path and removes it.
func (n *node) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := required(field{"volume_id", id != ""}, field{"target_path", target != ""}); err != nil {
		return nil, err
	}
	unlock, err := n.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
		if n.volume(id) == nil {
			return nil, status.Errorf(codes.NotFound, "volume %q is not staged on this node", id)
		}
		return &csipb.NodeUnpublishVolumeResponse{}, nil
	}
	if err := unmount(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove the target: %v", err)
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// lockAt checks a request naming volume id at path (NodeExpandVolume, NodeGetVolumeStats) and
// locks the volume: the staged volume if path shows it, else NOT_FOUND.
func (n *node) lockAt(id, path string) (v *volume, unlock func(), err error) {
	if err := required(field{"volume_id", id != ""}, field{"volume_path", path != ""}); err != nil {
		return nil, nil, err
	}
	if unlock, err = n.lock(id); err != nil {
		return nil, nil, err
	}
	if v, err = n.stagedAt(id, path); err != nil {
		unlock()
		return nil, nil, err
	}
	return v, unlock, nil
}

func (n *node) stagedAt(id, path string) (*volume, error) {
	v := n.volume(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q is not staged on this node", id)
	}
	if err := v.serving(); err != nil {
		return nil, err
	}
	if ok, err := onVolume(v.rec, path); err != nil || !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q is not at %s", id, path)
	}
	return v, nil
}

// NodeExpandVolume grows the file system to the device, which a stage after an offline
// expansion serves at the volume's new size; the capacity is the device's size.
func (n *node) NodeExpandVolume(_ context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	v, unlock, err := n.lockAt(id, req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	defer unlock()
	size, err := deviceSize(v.rec.Device)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if want := req.GetCapacityRange().GetRequiredBytes(); want > size {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is served at %d bytes, less than the %d asked for: tierblk grows volumes offline; unstage and stage it again", id, size, want)
	}
	if !v.rec.Block && !v.rec.ReadOnly {
		if err := growFS(v.rec.Device, v.rec.StagingPath); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// NodeGetVolumeStats gives a file system volume's space and inodes, a block volume's size.
func (n *node) NodeGetVolumeStats(_ context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	path := req.GetVolumePath()
	v, unlock, err := n.lockAt(req.GetVolumeId(), path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if v.rec.Block {
		size, err := deviceSize(v.rec.Device)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{{Unit: csipb.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	bs := int64(st.Bsize)
	return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: csipb.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}
