// Package csi is tierblk's Container Storage Interface driver (`tierblk csi`): the Identity,
// Controller and Node services of CSI v1 on a unix socket, so that Kubernetes (or any CO) can ask
// for a cached volume.
//
// The controller creates dynamic volumes as sparse files in a backing directory that every node
// mounts at the same path (a NAS share), and passes the rest of a volume's settings to the nodes
// in its volume context; static volumes name their backend URL in the PV's volume attributes. The
// node plugin runs one tierblk daemon (package daemon) per staged volume, its SSD tier in the
// node's cache directory, attached as ublk (else the kernel NBD client), and records each staged
// volume in its state directory, so that a restarted plugin takes every device back.
//
// It must never let a volume be staged on a second node while dirty data of it waits in another
// node's cache: NodeUnstage returns only once the dirty data is on the backing store, and drops
// the node's cached copy, which would be stale once the volume was written elsewhere. It must
// never stop a staged volume's device when the plugin itself stops (an upgrade): that stop is not
// final (daemon.Options.Final), so the next plugin takes the device back with its I/O.
package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tierblk/tierblk/internal/daemon"
	"github.com/tierblk/tierblk/pkg/backend"
)

// DriverName is the CSI driver's name, as a CSIDriver object and a StorageClass's provisioner
// name it.
const DriverName = "tierblk.csi.tierblk.io"

// Options configure `tierblk csi`.
type Options struct {
	// Endpoint is the unix socket the services listen on: unix:///csi/csi.sock or a path.
	Endpoint string
	// Version is the driver's version, as GetPluginInfo reports it.
	Version string
	// Controller and Node choose the services served besides Identity (a Deployment runs the
	// controller, a DaemonSet the node plugin; one process may run both).
	Controller, Node bool
	// NodeID names this node (NodeGetInfo); the node's host name by default.
	NodeID string
	// BackingDir holds dynamic volumes' files, VOLUME_ID.img: the controller creates and deletes
	// them, the nodes open them. Every node and the controller mount the same share at this path.
	BackingDir string
	// StateDir is where the node plugin records its staged volumes (StateDir/volumes/ID/), and
	// the run directory of their daemons: it must outlive the plugin's container (a hostPath).
	StateDir string
	// CacheDir holds the SSD tiers of the volumes staged on this node (CacheDir/ID/): a directory
	// on the node's SSD.
	CacheDir string
	// Attach is how the node plugin attaches a staged volume as a kernel block device:
	// AttachUBLK, AttachNBD, or AttachAuto (ublk where the kernel has it, else NBD).
	Attach string
	// Admin, if set, serves the admin endpoint (/metrics, /stats, and the actions tierblk flush,
	// mode and heal use) of every volume staged on this node, each under its PV's name: loopback
	// or a unix socket only. Metrics, if set, serves /metrics and /stats alone, on any address,
	// for the cluster's Prometheus.
	Admin, Metrics string
	// Registry opens backends; Logger logs.
	Registry *backend.Registry
	Logger   *slog.Logger
}

// Run serves the services o asks for on o.Endpoint until ctx is cancelled. The node plugin first
// takes back the volumes its state directory records as staged; at the end it stops them, not
// finally: their devices stay for the next plugin.
func Run(ctx context.Context, o Options) error {
	if err := o.Check(); err != nil {
		return err
	}
	path, _ := socketPath(o.Endpoint)
	srv := grpc.NewServer(grpc.UnaryInterceptor(logCalls(o.Logger)))
	csipb.RegisterIdentityServer(srv, &identity{o: o})
	if o.Controller {
		c, err := newController(o)
		if err != nil {
			return err
		}
		csipb.RegisterControllerServer(srv, c)
	}
	if o.Node {
		n, err := newNode(ctx, o)
		if err != nil {
			return err
		}
		defer n.close()
		csipb.RegisterNodeServer(srv, n)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// A socket left by a killed plugin: nothing listens on it any more.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("--endpoint: %w", err)
	}
	// A SIGHUP's default action would end the plugin at once, without stopping the volumes'
	// daemons; there is nothing to reload.
	defer daemon.OnHangup(func() { o.Logger.Info("csi: SIGHUP: nothing to reload") })()
	o.Logger.Info("csi: serving", "endpoint", path, "controller", o.Controller, "node", o.Node, "driver", DriverName, "version", o.Version)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		return nil
	case err := <-served:
		return err
	}
}

// socketPath is the file of a unix endpoint: unix:///path, unix:/path or a plain path.
// Check reports what is wrong with o itself, before Run looks at the machine: no service asked
// for, an endpoint that is not a unix socket's absolute path, a controller without its backing
// directory, an attach setting that names no way. The CLI reports these as usage errors.
func (o Options) Check() error {
	if !o.Controller && !o.Node {
		return errors.New("give --controller, --node or both: the services to serve")
	}
	if _, err := socketPath(o.Endpoint); err != nil {
		return err
	}
	if o.Controller && o.BackingDir == "" {
		return errors.New("--backing-dir: the controller needs the directory that holds dynamic volumes (a share every node mounts at the same path)")
	}
	switch o.Attach {
	case AttachAuto, AttachUBLK, AttachNBD, "":
		return nil
	}
	return fmt.Errorf("--attach %q: use auto, ublk or nbd", o.Attach)
}

func socketPath(endpoint string) (string, error) {
	p := strings.TrimPrefix(strings.TrimPrefix(endpoint, "unix://"), "unix:")
	if p == "" || !filepath.IsAbs(p) {
		return "", fmt.Errorf("--endpoint %q: give a unix socket's absolute path, as unix:///csi/csi.sock", endpoint)
	}
	return p, nil
}

// logCalls logs every call and its outcome at debug level, and failures at info: a CO retries
// what failed, and the log is where a user finds why.
func logCalls(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			log.Info("csi: call failed", "method", info.FullMethod, "err", err)
		} else {
			log.Debug("csi: call", "method", info.FullMethod)
		}
		return resp, err
	}
}

// field is a request's field, for required: its name, and whether the request gives it.
type field struct {
	name  string
	given bool
}

// required is INVALID_ARGUMENT naming the first of fields that the request lacks, as the CSI
// spec asks of a call without a field it needs.
func required(fields ...field) error {
	for _, f := range fields {
		if !f.given {
			return status.Errorf(codes.InvalidArgument, "%s missing", f.name)
		}
	}
	return nil
}
