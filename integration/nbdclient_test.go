package integration

// Tests of the NBD client (internal/nbd/client), run in this process against real servers:
// nbdkit in the shapes the client must handle (simple replies, the old handshake, small block
// sizes, errors injected, killed and restarted) and qemu-nbd.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/nbdkit"
	"github.com/tierblk/tierblk/pkg/backend"
)

// defaultMaxBlock is the largest request every server must take, the maximum block size the
// client assumes when a server advertises none, and nbdkit's.
const defaultMaxBlock = 32 << 20

// clientNbdkit is an nbdkit process serving on a Unix socket or on a loopback TCP port.
type clientNbdkit struct {
	*nbdkit.Server
	t *testing.T
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

func (k clientNbdkit) config() client.Config {
	return client.Config{Network: k.Network, Address: k.Addr, Logger: nbdtest.Logger(k.t, slog.LevelDebug)}
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
			c := nbdtest.Dial(t, start(t, tc.args...).config())
			require.Equal(t, int64(64<<20), c.Size())
			require.Equal(t, tc.structured, c.Structured())
			_, _, maxBlock := c.BlockSizes()
			require.Equal(t, tc.maxBlock, maxBlock)
			require.False(t, c.ReadOnly())
			nbdtest.Exercise(t, c)
		})
	}
}

