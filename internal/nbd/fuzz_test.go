package nbd

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/volume"
)

// The fuzz targets play a client that sends arbitrary bytes and then hangs up. The server must
// not panic, and must let go of the connection once the client is gone. Run them with
//
//	go test -run '^$' -fuzz FuzzHandshake ./internal/nbd/
//	go test -run '^$' -fuzz FuzzRequests ./internal/nbd/

// fuzzServer serves a small writable export and a read-only one.
func fuzzServer(f *testing.F) *Server {
	rw, _ := newVolume(1<<20, 0x5a, volume.Options{})
	ro, _ := newVolume(64<<10, 0x5a, volume.Options{ReadOnly: true})
	s, err := NewServer(ServerConfig{
		Exports: []Export{{Name: "disk", Description: "fuzz", Device: rw}, {Name: "ro", Device: ro}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	require.NoError(f, err)
	return s
}

// fuzzConn feeds in to one server connection over a pipe, draining whatever the server answers,
// then closes the client end and waits for the server to finish with the connection.
func fuzzConn(t *testing.T, s *Server, in []byte) {
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() {
		s.serveConn(server, "fuzz")
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
	var h [optionHeaderSize]byte
	putOptionHeader(h[:], opt, uint32(len(data)))
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
	flags := be32(cflagFixedNewstyle | cflagNoZeroes)
	for _, seed := range [][]byte{
		nil,
		flags,
		be32(1 << 5),
		cat(flags, option(optGo, appendInfoRequest(nil, "disk", infoName, infoDescription, infoBlockSize))),
		cat(flags, option(optStructuredReply, nil), option(optInfo, appendInfoRequest(nil, "")), option(optGo, appendInfoRequest(nil, "ro"))),
		cat(flags, option(optList, nil), option(optAbort, nil)),
		cat(be32(0), option(optExportName, []byte("disk"))),
		cat(flags, option(optExportName, []byte("nope"))),
		cat(flags, option(optStartTLS, nil), option(optSetMetaContext, []byte("xxxxxxxxxxxx")), option(optGo, []byte{0, 0, 0, 200})),
		cat(flags, option(optInfo, appendInfoRequest(nil, "nope", 1, 2, 3))),
		cat(flags, []byte("IHAVEOPT"), be32(optGo), be32(1<<30)),
		[]byte("GET / HTTP/1.0\r\n\r\n"),
	} {
		f.Add(seed)
	}
	s := fuzzServer(f)
	f.Fuzz(func(t *testing.T, in []byte) { fuzzConn(t, s, in) })
}

func FuzzRequests(f *testing.F) {
	req := func(typ, flags uint16, off uint64, length uint32, payload ...byte) []byte {
		var h [requestSize]byte
		putRequest(h[:], request{flags: flags, typ: typ, cookie: uint64(typ)<<8 | 1, offset: off, length: length})
		return append(h[:], payload...)
	}
	data := make([]byte, 4096)
	for _, seed := range [][]byte{
		req(cmdRead, 0, 0, 4096),
		cat(req(cmdWrite, cmdFlagFUA, 4096, 4096, data...), req(cmdFlush, 0, 0, 0), req(cmdRead, cmdFlagDF, 4096, 4096)),
		cat(req(cmdTrim, 0, 0, 1<<20), req(cmdWriteZeroes, cmdFlagNoHole|cmdFlagFastZero, 0, 65536), req(cmdCache, 0, 0, 4096)),
		cat(req(cmdRead, 0, 1<<20, 1), req(cmdWrite, 0, 1<<20-10, 20, data[:20]...), req(cmdRead, 0, 0, 64<<20)),
		cat(req(cmdBlockStatus, cmdFlagReqOne, 0, 4096), req(99, 0, 0, 0), req(cmdRead, 1<<15, 0, 512)),
		cat(req(cmdWrite, 0, 0, 4096, data[:100]...)),
		cat(req(cmdRead, 0, 0, 512), req(cmdDisc, 0, 0, 0), req(cmdRead, 0, 0, 512)),
		[]byte("not a request at all, just some text"),
	} {
		f.Add(false, "disk", seed)
		f.Add(true, "disk", seed)
		f.Add(true, "ro", seed)
	}
	s := fuzzServer(f)
	f.Fuzz(func(t *testing.T, structured bool, export string, in []byte) {
		hs := be32(cflagFixedNewstyle | cflagNoZeroes)
		if structured {
			hs = cat(hs, option(optStructuredReply, nil))
		}
		hs = cat(hs, option(optGo, appendInfoRequest(nil, export, infoBlockSize)))
		fuzzConn(t, s, cat(hs, in))
	})
}
