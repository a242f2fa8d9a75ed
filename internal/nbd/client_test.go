package nbd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbdkit"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// clientNbdkit is an nbdkit process serving on a Unix socket or on a loopback TCP port.
type clientNbdkit struct {
	*nbdkit.Server
	t *testing.T
}

func clientNeed(t *testing.T, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s is not installed (apt-get install nbdkit qemu-utils)", tool)
	}
}

// clientStartNbdkit starts `nbdkit -U SOCK args...` (args hold options, the plugin and its
// parameters) and stops it when the test ends.
func clientStartNbdkit(t *testing.T, args ...string) clientNbdkit {
	return clientNbdkit{Server: nbdkit.Start(t, "unix", args...), t: t}
}

// clientStartNbdkitTCP is clientStartNbdkit on a free loopback port.
func clientStartNbdkitTCP(t *testing.T, args ...string) clientNbdkit {
	return clientNbdkit{Server: nbdkit.Start(t, "tcp", args...), t: t}
}

func (k clientNbdkit) config() ClientConfig {
	return ClientConfig{Network: k.Network, Address: k.Addr, Logger: clientTestLogger(k.t)}
}

func clientTestLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// clientDial connects and closes the client when the test ends (before the server stops).
func clientDial(t *testing.T, cfg ClientConfig) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func clientPattern(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(p)
	return p
}

// clientExercise runs every command against a writable export of at least 8 MiB whose first
// 8 MiB are zeroes, checking the data with reads.
func clientExercise(t *testing.T, c *Client) {
	t.Helper()
	const mib = 1 << 20
	read := func(off int64, n int) []byte {
		t.Helper()
		p := make([]byte, n)
		got, err := c.ReadAt(p, off)
		require.NoError(t, err)
		require.Equal(t, n, got)
		return p
	}
	require.Equal(t, make([]byte, mib), read(7*mib, mib), "a fresh export reads as zeroes")

	data := clientPattern(1, 2*mib+4096)
	n, err := c.WriteAt(data, 4096)
	require.NoError(t, err)
	require.Equal(t, len(data), n)
	require.Equal(t, data, read(4096, len(data)))

	fua := clientPattern(2, 64<<10)
	_, err = c.WriteAtFUA(fua, 3*mib)
	require.NoError(t, err)
	require.Equal(t, fua, read(3*mib, len(fua)))
	require.NoError(t, c.Flush())

	require.NoError(t, c.WriteZeroes(8192, 64<<10, false))
	require.NoError(t, c.WriteZeroes(mib, 64<<10, true))
	want := bytes.Clone(data)
	clear(want[8192-4096 : 8192-4096+64<<10])
	clear(want[mib-4096 : mib-4096+64<<10])
	require.Equal(t, want, read(4096, len(data)))

	require.NoError(t, c.Trim(2*mib, mib))
	if c.Flags()&tflagSendCache != 0 {
		require.NoError(t, c.Cache(0, mib))
	}

	_, err = c.ReadAt(make([]byte, 4096), c.Size()-2048)
	require.ErrorIs(t, err, backend.ErrOutOfRange)
	_, err = c.WriteAt(make([]byte, 4096), c.Size())
	require.ErrorIs(t, err, backend.ErrOutOfRange)
	n, err = c.ReadAt(nil, c.Size())
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestClientPeers runs every command against real servers in the shapes the client must handle.
func TestClientPeers(t *testing.T) {
	sparse := filepath.Join(t.TempDir(), "sparse.img")
	require.NoError(t, os.WriteFile(sparse, nil, 0o600))
	require.NoError(t, os.Truncate(sparse, 64<<20))

	for _, tc := range []struct {
		name       string
		tcp        bool
		args       []string
		structured bool
		maxBlock   uint32
	}{
		{name: "memory", args: []string{"memory", "64M"}, structured: true, maxBlock: defaultMaxBlock},
		{name: "memory over TCP", tcp: true, args: []string{"memory", "64M"}, structured: true, maxBlock: defaultMaxBlock},
		{name: "simple replies", args: []string{"--no-sr", "memory", "64M"}, maxBlock: defaultMaxBlock},
		// Plain newstyle: no options, so NBD_OPT_EXPORT_NAME and the 124 bytes of padding.
		{name: "export name handshake", args: []string{"--mask-handshake=0", "memory", "64M"}, maxBlock: defaultMaxBlock},
		// Requests over 64 KiB are refused with EINVAL, so 2 MiB calls work only if split.
		{name: "small maximum block", args: []string{"--filter=blocksize-policy", "memory", "64M",
			"blocksize-maximum=64K", "blocksize-minimum=512", "blocksize-error-policy=error"}, structured: true, maxBlock: 64 << 10},
		{name: "sparse file", args: []string{"file", sparse}, structured: true, maxBlock: defaultMaxBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := clientStartNbdkit
			if tc.tcp {
				start = clientStartNbdkitTCP
			}
			c := clientDial(t, start(t, tc.args...).config())
			require.Equal(t, int64(64<<20), c.Size())
			require.Equal(t, tc.structured, c.conns[0].s.structured)
			_, _, maxBlock := c.BlockSizes()
			require.Equal(t, tc.maxBlock, maxBlock)
			require.False(t, c.ReadOnly())
			clientExercise(t, c)
		})
	}
}

