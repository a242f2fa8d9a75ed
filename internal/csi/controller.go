package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tierblk/tierblk/internal/units"
)

const (
	// defaultCapacity is a dynamic volume's size when CreateVolume asks for none.
	defaultCapacity = 1 << 30
	// capacityUnit is what a dynamic volume's size is rounded up to: the cache's largest line.
	capacityUnit = 1 << 20
)

// fsTypes are the file systems NodeStage makes and mounts ("" is ext4).
var fsTypes = []string{"", "ext4", "ext3", "ext2", "xfs"}

// controller is CSI's Controller service: dynamic volumes are sparse files in the backing directory.
type controller struct {
	csipb.UnimplementedControllerServer
	dir string
}

func newController(o Options) (*controller, error) {
	if fi, err := os.Stat(o.BackingDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("--backing-dir %s: not a directory (%v)", o.BackingDir, err)
	}
	return &controller{dir: o.BackingDir}, nil
}

func (c *controller) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	var caps []*csipb.ControllerServiceCapability
	for _, t := range []csipb.ControllerServiceCapability_RPC_Type{
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{
			Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// file is the backing file of the dynamic volume id.
func (c *controller) file(id string) string { return filepath.Join(c.dir, id+".img") }

// backendURL is the backend of the dynamic volume id, as NodeStage opens it.
func (c *controller) backendURL(id string) string { return "file://" + c.file(id) }

func (c *controller) CreateVolume(_ context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name missing")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume_content_source: tierblk makes no volume from a snapshot or another volume")
	}
	s, err := parseSettings(req.GetParameters())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if _, static := s[keyBackend]; static {
		return nil, status.Errorf(codes.InvalidArgument, "parameter %q names a static volume's backend: give it in a PV's volume attributes, not a StorageClass", keyBackend)
	}
	want, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if want < 0 || limit < 0 || limit > 0 && want > limit {
		return nil, status.Errorf(codes.InvalidArgument, "capacity_range: required %d and limit %d bytes", want, limit)
	}
	size := roundUp(want, defaultCapacity, limit)
	if limit > 0 && size > limit {
		return nil, status.Errorf(codes.OutOfRange, "capacity_range: %d bytes rounded up to whole MiB exceed the limit of %d", want, limit)
	}
	id := volumeID(req.GetName())
	path := c.file(id)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case errors.Is(err, os.ErrExist):
		// Asked again (the CO retries): the same volume if it is of a size the request allows.
		fi, err := os.Stat(path)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if fi.Size() < want || limit > 0 && fi.Size() > limit {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with %d bytes, outside the capacity range asked for", req.GetName(), fi.Size())
		}
		size = fi.Size()
	case err != nil:
		return nil, status.Errorf(codes.Internal, "create %s: %v", path, err)
	default:
		// Sparse: the share holds only what the volume's users write.
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return nil, status.Errorf(codes.Internal, "size %s: %v", path, err)
		}
	}
	vc := map[string]string{keyBackend: c.backendURL(id)}
	for k, v := range s {
		vc[k] = v
	}
	return &csipb.CreateVolumeResponse{Volume: &csipb.Volume{VolumeId: id, CapacityBytes: size, VolumeContext: vc}}, nil
}

// roundUp is the size of a volume that must hold want bytes (def when 0): whole MiB, and no more
// than limit (when not 0) if want fits it.
func roundUp(want, def, limit int64) int64 {
	if want == 0 {
		want = def
		if limit > 0 && limit < def {
			want = limit
		}
	}
	return (want + capacityUnit - 1) / capacityUnit * capacityUnit
}

func (c *controller) DeleteVolume(_ context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id missing")
	}
	if !validID(id) {
		return &csipb.DeleteVolumeResponse{}, nil // no volume of ours: gone already
	}
	if _, err := os.Stat(c.file(id)); errors.Is(err, os.ErrNotExist) {
		return &csipb.DeleteVolumeResponse{}, nil
	}
	// A daemon serving the volume would go on writing to a file no one can open again.
	unlock, err := c.lockUnused(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := os.Remove(c.file(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "delete volume %q: %v", id, err)
	}
	return &csipb.DeleteVolumeResponse{}, nil
}

