package sim

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMeasureReduction(t *testing.T) {
	random := make([]byte, 4*reductionBlock)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	text := []byte(strings.Repeat("tierblk caches blocks; ", 4*reductionBlock/23+1))[:4*reductionBlock]
	zeros := make([]byte, 4*reductionBlock)

	m, err := MeasureReduction(bytes.NewReader(append(append(append([]byte{}, zeros...), random...), text...)))
	require.NoError(t, err)
	require.EqualValues(t, 12, m.Blocks)
	require.EqualValues(t, 4, m.ZeroBlocks)
	require.EqualValues(t, 8*reductionBlock, m.Bytes)
	require.LessOrEqual(t, m.Compressed, m.Bytes, "a block is never stored larger than it is")
	require.Greater(t, m.Compressed, int64(4*reductionBlock), "random data does not compress")
	zero, err := m.Ratio(false)
	require.NoError(t, err)
	require.InDelta(t, 12.0/8, zero, 1e-9)
	comp, err := m.Ratio(true)
	require.NoError(t, err)
	require.Greater(t, comp, zero, "the text compresses")
	require.Contains(t, m.String(), "33.3 % zeros")

	// A short last block counts whole; all zeros measure no ratio.
	m, err = MeasureReduction(bytes.NewReader(make([]byte, reductionBlock+1)))
	require.NoError(t, err)
	require.EqualValues(t, 2, m.Blocks)
	_, err = m.Ratio(true)
	require.ErrorContains(t, err, "no block that is not zeros")
}

func TestParseRatio(t *testing.T) {
	for in, want := range map[string]float64{"2": 2, "2.5:1": 2.5, " 1 ": 1} {
		got, err := ParseRatio(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"0.5", "x", "", "NaN", "1e9"} {
		_, err := ParseRatio(in)
		require.ErrorContains(t, err, "ratio of logical to stored bytes", in)
	}
	require.Equal(t, 250, Reduce(100, 2.5))
	require.Equal(t, 1, Reduce(0, 2))
}
