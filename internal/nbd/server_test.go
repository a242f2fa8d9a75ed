package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// memBackend is the mem backend with what the tests look at: a copy of all it holds.
type memBackend struct{ *mem.Mem }

// newMem is a mem backend of size bytes, every one fill.
func newMem(size int, fill byte) memBackend {
	m := mem.New(int64(size))
	if fill != 0 {
		if _, err := m.WriteAt(bytes.Repeat([]byte{fill}, size), 0); err != nil {
			panic(err)
		}
	}
	return memBackend{m}
}

func (m memBackend) snapshot() []byte {
	p := make([]byte, m.Size())
	if _, err := m.ReadAt(p, 0); err != nil {
		panic(err)
	}
	return p
}

// plainBackend hides the optional abilities of the backend it wraps.
type plainBackend struct{ backend.Backend }

// hookDevice runs hooks before the calls it passes on, to block or observe them.
type hookDevice struct {
	volume.Device
	onRead  func(off int64)
	onWrite func(off int64) (after func())
	onFlush func()
}

func (d *hookDevice) ReadAt(p []byte, off int64) error {
	if d.onRead != nil {
		d.onRead(off)
	}
	return d.Device.ReadAt(p, off)
}

func (d *hookDevice) WriteAt(p []byte, off int64, fua bool) error {
	if d.onWrite != nil {
		defer d.onWrite(off)()
	}
	return d.Device.WriteAt(p, off, fua)
}

func (d *hookDevice) Flush() error {
	if d.onFlush != nil {
		d.onFlush()
	}
	return d.Device.Flush()
}

// errDevice fails every call with err.
type errDevice struct {
	volume.Device
	err error
}

func (d errDevice) ReadAt([]byte, int64) error                       { return d.err }
func (d errDevice) WriteAt([]byte, int64, bool) error                { return d.err }
func (d errDevice) Flush() error                                     { return d.err }
func (d errDevice) Trim(int64, int64, bool) error                    { return d.err }
func (d errDevice) WriteZeroes(int64, int64, volume.ZeroFlags) error { return d.err }
func (d errDevice) Cache(int64, int64) error                         { return d.err }

// testWriter sends the server's log to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testServer struct {
	s    *Server
	sock string // unix socket
	tcp  string // host:port on 127.0.0.1
}

// startServer serves cfg on a unix socket and a TCP port until the test ends, then checks that
// Shutdown is clean and both Serve calls return nil.
func startServer(t *testing.T, cfg ServerConfig) *testServer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := NewServer(cfg)
	require.NoError(t, err)
	return serve(t, s)
}

// serve serves s until the test ends.
func serve(t *testing.T, s *Server) *testServer {
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
	return &testServer{s: s, sock: sock, tcp: tl.Addr().String()}
}

func (ts *testServer) uri(export string) string {
	return "nbd+unix:///" + export + "?socket=" + ts.sock
}

// waitIdle waits until every connection's goroutines have ended.
func (ts *testServer) waitIdle(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		ts.s.mu.Lock()
		defer ts.s.mu.Unlock()
		return len(ts.s.conns) == 0
	}, 20*time.Second, 5*time.Millisecond, "connections still open")
}

// rawClient speaks the protocol byte by byte, so that tests can also speak it wrongly.
type rawClient struct {
	t          *testing.T
	nc         net.Conn
	structured bool
	reads      map[uint64]uint32 // cookie -> length of READs whose simple reply is pending
}

func dialRaw(t *testing.T, network, addr string) *rawClient {
	t.Helper()
	nc, err := net.Dial(network, addr)
	require.NoError(t, err)
	// A bound on every test exchange: a server that fails to answer fails the test, not hangs it.
	require.NoError(t, nc.SetDeadline(time.Now().Add(20*time.Second)))
	t.Cleanup(func() { nc.Close() })
	return &rawClient{t: t, nc: nc, reads: map[uint64]uint32{}}
}

func (c *rawClient) send(parts ...[]byte) {
	c.t.Helper()
	for _, p := range parts {
		if len(p) == 0 {
			continue // a write of nothing fails once the server closed, which DISC makes it do
		}
		_, err := c.nc.Write(p)
		require.NoError(c.t, err)
	}
}

