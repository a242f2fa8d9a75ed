//go:build linux

package cli

import (
	"context"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/csi"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

type csiOpts struct {
	csi.Options
	logLevel string
	stderr   io.Writer
}

func newCSICmd(version string) *cobra.Command {
	o := csiOpts{}
	cmd := &cobra.Command{
		Use:   "csi",
		Short: "Serve tierblk volumes to Kubernetes: a CSI driver",
		Long: `Serve the CSI (Container Storage Interface) Identity service, and the Controller service
(--controller), the Node service (--node) or both, on a unix socket, for Kubernetes or another
container orchestrator. configs/kubernetes/ has the manifests; docs/operations.md#kubernetes tells
how it works.

The controller makes each dynamic volume a sparse file VOLUME.img in --backing-dir, a share every
node mounts at the same path (a NAS's NFS export); a static volume names its backend URL in its
PV's volume attributes (backend: nbd://nas:10809/lun0, iscsi://...). A StorageClass's parameters
set each volume's cache: mode (writeback by default), ram (64MiB), ssdSize (1GiB), line.

The node plugin serves each volume it stages from a tierblk daemon with the volume's SSD tier in
--cache-dir, as a ublk device (else the kernel NBD client), formatted and mounted for a file system
volume. Unstaging writes the volume's dirty data back to its backend before it returns, so the
volume can move to another node. A stop of the plugin (an upgrade) leaves the devices, with their
I/O held, and the next plugin takes them back from what --state-dir recorded.`,
		Example: `  tierblk csi --controller --node --endpoint unix:///csi/csi.sock --backing-dir /mnt/nas/tierblk
  tierblk csi --node --node-id "$NODE_NAME" --endpoint unix:///csi/csi.sock --backing-dir /mnt/nas/tierblk \
    --cache-dir /var/cache/tierblk/csi --state-dir /var/lib/tierblk/csi --metrics :9810 --admin unix:/csi/admin.sock`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stderr = cmd.ErrOrStderr()
			o.Version = version
			return runCSI(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "the unix socket the CSI services listen on")
	f.BoolVar(&o.Controller, "controller", false, "serve the Controller service (create, delete and grow dynamic volumes)")
	f.BoolVar(&o.Node, "node", false, "serve the Node service (stage and publish volumes on this node)")
	f.StringVar(&o.NodeID, "node-id", "", "this node's name, as Kubernetes knows it (default: the host name)")
	f.StringVar(&o.BackingDir, "backing-dir", "", "the directory of dynamic volumes' files, mounted at this path on every node and the controller")
	f.StringVar(&o.StateDir, "state-dir", "/var/lib/tierblk/csi", "node: where staged volumes are recorded (must outlive the plugin: a host path)")
	f.StringVar(&o.CacheDir, "cache-dir", "/var/cache/tierblk/csi", "node: the directory on the node's SSD that holds the volumes' SSD tiers")
	f.StringVar(&o.Attach, "attach", csi.AttachAuto, "node: how volumes are attached: ublk, nbd (the kernel NBD client), or auto (ublk where the kernel has /dev/ublk-control, else nbd)")
	f.StringVar(&o.Admin, "admin", "", "node: the staged volumes' admin endpoint, for tierblk stats, flush, mode and heal (127.0.0.1:PORT or unix:/path; loopback only)")
	f.StringVar(&o.Metrics, "metrics", "", "node: serve /metrics and /stats alone of the staged volumes, on any address (:9810), for Prometheus")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

func runCSI(ctx context.Context, o csiOpts) error {
	log, err := newLogger(o.stderr, o.logLevel)
	if err != nil {
		return err
	}
	if o.NodeID == "" {
		if o.NodeID, err = os.Hostname(); err != nil {
			return usageErrorf("--node-id: none given, and the host name is unknown: %v", err)
		}
	}
	if err := o.Check(); err != nil {
		return usageErrorf("%v", err)
	}
	o.Logger, o.Registry = log, registry.Default()
	raiseProcs()
	return csi.Run(ctx, o.Options)
}
