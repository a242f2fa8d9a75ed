package server

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/tlsconf/tlstest"
	"github.com/tierblk/tierblk/internal/volume"
)

// The fuzz targets play a client that sends arbitrary bytes and then hangs up. The server must
// not panic, and must let go of the connection once the client is gone. Their seed corpora are
// testdata/fuzz (inputs the fuzzer found interesting, kept) and the seeds below; make test fuzzes
// each over 50,000 inputs (make fuzz-short). Run them longer with
//
//	go test -run '^$' -fuzz FuzzHandshake ./internal/nbd/server/
//	go test -run '^$' -fuzz FuzzRequests ./internal/nbd/server/

// fuzzServer serves a small writable export and a read-only one, with TLS as t says.
func fuzzServer(f *testing.F, t TLS) *Server {
	rw, _ := nbdtest.NewVolume(1<<20, 0x5a, volume.Options{})
	ro, _ := nbdtest.NewVolume(64<<10, 0x5a, volume.Options{ReadOnly: true})
	s, err := New(Config{
		Exports: []Export{{Name: "disk", Description: "fuzz", Device: rw}, {Name: "ro", Device: ro}},
		Logger:  slog.New(slog.DiscardHandler),
		TLS:     t,
	})
	require.NoError(f, err)
	return s
}

// requireTLS is a TLS configuration that requires TLS.
func requireTLS(f *testing.F) TLS {
	cfg, err := tlsconf.Server(tlsconf.Options{Dir: tlstest.NewCA(f, "fuzz").ServerDir(f)})
	require.NoError(f, err)
	return TLS{Mode: tlsconf.Require, Config: func() *tls.Config { return cfg }}
}

// socketPair returns the two ends of a connected unix stream socket: real sockets, so that the
// server reads them as it reads its clients' (raw system calls, sock.go), which a net.Pipe never
// reaches.
func socketPair(t *testing.T) (client, server net.Conn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "fuzz")
		conns[i], err = net.FileConn(f) // a duplicate of fd
		f.Close()
		require.NoError(t, err)
	}
	return conns[0], conns[1]
}

// fuzzConn feeds in to one server connection over a socket pair, draining whatever the server
// answers, then closes the client end and waits for the server to finish with the connection.
func fuzzConn(t *testing.T, s *Server, in []byte) {
	client, server := socketPair(t)
	done := make(chan struct{})
	go func() {
		s.ServeConn(server, "fuzz")
		close(done)
	}()
	go io.Copy(io.Discard, client)
	client.Write(in) // fails once the server hangs up, which is fine
	client.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not let go of a connection whose client hung up")
	}
}

func option(opt uint32, data []byte) []byte {
	var h [proto.OptionHeaderSize]byte
	proto.PutOptionHeader(h[:], opt, uint32(len(data)))
	return append(h[:], data...)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func FuzzHandshake(f *testing.F) {
	flags := be32(proto.ClientFlagFixedNewstyle | proto.ClientFlagNoZeroes)
	for _, seed := range [][]byte{
		nil,
		flags,
		be32(1 << 5),
		cat(flags, option(proto.OptGo, proto.AppendInfoRequest(nil, "disk", proto.InfoName, proto.InfoDescription, proto.InfoBlockSize))),
		cat(flags, option(proto.OptStructuredReply, nil), option(proto.OptInfo, proto.AppendInfoRequest(nil, "")), option(proto.OptGo, proto.AppendInfoRequest(nil, "ro"))),
		cat(flags, option(proto.OptList, nil), option(proto.OptAbort, nil)),
		cat(be32(0), option(proto.OptExportName, []byte("disk"))),
		cat(flags, option(proto.OptExportName, []byte("nope"))),
		cat(flags, option(proto.OptStartTLS, nil), option(proto.OptSetMetaContext, []byte("xxxxxxxxxxxx")), option(proto.OptGo, []byte{0, 0, 0, 200})),
		cat(flags, option(proto.OptList, nil), option(proto.OptStartTLS, []byte("x")), option(proto.OptStartTLS, nil)),
		cat(flags, option(proto.OptStartTLS, nil), []byte{0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0}), // the start of a ClientHello
		cat(flags, option(proto.OptInfo, proto.AppendInfoRequest(nil, "nope", 1, 2, 3))),
		cat(flags, []byte("IHAVEOPT"), be32(proto.OptGo), be32(1<<30)),
		[]byte("GET / HTTP/1.0\r\n\r\n"),
	} {
		f.Add(seed)
	}
	// Each input goes to a server without TLS, and to one that requires it.
	plain, tlsOnly := fuzzServer(f, TLS{}), fuzzServer(f, requireTLS(f))
	f.Fuzz(func(t *testing.T, in []byte) {
		fuzzConn(t, plain, in)
		fuzzConn(t, tlsOnly, in)
	})
}

func FuzzRequests(f *testing.F) {
	req := func(typ, flags uint16, off uint64, length uint32, payload ...byte) []byte {
		var h [proto.RequestSize]byte
		proto.PutRequest(h[:], proto.Request{Flags: flags, Type: typ, Cookie: uint64(typ)<<8 | 1, Offset: off, Length: length})
		return append(h[:], payload...)
	}
	data := make([]byte, 4096)
	for _, seed := range [][]byte{
		req(proto.CmdRead, 0, 0, 4096),
		cat(req(proto.CmdWrite, proto.CmdFlagFUA, 4096, 4096, data...), req(proto.CmdFlush, 0, 0, 0), req(proto.CmdRead, proto.CmdFlagDF, 4096, 4096)),
		cat(req(proto.CmdTrim, 0, 0, 1<<20), req(proto.CmdWriteZeroes, proto.CmdFlagNoHole|proto.CmdFlagFastZero, 0, 65536), req(proto.CmdCache, 0, 0, 4096)),
		cat(req(proto.CmdRead, 0, 1<<20, 1), req(proto.CmdWrite, 0, 1<<20-10, 20, data[:20]...), req(proto.CmdRead, 0, 0, 64<<20)),
		cat(req(proto.CmdBlockStatus, proto.CmdFlagReqOne, 0, 4096), req(99, 0, 0, 0), req(proto.CmdRead, 1<<15, 0, 512)),
		cat(req(proto.CmdWrite, 0, 0, 4096, data[:100]...)),
		cat(req(proto.CmdRead, 0, 0, 512), req(proto.CmdDisc, 0, 0, 0), req(proto.CmdRead, 0, 0, 512)),
		[]byte("not a request at all, just some text"),
	} {
		f.Add(false, "disk", seed)
		f.Add(true, "disk", seed)
		f.Add(true, "ro", seed)
	}
	s := fuzzServer(f, TLS{})
	f.Fuzz(func(t *testing.T, structured bool, export string, in []byte) {
		hs := be32(proto.ClientFlagFixedNewstyle | proto.ClientFlagNoZeroes)
		if structured {
			hs = cat(hs, option(proto.OptStructuredReply, nil))
		}
		hs = cat(hs, option(proto.OptGo, proto.AppendInfoRequest(nil, export, proto.InfoBlockSize)))
		fuzzConn(t, s, cat(hs, in))
	})
}
