package bench

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseFioGolden(t *testing.T) {
	// testdata/fio-randread.json is real fio 3.33 output (null engine, 4K random read).
	out, err := os.ReadFile("testdata/fio-randread.json")
	require.NoError(t, err)
	r, err := parseFio(append([]byte("fio: a warning line before the JSON\n"), out...))
	require.NoError(t, err)
	require.Equal(t, 2048000.0, r.value)
	require.Equal(t, 8388608000.0, r.bytesPerSec)
}

func TestParseFioErrors(t *testing.T) {
	for _, in := range []string{"", "not json", `{"jobs":[]}`, `{"jobs":[{"error":5}]}`} {
		_, err := parseFio([]byte(in))
		require.Error(t, err, in)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		require.Equal(t, tc.want, median(tc.in))
	}
}

func TestTable(t *testing.T) {
	targets := []Target{{Name: "a"}, {Name: "b"}}
	got := Table([]Result{{Row: "4K", Unit: "IOPS", Medians: map[string]float64{"a": 300, "b": 200}}}, targets)
	require.True(t, strings.HasSuffix(got, "| 4K | 300 IOPS | 200 IOPS | 1.50 |\n"), got)
}

func TestRoundOrderRotates(t *testing.T) {
	require.Equal(t, []int{0, 1}, roundOrder(2, 0))
	require.Equal(t, []int{1, 0}, roundOrder(2, 1))
	require.Equal(t, []int{2, 0, 1}, roundOrder(3, 2))
}
