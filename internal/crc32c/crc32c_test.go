package crc32c

import (
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestTablesMatchInstruction: the tables give hash/crc32's Castagnoli CRC for any bytes, length,
// alignment and starting CRC, so sums written by a run that chose one way verify in a run that
// chose the other.
func TestTablesMatchInstruction(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		buf := rapid.SliceOfN(rapid.Byte(), 0, 9000).Draw(t, "bytes")
		skip := rapid.IntRange(0, min(7, len(buf))).Draw(t, "skip")
		seed := rapid.Uint32().Draw(t, "seed")
		p := buf[skip:]
		want := crc32.Update(seed, castagnoli, p)
		if got := updateTables(seed, p); got != want {
			t.Fatalf("tables: %#x, want %#x", got, want)
		}
		if got := Update(seed, p); got != want {
			t.Fatalf("Update (%s): %#x, want %#x", Impl(), got, want)
		}
	})
}

// TestKnownValues: the check value of the CRC-32C catalogue ("123456789") and RFC 7143's iSCSI
// digest of 32 zero bytes (its appendix B.4, aa 36 91 8a least significant byte first), both ways.
func TestKnownValues(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want uint32
	}{
		{[]byte("123456789"), 0xe3069283},
		{make([]byte, 32), 0x8a9136aa},
		{nil, 0},
	} {
		require.Equal(t, tc.want, updateTables(0, tc.in), "tables, %q", tc.in)
		require.Equal(t, tc.want, Checksum(tc.in), "Checksum, %q", tc.in)
	}
}

// TestPick: the faster way is chosen, whichever it is; and the timings on this machine are logged.
func TestPick(t *testing.T) {
	require.True(t, pick(func() (time.Duration, time.Duration) { return 30 * time.Microsecond, 8 * time.Microsecond }))
	require.False(t, pick(func() (time.Duration, time.Duration) { return 150 * time.Nanosecond, 2 * time.Microsecond }))
	instr, tables := timeBoth()
	t.Logf("a 4 KiB block here: instruction %v, tables %v; Update uses the %s", instr, tables, Impl())
}

func BenchmarkUpdate4K(b *testing.B) {
	blk := make([]byte, 4096)
	for _, bc := range []struct {
		name string
		f    func(uint32, []byte) uint32
	}{
		{"instruction", func(c uint32, p []byte) uint32 { return crc32.Update(c, castagnoli, p) }},
		{"tables", updateTables},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(blk)))
			for b.Loop() {
				bc.f(0, blk)
			}
		})
	}
}
