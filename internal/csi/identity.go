package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identity is CSI's Identity service.
type identity struct {
	csipb.UnimplementedIdentityServer
	o Options
}

func (s *identity) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: DriverName, VendorVersion: s.o.Version}, nil
}

func (s *identity) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	caps := []*csipb.PluginCapability{}
	if s.o.Controller {
		caps = append(caps, &csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{
			Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_CONTROLLER_SERVICE}}})
	}
	// A volume grows while no node has it staged: the daemon serving a staged volume has a
	// fixed size, and the next NodeStage sees the larger backing file.
	caps = append(caps, &csipb.PluginCapability{Type: &csipb.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csipb.PluginCapability_VolumeExpansion{Type: csipb.PluginCapability_VolumeExpansion_OFFLINE}}})
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe says ready once the services are registered: Run serves only after the node plugin took
// its staged volumes back.
func (s *identity) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
