package kernel

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/volume"
)

// kernelSide speaks to the server, on a socket made for the kernel, as the kernel's client does:
// simple replies only, the handshake already done.
func kernelSide(t *testing.T, f *os.File) *nbdtest.RawClient {
	t.Helper()
	nc, err := net.FileConn(f)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return nbdtest.NewRawClient(t, nc)
}

// TestKernelSockets runs the kernel's half of Attach without a kernel: socketpairs served
// by the server and negotiated by the client, then used as the kernel would use them.
func TestKernelSockets(t *testing.T) {
	tests := []struct {
		name      string
		multiConn bool
		ask       int
		wantConns int
	}{
		{"one connection", true, 1, 1},
		{"several connections on a multi-conn export", true, 3, 3},
		{"an export without multi-conn gets one", false, 3, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dev, mem := nbdtest.NewVolume(1<<20, 0, volume.Options{MultiConn: tt.multiConn})
			log := nbdtest.Logger(t, slog.LevelWarn)
			s, err := server.New(server.Config{Exports: []server.Export{{Name: "disk", Device: dev}}, Logger: log})
			require.NoError(t, err)
			k := &Device{path: "/dev/nbd0", srv: s, log: log}
			files, ex, err := k.sockets("disk", tt.ask)
			require.NoError(t, err)
			require.Len(t, files, tt.wantConns)
			require.Equal(t, int64(1<<20), ex.Size)
			require.NotZero(t, ex.Flags&proto.FlagSendFlush)
			require.Zero(t, ex.Flags&proto.FlagSendDF, "DF means structured replies, which the kernel does not speak")

			for i, f := range files {
				flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
				require.NoError(t, err)
				require.Zero(t, flags&unix.O_NONBLOCK, "the kernel's socket must be blocking")

				c := kernelSide(t, f)
				data := bytes.Repeat([]byte{byte(i + 1)}, 4096)
				off := uint64(i) * 4096
				c.Request(proto.Request{Type: proto.CmdWrite, Cookie: 1, Offset: off, Length: 4096}, data)
				c.Request(proto.Request{Type: proto.CmdFlush, Cookie: 2}, nil)
				c.Request(proto.Request{Type: proto.CmdRead, Cookie: 3, Offset: off, Length: 4096}, nil)
				for range 3 {
					r := c.Reply() // a structured reply would fail here
					require.Zero(t, r.Errno)
					if r.Cookie == 3 {
						require.Equal(t, data, r.Data)
					}
				}
				c.Request(proto.Request{Type: proto.CmdDisc}, nil)
				c.ExpectClosed()
				require.Equal(t, data, mem.Snapshot()[off:off+4096])
			}
			k.conns.Wait() // every served connection ended with its client's disconnect
			require.NoError(t, s.Shutdown(context.Background()))
		})
	}
}

func TestKernelSocketsRefused(t *testing.T) {
	dev, _ := nbdtest.NewVolume(1<<20, 0, volume.Options{})
	tests := []struct {
		name    string
		export  string
		prepare func(s *server.Server)
		wantErr error
	}{
		{"unknown export", "nope", func(*server.Server) {}, client.ErrExportNotFound},
		{"server shut down", "disk", func(s *server.Server) { require.NoError(t, s.Shutdown(context.Background())) }, client.ErrNotNBDServer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := nbdtest.Logger(t, slog.LevelWarn)
			s, err := server.New(server.Config{Exports: []server.Export{{Name: "disk", Device: dev}}, Logger: log})
			require.NoError(t, err)
			tt.prepare(s)
			k := &Device{path: "/dev/nbd0", srv: s, log: log}
			_, _, err = k.sockets(tt.export, 2)
			require.ErrorIs(t, err, tt.wantErr)
			k.conns.Wait() // no connection left behind
		})
	}
}

func TestKernelConfigFor(t *testing.T) {
	f, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer f.Close()
	tests := []struct {
		name          string
		minBlock      uint32
		wantBlockSize uint64
		wantErr       bool
	}{
		{"byte-addressable export: the kernel's smallest", 1, 512, false},
		{"4 KiB sectors", 4096, 4096, false},
		{"more than a page", 1 << 16, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex := client.Export{Size: 1 << 30, Flags: proto.FlagHasFlags | proto.FlagSendFlush, MinBlock: tt.minBlock}
			cfg, err := kernelConfigFor(4, ex, []*os.File{f})
			if tt.wantErr {
				require.ErrorContains(t, err, "minimum block size")
				return
			}
			require.NoError(t, err)
			require.Equal(t, kernelConfig{
				index: 4, size: 1 << 30, blockSize: tt.wantBlockSize, flags: proto.FlagHasFlags | proto.FlagSendFlush,
				timeout: 30, deadConnTimeout: 0, fds: []int{int(f.Fd())},
			}, cfg)
		})
	}
}

func TestNBDIndex(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "disk")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nbd7"), nil, 0o600))
	require.NoError(t, os.Symlink(filepath.Join(dir, "nbd7"), link))
	tests := []struct {
		path    string
		want    uint32
		wantErr bool
	}{
		{"/dev/nbd0", 0, false},
		{"/dev/nbd15", 15, false},
		{link, 7, false},
		{"/dev/nbd", 0, true},
		{"/dev/nbd0p1", 0, true},
		{"/dev/nbd-1", 0, true},
		{"/dev/sda", 0, true},
		{"/dev/nbd99999999", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			got, err := nbdIndex(tt.path)
			if tt.wantErr {
				require.ErrorContains(t, err, "is not an NBD device")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestKernelErrors(t *testing.T) {
	connect := func(errno syscall.Errno) error { return connectError("/dev/nbd0", &genlError{errno: errno}) }
	tests := []struct {
		err  error
		want string
	}{
		{familyError(fmt.Errorf("%w: %q", errFamilyNotFound, "nbd")), "nbd module is not loaded (modprobe nbd)"},
		{familyError(&genlError{errno: syscall.EACCES}), "nbd: permission denied"},
		{connect(syscall.EBUSY), "/dev/nbd0 is in use"},
		{connect(syscall.EPERM), "needs CAP_SYS_ADMIN"},
		{connect(syscall.EINVAL), "the kernel refused the configuration of /dev/nbd0"},
		{connect(syscall.ENOMEM), "connect /dev/nbd0: cannot allocate memory"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			require.ErrorContains(t, tt.err, tt.want)
		})
	}
	require.NoError(t, connectError("/dev/nbd0", nil))
}

func TestWaitSysBlock(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(v), 0o600))
		return p
	}
	isZero := func(v string) bool { return v == "0" }
	tests := []struct {
		name      string
		file      string
		wantValue string
		wantDone  bool
	}{
		{"accepted", write("released", "0\n"), "0", true},
		{"gone with its device", filepath.Join(dir, "missing"), "", true},
		{"never accepted", write("busy", "2048\n"), "2048", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, done := waitSysBlock(tt.file, 50*time.Millisecond, isZero)
			require.Equal(t, tt.wantValue, v)
			require.Equal(t, tt.wantDone, done)
		})
	}
}
