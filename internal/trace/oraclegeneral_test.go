package trace

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteOracleGeneral(t *testing.T) {
	ids := []uint64{5, 7, 5, 9, 7, 5}
	var reqs []Request
	for i, id := range ids {
		reqs = append(reqs, Request{Time: int64(i / 2), ID: id, Length: int64(100 * id)})
	}
	var buf bytes.Buffer
	require.NoError(t, WriteOracleGeneral(&buf, reqs))
	require.Equal(t, len(ids)*oracleGeneralSize, buf.Len())

	// next_access_vtime: the index of the same id's next request, -1 for the last one.
	var next []int64
	for i := range ids {
		next = append(next, int64(binary.LittleEndian.Uint64(buf.Bytes()[i*oracleGeneralSize+16:])))
	}
	require.Equal(t, []int64{2, 4, 5, -1, -1, -1}, next)

	// Read back, by content alone (a file name without the extension).
	path := filepath.Join(t.TempDir(), "gen.bin")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	got := openAll(t, path, "auto")
	require.Len(t, got, len(reqs))
	for i, q := range got {
		require.Equal(t, Request{Time: reqs[i].Time, ID: ids[i], Offset: int64(ids[i]) * OracleGeneralStride,
			Length: reqs[i].Length, Op: OpRead}, q)
	}

	require.Error(t, WriteOracleGeneral(&buf, []Request{{Length: 1 << 32}}))
	require.Error(t, WriteOracleGeneral(&buf, []Request{{Time: -1}}))
}

// Without the extension, records whose clock goes back or whose next access lies behind them
// are not taken for oracleGeneral.
func TestOracleGeneralDetection(t *testing.T) {
	rec := func(clock uint32, next int64) []byte {
		b := make([]byte, oracleGeneralSize)
		binary.LittleEndian.PutUint32(b, clock)
		binary.LittleEndian.PutUint64(b[16:], uint64(next))
		return b
	}
	good := bytes.Join([][]byte{rec(1, 2), rec(1, -1), rec(2, -1)}, nil)
	backInTime := bytes.Join([][]byte{rec(2, 2), rec(1, -1), rec(3, -1)}, nil)
	nextBehind := bytes.Join([][]byte{rec(1, 2), rec(1, 0), rec(2, -1)}, nil)
	for _, c := range []struct {
		name string
		data []byte
		hint bool
		want bool
	}{
		{"good", good, false, true},
		{"good, hinted", good, true, true},
		{"clock goes back", backInTime, false, false},
		{"next access behind", nextBehind, false, false},
		{"one record, no hint", good[:oracleGeneralSize], false, false},
		{"one record, hinted", good[:oracleGeneralSize], true, true},
		{"not whole records", good[:50], false, false},
		{"zeros", make([]byte, 10*oracleGeneralSize), false, false},
	} {
		require.Equal(t, c.want, looksOracleGeneral(c.data, c.hint), c.name)
	}
}