func (c *rawClient) recv(n int) []byte {
	c.t.Helper()
	b := make([]byte, n)
	_, err := io.ReadFull(c.nc, b)
	require.NoError(c.t, err)
	return b
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// greet reads the server's greeting and sends the client flags.
func (c *rawClient) greet() {
	c.t.Helper()
	g := c.recv(18)
	require.Equal(c.t, magicNBD, binary.BigEndian.Uint64(g[0:]))
	require.Equal(c.t, magicIHaveOpt, binary.BigEndian.Uint64(g[8:]))
	require.Equal(c.t, flagFixedNewstyle|flagNoZeroes, binary.BigEndian.Uint16(g[16:]))
	c.send(be32(cflagFixedNewstyle | cflagNoZeroes))
}

func (c *rawClient) option(opt uint32, data []byte) {
	c.t.Helper()
	var h [optionHeaderSize]byte
	putOptionHeader(h[:], opt, uint32(len(data)))
	c.send(h[:], data)
}

func (c *rawClient) optReply(opt uint32) (typ uint32, data []byte) {
	c.t.Helper()
	gotOpt, typ, n, ok := parseOptionReplyHeader(c.recv(optionReplyHeaderSize))
	require.True(c.t, ok, "option reply magic")
	require.Equal(c.t, opt, gotOpt)
	return typ, c.recv(int(n))
}

// infos collects the NBD_REP_INFO replies to INFO or GO, by type, and the final reply type.
func (c *rawClient) infos(opt uint32) (map[uint16][]byte, uint32) {
	c.t.Helper()
	got := map[uint16][]byte{}
	for {
		typ, data := c.optReply(opt)
		if typ != repInfo {
			return got, typ
		}
		require.GreaterOrEqual(c.t, len(data), 2)
		got[binary.BigEndian.Uint16(data)] = data[2:]
	}
}

// connect negotiates up to the transmission phase with NBD_OPT_GO.
func (c *rawClient) connect(export string, structured bool) (size uint64, flags uint16) {
	c.t.Helper()
	c.greet()
	if structured {
		c.option(optStructuredReply, nil)
		typ, _ := c.optReply(optStructuredReply)
		require.Equal(c.t, repAck, typ)
		c.structured = true
	}
	return c.goExport(export)
}

// goExport sends NBD_OPT_GO after the greeting.
func (c *rawClient) goExport(export string) (size uint64, flags uint16) {
	c.t.Helper()
	c.option(optGo, appendInfoRequest(nil, export, infoBlockSize))
	infos, final := c.infos(optGo)
	require.Equal(c.t, repAck, final)
	e := infos[infoExport]
	require.Len(c.t, e, 10)
	return binary.BigEndian.Uint64(e), binary.BigEndian.Uint16(e[8:])
}

func (c *rawClient) request(r request, payload []byte) {
	c.t.Helper()
	var h [requestSize]byte
	putRequest(h[:], r)
	if r.typ == cmdRead && !c.structured {
		c.reads[r.cookie] = r.length
	}
	c.send(h[:], payload)
}

type reply struct {
	cookie uint64
	errno  uint32
	data   []byte
	msg    string
	chunks []uint16 // structured chunk types, in order
}

// reply reads one whole reply. The server sends every structured reply as one chunk (or a data
// chunk and nothing else), so chunks of different replies are not interleaved.
func (c *rawClient) reply() reply {
	c.t.Helper()
	h := c.recv(4)
	switch binary.BigEndian.Uint32(h) {
	case magicSimpleReply:
		errno, cookie, _ := parseSimpleReply(append(h, c.recv(simpleReplySize-4)...))
		r := reply{cookie: cookie, errno: errno}
		if n, isRead := c.reads[cookie]; isRead {
			delete(c.reads, cookie)
			if errno == 0 {
				r.data = c.recv(int(n))
			}
		}
		return r
	case magicStructReply:
		require.True(c.t, c.structured, "structured reply without negotiation")
		var r reply
		for {
			ch, _ := parseChunkHeader(append(h, c.recv(structReplySize-4)...))
			r.cookie = ch.cookie
			r.chunks = append(r.chunks, ch.typ)
			p := c.recv(int(ch.length))
			switch ch.typ {
			case replyTypeOffsetData:
				r.data = append(r.data, p[8:]...)
			case replyTypeError:
				r.errno = binary.BigEndian.Uint32(p)
				r.msg = string(p[6 : 6+binary.BigEndian.Uint16(p[4:])])
			}
			if ch.flags&replyFlagDone != 0 {
				return r
			}
			h = c.recv(4)
		}
	default:
		c.t.Fatalf("bad reply magic %x", h)
		return reply{}
	}
}

// expectClosed checks that the server closes the connection (after any bytes it still sends).
func (c *rawClient) expectClosed() {
	c.t.Helper()
	_, err := io.Copy(io.Discard, c.nc)
	if err != nil {
		require.ErrorIs(c.t, err, syscall.ECONNRESET, "want the server to close the connection")
	}
}

func newVolume(size int, fill byte, o volume.Options) (*volume.Volume, memBackend) {
	m := newMem(size, fill)
	return volume.New(m, o), m
}

func TestNewServerRejectsBadConfig(t *testing.T) {
	dev, _ := newVolume(4096, 0, volume.Options{})
	for _, tc := range []struct {
		name string
		cfg  ServerConfig
		want string
	}{
		{"no exports", ServerConfig{}, "no exports"},
		{"duplicate", ServerConfig{Exports: []Export{{Name: "a", Device: dev}, {Name: "a", Device: dev}}}, "used twice"},
		{"no device", ServerConfig{Exports: []Export{{Name: "a"}}}, "no device"},
		{"empty name not first", ServerConfig{Exports: []Export{{Name: "a", Device: dev}, {Device: dev}}}, "empty name"},
		{"long name", ServerConfig{Exports: []Export{{Name: strings.Repeat("x", 5000), Device: dev}}}, "longer than"},
		{"negative in-flight", ServerConfig{Exports: []Export{{Device: dev}}, MaxInFlight: -1}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewServer(tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestNegotiation(t *testing.T) {
	dev, _ := newVolume(1<<20, 0, volume.Options{MultiConn: true})
	ts := startServer(t, ServerConfig{Exports: []Export{
		{Name: "disk", Description: "a disk", Device: dev},
		{Name: "other", Device: dev},
	}})

	t.Run("list", func(t *testing.T) {
		c := dialRaw(t, "unix", ts.sock)
		c.greet()
		c.option(optList, nil)
		var names []string
		for {
			typ, data := c.optReply(optList)
			if typ == repAck {
				break
			}
			require.Equal(t, repServer, typ)
			n := binary.BigEndian.Uint32(data)
			names = append(names, string(data[4:4+n])+"|"+string(data[4+n:]))
		}
		require.Equal(t, []string{"disk|a disk", "other|"}, names)
		c.option(optAbort, nil)
		typ, _ := c.optReply(optAbort)
		require.Equal(t, repAck, typ)
		c.expectClosed()
	})

	t.Run("info then go on the default export", func(t *testing.T) {
		c := dialRaw(t, "tcp", ts.tcp)
		c.greet()
		c.option(optInfo, appendInfoRequest(nil, "", infoName, infoDescription, 999))
		infos, final := c.infos(optInfo)
		require.Equal(t, repAck, final)
		require.Equal(t, "disk", string(infos[infoName]))
		require.Equal(t, "a disk", string(infos[infoDescription]))
		bs := infos[infoBlockSize]
		require.Len(t, bs, 12, "block sizes are sent even when not asked for")
		require.Equal(t, []uint32{1, 4096, 32 << 20},
			[]uint32{binary.BigEndian.Uint32(bs), binary.BigEndian.Uint32(bs[4:]), binary.BigEndian.Uint32(bs[8:])})
		size, flags := c.goExport("")
		require.EqualValues(t, 1<<20, size)
		require.Equal(t, tflagHasFlags|tflagSendFlush|tflagSendFUA|tflagSendTrim|tflagSendWriteZeroes|
			tflagSendFastZero|tflagCanMultiConn|tflagSendCache, flags)
	})

	t.Run("export name with zeroes", func(t *testing.T) {
		c := dialRaw(t, "unix", ts.sock)
		c.recv(18)
		c.send(be32(cflagFixedNewstyle))
		c.option(optStructuredReply, nil)
		typ, _ := c.optReply(optStructuredReply)
		require.Equal(t, repAck, typ)
		c.structured = true
		c.option(optExportName, []byte("other"))
		b := c.recv(exportNameReplySize + exportNamePadding)
		require.EqualValues(t, 1<<20, binary.BigEndian.Uint64(b))
		require.NotZero(t, binary.BigEndian.Uint16(b[8:])&tflagSendDF, "DF with structured replies")
		require.Equal(t, make([]byte, exportNamePadding), b[exportNameReplySize:])
		c.request(request{typ: cmdRead, cookie: 7, offset: 4096, length: 512}, nil)
		r := c.reply()
		require.Equal(t, reply{cookie: 7, data: make([]byte, 512), chunks: []uint16{replyTypeOffsetData}}, r)
	})
}

func TestTransmission(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			dev, mem := newVolume(1<<20, 0x5a, volume.Options{})
			ts := startServer(t, ServerConfig{Exports: []Export{
				{Name: "disk", Device: dev},
				{Name: "plain", Device: volume.New(plainBackend{newMem(1<<20, 0x5a)}, volume.Options{})},
			}})
			c := dialRaw(t, "unix", ts.sock)
			c.connect("disk", structured)
			payload := bytes.Repeat([]byte{0xab}, 8192)
			cookie := uint64(100)
			do := func(r request, data []byte) reply {
				t.Helper()
				cookie++
				r.cookie = cookie
				c.request(r, data)
				got := c.reply()
				require.Equal(t, cookie, got.cookie)
				return got
			}

			require.Zero(t, do(request{typ: cmdWrite, offset: 4096, length: 8192}, payload).errno)
			require.Zero(t, do(request{typ: cmdWrite, flags: cmdFlagFUA, offset: 65536, length: 8192}, payload).errno)
			r := do(request{typ: cmdRead, offset: 4096, length: 8192}, nil)
			require.Zero(t, r.errno)
			require.Equal(t, payload, r.data)
			require.Zero(t, do(request{typ: cmdTrim, offset: 4096, length: 4096}, nil).errno)
			require.Zero(t, do(request{typ: cmdWriteZeroes, flags: cmdFlagNoHole, offset: 8192, length: 4096}, nil).errno)
			require.Zero(t, do(request{typ: cmdWriteZeroes, flags: cmdFlagFastZero | cmdFlagFUA, offset: 0, length: 4096}, nil).errno)
			require.Zero(t, do(request{typ: cmdFlush}, nil).errno)
			require.Zero(t, do(request{typ: cmdCache, offset: 0, length: 1 << 20}, nil).errno)
			r = do(request{typ: cmdRead, offset: 0, length: 0}, nil)
			require.Zero(t, r.errno)
			require.Empty(t, r.data)
			if structured {
				require.Equal(t, []uint16{replyTypeNone}, r.chunks, "an empty read is one NONE chunk")
				r = do(request{typ: cmdRead, flags: cmdFlagDF, offset: 0, length: 1 << 20}, nil)
				require.Equal(t, []uint16{replyTypeOffsetData}, r.chunks, "DF: one data chunk")
			}

			want := bytes.Repeat([]byte{0x5a}, 1<<20)
			clear(want[:4096*3])
			copy(want[65536:], payload)
			require.True(t, bytes.Equal(want, mem.snapshot()), "device content")

			// A fast zero on a backend that cannot zero fast: the flag is not advertised.
			p := dialRaw(t, "tcp", ts.tcp)
			_, flags := p.connect("plain", structured)
			require.Zero(t, flags&tflagSendFastZero)
			require.Zero(t, flags&tflagSendTrim)
			p.request(request{typ: cmdWriteZeroes, flags: cmdFlagFastZero, cookie: 1, length: 4096}, nil)
			require.Equal(t, errInval, p.reply().errno)
			p.request(request{typ: cmdWriteZeroes, cookie: 2, length: 4096}, nil)
			require.Zero(t, p.reply().errno, "zeroes emulated with writes")
			p.request(request{typ: cmdDisc}, nil)
			p.expectClosed()

			c.request(request{typ: cmdDisc}, nil)
			c.expectClosed()
		})
	}
}

func TestDeviceErrorsMapToNBDErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		cmd  uint16
		want uint32
	}{
		{"read out of range", fmt.Errorf("x: %w", volume.ErrOutOfRange), cmdRead, errInval},
		{"cache out of range", volume.ErrOutOfRange, cmdCache, errInval},
		{"trim out of range", volume.ErrOutOfRange, cmdTrim, errInval},
		{"write out of range", volume.ErrOutOfRange, cmdWrite, errNoSpc},
		{"zeroes out of range", volume.ErrOutOfRange, cmdWriteZeroes, errNoSpc},
		{"read-only", volume.ErrReadOnly, cmdWrite, errPerm},
		{"not supported", volume.ErrNotSupported, cmdWriteZeroes, errNotSup},
		{"invalid", volume.ErrInvalid, cmdRead, errInval},
		{"disk full", &os.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC}, cmdWrite, errNoSpc},
		{"quota", syscall.EDQUOT, cmdWrite, errNoSpc},
		{"other", errors.New("disk on fire"), cmdFlush, errIO},
		{"other on read", fmt.Errorf("read /srv/disk.img: %w", syscall.EIO), cmdRead, errIO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, _ := newVolume(1<<20, 0, volume.Options{})
			ts := startServer(t, ServerConfig{
				Exports: []Export{{Device: errDevice{Device: dev, err: tc.err}}},
				Logger:  slog.New(slog.DiscardHandler),
			})
			for _, structured := range []bool{false, true} {
				c := dialRaw(t, "unix", ts.sock)
				c.connect("", structured)
				var payload []byte
				r := request{typ: tc.cmd, cookie: 9, length: 4096}
				if tc.cmd == cmdWrite {
					payload = make([]byte, 4096)
				}
				if tc.cmd == cmdFlush {
					r.length = 0
				}
				c.request(r, payload)
				got := c.reply()
				require.Equal(t, tc.want, got.errno)
				require.Empty(t, got.data)
				if structured {
					require.Equal(t, []uint16{replyTypeError}, got.chunks)
					require.Equal(t, deviceErrorMessages[tc.want], got.msg)
					require.NotContains(t, got.msg, tc.err.Error(), "the device's own error stays in the log")
					require.NotContains(t, got.msg, "/srv", "no path of the server's")
				}
			}
		})
	}
}

