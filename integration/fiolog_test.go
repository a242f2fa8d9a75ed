package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/trace"
)

// TestFioReplaysRecordedLog: fio itself replays a log that internal/trace's fio iolog writer (the
// recorder of `tierblk serve --record-trace`) wrote: the same reads, writes and syncs (fio 3.33
// skips trims with "bad ddir: 2"; later versions replay them too). The writer's own tests,
// recording from several goroutines at once and reading the log back, are beside it.
func TestFioReplaysRecordedLog(t *testing.T) {
	requireTools(t, "fio")
	path := filepath.Join(t.TempDir(), "rec.iolog")
	f, err := os.Create(path)
	require.NoError(t, err)
	w, err := trace.NewFioLogWriter(f, filepath.Join(t.TempDir(), "target"))
	require.NoError(t, err)
	counts := map[string]int{}
	for i := range 300 {
		r := trace.Request{Offset: int64(i) * 4096, Length: 4096, Op: trace.Op(i % 3)}
		switch {
		case i%30 == 29: // a flush: OpOther without a range
			r.Op, r.Offset, r.Length = trace.OpOther, 0, 0
			counts["sync"]++
		case r.Op == trace.OpRead:
			counts["read"]++
		case r.Op == trace.OpWrite:
			counts["write"]++
		default:
			counts["trim"]++
		}
		require.NoError(t, w.Write(r))
	}
	require.NoError(t, w.Close())
	require.NoError(t, f.Close())

	out, err := exec.Command("fio", "--name=replay", "--ioengine=null", "--read_iolog="+path,
		"--replay_no_stall=1", "--output-format=json").Output()
	require.NoError(t, err)
	out = out[bytes.IndexByte(out, '{'):] // fio prints its complaints before the JSON
	var res struct {
		Jobs []struct {
			Error                   int
			Read, Write, Trim, Sync struct {
				TotalIOs int `json:"total_ios"`
			}
		}
	}
	require.NoError(t, json.Unmarshal(out, &res))
	require.Len(t, res.Jobs, 1)
	j := res.Jobs[0]
	require.Zero(t, j.Error)
	require.Equal(t, counts["read"], j.Read.TotalIOs)
	require.Equal(t, counts["write"], j.Write.TotalIOs)
	require.Equal(t, counts["sync"], j.Sync.TotalIOs)
	require.Contains(t, []int{0, counts["trim"]}, j.Trim.TotalIOs)
}
