package bench

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	nbdserver "github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// countingBackend counts what reaches a backend, and the most requests it had at once.
type countingBackend struct {
	backend.Backend
	mu                      sync.Mutex
	reads, writes           int64
	readBytes, writtenBytes int64
	inFlight, maxInFlight   int
	// notPattern counts written bytes that are not the replay's pattern.
	notPattern int
}

// counts returns the counters; under the lock, as the race detector cannot see that a reply
// received over the socket follows the counting.
func (b *countingBackend) counts() (reads, writes, readBytes, writtenBytes int64, maxInFlight, notPattern int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reads, b.writes, b.readBytes, b.writtenBytes, b.maxInFlight, b.notPattern
}

func (b *countingBackend) enter() {
	b.mu.Lock()
	b.inFlight++
	b.maxInFlight = max(b.maxInFlight, b.inFlight)
	b.mu.Unlock()
}

func (b *countingBackend) ReadAt(p []byte, off int64) (int, error) {
	b.enter()
	n, err := b.Backend.ReadAt(p, off)
	b.mu.Lock()
	b.inFlight--
	b.reads++
	b.readBytes += int64(len(p))
	b.mu.Unlock()
	return n, err
}

func (b *countingBackend) WriteAt(p []byte, off int64) (int, error) {
	b.enter()
	n, err := b.Backend.WriteAt(p, off)
	b.mu.Lock()
	b.inFlight--
	b.writes++
	b.writtenBytes += int64(len(p))
	for _, c := range p {
		if c != replayPattern {
			b.notPattern++
		}
	}
	b.mu.Unlock()
	return n, err
}

// serveCounting serves a RAM disk of size bytes through a counting backend with this package's NBD
// server, and returns a client connected to it and the counters.
func serveCounting(t *testing.T, size int64) (*client.Client, *countingBackend) {
	t.Helper()
	b := &countingBackend{Backend: mem.New(size)}
	log := slog.New(slog.DiscardHandler)
	srv, err := nbdserver.New(nbdserver.Config{Exports: []nbdserver.Export{{Device: volume.New(b, volume.Options{})}}, Logger: log})
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{Network: "unix", Address: sock, Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, <-served)
	})
	return c, b
}

// writeMSRTrace writes lines "op,offset,size" as an MSR Cambridge trace and returns its path.
func writeMSRTrace(t *testing.T, dir string, reqs []string) string {
	t.Helper()
	var b strings.Builder
	for i, r := range reqs {
		op, rest, _ := strings.Cut(r, ",")
		fmt.Fprintf(&b, "%d,host,0,%s,%s,100\n", 128166372003061629+int64(i), op, rest)
	}
	path := filepath.Join(dir, "small.msr.csv")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	return path
}

func TestReplayIssuesEveryRequest(t *testing.T) {
	const size = 64 << 20
	var reqs []string
	var reads, writes, readBytes, writtenBytes int64
	for i := range 300 {
		off, n := int64(i)*12288%(size-65536), int64(512*(1+i%128))
		if i%3 == 0 {
			reqs = append(reqs, fmt.Sprintf("Write,%d,%d", off, n))
			writes++
			writtenBytes += n
		} else {
			reqs = append(reqs, fmt.Sprintf("Read,%d,%d", off, n))
			reads++
			readBytes += n
		}
	}
	// Past the end of the export: replayed inside it, whole.
	reqs = append(reqs, fmt.Sprintf("Read,%d,4096", int64(size)+8192), fmt.Sprintf("Write,%d,8192", int64(3*size)))
	reads, writes, readBytes, writtenBytes = reads+1, writes+1, readBytes+4096, writtenBytes+8192
	// Of length 0: skipped.
	reqs = append(reqs, "Read,0,0")

	rp, err := LoadReplay(writeMSRTrace(t, t.TempDir(), reqs))
	require.NoError(t, err)
	require.Equal(t, "small.msr.csv", rp.Name)
	require.Equal(t, len(reqs)-1, rp.Requests())
	require.Equal(t, 1, rp.Skipped)

	c, b := serveCounting(t, size)
	const depth = 8
	st, err := rp.Run(t.Context(), c, depth)
	require.NoError(t, err)
	want := ReplayStats{Reads: reads, Writes: writes, ReadBytes: readBytes, WrittenBytes: writtenBytes, Elapsed: st.Elapsed}
	require.Equal(t, want, st)
	require.Positive(t, st.Elapsed)
	// What the server saw: every request once, whole (none is over the client's 32 MiB split).
	gotReads, gotWrites, gotReadBytes, gotWrittenBytes, maxInFlight, notPattern := b.counts()
	require.Equal(t, []int64{reads, writes, readBytes, writtenBytes}, []int64{gotReads, gotWrites, gotReadBytes, gotWrittenBytes})
	require.Zero(t, notPattern, "every written byte is the pattern")
	require.LessOrEqual(t, maxInFlight, depth)
}