// TestBadInput sends what a broken or hostile client might, and checks that the server answers
// with an error or closes that connection, writes nothing, and keeps serving others.
func TestBadInput(t *testing.T) {
	const size = 1 << 20
	dev, mem := newVolume(size, 0x5a, volume.Options{})
	ts := startServer(t, ServerConfig{
		Exports: []Export{{Name: "disk", Device: dev}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	initial := mem.snapshot()
	// transmission starts a connection in the transmission phase.
	transmission := func(structured bool, f func(*rawClient)) func(*rawClient) {
		return func(c *rawClient) {
			c.connect("disk", structured)
			f(c)
		}
	}
	expectErr := func(r request, payload []byte, errno uint32) func(*rawClient) {
		return func(c *rawClient) {
			c.request(r, payload)
			got := c.reply()
			require.Equal(c.t, r.cookie, got.cookie)
			require.Equal(c.t, errno, got.errno)
			require.Empty(c.t, got.data)
			// The connection is still in step: a good request after the bad one works.
			c.request(request{typ: cmdRead, cookie: 2, offset: 0, length: 4096}, nil)
			got = c.reply()
			require.Zero(c.t, got.errno)
			require.Equal(c.t, initial[:4096], got.data)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(*rawClient)
	}{
		{"garbage instead of client flags", func(c *rawClient) {
			c.recv(18)
			c.send([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
			c.expectClosed()
		}},
		{"unknown client flags", func(c *rawClient) {
			c.recv(18)
			c.send(be32(cflagFixedNewstyle | 1<<7))
			c.expectClosed()
		}},
		{"garbage option magic", func(c *rawClient) {
			c.greet()
			c.send(bytes.Repeat([]byte{0xff}, 64))
			c.expectClosed()
		}},
		{"oversized option length", func(c *rawClient) {
			c.greet()
			var h [optionHeaderSize]byte
			putOptionHeader(h[:], optGo, 1<<31)
			c.send(h[:])
			c.expectClosed()
		}},
		{"unknown options then go", func(c *rawClient) {
			c.greet()
			for _, opt := range []uint32{optStartTLS, optListMetaContext, optSetMetaContext, 11, 4, 0, 12345, 1 << 31} {
				c.option(opt, []byte("some data"))
				typ, _ := c.optReply(opt)
				require.Equal(c.t, repErrUnsup, typ)
			}
			c.option(optGo, appendInfoRequest(nil, "disk"))
			_, final := c.infos(optGo)
			require.Equal(c.t, repAck, final)
		}},
		{"malformed info requests", func(c *rawClient) {
			c.greet()
			bad := [][]byte{
				nil,
				{0, 0, 0, 9, 'd', 'i', 's', 'k', 0, 0}, // name longer than the data
				append(appendInfoRequest(nil, "disk", 1), 0), // odd trailing byte
				appendInfoRequest(nil, "disk", 1)[:9],        // count says one, none follows
			}
			for _, data := range bad {
				c.option(optInfo, data)
				_, final := c.infos(optInfo)
				require.Equal(c.t, repErrInvalid, final)
			}
			c.option(optList, []byte("x"))
			typ, _ := c.optReply(optList)
			require.Equal(c.t, repErrInvalid, typ)
			c.option(optStructuredReply, []byte("x"))
			typ, _ = c.optReply(optStructuredReply)
			require.Equal(c.t, repErrInvalid, typ)
		}},
		{"unknown export with go, then the right one", func(c *rawClient) {
			c.greet()
			c.option(optGo, appendInfoRequest(nil, "nope", infoBlockSize))
			infos, final := c.infos(optGo)
			require.Equal(c.t, repErrUnknown, final)
			require.Empty(c.t, infos)
			c.option(optGo, appendInfoRequest(nil, "disk"))
			_, final = c.infos(optGo)
			require.Equal(c.t, repAck, final)
		}},
		{"unknown export with export name", func(c *rawClient) {
			c.greet()
			c.option(optExportName, []byte("nope"))
			c.expectClosed()
		}},
		{"read past the end", transmission(false, expectErr(request{typ: cmdRead, cookie: 1, offset: size - 512, length: 4096}, nil, errInval))},
		{"read at a huge offset", transmission(true, expectErr(request{typ: cmdRead, cookie: 1, offset: 1 << 63, length: 4096}, nil, errInval))},
		{"write past the end", transmission(false, expectErr(request{typ: cmdWrite, cookie: 1, offset: size - 512, length: 4096}, make([]byte, 4096), errNoSpc))},
		{"zeroes past the end", transmission(true, expectErr(request{typ: cmdWriteZeroes, cookie: 1, offset: size, length: 1}, nil, errNoSpc))},
		{"trim past the end", transmission(false, expectErr(request{typ: cmdTrim, cookie: 1, offset: ^uint64(0), length: 1}, nil, errInval))},
		{"cache past the end", transmission(false, expectErr(request{typ: cmdCache, cookie: 1, offset: size, length: 1}, nil, errInval))},
		{"read over the maximum", transmission(true, expectErr(request{typ: cmdRead, cookie: 1, length: 32<<20 + 1}, nil, errOverflow))},
		{"write over the maximum", transmission(false, expectErr(request{typ: cmdWrite, cookie: 1, length: 33 << 20}, make([]byte, 33<<20), errOverflow))},
		{"cache over the maximum", transmission(false, expectErr(request{typ: cmdCache, cookie: 1, length: 32<<20 + 4096}, nil, errOverflow))},
		{"write over the hard cap", transmission(false, func(c *rawClient) {
			c.request(request{typ: cmdWrite, cookie: 1, length: 1 << 31}, nil)
			c.expectClosed()
		})},
		{"unknown command", transmission(true, expectErr(request{typ: 42, cookie: 1, length: 4096}, nil, errInval))},
		{"block status", transmission(true, expectErr(request{typ: cmdBlockStatus, cookie: 1, length: 4096}, nil, errInval))},
		{"unknown flag", transmission(false, expectErr(request{typ: cmdRead, flags: 1 << 9, cookie: 1, length: 4096}, nil, errInval))},
		{"DF without structured replies", transmission(false, expectErr(request{typ: cmdRead, flags: cmdFlagDF, cookie: 1, length: 4096}, nil, errInval))},
		{"no-hole on a write", transmission(false, expectErr(request{typ: cmdWrite, flags: cmdFlagNoHole, cookie: 1, length: 4096}, make([]byte, 4096), errInval))},
		{"bad request magic", transmission(false, func(c *rawClient) {
			c.send(bytes.Repeat([]byte{0x25}, requestSize))
			c.expectClosed()
		})},
		{"client gone mid-payload", transmission(false, func(c *rawClient) {
			var h [requestSize]byte
			putRequest(h[:], request{typ: cmdWrite, cookie: 1, length: 65536})
			c.send(h[:], make([]byte, 1000))
		})},
		{"client gone mid-reply", transmission(true, func(c *rawClient) {
			for i := range 32 {
				c.request(request{typ: cmdRead, cookie: uint64(i), length: size}, nil)
			}
			c.recv(100)
		})},
		{"client gone mid-handshake", func(c *rawClient) {
			c.greet()
			c.send([]byte("IHAVEOPT"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, "unix", ts.sock)
			tc.run(c)
			c.nc.Close()

			h := dialRaw(t, "tcp", ts.tcp)
			h.connect("disk", true)
			h.request(request{typ: cmdRead, cookie: 1, length: size}, nil)
			require.True(t, bytes.Equal(initial, h.reply().data), "a second connection reads the data unchanged")
			require.True(t, bytes.Equal(initial, mem.snapshot()), "nothing was written")
			h.request(request{typ: cmdDisc}, nil)
			h.expectClosed()
		})
	}
	ts.waitIdle(t)
}

func TestSilentClientTimesOut(t *testing.T) {
	dev, _ := newVolume(4096, 0, volume.Options{})
	s, err := NewServer(ServerConfig{Exports: []Export{{Device: dev}}, Logger: testLogger(t)})
	require.NoError(t, err)
	s.handshakeTimeout = 50 * time.Millisecond
	ts := serve(t, s)
	for _, tc := range []struct {
		name string
		run  func(*rawClient)
	}{
		{"before the client flags", func(c *rawClient) { c.recv(18) }},
		{"between options", func(c *rawClient) {
			c.greet()
			c.option(optList, nil)
			for typ := uint32(0); typ != repAck; typ, _ = c.optReply(optList) {
			}
		}},
		{"inside an option", func(c *rawClient) {
			c.greet()
			c.send([]byte("IHAVEOPT"))
		}},
		{"options that trickle in", func(c *rawClient) {
			c.greet()
			var h [optionHeaderSize]byte
			putOptionHeader(h[:], optList, 0)
			for range 16 { // four times the timeout in all, each option well within it
				time.Sleep(s.handshakeTimeout / 4)
				if _, err := c.nc.Write(h[:]); err != nil {
					return // closed: the deadline is the whole handshake's
				}
			}
			c.t.Error("the server took options for four times its handshake timeout")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, "unix", ts.sock)
			tc.run(c)
			c.expectClosed()
		})
	}
	// Once in transmission, an idle client is left alone.
	c := dialRaw(t, "unix", ts.sock)
	c.connect("", false)
	time.Sleep(4 * s.handshakeTimeout)
	c.request(request{typ: cmdFlush, cookie: 1}, nil)
	require.Equal(t, reply{cookie: 1}, c.reply())
}

// TestRepliesOutOfOrder: a read stuck in the device does not hold back the others on the same
// connection, and no more than MaxInFlight requests reach the device at once.
func TestRepliesOutOfOrder(t *testing.T) {
	const maxInFlight = 3
	vol, _ := newVolume(1<<20, 0x11, volume.Options{})
	release := make(chan struct{})
	stuck := make(chan struct{})
	var active, peak atomic.Int32
	dev := &hookDevice{Device: vol, onRead: func(off int64) {
		n := active.Add(1)
		defer active.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		switch {
		case off == 0:
			close(stuck)
			<-release
		case off >= 1<<19:
			<-release
		}
	}}
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}, MaxInFlight: maxInFlight})
	c := dialRaw(t, "unix", ts.sock)
	c.connect("", true)

	readsPastStuck(t, c, stuck, 10, "fast reads are answered while the slow one waits")
	// Flood the connection with reads that all block: the server must not run more than
	// maxInFlight of them at once.
	for i := range uint64(20) {
		c.request(request{typ: cmdRead, cookie: 100 + i, offset: 1<<19 + 4096*i, length: 4096}, nil)
	}
	close(release)
	seen := map[uint64]bool{}
	for range 21 {
		r := c.reply()
		require.Zero(t, r.errno)
		require.Equal(t, bytes.Repeat([]byte{0x11}, 4096), r.data)
		seen[r.cookie] = true
	}
	require.Len(t, seen, 21)
	require.True(t, seen[1])
	require.LessOrEqual(t, peak.Load(), int32(maxInFlight))
}

// readsPastStuck sends a read of offset 0 (cookie 1), which the device holds until the test
// releases it, and once stuck is closed, n reads of other blocks, each of which must be answered
// while the first still waits.
func readsPastStuck(t *testing.T, c *rawClient, stuck <-chan struct{}, n uint64, msg string) {
	t.Helper()
	c.request(request{typ: cmdRead, cookie: 1, offset: 0, length: 4096}, nil)
	<-stuck
	for i := range n {
		c.request(request{typ: cmdRead, cookie: 10 + i, offset: 4096 * (1 + i), length: 4096}, nil)
		require.Equal(t, 10+i, c.reply().cookie, msg)
	}
}

// TestWatchdogHoldingAP: with Ps to spare the watchdog sleeps in a raw system call, holding its
// P; it must still rescue a stuck reader, and a garbage collection (which stops the world, so
// must stop the watchdog too) must still complete while it runs.
func TestWatchdogHoldingAP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(minProcsToHoldOne))
	vol, _ := newVolume(1<<20, 0x22, volume.Options{})
	release := make(chan struct{})
	stuck := make(chan struct{})
	dev := &hookDevice{Device: vol, onRead: func(off int64) {
		if off == 0 {
			close(stuck)
			<-release
		}
	}}
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}})
	c := dialRaw(t, "unix", ts.sock)
	c.connect("", true)

	readsPastStuck(t, c, stuck, 5, "the watchdog handed the reading on")
	gcDone := make(chan struct{})
	go func() {
		for range 3 {
			runtime.GC()
		}
		close(gcDone)
	}()
	select {
	case <-gcDone:
	case <-time.After(10 * time.Second):
		t.Fatal("garbage collection blocked by the watchdog's sleep")
	}
	close(release)
	require.Equal(t, uint64(1), c.reply().cookie)
}

