package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tierblk/tierblk/internal/daemon"
	"github.com/tierblk/tierblk/internal/metrics"
)

// node is CSI's Node service: one tierblk daemon (daemon.Run, in this process) per staged volume.
type node struct {
	csipb.UnimplementedNodeServer
	o    Options
	log  *slog.Logger
	devs devices

	mu   sync.Mutex
	vols map[string]*volume // by volume ID: every volume with a record
	// busy holds the volumes a call is working on: CSI allows one operation per volume at a
	// time, and a CO retries one that got ABORTED.
	busy map[string]bool
	// sources are the metric sources of each volume's running daemon, for the admin endpoint.
	sources map[string][]metrics.Source

	stopEndpoints func() error
}

// volume is a staged volume. Its fields are used under the node's busy mark for its ID.
type volume struct {
	rec record
	// run is its daemon; nil while it runs none (it could not start, or a final stop failed).
	run *daemonRun
	// err is why it has no daemon.
	err error
}

// daemonRun is a running daemon.Run.
type daemonRun struct {
	cancel context.CancelFunc
	final  atomic.Bool
	done   chan struct{}
	err    error // daemon.Run's, once done is closed
}

// newNode starts the node service: it takes back the volumes that the state directory records
// as staged, starting each one's daemon with the configuration it was staged with; the daemon
// takes the kernel device back (ublk) or over (NBD) with the I/O it held. A volume whose daemon
// does not start is logged, and its calls answer why.
func newNode(_ context.Context, o Options) (*node, error) {
	if o.StateDir == "" || o.CacheDir == "" {
		return nil, errors.New("--state-dir and --cache-dir: the node service needs both")
	}
	n := &node{o: o, log: o.Logger, devs: devices{dev: "/dev", sys: "/sys"},
		vols: map[string]*volume{}, busy: map[string]bool{}, sources: map[string][]metrics.Source{}}
	if _, err := n.devs.kind(o.Attach); err != nil {
		return nil, err
	}
	for _, d := range []string{n.volumesDir(), n.runDir(), o.CacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	stop, err := metrics.Endpoints{Admin: o.Admin, Metrics: o.Metrics}.Serve(metrics.NewHandlers(n.allSources), n.log)
	if err != nil {
		return nil, err
	}
	n.stopEndpoints = stop
	n.restore()
	return n, nil
}

func (n *node) volumesDir() string { return filepath.Join(n.o.StateDir, "volumes") }

// runDir is the daemons' run directory (config.Config.RunDir): their SSD tiers' run logs and the
// marks of devices a clean stop left, which the next plugin's daemons read.
func (n *node) runDir() string { return filepath.Join(n.o.StateDir, "run") }

// recordDir and cacheDir are where volume id's record and SSD tier are.
func (n *node) recordDir(id string) string { return filepath.Join(n.volumesDir(), volumeID(id)) }
func (n *node) cacheDir(id string) string  { return filepath.Join(n.o.CacheDir, volumeID(id)) }

// restore starts the daemon of every recorded volume.
func (n *node) restore() {
	entries, err := os.ReadDir(n.volumesDir())
	if err != nil {
		n.log.Error("csi: cannot read the staged volumes' records", "dir", n.volumesDir(), "err", err)
		return
	}
	for _, e := range entries {
		dir := filepath.Join(n.volumesDir(), e.Name())
		r, err := readRecord(dir, n.o.Registry.Schemes())
		if errors.Is(err, errIncomplete) {
			// Cut short before any device or daemon existed: nothing to take back.
			n.log.Warn("csi: removing a record whose writing was cut short", "dir", dir)
			os.RemoveAll(dir)
			continue
		}
		if r.VolumeID == "" {
			n.log.Error("csi: unreadable record of a staged volume; its volume cannot be taken back", "dir", dir, "err", err)
			continue
		}
		v := &volume{rec: r, err: err}
		n.vols[r.VolumeID] = v
		if err == nil {
			err = n.start(v)
		}
		if err != nil {
			n.log.Error("csi: cannot serve a staged volume again", "volume", r.VolumeID, "device", r.Device, "err", err)
			continue
		}
		n.log.Info("csi: serving a staged volume again", "volume", r.VolumeID, "device", r.Device)
	}
}

// close stops every staged volume's daemon, not finally: the devices stay for the next plugin.
func (n *node) close() {
	for id, v := range n.vols {
		if err := n.stop(v, false); err != nil {
			n.log.Error("csi: stopping a volume's daemon", "volume", id, "err", err)
		}
	}
	if err := n.stopEndpoints(); err != nil {
		n.log.Error("csi: admin or metrics endpoint", "err", err)
	}
}

// start runs v's daemon and waits until its device is attached.
func (n *node) start(v *volume) error {
	id := v.rec.VolumeID
	ctx, cancel := context.WithCancel(context.Background())
	r := &daemonRun{cancel: cancel, done: make(chan struct{})}
	ready := make(chan struct{})
	log := n.log.With("volume", id)
	go func() {
		defer close(r.done)
		r.err = daemon.Run(ctx, v.rec.cfg, n.o.Registry, log, daemon.Options{
			Ready:  func([]string) { close(ready) },
			Final:  r.final.Load,
			Opened: func(s []metrics.Source) { n.setSources(id, s) },
		})
		if ctx.Err() == nil {
			log.Error("csi: the volume's daemon stopped by itself", "err", r.err)
		}
	}()
	select {
	case <-ready:
		v.run, v.err = r, nil
		return nil
	case <-r.done:
		cancel()
		n.setSources(id, nil)
		v.err = fmt.Errorf("serving volume %q on %s: %w", id, v.rec.Device, r.err)
		return v.err
	}
}

// stop stops v's daemon; a final stop removes its device and writes its dirty data back first.
func (n *node) stop(v *volume, final bool) error {
	r := v.run
	if r == nil {
		return nil
	}
	r.final.Store(final)
	r.cancel()
	<-r.done
	v.run = nil
	n.setSources(v.rec.VolumeID, nil)
	if r.err != nil {
		v.err = fmt.Errorf("stopping the daemon of volume %q: %w", v.rec.VolumeID, r.err)
		return v.err
	}
	return nil
}

// serving returns nil if v's daemon runs, else a status that says why not.
func (v *volume) serving() error {
	if v.run != nil {
		select {
		case <-v.run.done:
			return status.Errorf(codes.Internal, "volume %q: its daemon stopped: %v", v.rec.VolumeID, v.run.err)
		default:
			return nil
		}
	}
	return status.Errorf(codes.Internal, "volume %q is recorded as staged here but not served: %v", v.rec.VolumeID, v.err)
}

// ensureServing starts v's daemon again if it runs none (it stopped, or could not start when the
// plugin did).
func (n *node) ensureServing(v *volume) error {
	if v.serving() == nil {
		return nil
	}
	if v.run != nil {
		v.run.cancel()
		<-v.run.done
		v.run = nil
	}
	if err := n.start(v); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// lockWith checks a request for volume id with capability vc and paths (NodeStageVolume,
// NodePublishVolume): the fields it needs, a capability tierblk gives; then locks the volume.
func (n *node) lockWith(id string, vc *csipb.VolumeCapability, paths ...field) (unlock func(), err error) {
	fields := append([]field{{"volume_id", id != ""}}, paths...)
	if err := required(append(fields, field{"volume_capability", vc != nil})...); err != nil {
		return nil, err
	}
	if err := checkCapabilities([]*csipb.VolumeCapability{vc}); err != nil {
		return nil, err
	}
	return n.lock(id)
}

// lock marks volume id busy for the caller, who calls the returned func when done: ABORTED if
// another call has it.
func (n *node) lock(id string) (unlock func(), err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busy[id] {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %q is in progress", id)
	}
	n.busy[id] = true
	return func() {
		n.mu.Lock()
		delete(n.busy, id)
		n.mu.Unlock()
	}, nil
}

// volume returns the staged volume id, nil if it is not staged here.
func (n *node) volume(id string) *volume {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.vols[id]
}

func (n *node) setSources(id string, s []metrics.Source) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s == nil {
		delete(n.sources, id)
	} else {
		n.sources[id] = s
	}
}

// allSources are the metric sources of every volume served, in the order of their IDs; each is
// named after its export, which is the volume's PV.
func (n *node) allSources() []metrics.Source {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]string, 0, len(n.sources))
	for id := range n.sources {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var all []metrics.Source
	for _, id := range ids {
		all = append(all, n.sources[id]...)
	}
	return all
}

func (n *node) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: n.o.NodeID}, nil
}

func (n *node) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, t := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{
			Rpc: &csipb.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}
