package csi

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// testNode is a node service whose state and cache directories are the test's: what it can do
// without kernel devices (this machine's kernel has neither ublk nor nbd; the VM tests in
// integration/ stage volumes for real).
func testNode(t *testing.T, admin string) *node {
	t.Helper()
	dir := t.TempDir()
	n, err := newNode(context.Background(), Options{
		NodeID: "node-1", StateDir: filepath.Join(dir, "state"), CacheDir: filepath.Join(dir, "cache"), Attach: AttachNBD,
		Admin: admin, Registry: registry.Default(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	t.Cleanup(n.close)
	return n
}

func requireCode(t *testing.T, want codes.Code, err error, what string) {
	t.Helper()
	require.Error(t, err, what)
	require.Equal(t, want, status.Code(err), "%s: %v", what, err)
}

func TestNodeArguments(t *testing.T) {
	n := testNode(t, "")
	ctx := context.Background()
	multi := mountCap("", rwo)
	multi.AccessMode.Mode = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	backend := map[string]string{keyBackend: "file:///nonexistent.img"}
	for _, c := range []struct {
		what string
		call func() error
		want codes.Code
	}{
		{"stage without volume_id", func() error {
			_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo)})
			return err
		}, codes.InvalidArgument},
		{"stage without staging_target_path", func() error {
			_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", VolumeCapability: mountCap("", rwo)})
			return err
		}, codes.InvalidArgument},
		{"stage without volume_capability", func() error {
			_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s"})
			return err
		}, codes.InvalidArgument},
		{"stage on many nodes", func() error {
			_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: multi, VolumeContext: backend})
			return err
		}, codes.InvalidArgument},
		{"stage without a backend", func() error {
			_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo)})
			return err
		}, codes.InvalidArgument},
		{"stage with an unknown setting", func() error {
			_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo),
				VolumeContext: map[string]string{keyBackend: "file:///x.img", "colour": "blue"}})
			return err
		}, codes.InvalidArgument},
		{"stage with a bad cache size", func() error {
			_, err := n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo),
				VolumeContext: map[string]string{keyBackend: "file:///x.img", keySSDSize: "lots"}})
			return err
		}, codes.InvalidArgument},
		{"unstage without volume_id", func() error {
			_, err := n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{StagingTargetPath: "/s"})
			return err
		}, codes.InvalidArgument},
		{"unstage without staging_target_path", func() error {
			_, err := n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "v"})
			return err
		}, codes.InvalidArgument},
		{"publish without volume_id", func() error {
			_, err := n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{TargetPath: "/t", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo)})
			return err
		}, codes.InvalidArgument},
		{"publish without target_path", func() error {
			_, err := n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo)})
			return err
		}, codes.InvalidArgument},
		{"publish without staging_target_path", func() error {
			_, err := n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", VolumeCapability: mountCap("", rwo)})
			return err
		}, codes.InvalidArgument},
		{"publish without volume_capability", func() error {
			_, err := n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", StagingTargetPath: "/s"})
			return err
		}, codes.InvalidArgument},
		{"publish of a volume not staged", func() error {
			_, err := n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo)})
			return err
		}, codes.NotFound},
		{"unpublish without volume_id", func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{TargetPath: "/t"})
			return err
		}, codes.InvalidArgument},
		{"unpublish without target_path", func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v"})
			return err
		}, codes.InvalidArgument},
		{"unpublish of a volume not staged, nothing at the target", func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: filepath.Join(t.TempDir(), "none")})
			return err
		}, codes.NotFound},
		{"expand without volume_id", func() error {
			_, err := n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumePath: "/t"})
			return err
		}, codes.InvalidArgument},
		{"expand without volume_path", func() error {
			_, err := n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v"})
			return err
		}, codes.InvalidArgument},
		{"expand of a volume not staged", func() error {
			_, err := n.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "v", VolumePath: "/t"})
			return err
		}, codes.NotFound},
		{"stats without volume_id", func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumePath: "/t"})
			return err
		}, codes.InvalidArgument},
		{"stats without volume_path", func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v"})
			return err
		}, codes.InvalidArgument},
		{"stats of a volume not staged", func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/t"})
			return err
		}, codes.NotFound},
	} {
		requireCode(t, c.want, c.call(), c.what)
	}
	// Not staged: nothing to do, which is success.
	_, err := n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s"})
	require.NoError(t, err)
	// A failed stage leaves nothing behind.
	entries, err := os.ReadDir(n.volumesDir())
	require.NoError(t, err)
	require.Empty(t, entries)

	info, err := n.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	require.NoError(t, err)
	require.Equal(t, "node-1", info.GetNodeId())
	caps, err := n.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	require.NoError(t, err)
	var got []csipb.NodeServiceCapability_RPC_Type
	for _, c := range caps.GetCapabilities() {
		got = append(got, c.GetRpc().GetType())
	}
	require.ElementsMatch(t, []csipb.NodeServiceCapability_RPC_Type{csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME, csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS}, got)
}