// TestFlushWaitsForEarlierWrites: a FLUSH is answered only after the writes received before it
// completed, while writes received after it do not wait for it.
func TestFlushWaitsForEarlierWrites(t *testing.T) {
	vol, mem := newVolume(1<<20, 0, volume.Options{})
	release := make(chan struct{})
	stuck := make(chan struct{})
	var writing, flushes, writingAtFlush atomic.Int32
	dev := &hookDevice{
		Device: vol,
		onWrite: func(off int64) func() {
			writing.Add(1)
			if off == 0 {
				close(stuck)
				<-release
			}
			return func() { writing.Add(-1) }
		},
		onFlush: func() {
			writingAtFlush.Store(writing.Load())
			flushes.Add(1)
		},
	}
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}})
	c := dialRaw(t, "unix", ts.sock)
	c.connect("", false)

	block := bytes.Repeat([]byte{0xee}, 4096)
	c.request(request{typ: cmdWrite, cookie: 1, offset: 0, length: 4096}, block)
	<-stuck
	c.request(request{typ: cmdFlush, cookie: 2}, nil)
	c.request(request{typ: cmdWrite, cookie: 3, offset: 8192, length: 4096}, block)
	require.Equal(t, uint64(3), c.reply().cookie, "a write after the flush is not held back")
	c.request(request{typ: cmdRead, cookie: 4, offset: 8192, length: 4096}, nil)
	require.Equal(t, reply{cookie: 4, data: block}, c.reply())
	require.Zero(t, flushes.Load(), "flush ran while an earlier write was still in flight")

	close(release)
	require.Equal(t, uint64(1), c.reply().cookie)
	require.Equal(t, uint64(2), c.reply().cookie)
	require.EqualValues(t, 1, flushes.Load())
	require.Zero(t, writingAtFlush.Load())
	require.Equal(t, block, mem.snapshot()[:4096])
}

