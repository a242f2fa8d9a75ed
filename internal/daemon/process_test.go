package daemon

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/process"
	"github.com/tierblk/tierblk/internal/ublk"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// The bound is the request buffers (the NBD payloads and read-ahead, the ublk devices'), as much
// again for the caches' copies of them, runtimeMemory, and a mem:// backend's bytes; the pool
// keeps the buffers of the first two; the Go runtime's limit leaves out what is not on its heap.
// (The caches' parts are held to the bound by integration's TestMemoryBoundNBD.)
func TestPlanMemory(t *testing.T) {
	memVol := volume.New(mem.New(32<<20), volume.Options{})
	const payloads = server.DefaultPayloadBytes * 5 / 4
	for _, tc := range []struct {
		name      string
		listen    []string
		exports   []config.Export
		bound     uint64
		outsideGo uint64
	}{
		{"a file", []string{"unix:/run/nbd.sock"}, []config.Export{{Backend: "file:///srv/disk.img"}}, 2*payloads + runtimeMemory, 0},
		{"a mem backend", []string{"unix:/run/nbd.sock"}, []config.Export{{Backend: "mem://32MiB"}}, 2*payloads + runtimeMemory + 32<<20, 0},
		{"a kernel NBD device", nil, []config.Export{{Backend: "file:///srv/disk.img", NBDDevice: "/dev/nbd0"}}, 2*payloads + runtimeMemory, 0},
		{"two ublk devices and NBD", []string{"127.0.0.1:10809"}, []config.Export{{Backend: "file:///a", UBLK: &config.UBLK{}}, {Backend: "file:///b", UBLK: &config.UBLK{}}},
			2*(payloads+2*ublk.DefaultBufferBytes) + runtimeMemory, 2 * ublk.DefaultBufferBytes},
		{"a ublk device alone: no NBD payloads", nil, []config.Export{{Backend: "file:///a", UBLK: &config.UBLK{}}},
			2*ublk.DefaultBufferBytes + runtimeMemory, ublk.DefaultBufferBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vols := make([]*volume.Volume, len(tc.exports))
			for i := range vols {
				vols[i] = memVol
			}
			p := planMemory(config.Config{Listen: tc.listen, Exports: tc.exports}, make([]*cache.Cache, len(tc.exports)), vols)
			require.Equal(t, tc.bound, p.bound)
			require.Equal(t, tc.outsideGo, p.outsideGo)
			require.Zero(t, p.metadata, "no SSD tier, no metadata store")
			require.Equal(t, p.ioMax, p.work, "no cache has a destager: the work buffers are the requests' copies")
			require.Equal(t, p.ioMax-p.ublk+p.work, p.pooled, "the pool keeps the payloads and the work buffers")
		})
	}
}

// The Go runtime's limit is what it counts now and the part of the bound the process does not
// hold, less goLimitMargin: never below the planned share (the bound less the planned outside
// parts), never above the bound.
func TestFollowGoLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "") // the user's limit would stay: none here
	processPlans.Lock()
	bound, outside := processPlans.bound, processPlans.outsideGo
	processPlans.bound, processPlans.outsideGo = 100<<20, 30<<20
	processPlans.Unlock()
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		processPlans.Lock()
		processPlans.bound, processPlans.outsideGo = bound, outside
		processPlans.Unlock()
		debug.SetMemoryLimit(before)
	})
	for _, tc := range []struct {
		name       string
		held, inGo uint64
		want       int64
	}{
		{"a quarter of the bound free: the runtime gets it", 75 << 20, 80 << 20, (80 + 25 - 8) << 20},
		{"the margin alone free: the planned share", 92 << 20, 60 << 20, (100 - 30) << 20},
		{"over the bound: the excess taken from the runtime", 110 << 20, 90 << 20, (90 - 10 - 8) << 20},
		{"far over the bound: the planned share", 110 << 20, 80 << 20, (100 - 30) << 20},
		{"never more than the bound", 10 << 20, 100 << 20, 100 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			followGoLimit(process.Memory{RSS: 1, Held: tc.held, GoHeap: tc.inGo})
			require.Equal(t, tc.want, debug.SetMemoryLimit(-1))
		})
	}
}