// TestClientQemuNbd checks the client against a second server implementation, one that answers
// reads of unallocated ranges with NBD_REPLY_TYPE_OFFSET_HOLE chunks.
func TestClientQemuNbd(t *testing.T) {
	requireTools(t, "qemu-nbd")
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

	cfg := client.Config{Network: "unix", Address: sock, Export: "disk", Logger: nbdtest.Logger(t, slog.LevelDebug)}
	c := nbdtest.Dial(t, cfg)
	require.Equal(t, int64(16<<20), c.Size())
	nbdtest.Exercise(t, c)

	cfg.Export = "nope"
	_, err := client.Dial(context.Background(), cfg)
	require.ErrorIs(t, err, client.ErrExportNotFound)
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
		c := nbdtest.Dial(t, cfg)
		require.Equal(t, 1, c.Connections(), "no multi-conn: one connection")
		require.ErrorIs(t, c.Trim(0, 4096), backend.ErrNotSupported)
		require.ErrorIs(t, c.WriteZeroes(0, 4096, true), backend.ErrNotSupported)
		require.ErrorIs(t, c.Cache(0, 4096), backend.ErrNotSupported)
		require.NoError(t, c.Flush(), "no flush offered: nothing is volatile")
		_, err := c.WriteAtFUA(make([]byte, 4096), 0)
		require.NoError(t, err)
	})
	t.Run("read-only export", func(t *testing.T) {
		c := nbdtest.Dial(t, clientStartNbdkit(t, "-r", "memory", "1M").config())
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
		c := nbdtest.Dial(t, clientStartNbdkit(t, "--filter=blocksize-policy", "memory", "1M",
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
		op                    func(c *client.Client) error
		errno                 syscall.Errno
		is                    error // backend error it must map to, if any
	}{
		{name: "EIO on read", inject: "pread", errName: "EIO", errno: syscall.EIO,
			op: func(c *client.Client) error { _, err := c.ReadAt(make([]byte, 4096), 0); return err }},
		{name: "EIO on an asynchronous read", inject: "pread", errName: "EIO", errno: syscall.EIO,
			op: func(c *client.Client) error {
				ended := make(chan error, 1)
				if !c.ReadAtAsync(make([]byte, 4096), 0, func(err error) { ended <- err }) {
					return errors.New("ReadAtAsync did not start")
				}
				return <-ended
			}},
		{name: "EPERM on write", inject: "pwrite", errName: "EPERM", errno: syscall.EPERM, is: backend.ErrReadOnly,
			op: func(c *client.Client) error { _, err := c.WriteAt(make([]byte, 4096), 0); return err }},
		{name: "ENOSPC on write", inject: "pwrite", errName: "ENOSPC", errno: syscall.ENOSPC,
			op: func(c *client.Client) error { _, err := c.WriteAt(make([]byte, 4096), 0); return err }},
		{name: "EINVAL on trim", inject: "trim", errName: "EINVAL", errno: syscall.EINVAL,
			op: func(c *client.Client) error { return c.Trim(0, 4096) }},
		{name: "ENOMEM on write-zeroes", inject: "zero", errName: "ENOMEM", errno: syscall.ENOMEM,
			op: func(c *client.Client) error { return c.WriteZeroes(0, 4096, false) }},
	} {
		for _, sr := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s structured=%t", tc.name, sr), func(t *testing.T) {
				var args []string
				if !sr {
					args = append(args, "--no-sr")
				}
				args = append(args, "--filter=error", "memory", "1M",
					"error-"+tc.inject+"="+tc.errName, "error-"+tc.inject+"-rate=100%")
				c := nbdtest.Dial(t, clientStartNbdkit(t, args...).config())
				require.Equal(t, sr, c.Structured())
				err := tc.op(c)
				require.ErrorIs(t, err, tc.errno)
				var re *client.RemoteError
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

// TestClientPipelined runs 256 concurrent calls on one connection (and on four), each writing
// its own pattern and reading it back.
func TestClientPipelined(t *testing.T) {
	for _, conns := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d connections", conns), func(t *testing.T) {
			cfg := clientStartNbdkit(t, "memory", "64M").config()
			cfg.Connections = conns
			c := nbdtest.Dial(t, cfg)
			require.Equal(t, conns, c.Connections(), "nbdkit memory offers multi-conn")
			require.NotZero(t, c.Flags()&proto.FlagCanMultiConn)
			nbdtest.Hammer(t, c, 256, 4, nil)
			// Every call waited on the network (backend.Waiter): 256 workers' 4 rounds of
			// writes (1 to 16 calls each) and a read.
			require.GreaterOrEqual(t, c.Waits(), uint64(256*4*2))
		})
	}
}

// TestClientLargeRequests checks that calls larger than the server's maximum request are split.
func TestClientLargeRequests(t *testing.T) {
	k := clientStartNbdkit(t, "--filter=blocksize-policy", "memory", "96M",
		"blocksize-maximum=1M", "blocksize-error-policy=error")
	c := nbdtest.Dial(t, k.config())
	data := nbdtest.Pattern(7, 40<<20)
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
	c := nbdtest.Dial(t, cfg)

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
	nbdtest.Hammer(t, c, 32, 40, func() { rounds.Add(1) })
	<-restarted
	require.GreaterOrEqual(t, c.Reconnects(), int64(1))

	// The connections were lost with acknowledged writes no flush covered: the first flush says
	// that the server may have lost them (nbdkit's file plugin did not: they are in the page
	// cache), once. Then what the last round wrote is on the file.
	require.ErrorContains(t, c.Flush(), "lost with acknowledged writes not yet flushed")
	require.NoError(t, c.Flush())
	disk, err := os.ReadFile(img)
	require.NoError(t, err)
	for w := range 32 {
		require.True(t, bytes.Equal(nbdtest.Pattern(uint64(w*1000+39), 64<<10), disk[w*64<<10:(w+1)*64<<10]), "worker %d", w)
	}
}

// TestClientReconnectGivesUp checks that requests fail clearly once MaxReconnectWait passes (those
// of ReadAtAsync too), and that the client recovers when the server comes back.
func TestClientReconnectGivesUp(t *testing.T) {
	k := clientStartNbdkit(t, "memory", "1M")
	cfg := k.config()
	cfg.MaxReconnectWait = 300 * time.Millisecond
	c := nbdtest.Dial(t, cfg)
	k.Kill()

	_, err := c.ReadAt(make([]byte, 4096), 0)
	require.ErrorContains(t, err, "not re-established within 300ms")
	require.True(t, backend.IsRetryable(err))
	ended := make(chan error, 1)
	require.True(t, c.ReadAtAsync(make([]byte, 4096), 0, func(err error) { ended <- err }))
	err = <-ended
	require.ErrorContains(t, err, "not re-established within 300ms", "an asynchronous read fails the same way")
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
	c := nbdtest.Dial(t, clientStartNbdkit(t, "--filter=error", "memory", "1M",
		"error-pread=ESHUTDOWN", "error-pread-rate=100%", "error-pread-file="+inject).config())

	done := make(chan error, 1)
	go func() {
		_, err := c.ReadAt(make([]byte, 4096), 0)
		done <- err
	}()
	require.Eventually(t, func() bool { return c.Reconnects() >= 2 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Remove(inject))
	require.NoError(t, <-done)
}

// TestClientClose checks that Close fails calls in flight and calls waiting for a reconnect,
// and every later call.
func TestClientClose(t *testing.T) {
	t.Run("in flight", func(t *testing.T) {
		c, err := client.Dial(context.Background(), clientStartNbdkit(t, "--filter=delay", "memory", "1M", "delay-read=60").config())
		require.NoError(t, err)
		clientCloseWithPending(t, c)
	})
	t.Run("reconnecting", func(t *testing.T) {
		k := clientStartNbdkit(t, "memory", "1M")
		c, err := client.Dial(context.Background(), k.config())
		require.NoError(t, err)
		k.Kill()
		clientCloseWithPending(t, c)
	})
}

func clientCloseWithPending(t *testing.T, c *client.Client) {
	const calls = 4 // half of them ReadAtAsync
	errs := make(chan error, calls)
	for i := range calls {
		if i%2 == 1 {
			require.True(t, c.ReadAtAsync(make([]byte, 4096), int64(i)*4096, func(err error) { errs <- err }))
			continue
		}
		go func() {
			_, err := c.ReadAt(make([]byte, 4096), int64(i)*4096)
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return c.Pending() == calls }, 10*time.Second, time.Millisecond)
	require.NoError(t, c.Close())
	for range calls {
		require.ErrorIs(t, <-errs, backend.ErrClosed)
	}
	_, err := c.WriteAt(make([]byte, 512), 0)
	require.ErrorIs(t, err, backend.ErrClosed)
	require.ErrorIs(t, c.Flush(), backend.ErrClosed)
	require.False(t, c.ReadAtAsync(make([]byte, 512), 0, func(error) { t.Error("done called after Close") }))
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
		cfg      client.Config
		is       error
		contains string
	}{
		{name: "unknown export", cfg: client.Config{Network: "unix", Address: strict.Addr, Export: "other"},
			is: client.ErrExportNotFound, contains: `"other"`},
		{name: "oldstyle server", cfg: client.Config{Network: "unix", Address: old.Addr}, is: client.ErrServerRefused, contains: "oldstyle"},
		{name: "not an NBD server", cfg: client.Config{Network: "unix", Address: notNBD}, is: client.ErrNotNBDServer, contains: "HTTP/1.0"},
		{name: "nothing listening", cfg: client.Config{Network: "unix", Address: filepath.Join(t.TempDir(), "none")},
			is: syscall.ENOENT, contains: "connect to unix"},
		{name: "bad network", cfg: client.Config{Network: "udp", Address: "x"}, contains: `"unix"`},
		{name: "export name too long", cfg: client.Config{Network: "unix", Address: strict.Addr, Export: string(make([]byte, 5000))},
			contains: "export name is 5000 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.Dial(context.Background(), tc.cfg)
			require.Nil(t, c)
			require.Error(t, err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			require.ErrorContains(t, err, tc.contains)
		})
	}

	c := nbdtest.Dial(t, client.Config{Network: "unix", Address: strict.Addr, Export: "disk"})
	require.Equal(t, int64(1<<20), c.Size())
}