// A volume staged already: the same path and capability is the idempotent case (it goes on to
// check its device); another path or capability is ALREADY_EXISTS; a call on a volume that
// another call is working on is ABORTED.
func TestNodeStageStaged(t *testing.T) {
	n := testNode(t, "")
	ctx := context.Background()
	n.vols["v"] = &volume{rec: record{VolumeID: "v", StagingPath: "/s", Device: "/dev/nbd0"}, err: os.ErrNotExist}
	other := mountCap("", rwo)
	other.GetMount().MountFlags = []string{"noatime"}
	block := mountCap("", rwo)
	block.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	for what, req := range map[string]*csipb.NodeStageVolumeRequest{
		"another path":        {VolumeId: "v", StagingTargetPath: "/elsewhere", VolumeCapability: mountCap("", rwo)},
		"other mount flags":   {VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: other},
		"another access type": {VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: block},
	} {
		_, err := n.NodeStageVolume(ctx, req)
		requireCode(t, codes.AlreadyExists, err, what)
	}
	unlock, err := n.lock("v")
	require.NoError(t, err)
	_, err = n.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo)})
	requireCode(t, codes.Aborted, err, "a stage while another call works on the volume")
	_, err = n.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s"})
	requireCode(t, codes.Aborted, err, "an unstage while another call works on the volume")
	unlock()
	// Unlocked, the other volume calls go through: the volume has no daemon (it could not start),
	// and the calls that need it say so.
	_, err = n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", StagingTargetPath: "/s", VolumeCapability: mountCap("", rwo)})
	requireCode(t, codes.Internal, err, "publish of a volume whose daemon does not run")
	require.Contains(t, err.Error(), "not served")
	_, err = n.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", StagingTargetPath: "/other", VolumeCapability: mountCap("", rwo)})
	requireCode(t, codes.FailedPrecondition, err, "publish from another staging path")
}

