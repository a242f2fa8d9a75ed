package daemon

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/ublk"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// The bound is baselineMemory, plus a mem:// backend's bytes, plus a ublk device's buffers past
// the first; the Go runtime's limit leaves out what is not on its heap. (The caches' parts are
// held to the bound by integration's TestMemoryBoundNBD.)
func TestPlanMemory(t *testing.T) {
	memVol := volume.New(mem.New(32<<20), volume.Options{})
	for _, tc := range []struct {
		name      string
		exports   []config.Export
		bound     uint64
		outsideGo uint64
	}{
		{"a file", []config.Export{{Backend: "file:///srv/disk.img"}}, baselineMemory, 0},
		{"a mem backend", []config.Export{{Backend: "mem://32MiB"}}, baselineMemory + 32<<20, 0},
		{"two ublk devices", []config.Export{{Backend: "file:///a", UBLK: &config.UBLK{}}, {Backend: "file:///b", UBLK: &config.UBLK{}}},
			baselineMemory + ublk.DefaultBufferBytes, 2 * ublk.DefaultBufferBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vols := make([]*volume.Volume, len(tc.exports))
			for i := range vols {
				vols[i] = memVol
			}
			p := planMemory(config.Config{Exports: tc.exports}, make([]*cache.Cache, len(tc.exports)), vols)
			require.Equal(t, tc.bound, p.bound)
			require.Equal(t, tc.outsideGo, p.outsideGo)
			require.Zero(t, p.metadata, "no SSD tier, no metadata store")
		})
	}
	require.Less(t, uint64(meta.BadgerMemoryBytes), uint64(baselineMemory/2), "one store leaves room in the baseline")
}