// TestClientQemuNbd checks the client against a second server implementation, one that answers
// reads of unallocated ranges with NBD_REPLY_TYPE_OFFSET_HOLE chunks.
func TestClientQemuNbd(t *testing.T) {
	clientNeed(t, "qemu-nbd")
	dir := t.TempDir()
	img, sock := filepath.Join(dir, "disk.img"), filepath.Join(dir, "q.sock")
	require.NoError(t, os.WriteFile(img, nil, 0o600))
	require.NoError(t, os.Truncate(img, 16<<20))
	cmd := exec.Command("qemu-nbd", "-f", "raw", "-k", sock, "-x", "disk", "--shared=4", "--persistent", "--discard=unmap", img)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// The socket's file appears at bind, before qemu-nbd listens: wait until it takes a connection
	// (--persistent: that probe must not be the last client qemu-nbd waits for).
	require.Eventually(t, func() bool {
		nc, err := net.Dial("unix", sock)
		if err == nil {
			nc.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)

	cfg := ClientConfig{Network: "unix", Address: sock, Export: "disk", Logger: clientTestLogger(t)}
	c := clientDial(t, cfg)
	require.Equal(t, int64(16<<20), c.Size())
	clientExercise(t, c)

	cfg.Export = "nope"
	_, err := Dial(context.Background(), cfg)
	require.ErrorIs(t, err, ErrExportNotFound)
}

// TestClientCapabilities checks that the client offers only what the server does.
func TestClientCapabilities(t *testing.T) {
	t.Run("minimal server", func(t *testing.T) {
		// No trim, zero, flush, FUA, cache or multi-conn; reads are zeroes, writes are dropped.
		k := clientStartNbdkit(t, "--filter=nozero", "eval", "get_size=echo 1048576",
			"pread=head -c $3 /dev/zero", "pwrite=cat >/dev/null", "can_write=exit 0",
			"can_trim=exit 3", "can_flush=exit 3", "can_fua=echo none", "zeromode=none")
		cfg := k.config()
		cfg.Connections = 4
		c := clientDial(t, cfg)
		require.Len(t, c.conns, 1, "no multi-conn: one connection")
		require.ErrorIs(t, c.Trim(0, 4096), backend.ErrNotSupported)
		require.ErrorIs(t, c.WriteZeroes(0, 4096, true), backend.ErrNotSupported)
		require.ErrorIs(t, c.Cache(0, 4096), backend.ErrNotSupported)
		require.NoError(t, c.Flush(), "no flush offered: nothing is volatile")
		_, err := c.WriteAtFUA(make([]byte, 4096), 0)
		require.NoError(t, err)
	})
	t.Run("read-only export", func(t *testing.T) {
		c := clientDial(t, clientStartNbdkit(t, "-r", "memory", "1M").config())
		require.True(t, c.ReadOnly())
		_, err := c.ReadAt(make([]byte, 4096), 0)
		require.NoError(t, err)
		_, err = c.WriteAt(make([]byte, 4096), 0)
		require.ErrorIs(t, err, backend.ErrReadOnly)
		_, err = c.WriteAtFUA(make([]byte, 4096), 0)
		require.ErrorIs(t, err, backend.ErrReadOnly)
		require.ErrorIs(t, c.Trim(0, 4096), backend.ErrReadOnly)
		require.ErrorIs(t, c.WriteZeroes(0, 4096, false), backend.ErrReadOnly)
	})
	t.Run("minimum block size", func(t *testing.T) {
		c := clientDial(t, clientStartNbdkit(t, "--filter=blocksize-policy", "memory", "1M",
			"blocksize-minimum=4096", "blocksize-maximum=64K", "blocksize-error-policy=error").config())
		minB, prefB, maxB := c.BlockSizes()
		require.Equal(t, [3]uint32{4096, 4096, 64 << 10}, [3]uint32{minB, prefB, maxB})
		_, err := c.ReadAt(make([]byte, 512), 0)
		require.ErrorIs(t, err, backend.ErrNotSupported)
		_, err = c.ReadAt(make([]byte, 256<<10), 4096)
		require.NoError(t, err)
	})
}

// TestClientServerErrors checks the mapping of the server's error values, in simple and in
// structured replies, and that an error leaves the connection usable.
func TestClientServerErrors(t *testing.T) {
	for _, tc := range []struct {
		name, inject, errName string // nbdkit error filter: error-INJECT=ERRNAME
		op                    func(c *Client) error
		errno                 syscall.Errno
		is                    error // backend error it must map to, if any
	}{
		{name: "EIO on read", inject: "pread", errName: "EIO", errno: syscall.EIO,
			op: func(c *Client) error { _, err := c.ReadAt(make([]byte, 4096), 0); return err }},
		{name: "EPERM on write", inject: "pwrite", errName: "EPERM", errno: syscall.EPERM, is: backend.ErrReadOnly,
			op: func(c *Client) error { _, err := c.WriteAt(make([]byte, 4096), 0); return err }},
		{name: "ENOSPC on write", inject: "pwrite", errName: "ENOSPC", errno: syscall.ENOSPC,
			op: func(c *Client) error { _, err := c.WriteAt(make([]byte, 4096), 0); return err }},
		{name: "EINVAL on trim", inject: "trim", errName: "EINVAL", errno: syscall.EINVAL,
			op: func(c *Client) error { return c.Trim(0, 4096) }},
		{name: "ENOMEM on write-zeroes", inject: "zero", errName: "ENOMEM", errno: syscall.ENOMEM,
			op: func(c *Client) error { return c.WriteZeroes(0, 4096, false) }},
	} {
		for _, sr := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s structured=%t", tc.name, sr), func(t *testing.T) {
				var args []string
				if !sr {
					args = append(args, "--no-sr")
				}
				args = append(args, "--filter=error", "memory", "1M",
					"error-"+tc.inject+"="+tc.errName, "error-"+tc.inject+"-rate=100%")
				c := clientDial(t, clientStartNbdkit(t, args...).config())
				require.Equal(t, sr, c.conns[0].s.structured)
				err := tc.op(c)
				require.ErrorIs(t, err, tc.errno)
				var re *RemoteError
				require.ErrorAs(t, err, &re)
				if tc.is != nil {
					require.ErrorIs(t, err, tc.is)
				} else {
					require.True(t, backend.IsRetryable(err), "%v must be retryable", err)
				}
				// The connection survives the error.
				require.NoError(t, c.Flush())
			})
		}
	}
}

