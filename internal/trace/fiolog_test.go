package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// recordConcurrently writes the same requests as a server would: from several goroutines at once.
func recordConcurrently(t *testing.T, path, filename string, workers, each int) []Request {
	f, err := os.Create(path)
	require.NoError(t, err)
	w, err := NewFioLogWriter(f, filename)
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		want []Request
		wg   sync.WaitGroup
	)
	for g := range workers {
		wg.Go(func() {
			for i := range each {
				r := Request{Offset: int64(g*each+i) * 4096, Length: 4096, Op: Op(i % 3)}
				if i%30 == 29 { // a flush: no range
					r.Offset, r.Length = 0, 0
				}
				require.NoError(t, w.Write(r))
				mu.Lock()
				want = append(want, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Close())
	require.Error(t, w.Write(Request{}), "write after close")
	require.NoError(t, f.Close())
	return want
}

func byRange(a, b Request) int {
	if a.Offset != b.Offset {
		return int(a.Offset - b.Offset)
	}
	return int(a.Op) - int(b.Op)
}

func TestFioLogRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.iolog")
	want := recordConcurrently(t, path, "/dev/nbd0", 4, 300)

	r, err := Open(path, "auto")
	require.NoError(t, err)
	got := readAll(t, r)
	require.Equal(t, "/dev/nbd0", r.(VolumeNamer).VolumeName(0))
	require.Len(t, got, len(want))
	for i := 1; i < len(got); i++ {
		require.LessOrEqual(t, got[i-1].Time, got[i].Time, "timestamps go forward")
	}
	for i := range got {
		got[i].Time, got[i].ID, got[i].Volume = 0, 0, 0
	}
	slices.SortFunc(got, byRange)
	slices.SortFunc(want, byRange)
	require.Equal(t, want, got)
}

func TestFioLogWriterRejects(t *testing.T) {
	for _, name := range []string{"", "a b", string(bytes.Repeat([]byte("x"), 257))} {
		_, err := NewFioLogWriter(&bytes.Buffer{}, name)
		require.Error(t, err, "%q", name)
	}
	w, err := NewFioLogWriter(&bytes.Buffer{}, "/dev/x")
	require.NoError(t, err)
	require.Error(t, w.Write(Request{Offset: -1, Length: 1}))
	require.Error(t, w.Write(Request{Length: 1 << 32}))
}

// fio itself replays a recorded log: the same reads, writes and syncs (fio 3.33 skips trims with
// "bad ddir: 2"; later versions replay them too).
func TestFioReplaysRecordedLog(t *testing.T) {
	fio, err := exec.LookPath("fio")
	require.NoError(t, err, "fio is needed (apt-get install fio)")
	path := filepath.Join(t.TempDir(), "rec.iolog")
	want := recordConcurrently(t, path, filepath.Join(t.TempDir(), "target"), 2, 150)
	counts := map[string]int{}
	for _, r := range want {
		switch {
		case r.Op == OpRead:
			counts["read"]++
		case r.Op == OpWrite:
			counts["write"]++
		case r.Length == 0:
			counts["sync"]++
		default:
			counts["trim"]++
		}
	}

	out, err := exec.Command(fio, "--name=replay", "--ioengine=null", "--read_iolog="+path,
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