func TestReadOnlyExport(t *testing.T) {
	dev, mem := newVolume(1<<20, 0x77, volume.Options{ReadOnly: true})
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}, Logger: slog.New(slog.DiscardHandler)})
	initial := mem.snapshot()
	c := dialRaw(t, "unix", ts.sock)
	_, flags := c.connect("", true)
	require.Equal(t, tflagHasFlags|tflagReadOnly|tflagSendFlush|tflagSendCache|tflagSendDF, flags)
	for i, r := range []request{
		{typ: cmdWrite, length: 4096},
		{typ: cmdTrim, length: 4096},
		{typ: cmdWriteZeroes, length: 4096},
		{typ: cmdWriteZeroes, flags: cmdFlagNoHole, offset: 1 << 30, length: 4096},
	} {
		r.cookie = uint64(i)
		var payload []byte
		if r.typ == cmdWrite {
			payload = make([]byte, r.length)
		}
		c.request(r, payload)
		got := c.reply()
		require.Equal(t, errPerm, got.errno, "command %d", r.typ)
		require.Equal(t, []uint16{replyTypeError}, got.chunks)
	}
	c.request(request{typ: cmdFlush, cookie: 10}, nil)
	require.Zero(t, c.reply().errno)
	c.request(request{typ: cmdRead, cookie: 11, length: 4096}, nil)
	require.Equal(t, initial[:4096], c.reply().data)
	require.True(t, bytes.Equal(initial, mem.snapshot()))

	if _, err := exec.LookPath("qemu-io"); err == nil {
		out, _ := exec.Command("qemu-io", "-f", "raw", ts.uri(""), "-c", "write -P 0xab 0 4k").CombinedOutput()
		require.Contains(t, strings.ToLower(string(out)), "permission denied", "qemu-io output: %s", out)
		require.True(t, bytes.Equal(initial, mem.snapshot()))
	}
}

