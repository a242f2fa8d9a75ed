// Command csiclient makes single CSI calls to a driver's unix socket, as a CO would, for the
// tests of `tierblk csi` in the VM (integration/csi_vm_test.go), where neither Kubernetes nor a
// CSI CLI is at hand. Only tests use it; it must never be shipped as a tool.
//
//	csiclient -endpoint SOCK create -name N -size BYTES [-param k=v]... -out CONTEXT.json
//	csiclient -endpoint SOCK stage -id ID -path DIR -context CONTEXT.json [-block] [-fs ext4] [-ro]
//	csiclient -endpoint SOCK unstage -id ID -path DIR
//	csiclient -endpoint SOCK publish -id ID -staging DIR -target PATH [-block] [-ro]
//	csiclient -endpoint SOCK unpublish -id ID -target PATH
//	csiclient -endpoint SOCK expand -id ID -size BYTES
//	csiclient -endpoint SOCK delete -id ID
//
// It exits 0 when the call succeeded, else 1 with the gRPC status on stderr (code and message).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// params collects repeated -param k=v flags.
type params map[string]string

func (p params) String() string { return fmt.Sprint(map[string]string(p)) }

func (p params) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q: want key=value", s)
	}
	p[k] = v
	return nil
}

func main() {
	endpoint := flag.String("endpoint", "/tmp/csi.sock", "the driver's unix socket")
	flag.Parse()
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "csiclient: give a call: create, stage, unstage, publish, unpublish, expand, delete")
		os.Exit(2)
	}
	conn, err := grpc.NewClient("unix://"+*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "csiclient:", err)
		os.Exit(1)
	}
	defer conn.Close()
	// A stage makes a file system under emulation, an unstage writes a cache back: minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := call(ctx, conn, flag.Arg(0), flag.Args()[1:]); err != nil {
		if s, ok := status.FromError(err); ok {
			fmt.Fprintf(os.Stderr, "csiclient %s: %s: %s\n", flag.Arg(0), s.Code(), s.Message())
		} else {
			fmt.Fprintf(os.Stderr, "csiclient %s: %v\n", flag.Arg(0), err)
		}
		os.Exit(1)
	}
}

func call(ctx context.Context, conn *grpc.ClientConn, name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	id := fs.String("id", "", "volume ID")
	path := fs.String("path", "", "staging path")
	staging := fs.String("staging", "", "staging path (publish)")
	target := fs.String("target", "", "target path")
	block := fs.Bool("block", false, "a raw block volume (else a file system)")
	fsType := fs.String("fs", "", "file system type")
	ro := fs.Bool("ro", false, "read-only")
	volName := fs.String("name", "", "volume name (create)")
	size := fs.Int64("size", 0, "capacity in bytes (create, expand)")
	out := fs.String("out", "", "file to write the volume ID and context to, as JSON (create)")
	ctxFile := fs.String("context", "", "the JSON create wrote (stage)")
	ps := params{}
	fs.Var(ps, "param", "key=value of a StorageClass parameter (create), repeated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	capability := &csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if *ro {
		capability.AccessMode.Mode = csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	}
	if *block {
		capability.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	} else {
		capability.AccessType = &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: *fsType}}
	}
	node, ctrl := csipb.NewNodeClient(conn), csipb.NewControllerClient(conn)
	switch name {
	case "create":
		r, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: *volName, Parameters: ps,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: *size}, VolumeCapabilities: []*csipb.VolumeCapability{capability}})
		if err != nil {
			return err
		}
		b, err := json.Marshal(map[string]any{"id": r.GetVolume().GetVolumeId(), "context": r.GetVolume().GetVolumeContext()})
		if err != nil {
			return err
		}
		fmt.Println(r.GetVolume().GetVolumeId())
		return os.WriteFile(*out, b, 0o644)
	case "stage":
		var created struct {
			Context map[string]string `json:"context"`
		}
		b, err := os.ReadFile(*ctxFile)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &created); err != nil {
			return err
		}
		_, err = node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: *id, StagingTargetPath: *path,
			VolumeCapability: capability, VolumeContext: created.Context})
		return err
	case "unstage":
		_, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: *id, StagingTargetPath: *path})
		return err
	case "publish":
		_, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: *id, StagingTargetPath: *staging,
			TargetPath: *target, VolumeCapability: capability, Readonly: *ro})
		return err
	case "unpublish":
		_, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: *id, TargetPath: *target})
		return err
	case "expand":
		_, err := ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: *id,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: *size}, VolumeCapability: capability})
		return err
	case "delete":
		_, err := ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: *id})
		return err
	}
	return fmt.Errorf("unknown call %q", name)
}