func TestClientRemoteErrorMapping(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		errno       uint32
		off, length int64
		want        error
		errnoWant   syscall.Errno
	}{
		{errno: errPerm, want: backend.ErrReadOnly, errnoWant: syscall.EPERM},
		{errno: errNotSup, want: backend.ErrNotSupported, errnoWant: syscall.ENOTSUP},
		{errno: errNoSpc, off: size - 512, length: 4096, want: backend.ErrOutOfRange, errnoWant: syscall.ENOSPC},
		{errno: errInval, off: size, length: 1, want: backend.ErrOutOfRange, errnoWant: syscall.EINVAL},
		{errno: errNoSpc, length: 4096, errnoWant: syscall.ENOSPC},
		{errno: errInval, length: 4096, errnoWant: syscall.EINVAL},
		{errno: errIO, length: 4096, errnoWant: syscall.EIO},
		{errno: errOverflow, length: 4096, errnoWant: syscall.EOVERFLOW},
		{errno: 9999, length: 4096, errnoWant: syscall.EINVAL},
	} {
		t.Run(fmt.Sprint(tc.errno, tc.off), func(t *testing.T) {
			err := clientRemoteError(cmdWrite, tc.off, tc.length, size, tc.errno, "why")
			require.ErrorIs(t, err, tc.errnoWant)
			require.Contains(t, err.Error(), "why")
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				require.False(t, backend.IsRetryable(err))
			} else {
				require.True(t, backend.IsRetryable(err))
			}
		})
	}
}