func TestSameStage(t *testing.T) {
	a := record{VolumeID: "v", StagingPath: "/s", MountFlags: []string{"noatime"}}
	b := a
	b.FsType = "ext4"
	b.Device, b.PVName = "/dev/ublkb3", "pv" // what the plugin chose, not what the CO asked
	require.True(t, a.sameStage(b), "ext4 is the default file system")
	for what, change := range map[string]func(*record){
		"path":      func(r *record) { r.StagingPath = "/t" },
		"block":     func(r *record) { r.Block = true },
		"fs":        func(r *record) { r.FsType = "xfs" },
		"flags":     func(r *record) { r.MountFlags = nil },
		"read-only": func(r *record) { r.ReadOnly = true },
	} {
		c := a
		change(&c)
		require.False(t, a.sameStage(c), what)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	id := 3
	cfg := config.Defaults()
	cfg.Listen, cfg.RunDir = nil, "/state/run"
	e := settings{keyMode: "writethrough", keyRAM: "8MiB"}.export("pv-1", "file:///backing/v.img", "/cache/v")
	e.UBLK = &config.UBLK{ID: &id, OnStop: "keep"}
	cfg.Exports = []config.Export{e}
	want := record{VolumeID: "v", StagingPath: "/s", FsType: "xfs", MountFlags: []string{"noatime", "discard"},
		Device: "/dev/ublkb3", PVName: "pv-1", cfg: cfg}
	require.NoError(t, writeRecord(dir, want))
	got, err := readRecord(dir, registry.Default().Schemes())
	require.NoError(t, err)
	// YAML has no nil list: none comes back empty.
	require.Empty(t, got.cfg.Listen)
	require.Empty(t, got.cfg.Allow)
	got.cfg.Listen, got.cfg.Allow = nil, nil
	require.Equal(t, want, got)
	require.True(t, got.cfg.Exports[0].UBLK.KeepOnStop())

	// The configuration alone is a record whose writing was cut short.
	require.NoError(t, os.Remove(filepath.Join(dir, recordFacts)))
	_, err = readRecord(dir, registry.Default().Schemes())
	require.ErrorIs(t, err, errIncomplete)
	// A configuration that no longer validates is reported, not served.
	require.NoError(t, os.WriteFile(filepath.Join(dir, recordConfig), []byte("exports: []\n"), 0o644))
	require.NoError(t, writeAtomic(dir, recordFacts, []byte(`{"volume_id": "v"}`)))
	_, err = readRecord(dir, registry.Default().Schemes())
	require.ErrorContains(t, err, "no export configured")
}

// At start the node serves every record again; one cut short is removed, one that cannot be
// served is kept and reported by the calls on its volume.
func TestNodeRestore(t *testing.T) {
	dir := t.TempDir()
	o := Options{NodeID: "n", StateDir: filepath.Join(dir, "state"), CacheDir: filepath.Join(dir, "cache"), Attach: AttachNBD,
		Registry: registry.Default(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	vols := filepath.Join(o.StateDir, "volumes")
	cut := filepath.Join(vols, "cut")
	require.NoError(t, os.MkdirAll(cut, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(cut, recordConfig), []byte("exports: []\n"), 0o644))
	cfg := config.Defaults()
	cfg.Listen, cfg.RunDir = nil, filepath.Join(o.StateDir, "run")
	e := settings{}.export("pv", "file://"+filepath.Join(dir, "missing.img"), filepath.Join(o.CacheDir, "bad"))
	e.NBDDevice = "/dev/nbd7"
	cfg.Exports = []config.Export{e}
	require.NoError(t, writeRecord(filepath.Join(vols, "bad"), record{VolumeID: "bad", StagingPath: "/s", Block: true, Device: "/dev/nbd7", cfg: cfg}))

	n, err := newNode(context.Background(), o)
	require.NoError(t, err)
	defer n.close()
	require.NoDirExists(t, cut)
	require.DirExists(t, filepath.Join(vols, "bad"))
	require.Contains(t, n.vols, "bad")
	_, err = n.NodeGetVolumeStats(context.Background(), &csipb.NodeGetVolumeStatsRequest{VolumeId: "bad", VolumePath: "/s"})
	requireCode(t, codes.Internal, err, "stats of a volume whose daemon could not start")
	require.Contains(t, err.Error(), "missing.img")
	// Its device is taken: no other volume gets it.
	n.devs = devices{dev: filepath.Join(dir, "dev"), sys: filepath.Join(dir, "sys")}
	for _, d := range []string{"nbd7", "nbd8"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "sys/block", d), 0o755))
	}
	var e2 config.Export
	v, err := n.reserve(&record{VolumeID: "x"}, &e2)
	require.NoError(t, err)
	require.Equal(t, "/dev/nbd8", v.rec.Device)
	require.Equal(t, "/dev/nbd8", e2.NBDDevice)
	require.True(t, e2.KeepNBDDevice())
}

func TestDeviceChoice(t *testing.T) {
	root := t.TempDir()
	d := devices{dev: filepath.Join(root, "dev"), sys: filepath.Join(root, "sys")}
	touch := func(p string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), nil, 0o644))
	}

	kind, err := d.kind(AttachAuto)
	require.NoError(t, err)
	require.Equal(t, AttachNBD, kind, "no /dev/ublk-control")
	_, err = d.kind(AttachUBLK)
	require.ErrorContains(t, err, "ublk_drv")
	_, err = d.kind("iscsi")
	require.ErrorContains(t, err, "use auto, ublk or nbd")
	touch("dev/ublk-control")
	kind, err = d.kind(AttachAuto)
	require.NoError(t, err)
	require.Equal(t, AttachUBLK, kind)
	kind, err = d.kind(AttachNBD)
	require.NoError(t, err)
	require.Equal(t, AttachNBD, kind)

	require.Equal(t, 0, d.freeUBLK(nil))
	touch("dev/ublkb0") // a device of the kernel
	touch("dev/ublkc1") // one being removed: its block device gone, its number not free yet
	require.Equal(t, 2, d.freeUBLK(nil))
	require.Equal(t, 4, d.freeUBLK([]string{"/dev/ublkb2", "/dev/ublkb3"}), "recorded volumes' devices")

	_, err = d.freeNBD(nil)
	require.Error(t, err, "no /sys/block")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/block/loop0"), 0o755))
	_, err = d.freeNBD(nil)
	require.ErrorContains(t, err, "modprobe nbd")
	touch("sys/block/nbd0/pid") // connected
	touch("sys/block/nbd1/size")
	touch("sys/block/nbd10/size")
	touch("sys/block/nbd2/size")
	dev, err := d.freeNBD(nil)
	require.NoError(t, err)
	require.Equal(t, "/dev/nbd1", dev)
	dev, err = d.freeNBD([]string{"/dev/nbd1"})
	require.NoError(t, err)
	require.Equal(t, "/dev/nbd2", dev, "by number: nbd2 before nbd10")
	dev, err = d.freeNBD([]string{"/dev/nbd1", "/dev/nbd2"})
	require.NoError(t, err)
	require.Equal(t, "/dev/nbd10", dev)
	_, err = d.freeNBD([]string{"/dev/nbd1", "/dev/nbd2", "/dev/nbd10"})
	require.ErrorContains(t, err, "all 4 kernel NBD devices are in use")
}

