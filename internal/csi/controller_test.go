package csi

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"google.golang.org/grpc/status"
)

func mountCap(fs string, mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

var rwo = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func newTestController(t *testing.T) *controller {
	t.Helper()
	c, err := newController(Options{BackingDir: t.TempDir()})
	require.NoError(t, err)
	return c
}

// TestCreateVolume: what CreateVolume makes of each request, and the code of each refusal.
func TestCreateVolume(t *testing.T) {
	for _, tc := range []struct {
		name   string
		req    *csipb.CreateVolumeRequest
		code   codes.Code
		msg    string // in the refusal
		size   int64
		params map[string]string // in the volume context, besides the backend
	}{
		{name: "default size", req: &csipb.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csipb.VolumeCapability{mountCap("", rwo)}},
			size: defaultCapacity},
		{name: "rounded up to MiB", req: &csipb.CreateVolumeRequest{Name: "pvc-2", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 5<<20 + 1}}, size: 6 << 20},
		{name: "limit below the default", req: &csipb.CreateVolumeRequest{Name: "pvc-3", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			CapacityRange: &csipb.CapacityRange{LimitBytes: 8 << 20}}, size: 8 << 20},
		{name: "settings pass to the node", req: &csipb.CreateVolumeRequest{Name: "pvc-4", VolumeCapabilities: []*csipb.VolumeCapability{mountCap("xfs", rwo)},
			Parameters: map[string]string{"mode": "writethrough", "ssdSize": "2GiB", paramPVName: "pvc-4-pv", "csi.storage.k8s.io/pvc/name": "data"}},
			size: defaultCapacity, params: map[string]string{"mode": "writethrough", "ssdSize": "2GiB", keyPVName: "pvc-4-pv"}},
		{name: "no name", req: &csipb.CreateVolumeRequest{VolumeCapabilities: []*csipb.VolumeCapability{blockCap()}},
			code: codes.InvalidArgument, msg: "name missing"},
		{name: "no capability", req: &csipb.CreateVolumeRequest{Name: "x"}, code: codes.InvalidArgument, msg: "volume_capabilities missing"},
		{name: "many nodes", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{
			mountCap("", csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}}, code: codes.InvalidArgument, msg: "one node at a time"},
		{name: "foreign fs", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{mountCap("ntfs", rwo)}},
			code: codes.InvalidArgument, msg: `fs_type "ntfs"`},
		{name: "unknown parameter", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			Parameters: map[string]string{"ssd_size": "1GiB"}}, code: codes.InvalidArgument, msg: `unknown parameter "ssd_size": tierblk's are backend, mode, ram, ssdSize, line, pvName`},
		{name: "bad mode", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			Parameters: map[string]string{"mode": "fast"}}, code: codes.InvalidArgument, msg: "mode"},
		{name: "bad size", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			Parameters: map[string]string{"ssdSize": "lots"}}, code: codes.InvalidArgument, msg: "ssdSize"},
		{name: "backend in a class", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			Parameters: map[string]string{"backend": "nbd://nas/lun0"}}, code: codes.InvalidArgument, msg: "static volume"},
		{name: "limit below required", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 2 << 20, LimitBytes: 1 << 20}}, code: codes.InvalidArgument, msg: "capacity_range"},
		{name: "MiB rounding past the limit", req: &csipb.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 1<<20 + 1, LimitBytes: 1<<20 + 2}}, code: codes.OutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestController(t)
			resp, err := c.CreateVolume(context.Background(), tc.req)
			if tc.code != codes.OK {
				require.Equal(t, tc.code, status.Code(err), "%v", err)
				require.Contains(t, status.Convert(err).Message(), tc.msg)
				entries, _ := os.ReadDir(c.dir)
				require.Empty(t, entries, "a refused request makes no file")
				return
			}
			require.NoError(t, err)
			v := resp.GetVolume()
			require.Equal(t, tc.size, v.GetCapacityBytes())
			fi, err := os.Stat(c.file(v.GetVolumeId()))
			require.NoError(t, err)
			require.Equal(t, tc.size, fi.Size())
			want := map[string]string{keyBackend: "file://" + filepath.Join(c.dir, v.GetVolumeId()+".img")}
			for k, v := range tc.params {
				want[k] = v
			}
			require.Equal(t, want, v.GetVolumeContext())
		})
	}
}