func TestReplayCompressedTrace(t *testing.T) {
	// The carried traces are xz files; LoadReplay names a trace without its compression suffix.
	path := filepath.Join("..", "..", "testdata", "traces", "cloudPhysicsIO.vscsi.xz")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the repository's trace %s is missing: %v", path, err)
	}
	rp, err := LoadReplay(path)
	require.NoError(t, err)
	require.Equal(t, "cloudPhysicsIO.vscsi", rp.Name)
	// Every request of the CloudPhysics trace is a READ or a WRITE, at a whole 512-byte sector.
	require.Equal(t, 113872, rp.Requests())
	require.Zero(t, rp.Skipped)
	var writes int
	for _, q := range rp.reqs {
		if q.write {
			writes++
		}
		require.Zero(t, q.off%512)
		require.Less(t, q.off+int64(q.length), int64(1)<<40, "inside the 1 TiB NAS")
	}
	require.Equal(t, 66898, writes)
}

func TestReplayStopsAtAnError(t *testing.T) {
	rp, err := LoadReplay(writeMSRTrace(t, t.TempDir(), []string{"Read,0,4096", "Write,4096,4096", "Read,8192,4096"}))
	require.NoError(t, err)
	c, _ := serveCounting(t, 1<<20)
	require.NoError(t, c.Close())
	_, err = rp.Run(t.Context(), c, 4)
	require.ErrorIs(t, err, backend.ErrClosed)
	require.ErrorContains(t, err, "replaying small.msr.csv")
}

func TestReplayFit(t *testing.T) {
	for _, tc := range []struct {
		off              int64
		length           uint32
		size             int64
		wantOff, wantLen int64
	}{
		{0, 4096, 1 << 20, 0, 4096},
		{1<<20 - 4096, 4096, 1 << 20, 1<<20 - 4096, 4096},           // ends at the end
		{1<<20 - 4095, 4096, 1 << 20, 0, 4096},                      // one byte too far: wraps to 0
		{5 << 20, 512, 1 << 20, (5 << 20) % (1<<20 - 512 + 1), 512}, // wraps
		{0, 1 << 21, 1 << 20, 0, 1 << 20},                           // cut to the export
		{4096, 1 << 21, 1 << 20, 0, 1 << 20},
	} {
		off, n := fit(replayReq{off: tc.off, length: tc.length}, tc.size)
		require.Equal(t, []int64{tc.wantOff, tc.wantLen}, []int64{off, n}, "%+v", tc)
		require.LessOrEqual(t, off+n, tc.size)
	}
}

func TestLoadReplayRejectsEmpty(t *testing.T) {
	_, err := LoadReplay(writeMSRTrace(t, t.TempDir(), []string{"Read,0,0"}))
	require.ErrorContains(t, err, "no reads or writes")
	path := filepath.Join(t.TempDir(), "garbage.bin")
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{0xff, 0}, 100), 0o644))
	_, err = LoadReplay(path)
	require.Error(t, err)
}
