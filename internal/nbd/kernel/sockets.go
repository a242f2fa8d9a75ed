package kernel

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/proto"
)

// sockets makes n connections to export (one if the export cannot take several) and returns the
// client ends, negotiated, with what the first negotiation learnt.
func (k *Device) sockets(export string, n int) ([]*os.File, client.Export, error) {
	var files []*os.File
	var first client.Export
	for i := 0; i < n; i++ {
		f, ex, err := k.socket(export, i)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, client.Export{}, err
		}
		files = append(files, f)
		if i == 0 {
			first = ex
			if n > 1 && ex.Flags&proto.FlagCanMultiConn == 0 {
				k.log.Info("nbd: export does not allow several connections; the kernel gets one", "export", export, "asked", n)
				n = 1
			}
		}
	}
	return files, first, nil
}

// socket makes one socketpair, serves one end and negotiates export on the other, which it
// returns in blocking mode, ready for the kernel.
func (k *Device) socket(export string, i int) (*os.File, client.Export, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, client.Export{}, fmt.Errorf("socketpair: %w", err)
	}
	server, err := fileConn(fds[0], "nbd-server")
	if err != nil {
		unix.Close(fds[1])
		return nil, client.Export{}, err
	}
	k.conns.Add(1)
	go func() {
		defer k.conns.Done()
		k.srv.ServeLocalConn(server, fmt.Sprintf("kernel:%s#%d", k.path, i))
		k.ended.Add(1)
		if k.attached.Load() && !k.detaching.Load() && !k.srv.ShuttingDown() {
			// The kernel gave up on the connection: a request took longer than its timeout, or
			// someone disconnected the device. Its requests go to the other connections, if any.
			k.log.Warn("nbd: the kernel closed a connection of its device", "device", k.path, "connection", i,
				"request_timeout", requestTimeout)
		}
	}()

	f := os.NewFile(uintptr(fds[1]), "nbd-kernel")
	ex, err := negotiate(f, export)
	if err != nil {
		f.Close()
		return nil, client.Export{}, err
	}
	// net.FileConn made the socket non-blocking; the kernel's client expects it blocking.
	if err := unix.SetNonblock(fds[1], false); err != nil {
		f.Close()
		return nil, client.Export{}, fmt.Errorf("socket: %w", err)
	}
	return f, ex, nil
}

// fileConn wraps a socket descriptor in a net.Conn, which takes it over.
func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", name, err)
	}
	return nc, nil
}

// negotiate runs the client's handshake for export on the socket f, without structured replies
// (the kernel knows none), through a duplicate that it closes: f stays open.
func negotiate(f *os.File, export string) (client.Export, error) {
	nc, err := net.FileConn(f)
	if err != nil {
		return client.Export{}, fmt.Errorf("socket: %w", err)
	}
	defer nc.Close()
	if err := nc.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return client.Export{}, err
	}
	ex, err := client.Handshake(nc, export)
	if err != nil {
		return client.Export{}, fmt.Errorf("handshake for export %q: %w", export, err)
	}
	return ex, nil
}

// kernelConfigFor is the kernel's view of the negotiated export. The kernel's logical block size
// must be a power of two from 512 bytes to a page, and no smaller than the export's minimum.
func kernelConfigFor(index uint32, ex client.Export, files []*os.File) (kernelConfig, error) {
	bs := max(uint64(ex.MinBlock), 512)
	if bs > uint64(os.Getpagesize()) {
		return kernelConfig{}, fmt.Errorf("nbd: the export's minimum block size %d is more than the kernel's client allows (%d)", bs, os.Getpagesize())
	}
	cfg := kernelConfig{
		index:           index,
		size:            uint64(ex.Size),
		blockSize:       bs,
		flags:           ex.Flags,
		timeout:         uint64(requestTimeout / time.Second),
		deadConnTimeout: deadConnTimeout,
	}
	for _, f := range files {
		cfg.fds = append(cfg.fds, int(f.Fd()))
	}
	return cfg, nil
}