func TestShutdown(t *testing.T) {
	t.Run("in-flight requests finish", func(t *testing.T) {
		vol, _ := newVolume(1<<20, 0x33, volume.Options{})
		release, stuck := make(chan struct{}), make(chan struct{})
		dev := &hookDevice{Device: vol, onRead: func(int64) { close(stuck); <-release }}
		ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}})
		c := dialRaw(t, "unix", ts.sock)
		c.connect("", false)
		idle := dialRaw(t, "tcp", ts.tcp)
		idle.connect("", true)
		shaking := dialRaw(t, "unix", ts.sock)
		shaking.greet()

		c.request(request{typ: cmdRead, cookie: 1, length: 4096}, nil)
		<-stuck
		done := make(chan error, 1)
		go func() { done <- ts.s.Shutdown(context.Background()) }()
		shaking.expectClosed()
		idle.expectClosed()
		require.Eventually(t, func() bool {
			nc, err := net.Dial("unix", ts.sock)
			if err == nil {
				nc.Close()
			}
			return err != nil
		}, 10*time.Second, time.Millisecond, "listener still accepting")

		close(release)
		require.Equal(t, reply{cookie: 1, data: bytes.Repeat([]byte{0x33}, 4096)}, c.reply())
		c.expectClosed()
		require.NoError(t, <-done)
	})

	t.Run("context ends first", func(t *testing.T) {
		vol, _ := newVolume(1<<20, 0, volume.Options{})
		release, stuck := make(chan struct{}), make(chan struct{})
		dev := &hookDevice{Device: vol, onRead: func(int64) { close(stuck); <-release }}
		ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}})
		c := dialRaw(t, "unix", ts.sock)
		c.connect("", false)
		c.request(request{typ: cmdRead, cookie: 1, length: 4096}, nil)
		<-stuck
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, ts.s.Shutdown(ctx), context.DeadlineExceeded)
		c.expectClosed()
		close(release)
		ts.waitIdle(t)
	})

	t.Run("before serve", func(t *testing.T) {
		dev, _ := newVolume(4096, 0, volume.Options{})
		s, err := NewServer(ServerConfig{Exports: []Export{{Device: dev}}})
		require.NoError(t, err)
		require.NoError(t, s.Shutdown(context.Background()))
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		require.NoError(t, s.Serve(l))
		_, err = net.Dial("tcp", l.Addr().String())
		require.Error(t, err, "Serve closes its listener")
	})
}