// The admin endpoint serves the union of the staged volumes' sources, each under its PV's name,
// and drops a volume's once it is unstaged.
func TestNodeAdminSources(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	n := testNode(t, "unix:"+sock)
	source := func(pv string) metrics.Source {
		return metrics.Source{Export: pv, Stats: func() cache.Stats { return cache.Stats{Mode: "writeback", LineSize: 65536} }}
	}
	n.setSources("vol-b", []metrics.Source{source("pv-b")})
	n.setSources("vol-a", []metrics.Source{source("pv-a")})
	client := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	get := func(path string) string {
		resp, err := client.Get("http://localhost" + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	stats := get("/stats")
	require.Less(t, strings.Index(stats, `"pv-a"`), strings.Index(stats, `"pv-b"`), "both volumes, in the order of their IDs:\n%s", stats)
	require.Greater(t, strings.Index(stats, `"pv-a"`), 0, stats)
	require.Contains(t, get("/metrics"), `export="pv-b"`)
	n.setSources("vol-b", nil)
	require.NotContains(t, get("/stats"), "pv-b")
	require.NotContains(t, get("/metrics"), `export="pv-b"`)
	require.Contains(t, get("/metrics"), `export="pv-a"`)
}

func TestFileSystemTools(t *testing.T) {
	for _, tool := range []string{"mkfs.ext4", "resize2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (Debian package e2fsprogs)", tool)
		}
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(img, nil, 0o644))
	require.NoError(t, os.Truncate(img, 16<<20))
	kind, _, err := fsOn(img)
	require.NoError(t, err)
	require.Empty(t, kind, "a blank device has no file system")
	require.NoError(t, mkfs("", img))
	kind, size, err := fsOn(img)
	require.NoError(t, err)
	require.Equal(t, "ext", kind)
	require.Equal(t, int64(16<<20), size)
	// Grown offline: the file system is grown to the device.
	require.NoError(t, os.Truncate(img, 32<<20))
	require.NoError(t, growFS(img, ""))
	_, size, err = fsOn(img)
	require.NoError(t, err)
	require.Equal(t, int64(32<<20), size)

	err = mkfs("xfs-not-here", img)
	require.ErrorContains(t, err, "mkfs.xfs-not-here is not on the node plugin's PATH")
}

func TestMountOptions(t *testing.T) {
	flags, data := mountOptions([]string{"ro,noatime", "discard", "nosuid", "commit=30"})
	require.NotZero(t, flags&uintptr(0x1), "MS_RDONLY")
	require.Equal(t, "discard,commit=30", data)
	points, err := parseMountInfo(strings.NewReader(
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n" +
			"40 22 0:5 / /var/lib/kubelet/pods/a\\040b/volumes rw - tmpfs tmpfs rw\n" +
			"41 22 0:6 /ublkb0 /var/lib/kubelet/plugins/blk rw shared:2 master:1 - devtmpfs udev rw\n" +
			"truncated line\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]mount{
		"/":                                 {dev: "8:1", root: "/", fs: "ext4"},
		"/var/lib/kubelet/pods/a b/volumes": {dev: "0:5", root: "/", fs: "tmpfs"},
		"/var/lib/kubelet/plugins/blk":      {dev: "0:6", root: "/ublkb0", fs: "devtmpfs"},
	}, points)
}
