package trace

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from the readers' output")

// goldenCases are small crafted traces, each with the format to read it by and whether
// auto-detection must find that format by itself.
var goldenCases = []struct {
	file, format string
	auto         bool
}{
	{"v1.vscsi", "vscsi", true},
	{"v2.vscsi", "vscsi", true},
	{"small.oracleGeneral", "oraclegeneral", true},
	{"sample.arc", "arc", true},
	{"sample.msr.csv", "msr", true},
	{"sample.blkparse", "blkparse", true},
	{"v2.fiolog", "fio", true},
	{"v3.fiolog", "fio", true},
	{"cloud.csv", "csv:time=2,op=3,size=4,lbn=5,header=true,sep=,", false},
	{"blank.ssv", "csv:volume=1,time=2,op=3,offset=4,size=5,header=true,sep=space", false},
}

var opNames = [...]string{OpRead: "read", OpWrite: "write", OpOther: "other"}

// dump reads a whole trace into the golden text form: one request a line, the volume by name
// when the reader names volumes.
func dump(r Reader) (string, error) {
	var b strings.Builder
	namer, _ := r.(VolumeNamer)
	for {
		q, err := r.Next()
		if errors.Is(err, io.EOF) {
			return b.String(), nil
		}
		if err != nil {
			return b.String(), err
		}
		vol := fmt.Sprint(q.Volume)
		if namer != nil {
			vol = fmt.Sprintf("%d(%s)", q.Volume, namer.VolumeName(q.Volume))
		}
		fmt.Fprintf(&b, "time=%d id=%d offset=%d length=%d op=%s volume=%s\n",
			q.Time, q.ID, q.Offset, q.Length, opNames[q.Op], vol)
	}
}

func TestGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join("testdata", c.file)
			r, err := Open(path, c.format)
			require.NoError(t, err)
			got, err := dump(r)
			require.NoError(t, err)
			require.NoError(t, r.Close())
			golden := path + ".golden"
			if *update {
				require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err)
			require.Equal(t, string(want), got)

			r, err = Open(path, "auto")
			if !c.auto {
				require.Error(t, err, "auto-detection must not guess a csv spec")
				return
			}
			require.NoError(t, err)
			gotAuto, err := dump(r)
			require.NoError(t, err)
			require.NoError(t, r.Close())
			require.Equal(t, got, gotAuto, "auto-detection read the file differently")
		})
	}
}