// TestLargeWriteStreams pipelines large WRITEs of one length (which the reader reads ahead of
// their headers, see readHeader) among requests that break the pattern: other lengths, a READ, a
// refused WRITE whose payload must be skipped, a FLUSH, a header that arrives in pieces. Each must
// be answered and each payload land where its header says, over both kinds of socket.
func TestLargeWriteStreams(t *testing.T) {
	const size = 5 << 20
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			dev, mem := newVolume(size, 0, volume.Options{})
			ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}})
			addr := ts.sock
			if network == "tcp" {
				addr = ts.tcp
			}
			c := dialRaw(t, network, addr)
			c.connect("", false)

			rng := rand.New(rand.NewPCG(5, 7))
			want := make([]byte, size)
			type step struct {
				r     request
				errno uint32
			}
			var steps []step
			var stream []byte
			add := func(r request, errno uint32) {
				r.cookie = uint64(len(steps) + 1)
				var h [requestSize]byte
				putRequest(h[:], r)
				stream = append(stream, h[:]...)
				if r.typ == cmdWrite {
					p := make([]byte, r.length)
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					stream = append(stream, p...)
					if errno == 0 {
						copy(want[r.offset:], p)
					}
				}
				if r.typ == cmdRead {
					c.reads[r.cookie] = r.length
				}
				steps = append(steps, step{r, errno})
			}
			w := func(off uint64, n uint32) { add(request{typ: cmdWrite, offset: off, length: n}, 0) }
			w(0, 64<<10)
			w(64<<10, 64<<10)
			w(128<<10, 64<<10)
			add(request{typ: cmdRead, offset: 4 << 20, length: 64 << 10}, 0) // a read among the writes
			w(192<<10, 64<<10)
			w(256<<10, 32<<10)  // shorter than expected
			w(288<<10, 128<<10) // longer
			w(416<<10, 128<<10)
			add(request{typ: cmdWrite, offset: size - 4096, length: 128 << 10}, errNoSpc) // refused: skip its payload
			w(544<<10, 128<<10)
			add(request{typ: cmdFlush}, 0)
			w(672<<10, 4096) // small, through br
			w(676<<10, 128<<10)
			w(1<<20, 1<<20)
			w(2<<20, 1<<20)
			first := len(stream)
			w(3<<20, 1<<20) // sent in pieces: its header split, then its payload
			add(request{typ: cmdRead, offset: 4<<20 + 4096, length: 4096}, 0)

			sent := make(chan error, 1)
			go func() {
				_, err := c.nc.Write(stream[:first])
				for _, cut := range []int{first + 5, first + requestSize - 3, first + requestSize + 1000, len(stream)} {
					if err != nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
					_, err = c.nc.Write(stream[first:cut])
					first = cut
				}
				sent <- err
			}()
			for range steps {
				got := c.reply()
				require.NotZero(t, got.cookie)
				require.LessOrEqual(t, got.cookie, uint64(len(steps)))
				s := steps[got.cookie-1]
				require.Equal(t, s.errno, got.errno, "request %d (%+v)", got.cookie, s.r)
				if s.r.typ == cmdRead {
					require.True(t, bytes.Equal(want[s.r.offset:s.r.offset+uint64(s.r.length)], got.data), "read %d", got.cookie)
				}
			}
			require.NoError(t, <-sent)
			require.True(t, bytes.Equal(want, mem.snapshot()), "device content")
			c.request(request{typ: cmdDisc}, nil)
			c.expectClosed()
		})
	}
}

