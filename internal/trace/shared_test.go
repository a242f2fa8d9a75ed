package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"
	"github.com/ulikunitz/xz"
)

// realTrace returns the path of a real trace in the repository's testdata/traces (xz-compressed;
// see its README), failing clearly when it is missing.
func realTrace(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join("..", "..", "testdata", "traces", name+".xz")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("trace %s is missing (%v): the tests read real traces from testdata/traces", name, err)
	}
	return path
}

// readAll reads a whole trace.
func readAll(t testing.TB, r Reader) []Request {
	t.Helper()
	var out []Request
	for {
		q, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		out = append(out, q)
	}
	require.NoError(t, r.Close())
	return out
}

func openAll(t testing.TB, path, format string) []Request {
	t.Helper()
	r, err := Open(path, format)
	require.NoError(t, err)
	return readAll(t, r)
}

func TestCloudPhysicsVscsi(t *testing.T) {
	reqs := openAll(t, realTrace(t, "cloudPhysicsIO.vscsi"), "auto")
	require.Len(t, reqs, 113872)
	distinct := map[uint64]bool{}
	ops := map[Op]int{}
	for _, q := range reqs {
		distinct[q.ID] = true
		ops[q.Op]++
		require.Equal(t, int64(q.ID)*512, q.Offset)
	}
	require.Len(t, distinct, 48974)
	require.Equal(t, map[Op]int{OpRead: 46974, OpWrite: 66898}, ops) // opcodes 0x28 and 0x2a
}

// The CSV copy of the trace holds the same requests, with the time in seconds.
func TestCloudPhysicsCSVMatchesVscsi(t *testing.T) {
	bin := openAll(t, realTrace(t, "cloudPhysicsIO.vscsi"), "vscsi")
	txt := openAll(t, realTrace(t, "cloudPhysicsIO.csv"), "csv:time=2,op=3,size=4,lbn=5,header=true,sep=,")
	require.Equal(t, len(bin), len(txt))
	for i := range bin {
		b, c := bin[i], txt[i]
		require.Equal(t, b.Time/1e6, c.Time, "request %d: time", i+1)
		b.Time = c.Time
		require.Equal(t, b, c, "request %d", i+1)
	}
}

func TestOLTPArc(t *testing.T) {
	reqs := openAll(t, realTrace(t, "oltp.arc"), "auto")
	require.Len(t, reqs, 914145)
	for _, q := range reqs[:100] {
		require.Equal(t, int64(q.ID)*512, q.Offset)
		require.Positive(t, q.Length)
	}
}

// Compressed files are recognized by their magic bytes, whatever their names.
func TestDecompression(t *testing.T) {
	const n = 20000 // requests: enough for many compressed blocks, quick to compress
	f, err := os.Open(realTrace(t, "cloudPhysicsIO.vscsi"))
	require.NoError(t, err)
	defer f.Close()
	xr, err := xz.NewReader(f)
	require.NoError(t, err)
	raw := make([]byte, n*vscsiV1Size)
	_, err = io.ReadFull(xr, raw)
	require.NoError(t, err)
	want := openAll(t, realTrace(t, "cloudPhysicsIO.vscsi"), "vscsi")[:n]

	compressors := map[string]func(io.Writer) (io.WriteCloser, error){
		"gzip": func(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriter(w), nil },
		"zstd": func(w io.Writer) (io.WriteCloser, error) { return zstd.NewWriter(w) },
		"xz":   func(w io.Writer) (io.WriteCloser, error) { return xz.NewWriter(w) },
	}
	for name, compress := range compressors {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := compress(&buf)
			require.NoError(t, err)
			_, err = w.Write(raw)
			require.NoError(t, err)
			require.NoError(t, w.Close())
			path := filepath.Join(t.TempDir(), "trace.bin") // no telling extension
			require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
			got := openAll(t, path, "auto")
			require.Equal(t, want, got)

			// A cut-off download is an error naming the file, not a shorter trace.
			cut := filepath.Join(t.TempDir(), "cut.vscsi")
			require.NoError(t, os.WriteFile(cut, buf.Bytes()[:buf.Len()/2], 0o644))
			r, err := Open(cut, "vscsi")
			if err == nil { // the error comes at the first record that is missing
				for err == nil {
					_, err = r.Next()
				}
				require.NotErrorIs(t, err, io.EOF)
				require.ErrorContains(t, err, ": record ")
				require.NoError(t, r.Close())
			}
			require.ErrorContains(t, err, "trace "+cut+": ")
			require.ErrorContains(t, err, name+" stream")
		})
	}
}
