package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// exportFlags are the transmission flags as nbdinfo --json reports them.
type exportFlags struct {
	ReadOnly  bool `json:"is_read_only"`
	Flush     bool `json:"can_flush"`
	FUA       bool `json:"can_fua"`
	Trim      bool `json:"can_trim"`
	Zero      bool `json:"can_zero"`
	FastZero  bool `json:"can_fast_zero"`
	Cache     bool `json:"can_cache"`
	MultiConn bool `json:"can_multi_conn"`
}

// nbdInfoExport is one export in nbdinfo --json's output.
type nbdInfoExport struct {
	Name        string `json:"export-name"`
	Size        int64  `json:"export-size"`
	BlockMin    int64  `json:"block_size_minimum"`
	BlockPref   int64  `json:"block_size_preferred"`
	BlockMax    int64  `json:"block_size_maximum"`
	exportFlags        // decoded from the same JSON object
}

// nbdInfo runs nbdinfo --json (with --list when list is set) and returns the exports it saw.
func nbdInfo(t *testing.T, uri string, list bool) []nbdInfoExport {
	t.Helper()
	args := []string{"--json", uri}
	if list {
		args = []string{"--list", "--json", uri}
	}
	out := mustRunTool(t, "nbdinfo", args...)
	var info struct {
		Protocol string          `json:"protocol"`
		Exports  []nbdInfoExport `json:"exports"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &info), "nbdinfo output:\n%s", out)
	require.Equal(t, "newstyle-fixed", info.Protocol)
	return info.Exports
}

// writableFlags and readOnlyFlags are what tierblk advertises: every command for a writable
// export; for a read-only one, none of the commands that modify data.
var (
	writableFlags = exportFlags{Flush: true, FUA: true, Trim: true, Zero: true, FastZero: true, Cache: true, MultiConn: true}
	readOnlyFlags = exportFlags{ReadOnly: true, Flush: true, Cache: true, MultiConn: true}
)

func TestNBDInfo(t *testing.T) {
	requireTools(t, "nbdinfo")
	for _, ro := range []bool{false, true} {
		args := []string{"--backend", "mem://64MiB"}
		want := writableFlags
		if ro {
			args = append(args, "--read-only")
			want = readOnlyFlags
		}
		t.Run(fmt.Sprintf("read-only=%v", ro), func(t *testing.T) {
			d := startServe(t, args...)
			for _, tr := range transports {
				t.Run(tr.name, func(t *testing.T) {
					exports := nbdInfo(t, tr.uri(d, ""), false)
					require.Len(t, exports, 1)
					e := exports[0]
					require.Equal(t, int64(64<<20), e.Size)
					// Any byte range is served (minimum 1); below 4 KiB it may cost a read-modify-write.
					require.Equal(t, []int64{1, 4096, 32 << 20}, []int64{e.BlockMin, e.BlockPref, e.BlockMax},
						"block sizes: minimum, preferred, maximum")
					require.Equal(t, want, e.exportFlags)
				})
			}
		})
	}
}

func TestQemuIOPatterns(t *testing.T) {
	requireTools(t, "qemu-io")
	d := startServe(t, "--backend", "mem://64MiB")
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			uri := tr.uri(d, "")
			mustQemuIO(t, uri,
				"write -P 0xab 0 64k",
				"read -P 0xab 0 64k",
				"write -z 64k 64k",
				"read -P 0 64k 64k",
				"discard 0 64k",
				// FUA write, then a flush.
				"write -f -P 0x5a 1M 128k",
				"flush",
				"read -P 0x5a 1M 128k",
				// A few bytes at an unaligned offset, inside a block the server must not clobber.
				fmt.Sprintf("write -P 0x11 %d 10", 2<<20+100),
				fmt.Sprintf("read -P 0x11 %d 10", 2<<20+100),
				"read -P 0 2M 100",
				fmt.Sprintf("read -P 0 %d %d", 2<<20+110, 4096-110),
				// The last block of the device.
				fmt.Sprintf("write -P 0x77 %d 4k", 64<<20-4096),
				fmt.Sprintf("read -P 0x77 %d 4k", 64<<20-4096),
			)
			// A wrong pattern must be noticed: this proves the reads above checked something.
			out, err := qemuIO(t, uri, "write -P 0xab 4M 64k", "read -P 0xcd 4M 64k")
			require.Error(t, err, "qemu-io reading 0xcd where 0xab was written:\n%s", out)
			require.Contains(t, out, "Pattern verification failed")
		})
	}
}

// randomFile writes size pseudo-random bytes (fixed seed) to path and returns their sha256.
func randomFile(t *testing.T, path string, size int64) [sha256.Size]byte {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{'t', 'i', 'e', 'r'})
	_, err = io.CopyN(io.MultiWriter(f, h), rng, size)
	require.NoError(t, err)
	return [sha256.Size]byte(h.Sum(nil))
}

func fileSHA256(t *testing.T, path string) [sha256.Size]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return sha256.Sum256(data)
}

func TestNBDCopy(t *testing.T) {
	requireTools(t, "nbdcopy")
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	want := randomFile(t, in, 64<<20)
	d := startServe(t, "--backend", "file://"+filepath.Join(dir, "disk.img")+"?size=64MiB")
	// In over the unix socket, out over TCP: nbdcopy uses several connections each way.
	mustRunTool(t, "nbdcopy", in, unixURI(d.Unix, ""))
	mustRunTool(t, "nbdcopy", tcpURI(d.TCP, ""), out)
	require.Equal(t, want, fileSHA256(t, out), "the image read back differs from the one written")
	d.requireStop(syscall.SIGTERM)
	require.Equal(t, want, fileSHA256(t, filepath.Join(dir, "disk.img")), "the backing file differs")
}

// fioResult is the part of fio's JSON output the tests check.
type fioResult struct {
	Jobs []struct {
		Name  string `json:"jobname"`
		Error int    `json:"error"`
		Read  struct {
			Bytes int64 `json:"io_bytes"`
		} `json:"read"`
		Write struct {
			Bytes int64 `json:"io_bytes"`
		} `json:"write"`
	} `json:"jobs"`
}

func TestFioVerify(t *testing.T) {
	requireTools(t, "fio")
	backends := []struct {
		name string
		url  func(dir string) string
	}{
		{"file", func(dir string) string { return "file://" + filepath.Join(dir, "disk.img") + "?size=64MiB" }},
		{"mem", func(string) string { return "mem://64MiB" }},
	}
	const jobs = 4
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			d := startServe(t, "--backend", b.url(t.TempDir()))
			for _, tr := range transports {
				t.Run(tr.name, func(t *testing.T) {
					// Each job is its own NBD connection, writing and then verifying its own
					// 8 MiB region at queue depth 32 with mixed block sizes.
					fioVerify(t, tr.uri(d, ""), jobs, "--name=verify", "--rw=randwrite", "--bsrange=4k-128k",
						"--iodepth=32", "--size=8m", "--offset_increment=8m")
				})
			}
		})
	}
}

// fioVerify runs fio's nbd engine against uri: jobs jobs, each its own connection, doing the
// workload args give (--name first), then reading back and verifying (crc32c) all they wrote. It
// checks from fio's JSON report that every job wrote data and verified every byte of it, and
// returns the bytes written.
func fioVerify(t *testing.T, uri string, jobs int, args ...string) (written int64) {
	t.Helper()
	args, report := fioVerifyArgs(t, uri, jobs, args...)
	return checkFioVerify(t, report, mustRunTool(t, "fio", args...), jobs)
}

// fioVerifyArgs are fioVerify's fio arguments, and the file its JSON report goes to.
func fioVerifyArgs(t *testing.T, uri string, jobs int, args ...string) ([]string, string) {
	report := filepath.Join(t.TempDir(), "fio.json")
	return append(args, "--ioengine=nbd", "--uri="+uri, fmt.Sprintf("--numjobs=%d", jobs),
		"--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
		"--output-format=json", "--output="+report), report
}

// checkFioVerify requires that fioVerify's run (out: what fio printed) wrote and verified
// everything, and returns the bytes written.
func checkFioVerify(t *testing.T, report, out string, jobs int) (written int64) {
	t.Helper()
	js, err := os.ReadFile(report)
	require.NoError(t, err, "fio:\n%s", out)
	var res fioResult
	require.NoError(t, json.Unmarshal(jsonPart(js), &res), "fio report:\n%s\n%s", js, out)
	require.Len(t, res.Jobs, jobs)
	for _, j := range res.Jobs {
		require.Zero(t, j.Error, "fio job error:\n%s", out)
		require.Positive(t, j.Write.Bytes)
		require.Equal(t, j.Write.Bytes, j.Read.Bytes, "every written byte must be read back and verified")
		written += j.Write.Bytes
	}
	return written
}

// jsonPart drops the notes fio writes before its JSON object ("fio: connected to NBD server").
func jsonPart(report []byte) []byte {
	if i := bytes.IndexByte(report, '{'); i >= 0 {
		return report[i:]
	}
	return report
}