func (c *controller) ValidateVolumeCapabilities(_ context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if err := required(field{"volume_id", id != ""}, field{"volume_capabilities", len(req.GetVolumeCapabilities()) > 0}); err != nil {
		return nil, err
	}
	if _, err := c.size(id); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		if status.Code(err) == codes.InvalidArgument {
			return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
		return nil, err
	}
	if _, err := parseSettings(req.GetParameters()); err != nil {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters(),
	}}, nil
}

// size is the size of dynamic volume id, NOT_FOUND if there is none.
func (c *controller) size(id string) (int64, error) {
	if !validID(id) {
		return 0, status.Errorf(codes.NotFound, "volume %q: no such volume", id)
	}
	fi, err := os.Stat(c.file(id))
	if errors.Is(err, os.ErrNotExist) {
		return 0, status.Errorf(codes.NotFound, "volume %q: no such volume", id)
	}
	if err != nil {
		return 0, status.Error(codes.Internal, err.Error())
	}
	return fi.Size(), nil
}

// ControllerExpandVolume grows the backing file. The CO calls it while no node has the volume
// staged (the plugin's expansion is OFFLINE): the next NodeStage serves the new size, and grows
// the file system (NodeExpandVolume).
func (c *controller) ControllerExpandVolume(_ context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := required(field{"volume_id", id != ""}, field{"capacity_range", req.GetCapacityRange() != nil}); err != nil {
		return nil, err
	}
	have, err := c.size(id)
	if err != nil {
		return nil, err
	}
	want, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	size := roundUp(want, have, limit)
	if limit > 0 && size > limit {
		return nil, status.Errorf(codes.OutOfRange, "capacity_range: %d bytes rounded up to whole MiB exceed the limit of %d", want, limit)
	}
	block := req.GetVolumeCapability().GetBlock() != nil
	if size <= have {
		return &csipb.ControllerExpandVolumeResponse{CapacityBytes: have, NodeExpansionRequired: !block}, nil
	}
	unlock, err := c.lockUnused(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// os.Truncate never shrinks here (size > have), so no byte a user wrote is lost.
	if err := os.Truncate(c.file(id), size); err != nil {
		return nil, status.Errorf(codes.Internal, "grow volume %q to %s: %v", id, units.FormatSize(size), err)
	}
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: !block}, nil
}

// lockUnused takes the lock on dynamic volume id's file that a daemon serving it holds (the file
// backend's flock, which NFS carries between hosts), so that no node stages the volume while the
// controller changes or deletes it: FAILED_PRECONDITION while a node has it staged, which tells
// the CO to retry once the volume is unstaged (the plugin's expansion is OFFLINE).
func (c *controller) lockUnused(id string) (unlock func(), err error) {
	f, err := os.OpenFile(c.file(id), os.O_RDWR, 0)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %q: %v", id, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is staged on a node (its file is locked): it grows once no pod uses it", id)
		}
		return nil, status.Errorf(codes.Internal, "lock volume %q: %v", id, err)
	}
	return func() { f.Close() }, nil
}

// checkCapabilities refuses what tierblk cannot give: a volume on more than one node at once (its
// cache is the node's), and file systems it does not make.
func checkCapabilities(caps []*csipb.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume_capabilities missing")
	}
	for _, c := range caps {
		switch m := c.GetAccessMode().GetMode(); m {
		case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		default:
			return status.Errorf(codes.InvalidArgument, "access mode %v: a tierblk volume is on one node at a time (its cache is that node's): use SINGLE_NODE_WRITER (ReadWriteOnce)", m)
		}
		switch {
		case c.GetBlock() != nil:
		case c.GetMount() != nil:
			if fs := c.GetMount().GetFsType(); !slices.Contains(fsTypes, fs) {
				return status.Errorf(codes.InvalidArgument, "fs_type %q: tierblk makes ext4 (the default), ext3, ext2 or xfs", fs)
			}
		default:
			return status.Error(codes.InvalidArgument, "access_type missing: block or mount")
		}
	}
	return nil
}