// TestCreateVolumeAgain: the same name gives the same volume while the size asked fits it, and
// ALREADY_EXISTS when it does not; an unsafe name is hashed into a safe ID.
func TestCreateVolumeAgain(t *testing.T) {
	c := newTestController(t)
	ctx := context.Background()
	req := &csipb.CreateVolumeRequest{Name: "pvc-again", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 4 << 20}}
	first, err := c.CreateVolume(ctx, req)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(c.file("pvc-again"), []byte("data"), 0o600)) // written; truncates it to 4 bytes
	require.NoError(t, os.Truncate(c.file("pvc-again"), 4<<20))
	again, err := c.CreateVolume(ctx, req)
	require.NoError(t, err)
	require.Equal(t, first.GetVolume().GetVolumeId(), again.GetVolume().GetVolumeId())
	b, err := os.ReadFile(c.file("pvc-again"))
	require.NoError(t, err)
	require.Equal(t, "data", string(b[:4]), "asking again does not make the volume anew")

	req.CapacityRange = &csipb.CapacityRange{RequiredBytes: 8 << 20}
	_, err = c.CreateVolume(ctx, req)
	require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)

	long := strings.Repeat("n", 128)
	resp, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: long, VolumeCapabilities: []*csipb.VolumeCapability{blockCap()}})
	require.NoError(t, err)
	id := resp.GetVolume().GetVolumeId()
	require.True(t, validID(id) && id != long, id)
	for _, name := range []string{"../escape", "a/b", ".hidden"} {
		require.False(t, validID(name), name)
		require.True(t, validID(volumeID(name)), name)
	}
}

// TestDeleteExpandValidate: DeleteVolume is idempotent and never reaches outside the backing
// directory; expansion grows the file and never shrinks it; validation answers for known volumes.
func TestDeleteExpandValidate(t *testing.T) {
	c := newTestController(t)
	ctx := context.Background()
	resp, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-x", VolumeCapabilities: []*csipb.VolumeCapability{mountCap("", rwo)},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 2 << 20}})
	require.NoError(t, err)
	id := resp.GetVolume().GetVolumeId()

	v, err := c.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csipb.VolumeCapability{mountCap("", rwo)}})
	require.NoError(t, err)
	require.NotNil(t, v.GetConfirmed())
	v, err = c.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: id,
		VolumeCapabilities: []*csipb.VolumeCapability{mountCap("", csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)}})
	require.NoError(t, err)
	require.Nil(t, v.GetConfirmed())
	require.Contains(t, v.GetMessage(), "one node at a time")
	_, err = c.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: "nope", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()}})
	require.Equal(t, codes.NotFound, status.Code(err))

	e, err := c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: 3<<20 + 5}})
	require.NoError(t, err)
	require.EqualValues(t, 4<<20, e.GetCapacityBytes())
	require.True(t, e.GetNodeExpansionRequired(), "a file system grows on the node")
	e, err = c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapability: blockCap()})
	require.NoError(t, err)
	require.EqualValues(t, 4<<20, e.GetCapacityBytes(), "never shrunk")
	require.False(t, e.GetNodeExpansionRequired())
	fi, err := os.Stat(c.file(id))
	require.NoError(t, err)
	require.EqualValues(t, 4<<20, fi.Size())
	_, err = c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: "nope", CapacityRange: &csipb.CapacityRange{RequiredBytes: 1}})
	require.Equal(t, codes.NotFound, status.Code(err))

	outside := filepath.Join(filepath.Dir(c.dir), "outside.img")
	require.NoError(t, os.WriteFile(outside, nil, 0o600))
	for _, id := range []string{id, id, "../outside", "nope"} {
		_, err := c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
		require.NoError(t, err, id)
	}
	require.FileExists(t, outside)
	_, err = os.Stat(c.file(id))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

// TestControllerRefusesStagedVolume: while a daemon serves a dynamic volume (it holds the lock on
// the file, as the file backend does), growing or deleting it fails with FAILED_PRECONDITION and
// changes nothing; once the lock is let go both succeed.
func TestControllerRefusesStagedVolume(t *testing.T) {
	c := newTestController(t)
	ctx := context.Background()
	resp, err := c.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-busy", VolumeCapabilities: []*csipb.VolumeCapability{blockCap()},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 2 << 20}})
	require.NoError(t, err)
	id := resp.GetVolume().GetVolumeId()
	f, err := os.OpenFile(c.file(id), os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB))

	_, err = c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: 4 << 20}})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	_, err = c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	fi, err := os.Stat(c.file(id))
	require.NoError(t, err)
	require.EqualValues(t, 2<<20, fi.Size())

	require.NoError(t, f.Close())
	e, err := c.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: 4 << 20}})
	require.NoError(t, err)
	require.EqualValues(t, 4<<20, e.GetCapacityBytes())
	_, err = c.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	require.NoError(t, err)
}

// TestRunSurvivesHangup: a SIGHUP to a running plugin is logged and changes nothing; without Run's
// handler its default action would end the process (this test's too).
func TestRunSurvivesHangup(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	log := &nbdtest.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Endpoint: "unix://" + sock, Controller: true, BackingDir: dir, Version: "test",
			Logger: slog.New(slog.NewTextHandler(log, nil))})
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	info := func() error {
		_, err := csipb.NewIdentityClient(conn).GetPluginInfo(context.Background(), &csipb.GetPluginInfoRequest{})
		return err
	}
	require.Eventually(t, func() bool { return info() == nil }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "SIGHUP: nothing to reload") }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, info(), "still serving")
	cancel()
	require.NoError(t, <-done)
}
