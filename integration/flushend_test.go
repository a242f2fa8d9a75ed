package integration

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWriteBackFlushEndsWhileWriting: `tierblk flush`, and then `tierblk mode
// writethrough`, while fio keeps writing 4 KiB blocks at random at a fixed rate to a write-back
// cache over a slow disk, faster than the disk takes them one by one: each writes back what was
// dirty when it started, so each exits 0, its progress reaching 100 %, long before fio stops. The
// bound is generous (the data dirty at the start drains in a few seconds); a flush that chases new
// dirty data never ends.
func TestWriteBackFlushEndsWhileWriting(t *testing.T) {
	requireTools(t, "nbdkit", "fio", "nbdcopy")
	sock := startNbdkit(t, slowDisk("256M")...)
	// The SSD tier holds more than twice what fio writes to (200 MiB, of which a flush's window
	// of lines locked at once is a small part, as in the 256 MiB tier): dirty lines stay
	// below the high watermark, and the destager leaves them alone while fio writes (the flush
	// has them all to do). fio's rate outruns the slow disk, 1 ms a write, one at a time.
	o := cacheOpts{backend: unixURI(sock, ""), dir: shortTempDir(t), ram: "4MiB", ssdSize: "512MiB", line: "64KiB", mode: "writeback"}
	d := startServe(t, o.args()...)

	ctx, stopFio := context.WithCancel(context.Background())
	defer stopFio()
	fio := exec.CommandContext(ctx, "fio", "--name=flushend", "--ioengine=nbd", "--uri="+tcpURI(d.TCP, ""),
		"--rw=randwrite", "--bs=4k", "--size=200m", "--iodepth=16", "--rate_iops=1500",
		"--time_based", "--runtime=180", "--thread") // threads: killing fio stops its jobs too
	var fioOut strings.Builder
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	fio.WaitDelay = 5 * time.Second
	require.NoError(t, fio.Start())
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	stillWriting := func(when string) {
		t.Helper()
		select {
		case err := <-fioDone:
			t.Fatalf("fio stopped %s: %v\n%s", when, err, fioOut.String())
		default:
		}
	}

	time.Sleep(3 * time.Second) // dirty data piles up
	stillWriting("before the flush")
	_, dirty := adminDirty(t, o.admin())
	require.Positive(t, dirty.Lines, "nothing dirty for the flush to write back")
	out := runActionWithin(t, flushEndBound, "flush", "--admin", o.admin())
	checkEndedAt100(t, out)
	require.Contains(t, out, "the backend holds every write acknowledged before the flush")
	stillWriting("during the flush")

	time.Sleep(2 * time.Second)
	stillWriting("before the switch")
	out = runActionWithin(t, flushEndBound, "mode", "--admin", o.admin(), "writethrough")
	checkEndedAt100(t, out)
	stillWriting("during the switch")
	mode, dirty := adminDirty(t, o.admin())
	require.Equal(t, "writethrough", mode)
	require.Zero(t, dirty.Lines, "dirty lines after the switch to write-through")
	require.Zero(t, dirty.DestageErrors)

	time.Sleep(time.Second) // fio goes on in write-through
	stopFio()
	if err := <-fioDone; err != nil && !isKilled(err) {
		t.Fatalf("fio: %v\n%s", err, fioOut.String())
	}
	// In write-through the slow disk itself, read straight from nbdkit, is what tierblk serves.
	sameImage(t, unixURI(d.Unix, ""), unixURI(sock, ""))
	d.requireStop(syscall.SIGTERM)
}

// flushEndBound bounds how long `tierblk flush` or `tierblk mode` may take in
// TestWriteBackFlushEndsWhileWriting: a few times what the dirty data of its start needs.
const flushEndBound = 60 * time.Second

// runActionWithin runs `tierblk ARGS` (flush or mode), which must exit 0 within limit, and returns
// its output.
func runActionWithin(t *testing.T, limit time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, tierblkPath, args...).CombinedOutput()
	require.NoError(t, ctx.Err(), "tierblk %s did not end within %v while fio writes:\n%s", strings.Join(args, " "), limit, out)
	require.NoError(t, err, "tierblk %s:\n%s", strings.Join(args, " "), out)
	t.Logf("tierblk %s took %v:\n%s", strings.Join(args, " "), time.Since(t0).Round(time.Millisecond), out)
	return string(out)
}

var progressLine = regexp.MustCompile(`(?m)^written back (\S+) of (\S+) \((\d+)%\)`)

// checkEndedAt100 requires that a flush's output shows progress lines, the last at 100 % of
// dirty data there was (not nothing).
func checkEndedAt100(t *testing.T, out string) {
	t.Helper()
	lines := progressLine.FindAllStringSubmatch(out, -1)
	require.NotEmpty(t, lines, "no progress shown:\n%s", out)
	last := lines[len(lines)-1]
	require.Equal(t, "100", last[3], "the progress ended short of 100 %%:\n%s", out)
	require.NotEqual(t, "0", last[2], "nothing was dirty at the start:\n%s", out)
}

// isKilled reports whether err is a process ending by SIGKILL (the test stopping fio).
func isKilled(err error) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}
