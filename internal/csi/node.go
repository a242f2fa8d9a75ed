package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// node is CSI's Node service. (Being written: NodeStage, NodeUnstage, NodePublish,
// NodeUnpublish, NodeExpandVolume, NodeGetVolumeStats, and taking staged volumes back at start.)
type node struct {
	csipb.UnimplementedNodeServer
	o Options
}

// newNode starts the node service: it takes back the volumes that the state directory records
// as staged.
func newNode(_ context.Context, o Options) (*node, error) { return &node{o: o}, nil }

// close stops every staged volume's daemon, not finally: the devices stay for the next plugin.
func (n *node) close() {}
