package trace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/ulikunitz/xz"
)

// cpuTime is the process's user and system time: on a shared machine, requests per CPU second
// say more about a reader than requests per wall-clock second.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportRate reports requests per wall-clock second and per CPU second since cpu0.
func reportRate(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(float64(b.N)/(cpuTime(b)-cpu0).Seconds(), "req/cpu-s")
}

// benchFormat replays data as format until b.N requests are read (reopening at the end), so
// ns/op is the time per request.
func benchFormat(b *testing.B, data []byte, format string) {
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	n := 0
	for n < b.N {
		r, err := NewReader(bytes.NewReader(data), "bench", format)
		if err != nil {
			b.Fatal(err)
		}
		for n < b.N {
			_, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n++
		}
		r.Close()
	}
	reportRate(b, cpu0)
}

// readTrace returns a real trace of testdata/traces as stored there (xz-compressed).
func readTrace(b *testing.B, name string) []byte {
	data, err := os.ReadFile(realTrace(b, name))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// cloudRequests is the CloudPhysics trace, the source of the synthetic text traces.
func cloudRequests(b *testing.B) []Request {
	r, err := Open(realTrace(b, "cloudPhysicsIO.vscsi"), "vscsi")
	if err != nil {
		b.Fatal(err)
	}
	return readAll(b, r)
}

// synth prints the CloudPhysics requests in a text format, one line per request.
func synth(b *testing.B, header string, line func(w io.Writer, q Request)) []byte {
	var buf bytes.Buffer
	buf.WriteString(header)
	for _, q := range cloudRequests(b) {
		line(&buf, q)
	}
	return buf.Bytes()
}

func opWord(op Op) string { return [...]string{"Read", "Write", "Read"}[op] }

func BenchmarkVscsi(b *testing.B) {
	benchFormat(b, unxz(b, readTrace(b, "cloudPhysicsIO.vscsi")), "vscsi")
}

func BenchmarkOracleGeneral(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.1, 1, 1<<20)
	reqs := make([]Request, 1<<20)
	for i := range reqs {
		reqs[i] = Request{Time: int64(i / 1000), ID: zipf.Uint64(), Length: 4096}
	}
	var buf bytes.Buffer
	if err := WriteOracleGeneral(&buf, reqs); err != nil {
		b.Fatal(err)
	}
	benchFormat(b, buf.Bytes(), "oraclegeneral")
}

func unxz(b *testing.B, data []byte) []byte {
	z, err := xz.NewReader(bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	out, err := io.ReadAll(z)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

func BenchmarkArc(b *testing.B) { benchFormat(b, unxz(b, readTrace(b, "oltp.arc")), "arc") }

// BenchmarkArcXz includes decompression, as a simulation of oltp.arc.xz pays it.
func BenchmarkArcXz(b *testing.B) { benchFormat(b, readTrace(b, "oltp.arc"), "arc") }

func BenchmarkCSV(b *testing.B) {
	benchFormat(b, unxz(b, readTrace(b, "cloudPhysicsIO.csv")), "csv:time=2,op=3,size=4,lbn=5,header=true")
}

func BenchmarkMSR(b *testing.B) {
	data := synth(b, "", func(w io.Writer, q Request) {
		fmt.Fprintf(w, "%d,usr,%d,%s,%d,%d,%d\n", 128166372003061629+q.Time*10, q.ID%3, opWord(q.Op), q.Offset, q.Length, 1000)
	})
	benchFormat(b, data, "msr")
}

func BenchmarkBlkparse(b *testing.B) {
	data := synth(b, "", func(w io.Writer, q Request) {
		// A request as blkparse shows it: queued, then issued and completed (the reader keeps Q).
		t := float64(q.Time) / 1e6
		for i, act := range []string{"Q", "D", "C"} {
			fmt.Fprintf(w, "  8,0    1 %8d %14.9f  697  %s  %sS %d + %d [kworker/u8:2]\n",
				i, t, act, opWord(q.Op)[:1], q.Offset/512, q.Length/512)
		}
	})
	benchFormat(b, data, "blkparse")
}

func BenchmarkFio(b *testing.B) {
	data := synth(b, fioV3Header+"\n0 /dev/sdb add\n0 /dev/sdb open\n", func(w io.Writer, q Request) {
		fmt.Fprintf(w, "%d /dev/sdb %s %d %d\n", q.Time/1000, [...]string{"read", "write", "trim"}[q.Op], q.Offset, q.Length)
	})
	benchFormat(b, data, "fio")
}

func BenchmarkFioLogWriter(b *testing.B) {
	w, err := NewFioLogWriter(io.Discard, "/dev/nbd0")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		r := Request{Offset: 1 << 30, Length: 4096, Op: OpWrite}
		for pb.Next() {
			if err := w.Write(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	reportRate(b, cpu0)
}
