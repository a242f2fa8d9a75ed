package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDestageAndThrottle: the write-back policies' decisions at the watermarks, and the
// registries' names and errors.
func TestDestageAndThrottle(t *testing.T) {
	wm := Watermarks{High: 0.5, Low: 0.25, Max: 0.9}
	d, err := NewDestage("watermark")
	require.NoError(t, err)
	for _, tc := range []struct {
		s           DestageState
		run, urgent bool
	}{
		{DestageState{Ratio: 0, Draining: true}, false, true},
		{DestageState{Ratio: 0.4}, false, false},
		{DestageState{Ratio: 0.6}, true, true},
		{DestageState{Ratio: 0.3, Running: true}, true, false},
		{DestageState{Ratio: 0.2, Running: true}, false, false},
		{DestageState{Ratio: 0.1, Idle: time.Second}, true, false},
		{DestageState{Ratio: 0.1, Waiting: true}, true, true},
	} {
		tc.s.Watermarks = wm
		require.Equal(t, tc.run, d.Run(tc.s), "run %+v", tc.s)
		require.Equal(t, tc.urgent, d.Urgent(tc.s), "urgent %+v", tc.s)
	}

	p, err := NewThrottle("proportional")
	require.NoError(t, err)
	st := ThrottleState{BlockTime: time.Millisecond, Blocks: 16, Watermarks: wm}
	for ratio, want := range map[float64]time.Duration{0.4: 0, 0.5: 0, 0.7: 8 * time.Millisecond, 0.9: 16 * time.Millisecond, 1: 16 * time.Millisecond} {
		st.Ratio = ratio
		require.InDelta(t, float64(want), float64(p.Delay(st)), float64(time.Microsecond), "ratio %g", ratio)
	}
	n, err := NewThrottle("none")
	require.NoError(t, err)
	require.Zero(t, n.Delay(st))

	require.Equal(t, []string{"watermark"}, DestageNames())
	require.Equal(t, []string{"none", "proportional"}, ThrottleNames())
	_, err = NewDestage("lazy")
	require.ErrorContains(t, err, `unknown destage policy "lazy"; use one of watermark`)
	_, err = NewThrottle("hard")
	require.ErrorContains(t, err, `unknown throttle policy "hard"; use one of none, proportional`)
}