// asyncDevice starts the reads of the upper half of a volume asynchronously, holding each until
// the test releases it; the read at failAt fails. The other reads are left to ReadAt.
type asyncDevice struct {
	volume.Device
	release      chan struct{}
	failAt       int64
	active, peak atomic.Int32
	started      atomic.Int32
}

func (d *asyncDevice) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	if off < 1<<19 {
		return false
	}
	n := d.active.Add(1)
	for p := d.peak.Load(); n > p && !d.peak.CompareAndSwap(p, n); p = d.peak.Load() {
	}
	d.started.Add(1)
	go func() {
		<-d.release
		err := d.Device.ReadAt(p, off)
		if off == d.failAt {
			err = syscall.EIO
		}
		d.active.Add(-1)
		done(err)
	}()
	return true
}

// TestAsyncReadsPipelined: asynchronous reads that end at once, batch after batch of them, are
// each answered once, with their data or their error, whether the reader answers them (while it
// looks again at an empty socket) or a replier goroutine does.
func TestAsyncReadsPipelined(t *testing.T) {
	const batch, rounds = 32, 64
	vol, _ := newVolume(1<<20, 0x33, volume.Options{})
	dev := &asyncDevice{Device: vol, release: make(chan struct{}), failAt: 1<<19 + 4096}
	close(dev.release)
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}, MaxInFlight: batch})
	c := dialRaw(t, "unix", ts.sock)
	c.connect("", true)
	for r := range uint64(rounds) {
		for i := range uint64(batch) {
			c.request(request{typ: cmdRead, cookie: r*batch + i, offset: 1<<19 + 4096*i, length: 4096}, nil)
		}
		seen := map[uint64]bool{}
		for range batch {
			rep := c.reply()
			require.False(t, seen[rep.cookie], "cookie %d answered twice", rep.cookie)
			seen[rep.cookie] = true
			require.Equal(t, r, rep.cookie/batch, "a reply from this round")
			if rep.cookie%batch == 1 { // offset failAt
				require.Equal(t, errIO, rep.errno)
			} else {
				require.Zero(t, rep.errno, "cookie %d", rep.cookie)
				require.Equal(t, bytes.Repeat([]byte{0x33}, 4096), rep.data)
			}
		}
	}
	require.Equal(t, int32(batch*rounds), dev.started.Load())
}

// TestAsyncReads: reads a device starts asynchronously (backend.AsyncReader, an SSD-tier hit on
// io_uring) leave the reader free for the next requests, count against MaxInFlight until they
// end, are answered with their data or their error, and are all answered before a connection
// that sent NBD_CMD_DISC closes.
func TestAsyncReads(t *testing.T) {
	const maxInFlight = 4
	vol, _ := newVolume(1<<20, 0x22, volume.Options{})
	dev := &asyncDevice{Device: vol, release: make(chan struct{}), failAt: 1<<19 + 3*4096}
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}, MaxInFlight: maxInFlight})
	c := dialRaw(t, "unix", ts.sock)
	c.connect("", true)

	// Three held asynchronous reads, then synchronous ones: those are answered meanwhile.
	for i := range uint64(3) {
		c.request(request{typ: cmdRead, cookie: 100 + i, offset: 1<<19 + 4096*(i+1), length: 4096}, nil)
	}
	for i := range uint64(5) {
		c.request(request{typ: cmdRead, cookie: 10 + i, offset: 4096 * i, length: 4096}, nil)
		r := c.reply()
		require.Equal(t, 10+i, r.cookie, "a read behind asynchronous ones that have not ended")
		require.Equal(t, bytes.Repeat([]byte{0x22}, 4096), r.data)
	}
	// More than MaxInFlight in all: the reader waits for a slot rather than start them.
	for i := range uint64(6) {
		c.request(request{typ: cmdRead, cookie: 200 + i, offset: 1<<19 + 4096*(i+10), length: 4096}, nil)
	}
	c.request(request{typ: cmdDisc}, nil)
	require.Eventually(t, func() bool { return dev.started.Load() == maxInFlight }, 5*time.Second, time.Millisecond)
	close(dev.release)
	seen := map[uint64]bool{}
	for range 9 {
		r := c.reply()
		if r.cookie == 102 { // offset failAt
			require.Equal(t, errIO, r.errno, "the failed asynchronous read")
		} else {
			require.Zero(t, r.errno, "cookie %d", r.cookie)
			require.Equal(t, bytes.Repeat([]byte{0x22}, 4096), r.data)
		}
		seen[r.cookie] = true
	}
	require.Len(t, seen, 9, "every read answered before the connection closed")
	c.expectClosed()
	require.LessOrEqual(t, dev.peak.Load(), int32(maxInFlight))
	require.Equal(t, int32(9), dev.started.Load())
}

// TestMaxConnections: connections past MaxConnections are closed as they arrive, and one is taken
// again once another has gone.
func TestMaxConnections(t *testing.T) {
	dev, _ := newVolume(4096, 0, volume.Options{})
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}, MaxConnections: 2, Logger: slog.New(slog.DiscardHandler)})
	a, b := dialRaw(t, "unix", ts.sock), dialRaw(t, "unix", ts.sock)
	a.connect("", false)
	b.connect("", false)
	extra := dialRaw(t, "unix", ts.sock)
	extra.expectClosed()
	a.request(request{typ: cmdDisc}, nil)
	a.expectClosed()
	require.Eventually(t, func() bool {
		c := dialRaw(t, "unix", ts.sock)
		defer c.nc.Close()
		c.nc.SetReadDeadline(time.Now().Add(time.Second))
		var greeting [18]byte
		_, err := io.ReadFull(c.nc, greeting[:])
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "a connection is served again once one has gone")
	b.request(request{typ: cmdFlush, cookie: 1}, nil)
	require.Equal(t, reply{cookie: 1}, b.reply())
}