// TestClientPipelined runs 256 concurrent calls on one connection (and on four), each writing
// its own pattern and reading it back.
func TestClientPipelined(t *testing.T) {
	for _, conns := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d connections", conns), func(t *testing.T) {
			cfg := clientStartNbdkit(t, "memory", "64M").config()
			cfg.Connections = conns
			c := clientDial(t, cfg)
			require.Len(t, c.conns, conns, "nbdkit memory offers multi-conn")
			require.NotZero(t, c.Flags()&tflagCanMultiConn)
			clientHammer(t, c, 256, 4, nil)
			// Every call waited on the network (backend.Waiter): 256 workers' 4 rounds of
			// writes (1 to 16 calls each) and a read.
			require.GreaterOrEqual(t, c.Waits(), uint64(256*4*2))
		})
	}
}

// clientHammer runs workers goroutines, each writing a fresh pattern to its own 64 KiB region
// and reading it back rounds times. It calls each (if not nil) after every completed round.
func clientHammer(t *testing.T, c *Client, workers, rounds int, each func()) {
	t.Helper()
	const region = 64 << 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			got := make([]byte, region)
			off := int64(w) * region
			for r := range rounds {
				// Odd workers write and read in pieces so requests of many sizes interleave.
				data := clientPattern(uint64(w*1000+r), region)
				piece := region
				if w%2 == 1 {
					piece = 4096 << (w % 4)
				}
				for p := 0; p < region; p += piece {
					if _, err := c.WriteAt(data[p:p+piece], off+int64(p)); err != nil {
						errs <- fmt.Errorf("worker %d round %d write: %w", w, r, err)
						return
					}
				}
				if _, err := c.ReadAt(got, off); err != nil {
					errs <- fmt.Errorf("worker %d round %d read: %w", w, r, err)
					return
				}
				if !bytes.Equal(got, data) {
					errs <- fmt.Errorf("worker %d round %d: read back other data", w, r)
					return
				}
				if each != nil {
					each()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestClientLargeRequests checks that calls larger than the server's maximum request are split.
func TestClientLargeRequests(t *testing.T) {
	k := clientStartNbdkit(t, "--filter=blocksize-policy", "memory", "96M",
		"blocksize-maximum=1M", "blocksize-error-policy=error")
	c := clientDial(t, k.config())
	data := clientPattern(7, 40<<20)
	_, err := c.WriteAt(data, 4096)
	require.NoError(t, err)
	got := make([]byte, len(data))
	_, err = c.ReadAt(got, 4096)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	require.NoError(t, c.WriteZeroes(0, 90<<20, false))
	require.NoError(t, c.Trim(0, 90<<20))
	_, err = c.ReadAt(got, 4096)
	require.NoError(t, err)
	require.True(t, bytes.Equal(make([]byte, len(got)), got))
}

// TestClientReconnect kills the server in the middle of a workload and starts it again on the
// same socket: every call completes, with the right data.
func TestClientReconnect(t *testing.T) {
	img := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(img, nil, 0o600))
	require.NoError(t, os.Truncate(img, 32<<20))
	k := clientStartNbdkit(t, "file", img)
	cfg := k.config()
	cfg.Connections = 2
	c := clientDial(t, cfg)

	var rounds atomic.Int64
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		for rounds.Load() < 100 {
			time.Sleep(time.Millisecond)
		}
		k.Kill()
		time.Sleep(200 * time.Millisecond)
		k.Restart()
	}()
	clientHammer(t, c, 32, 40, func() { rounds.Add(1) })
	<-restarted
	require.GreaterOrEqual(t, c.reconnects.Load(), int64(1))

	// What the last round wrote reached the file.
	require.NoError(t, c.Flush())
	disk, err := os.ReadFile(img)
	require.NoError(t, err)
	for w := range 32 {
		require.True(t, bytes.Equal(clientPattern(uint64(w*1000+39), 64<<10), disk[w*64<<10:(w+1)*64<<10]), "worker %d", w)
	}
}

// TestClientReconnectGivesUp checks that requests fail clearly once MaxReconnectWait passes, and
// that the client recovers when the server comes back.
func TestClientReconnectGivesUp(t *testing.T) {
	k := clientStartNbdkit(t, "memory", "1M")
	cfg := k.config()
	cfg.MaxReconnectWait = 300 * time.Millisecond
	c := clientDial(t, cfg)
	k.Kill()

	_, err := c.ReadAt(make([]byte, 4096), 0)
	require.ErrorContains(t, err, "not re-established within 300ms")
	require.True(t, backend.IsRetryable(err))

	k.Restart()
	require.Eventually(t, func() bool {
		_, err := c.ReadAt(make([]byte, 4096), 0)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
}

// TestClientServerShutdown checks the ESHUTDOWN path: the client disconnects softly, reconnects
// and sends the request again until the server stops refusing.
func TestClientServerShutdown(t *testing.T) {
	inject := filepath.Join(t.TempDir(), "inject")
	require.NoError(t, os.WriteFile(inject, nil, 0o600))
	c := clientDial(t, clientStartNbdkit(t, "--filter=error", "memory", "1M",
		"error-pread=ESHUTDOWN", "error-pread-rate=100%", "error-pread-file="+inject).config())

	done := make(chan error, 1)
	go func() {
		_, err := c.ReadAt(make([]byte, 4096), 0)
		done <- err
	}()
	require.Eventually(t, func() bool { return c.reconnects.Load() >= 2 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Remove(inject))
	require.NoError(t, <-done)
}

// TestClientClose checks that Close fails calls in flight and calls waiting for a reconnect,
// and every later call.
func TestClientClose(t *testing.T) {
	t.Run("in flight", func(t *testing.T) {
		c, err := Dial(context.Background(), clientStartNbdkit(t, "--filter=delay", "memory", "1M", "delay-read=60").config())
		require.NoError(t, err)
		clientCloseWithPending(t, c)
	})
	t.Run("reconnecting", func(t *testing.T) {
		k := clientStartNbdkit(t, "memory", "1M")
		c, err := Dial(context.Background(), k.config())
		require.NoError(t, err)
		k.Kill()
		clientCloseWithPending(t, c)
	})
}

func clientCloseWithPending(t *testing.T, c *Client) {
	const calls = 4
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			_, err := c.ReadAt(make([]byte, 4096), int64(i)*4096)
			errs <- err
		}()
	}
	require.Eventually(t, func() bool {
		cn := c.conns[0]
		cn.mu.Lock()
		defer cn.mu.Unlock()
		return len(cn.pending) == calls
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, c.Close())
	for range calls {
		require.ErrorIs(t, <-errs, backend.ErrClosed)
	}
	_, err := c.WriteAt(make([]byte, 512), 0)
	require.ErrorIs(t, err, backend.ErrClosed)
	require.ErrorIs(t, c.Flush(), backend.ErrClosed)
	require.NoError(t, c.Close(), "Close twice")
}

func TestClientDialErrors(t *testing.T) {
	notNBD := filepath.Join(t.TempDir(), "http.sock")
	l, err := net.Listen("unix", notNBD)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = nc.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n"))
			nc.Close()
		}
	}()

	strict := clientStartNbdkit(t, "--filter=exportname", "memory", "1M", "exportname=disk", "exportname-strict=true")
	old := clientStartNbdkit(t, "-o", "memory", "1M")
	for _, tc := range []struct {
		name     string
		cfg      ClientConfig
		is       error
		contains string
	}{
		{name: "unknown export", cfg: ClientConfig{Network: "unix", Address: strict.Addr, Export: "other"},
			is: ErrExportNotFound, contains: `"other"`},
		{name: "oldstyle server", cfg: ClientConfig{Network: "unix", Address: old.Addr}, is: ErrServerRefused, contains: "oldstyle"},
		{name: "not an NBD server", cfg: ClientConfig{Network: "unix", Address: notNBD}, is: ErrNotNBDServer, contains: "HTTP/1.0"},
		{name: "nothing listening", cfg: ClientConfig{Network: "unix", Address: filepath.Join(t.TempDir(), "none")},
			is: syscall.ENOENT, contains: "connect to unix"},
		{name: "bad network", cfg: ClientConfig{Network: "udp", Address: "x"}, contains: `"unix"`},
		{name: "export name too long", cfg: ClientConfig{Network: "unix", Address: strict.Addr, Export: string(make([]byte, 5000))},
			contains: "export name is 5000 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(context.Background(), tc.cfg)
			require.Nil(t, c)
			require.Error(t, err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			require.ErrorContains(t, err, tc.contains)
		})
	}

	c := clientDial(t, ClientConfig{Network: "unix", Address: strict.Addr, Export: "disk"})
	require.Equal(t, int64(1<<20), c.Size())
}

// TestClientAgainstServer runs the client against this package's server.
func TestClientAgainstServer(t *testing.T) {
	dev := volume.New(mem.New(64<<20), volume.Options{MultiConn: true})
	srv, err := NewServer(ServerConfig{Exports: []Export{{Name: "disk", Device: dev}}, Logger: clientTestLogger(t)})
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "srv.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, <-served)
	})

	cfg := ClientConfig{Network: "unix", Address: sock, Export: "disk", Connections: 2, Logger: clientTestLogger(t)}
	c := clientDial(t, cfg)
	require.Equal(t, int64(64<<20), c.Size())
	require.Len(t, c.conns, 2)
	clientExercise(t, c)
	clientHammer(t, c, 64, 2, nil)

	cfg.Export = "missing"
	_, err = Dial(context.Background(), cfg)
	require.ErrorIs(t, err, ErrExportNotFound)
}

