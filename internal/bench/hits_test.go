package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCurvesTable: the curves part's table pairs each tier's tierblk with the curves on against the
// same with them off, round by round.
func TestCurvesTable(t *testing.T) {
	var b strings.Builder
	CurvesTable(&b, []HitResult{{Row: "4K", Unit: "IOPS", Samples: map[string][]float64{
		nameCurvesRAM: {90, 100, 110}, nameCurvesRAMOff: {100, 100, 100},
		nameCurvesSSD: {50, 40, 60}, nameCurvesSSDOff: {50, 50, 50},
	}}})
	require.Equal(t, "| workload | tierblk --ram 256MiB | tierblk --ram 256MiB --curves off | tierblk --ram 0 | tierblk --ram 0 --curves off | "+
		"tierblk --ram 256MiB / tierblk --ram 256MiB --curves off (min-max) | tierblk --ram 0 / tierblk --ram 0 --curves off (min-max) |\n"+
		"|---|---:|---:|---:|---:|---:|---:|\n"+
		"| 4K | 100 IOPS | 100 IOPS | 50 IOPS | 50 IOPS | 1.00 (0.90-1.10) | 1.00 (0.80-1.20) |\n", b.String())
	targets := curvesTargets("/bin/tierblk", "/work")
	require.Len(t, targets, 4)
	require.Contains(t, targets[1].Command("/work/c1.sock").Args, "--curves", "the off targets turn the curves off")
	require.NotContains(t, targets[2].Command("/work/c2.sock").Args, "--curves")
}
