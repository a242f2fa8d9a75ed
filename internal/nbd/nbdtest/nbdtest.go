// Package nbdtest is what the tests of the NBD packages (internal/nbd/...) and the integration
// tests share: memory devices whose content a test reads back, a server's listeners for the length
// of a test, a client that speaks the protocol byte by byte (and wrongly, when a test wants it to),
// and a workload that checks what tierblk's client reads back.
//
// It is for tests only: nothing the daemon builds may import it. It must not import the server,
// whose own tests use it (Serve takes the server through an interface).
package nbdtest

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// Mem is the mem backend with what the tests look at: a copy of all it holds.
type Mem struct{ *mem.Mem }

// NewMem is a mem backend of size bytes, every one fill.
func NewMem(size int, fill byte) Mem {
	m := mem.New(int64(size))
	if fill != 0 {
		if _, err := m.WriteAt(bytes.Repeat([]byte{fill}, size), 0); err != nil {
			panic(err)
		}
	}
	return Mem{m}
}

// Snapshot is a copy of the backend's content.
func (m Mem) Snapshot() []byte {
	p := make([]byte, m.Size())
	if _, err := m.ReadAt(p, 0); err != nil {
		panic(err)
	}
	return p
}

// NewVolume is a volume with options o over a new Mem of size bytes, every one fill.
func NewVolume(size int, fill byte, o volume.Options) (*volume.Volume, Mem) {
	m := NewMem(size, fill)
	return volume.New(m, o), m
}

// Plain hides the optional abilities of the backend it wraps.
type Plain struct{ backend.Backend }

// Logger sends what is logged at level and above to the test's output.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
}

// Buffer collects what a logger or a child process writes while the test reads it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Server is what Serve serves: the NBD server (*server.Server).
type Server interface {
	Serve(l net.Listener) error
	Shutdown(ctx context.Context) error
}

// Addrs are where Serve serves.
type Addrs struct {
	Sock string // a unix socket's path
	TCP  string // host:port on 127.0.0.1
}

// URI is the NBD URI of an export on the unix socket, as libnbd and qemu take it.
func (a *Addrs) URI(export string) string {
	return "nbd+unix:///" + export + "?socket=" + a.Sock
}

// Serve serves s on a unix socket and a TCP port until the test ends, then checks that Shutdown
// is clean and both Serve calls return nil.
func Serve(t testing.TB, s Server) *Addrs {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	ul, err := net.Listen("unix", sock)
	require.NoError(t, err)
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	errs := make(chan error, 2)
	go func() { errs <- s.Serve(ul) }()
	go func() { errs <- s.Serve(tl) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, s.Shutdown(ctx))
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
	})
	return &Addrs{Sock: sock, TCP: tl.Addr().String()}
}
