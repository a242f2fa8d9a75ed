package sim

import (
	"bytes"
	"fmt"
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

	m, err := MeasureReduction(bytes.NewReader(append(append(append([]byte{}, zeros...), random...), text...)), ReduceCompress)
	require.NoError(t, err)
	require.EqualValues(t, 12, m.Blocks)
	require.EqualValues(t, 4, m.ZeroBlocks)
	require.EqualValues(t, 8*reductionBlock, m.Bytes)
	require.LessOrEqual(t, m.Compressed, m.Bytes, "a block is never stored larger than it is")
	require.Greater(t, m.Compressed, int64(4*reductionBlock), "random data does not compress")
	zero, err := m.Ratio(ReduceZero)
	require.NoError(t, err)
	require.InDelta(t, 12.0/8, zero, 1e-9)
	comp, err := m.Ratio(ReduceCompress)
	require.NoError(t, err)
	require.Greater(t, comp, zero, "the text compresses")
	require.Contains(t, m.String(), "33.3 % zeros")
	require.NotContains(t, m.String(), "unique", "compress does not count unique blocks")
	_, err = m.Ratio(ReduceDedupe)
	require.ErrorContains(t, err, "without counting unique blocks")

	// A short last block counts whole; all zeros measure no ratio.
	m, err = MeasureReduction(bytes.NewReader(make([]byte, reductionBlock+1)), ReduceDedupe)
	require.NoError(t, err)
	require.EqualValues(t, 2, m.Blocks)
	for _, mode := range []ReductionMode{ReduceZero, ReduceCompress, ReduceDedupe} {
		_, err = m.Ratio(mode)
		require.ErrorContains(t, err, "no block that is not zeros", mode)
	}
}

// TestMeasureReductionDedupe: files made of a few distinct blocks repeated measure each distinct
// block once, compressed as compress counts it; zero blocks count nothing, and blocks that differ
// in one byte are two.
func TestMeasureReductionDedupe(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	block := func() []byte { // random: S2 stores it as it is, so its stored size is 4 KiB
		b := make([]byte, reductionBlock)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	a, b, c := block(), block(), block()
	a2 := bytes.Clone(a)
	a2[reductionBlock-1] ^= 1 // a's bytes but the last
	zero := make([]byte, reductionBlock)
	cat := func(blocks ...[]byte) []byte { return bytes.Join(blocks, nil) }
	for _, tc := range []struct {
		name          string
		data          []byte
		unique, zeros int64
		ratio         float64 // logical over stored with dedupe
	}{
		{"all distinct", cat(a, b, c), 3, 0, 1},
		{"one block 8 times", cat(a, a, a, a, a, a, a, a), 1, 0, 8},
		{"two blocks, each twice", cat(a, b, a, b), 2, 0, 2},
		{"repeats and zeros", cat(a, zero, b, a, zero, b, a, c), 3, 2, 8.0 / 3},
		{"one byte apart", cat(a, a2, a, a2), 2, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := MeasureReduction(bytes.NewReader(tc.data), ReduceDedupe)
			require.NoError(t, err)
			require.EqualValues(t, len(tc.data)/reductionBlock, m.Blocks)
			require.Equal(t, tc.zeros, m.ZeroBlocks)
			require.Equal(t, tc.unique, m.UniqueBlocks)
			require.Equal(t, tc.unique*reductionBlock, m.UniqueCompressed, "random blocks are stored as they are")
			r, err := m.Ratio(ReduceDedupe)
			require.NoError(t, err)
			require.InDelta(t, tc.ratio, r, 1e-9)
			comp, err := m.Ratio(ReduceCompress)
			require.NoError(t, err)
			require.LessOrEqual(t, comp, r, "dedupe stores no more than compress")
			require.Contains(t, m.String(), fmt.Sprintf("%d unique of %d non-zero blocks", tc.unique, m.Blocks-m.ZeroBlocks))
		})
	}

	// Repeats of a block that compresses count its compressed size once.
	text := []byte(strings.Repeat("tierblk caches blocks; ", reductionBlock/23+1))[:reductionBlock]
	m, err := MeasureReduction(bytes.NewReader(cat(text, text, text, text)), ReduceDedupe)
	require.NoError(t, err)
	one, err := MeasureReduction(bytes.NewReader(text), ReduceCompress)
	require.NoError(t, err)
	require.Equal(t, one.Compressed, m.UniqueCompressed)
	require.Equal(t, 4*one.Compressed, m.Compressed)
	r, err := m.Ratio(ReduceDedupe)
	require.NoError(t, err)
	require.InDelta(t, 4*float64(reductionBlock)/float64(one.Compressed), r, 1e-9)
}

func TestParseReductionMode(t *testing.T) {
	for _, mode := range []ReductionMode{ReduceZero, ReduceCompress, ReduceDedupe} {
		got, err := ParseReductionMode(mode.String())
		require.NoError(t, err)
		require.Equal(t, mode, got)
	}
	_, err := ParseReductionMode("dedup")
	require.EqualError(t, err, `"dedup": use zero, compress or dedupe`)
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
