package trace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// checkReader reads at most 10,000 requests of data as format and checks what any input must
// get: no panic, requests with sane ranges and named volumes, or an *Error naming the file.
func checkReader(t *testing.T, data []byte, format string) {
	r, err := NewReader(bytes.NewReader(data), "fuzz", format)
	if err != nil {
		checkError(t, err)
		return
	}
	defer r.Close()
	namer, _ := r.(VolumeNamer)
	for range 10000 {
		q, err := r.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			checkError(t, err)
			return
		}
		if q.Offset < 0 || q.Length < 0 {
			t.Fatalf("%s: bad range %d+%d", format, q.Offset, q.Length)
		}
		if namer != nil && namer.VolumeName(q.Volume) == "" {
			t.Fatalf("%s: volume %d has no name", format, q.Volume)
		}
	}
}

func checkError(t *testing.T, err error) {
	var terr *Error
	if !errors.As(err, &terr) || terr.File != "fuzz" {
		t.Fatalf("error %q does not name the file", err)
	}
}

func addSeeds(f *testing.F, files ...string) {
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "time=2,op=3,size=4,lbn=5,header=true")
	}
}

func FuzzTextReaders(f *testing.F) {
	addSeeds(f, "sample.arc", "sample.msr.csv", "sample.blkparse", "v2.fiolog", "v3.fiolog", "cloud.csv", "blank.ssv")
	f.Fuzz(func(t *testing.T, data []byte, spec string) {
		for _, format := range []string{"auto", "arc", "msr", "blkparse", "blkparse:C", "fio", "csv:" + spec} {
			checkReader(t, data, format)
		}
	})
}

func FuzzBinaryReaders(f *testing.F) {
	addSeeds(f, "v1.vscsi", "v2.vscsi", "small.oracleGeneral")
	f.Fuzz(func(t *testing.T, data []byte, _ string) {
		for _, format := range []string{"auto", "vscsi", "oraclegeneral"} {
			checkReader(t, data, format)
		}
	})
}