// clientOptReply encodes an option reply as a server sends it.
func clientOptReply(opt, typ uint32, data []byte) []byte {
	b := make([]byte, optionReplyHeaderSize, optionReplyHeaderSize+len(data))
	putOptionReplyHeader(b, opt, typ, uint32(len(data)))
	return append(b, data...)
}

// FuzzClientHandshake feeds arbitrary server bytes to the handshake: it must return, without
// panicking, and only with sane export details.
func FuzzClientHandshake(f *testing.F) {
	greeting := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, magicNBD), magicIHaveOpt)
	greeting = binary.BigEndian.AppendUint16(greeting, flagFixedNewstyle|flagNoZeroes)
	export := binary.BigEndian.AppendUint16(nil, infoExport)
	export = binary.BigEndian.AppendUint64(export, 1<<20)
	export = binary.BigEndian.AppendUint16(export, tflagHasFlags|tflagSendFlush)
	sizes := binary.BigEndian.AppendUint16(nil, infoBlockSize)
	for _, v := range []uint32{512, 4096, 1 << 20} {
		sizes = binary.BigEndian.AppendUint32(sizes, v)
	}
	f.Add(slices.Concat(greeting, clientOptReply(optStructuredReply, repAck, nil),
		clientOptReply(optGo, repInfo, export), clientOptReply(optGo, repInfo, sizes), clientOptReply(optGo, repAck, nil)))
	f.Add(slices.Concat(greeting, clientOptReply(optStructuredReply, repErrUnsup, nil),
		clientOptReply(optGo, repErrUnsup, nil), export[2:]))
	f.Add(slices.Concat(greeting, clientOptReply(optStructuredReply, repAck, nil),
		clientOptReply(optGo, repErrUnknown, []byte("no such export"))))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		go func() { _, _ = b.Write(in); b.Close() }()
		s, err := clientHandshake(a, "disk", true)
		a.Close()
		if err != nil {
			return
		}
		e := s.export
		require.GreaterOrEqual(t, e.size, int64(0))
		require.NotZero(t, e.minBlock)
		require.Zero(t, e.minBlock&(e.minBlock-1), "minimum block size must be a power of two")
		require.GreaterOrEqual(t, e.maxBlock, e.minBlock)
	})
}

