package nbdbackend_test

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbdkit"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	nbdbackend "github.com/tierblk/tierblk/pkg/backend/nbd"
)

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want client.Config
		err  string // part of the error; "" for a good URL
	}{
		{url: "nbd://nas:10810/disk", want: client.Config{Network: "tcp", Address: "nas:10810", Export: "disk"}},
		{url: "nbd://nas/disk", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "disk"}},
		{url: "nbd://nas", want: client.Config{Network: "tcp", Address: "nas:10809"}},
		{url: "nbd://nas/", want: client.Config{Network: "tcp", Address: "nas:10809"}},
		{url: "nbd://nas//disk", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "/disk"}},
		{url: "nbd://nas/hello%20world", want: client.Config{Network: "tcp", Address: "nas:10809", Export: "hello world"}},
		{url: "nbd://[::1]:9000/x", want: client.Config{Network: "tcp", Address: "[::1]:9000", Export: "x"}},
		{url: "nbd://10.0.0.1/x?connections=4", want: client.Config{Network: "tcp", Address: "10.0.0.1:10809", Export: "x", Connections: 4}},
		{url: "nbd+unix:///disk?socket=/run/nbd.sock", want: client.Config{Network: "unix", Address: "/run/nbd.sock", Export: "disk"}},
		{url: "nbd+unix:///?socket=nbd.sock&connections=2", want: client.Config{Network: "unix", Address: "nbd.sock", Connections: 2}},

		{url: "nbd:///disk", err: "no host; use nbd://HOST[:PORT]/EXPORT"},
		{url: "nbd:nas:10809", err: "expected nbd:// followed by"},
		{url: "nbd://nas:0/x", err: `port "0"`},
		{url: "nbd://nas:99999/x", err: `port "99999"`},
		{url: "nbd://nas/x?socket=/s", err: "socket= needs the nbd+unix scheme"},
		{url: "nbd://user@nas/x", err: "user names are for TLS"},
		{url: "nbds://nas/x", err: "TLS is not supported"},
		{url: "nbds+unix:///x?socket=/s", err: "TLS is not supported"},
		{url: "file:///x", err: `scheme "file"`},
		{url: "nbd+unix:///disk", err: "no socket= path; use nbd+unix:///EXPORT?socket=PATH"},
		{url: "nbd+unix://host/disk?socket=/s", err: "takes no host"},
		{url: "nbd://nas/x?connections=0", err: "connections=0 is not a number from 1 to 64"},
		{url: "nbd://nas/x?connections=many", err: "connections=many"},
		{url: "nbd://nas/x?connections=1&connections=2", err: "connections= is given 2 times"},
		{url: "nbd://nas/x?tls-type=x509&zz=1", err: "unknown query parameter tls-type, zz"},
		{url: "nbd://nas/x?a=%zz", err: "query"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			require.NoError(t, err)
			got, err := nbdbackend.ClientConfig(u)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// startNbdkit runs nbdkit with args until the test ends, on a Unix socket or on a loopback TCP
// port, and returns the socket path or host:port.
func startNbdkit(t *testing.T, tcp bool, args ...string) string {
	t.Helper()
	network := "unix"
	if tcp {
		network = "tcp"
	}
	return nbdkit.Start(t, network, args...).Addr
}

// registry has the two schemes, as the daemon's registry does.
func registry() *backend.Registry {
	r := backend.NewRegistry()
	r.Register("nbd", nbdbackend.Usage, nbdbackend.Open)
	r.Register("nbd+unix", nbdbackend.UnixUsage, nbdbackend.Open)
	return r
}

func open(t *testing.T, rawURL string, opts backend.Options) backend.Backend {
	t.Helper()
	b, err := registry().Open(rawURL, opts)
	require.NoError(t, err)
	return b
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		sock := startNbdkit(t, false, "memory", strconv.FormatInt(size, 10))
		return open(t, "nbd+unix:///?socket="+sock, backend.Options{})
	})
}

func TestConformanceTCPMultiConn(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		addr := startNbdkit(t, true, "memory", strconv.FormatInt(size, 10))
		return open(t, "nbd://"+addr+"/?connections=3", backend.Options{})
	})
}

func TestReadOnly(t *testing.T) {
	t.Run("opened read-only", func(t *testing.T) {
		backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
			img := filepath.Join(t.TempDir(), "disk.img")
			require.NoError(t, os.WriteFile(img, content, 0o600))
			return open(t, "nbd+unix:///?socket="+startNbdkit(t, false, "file", img), backend.Options{ReadOnly: true})
		})
	})
	t.Run("read-only export", func(t *testing.T) {
		backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
			img := filepath.Join(t.TempDir(), "disk.img")
			require.NoError(t, os.WriteFile(img, content, 0o600))
			return open(t, "nbd+unix:///?socket="+startNbdkit(t, false, "-r", "file", img), backend.Options{})
		})
	})
}

// TestMissingCapabilities checks a server without trim, write-zeroes, flush and FUA: the calls
// that need them fail with ErrNotSupported, FUA writes still work.
func TestMissingCapabilities(t *testing.T) {
	sock := startNbdkit(t, false, "--filter=nozero", "eval", "get_size=echo 1048576",
		"pread=head -c $3 /dev/zero", "pwrite=cat >/dev/null", "can_write=exit 0",
		"can_trim=exit 3", "can_flush=exit 3", "can_fua=echo none", "zeromode=none")
	b := open(t, "nbd+unix:///?socket="+sock, backend.Options{})
	defer b.Close()
	require.ErrorIs(t, b.(backend.Trimmer).Trim(0, 4096), backend.ErrNotSupported)
	require.ErrorIs(t, b.(backend.ZeroWriter).WriteZeroes(0, 4096, false), backend.ErrNotSupported)
	_, err := b.(backend.FUAWriter).WriteAtFUA(make([]byte, 4096), 0)
	require.NoError(t, err)
	require.NoError(t, b.Flush())
	require.False(t, b.(backend.ReadOnlyReporter).ReadOnly())
}

func TestOpenErrors(t *testing.T) {
	sock := startNbdkit(t, false, "--filter=exportname", "memory", "1M", "exportname=disk", "exportname-strict=true")
	_, err := registry().Open("nbd+unix:///other?socket="+sock, backend.Options{})
	require.ErrorIs(t, err, client.ErrExportNotFound)
	_, err = registry().Open("nbd+unix:///disk", backend.Options{})
	require.ErrorContains(t, err, "socket=")
	b := open(t, "nbd+unix:///disk?socket="+sock, backend.Options{})
	require.Equal(t, int64(1<<20), b.Size())
	require.NoError(t, b.Close())
}
