package bench

import (
	"bytes"
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSnapCPU: this process's ticks grow while it spins, and the cores it used are between none
// and all.
func TestSnapCPU(t *testing.T) {
	procs := []Watch{{Name: "self", PID: os.Getpid()}}
	s0, err := snapCPU(procs)
	require.NoError(t, err)
	require.Len(t, s0.procs, 1)
	var s1 cpuSnap
	for s1.procs == nil || s1.procs[0] < s0.procs[0]+5 {
		if s1, err = snapCPU(procs); err != nil {
			t.Fatal(err)
		}
	}
	busy, cores := s1.since(s0)
	require.Greater(t, busy, 0.0)
	require.LessOrEqual(t, busy, 1.0)
	require.Greater(t, cores[0], 0.0)
	require.LessOrEqual(t, cores[0], float64(runtime.NumCPU())+0.01)

	busy, cores = s0.since(s0)
	require.Zero(t, busy)
	require.Equal(t, []float64{0}, cores)

	_, err = snapCPU([]Watch{{Name: "gone", PID: -1}})
	require.ErrorContains(t, err, "CPU of gone")
}

// TestAddCPU: a measurement's ticks become cores (the process's ticks against all CPUs' over
// their number) by target and process, and the machine's busy share.
func TestAddCPU(t *testing.T) {
	n := float64(runtime.NumCPU())
	procs := []Watch{{Name: "tierblk"}, {Name: "tgtd"}}
	var r Result
	// 400 ticks of all CPUs, 100 idle; the server 40 ticks, tgtd 20.
	r.addCPU("tierblk", procs, cpuSnap{total: 1400, idle: 600, procs: []uint64{140, 70}}, cpuSnap{total: 1000, idle: 500, procs: []uint64{100, 50}})
	r.addCPU("tierblk", procs, cpuSnap{total: 400, idle: 400, procs: []uint64{0, 0}}, cpuSnap{total: 0, idle: 0, procs: []uint64{0, 0}})
	u := r.CPU["tierblk"]
	require.Equal(t, []float64{0.75, 0}, u.Busy)
	require.InDeltaSlice(t, []float64{0.1 * n, 0}, u.Cores["tierblk"], 1e-9)
	require.InDeltaSlice(t, []float64{0.05 * n, 0}, u.Cores["tgtd"], 1e-9)
	require.Nil(t, r.CPU["qemu-nbd"])
}

func TestCPUTable(t *testing.T) {
	res := []Result{{
		Row: "4K", Unit: "IOPS",
		Samples: map[string][]float64{"tierblk": {10000, 20000, 30000}, "qemu-nbd": {50000}},
		CPU: map[string]*CPUUse{
			"tierblk":  {Busy: []float64{0.5, 0.75, 1}, Cores: map[string][]float64{"tierblk": {0.5, 0.5, 0.6}, "tgtd": {0.2, 0.4, 0.3}}},
			"qemu-nbd": {Busy: []float64{0.9}, Cores: map[string][]float64{"qemu-nbd": {0.5}, "tgtd": {0.25}}},
		},
	}}
	var b bytes.Buffer
	CPUTable(&b, res, []string{"tierblk", "qemu-nbd"}, []string{"tgtd"})
	// µs per I/O, round by round: tierblk 50, 25, 20; tgtd under it 20, 20, 10.
	require.Equal(t, "| workload | server | server cores | tgtd cores | machine busy | server µs per I/O or MiB | tgtd µs per I/O or MiB |\n"+
		"|---|---|---:|---:|---:|---:|---:|\n"+
		"| 4K | tierblk | 0.50 | 0.30 | 75 % | 25.0 | 20.0 |\n"+
		"|  | qemu-nbd | 0.50 | 0.25 | 90 % | 10.0 | 5.0 |\n", b.String())

	b.Reset()
	s := NBDSetup{Targets: []Target{{Name: "tierblk"}, {Name: "qemu-nbd"}}}
	s.CPUTable(&b, []Result{{Row: "4K", Unit: "IOPS"}})
	require.Equal(t, "| workload | server | server cores | machine busy | server µs per I/O or MiB |\n|---|---|---:|---:|---:|\n", b.String(),
		"no row where the CPU was not watched")
}