// FuzzClientReplies feeds arbitrary transmission-phase bytes to the reply reader with three
// requests pending: it must end (the input runs out) without panicking or writing outside the
// buffers, and finish each request at most once.
func FuzzClientReplies(f *testing.F) {
	simple := func(errno uint32, cookie uint64, data []byte) []byte {
		b := make([]byte, simpleReplySize)
		putSimpleReply(b, errno, cookie)
		return append(b, data...)
	}
	chunk := func(flags, typ uint16, cookie uint64, payload []byte) []byte {
		b := make([]byte, structReplySize)
		putChunkHeader(b, chunkHeader{flags: flags, typ: typ, cookie: cookie, length: uint32(len(payload))})
		return append(b, payload...)
	}
	offData := binary.BigEndian.AppendUint64(nil, 0)
	offData = append(offData, make([]byte, 4096)...)
	hole := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, 8192), 100)
	errChunk := append(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint32(nil, errIO), 3), "bad"...)
	f.Add(false, slices.Concat(simple(0, 1, make([]byte, 4096)), simple(0, 2, nil), simple(errShutdown, 3, nil)))
	f.Add(true, slices.Concat(chunk(0, replyTypeOffsetData, 1, offData), chunk(replyFlagDone, replyTypeNone, 1, nil),
		chunk(replyFlagDone, replyTypeError, 2, errChunk), chunk(replyFlagDone, replyTypeOffsetHole, 3, hole)))
	f.Fuzz(func(t *testing.T, structured bool, in []byte) {
		c := &Client{log: slog.New(slog.DiscardHandler), export: clientExport{size: 1 << 20, minBlock: 1, maxBlock: 1 << 20}}
		c.ctx, c.cancel = context.WithCancel(context.Background())
		defer c.cancel()
		cn := newClientConn(c, 0)
		a, b := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		s := &clientSession{nc: a, br: bufio.NewReader(bytes.NewReader(in)), structured: structured}
		var wg sync.WaitGroup
		reqs := []*clientRequest{
			{request: request{typ: cmdRead, cookie: 1, offset: 0, length: 4096}, buf: make([]byte, 4096)},
			{request: request{typ: cmdWrite, cookie: 2, offset: 4096, length: 10}, buf: make([]byte, 10)},
			{request: request{typ: cmdRead, cookie: 3, offset: 8192, length: 100}, buf: make([]byte, 100)},
		}
		for _, r := range reqs {
			wg.Add(1)
			r.wg = &wg
			cn.pending[r.cookie] = r
		}
		cn.s = s
		require.Error(t, cn.readReplies(s), "the input always runs out")
		a.Close()
		b.Close()
		c.wg.Wait()
		// Every request that left the pending set was finished once (twice would panic): finishing
		// the rest completes the group.
		for _, r := range cn.pending {
			r.finish(nil)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a request left the pending set without being finished")
		}
	})
}
