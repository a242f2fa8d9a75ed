package server

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
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/volume"
)

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

type testServer struct {
	*nbdtest.Addrs
	s *Server
}

// startServer serves cfg on a unix socket and a TCP port until the test ends, then checks that
// Shutdown is clean and both Serve calls return nil.
func startServer(t *testing.T, cfg Config) *testServer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = nbdtest.Logger(t, slog.LevelWarn)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	return serve(t, s)
}

// serve serves s until the test ends.
func serve(t *testing.T, s *Server) *testServer {
	t.Helper()
	return &testServer{Addrs: nbdtest.Serve(t, s), s: s}
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

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func TestNewServerRejectsBadConfig(t *testing.T) {
	dev, _ := nbdtest.NewVolume(4096, 0, volume.Options{})
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no exports", Config{}, "no exports"},
		{"duplicate", Config{Exports: []Export{{Name: "a", Device: dev}, {Name: "a", Device: dev}}}, "used twice"},
		{"no device", Config{Exports: []Export{{Name: "a"}}}, "no device"},
		{"empty name not first", Config{Exports: []Export{{Name: "a", Device: dev}, {Device: dev}}}, "empty name"},
		{"long name", Config{Exports: []Export{{Name: strings.Repeat("x", 5000), Device: dev}}}, "longer than"},
		{"negative in-flight", Config{Exports: []Export{{Device: dev}}, MaxInFlight: -1}, "negative"},
		{"TLS without its configuration", Config{Exports: []Export{{Device: dev}}, TLS: TLS{Mode: tlsconf.Require}}, "TLS mode require without a TLS configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestNegotiation(t *testing.T) {
	dev, _ := nbdtest.NewVolume(1<<20, 0, volume.Options{MultiConn: true})
	ts := startServer(t, Config{Exports: []Export{
		{Name: "disk", Description: "a disk", Device: dev},
		{Name: "other", Device: dev},
	}})

	t.Run("list", func(t *testing.T) {
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Greet()
		c.Option(proto.OptList, nil)
		var names []string
		for {
			typ, data := c.OptReply(proto.OptList)
			if typ == proto.RepAck {
				break
			}
			require.Equal(t, proto.RepServer, typ)
			n := binary.BigEndian.Uint32(data)
			names = append(names, string(data[4:4+n])+"|"+string(data[4+n:]))
		}
		require.Equal(t, []string{"disk|a disk", "other|"}, names)
		c.Option(proto.OptAbort, nil)
		typ, _ := c.OptReply(proto.OptAbort)
		require.Equal(t, proto.RepAck, typ)
		c.ExpectClosed()
	})

	t.Run("info then go on the default export", func(t *testing.T) {
		c := nbdtest.DialRaw(t, "tcp", ts.TCP)
		c.Greet()
		c.Option(proto.OptInfo, proto.AppendInfoRequest(nil, "", proto.InfoName, proto.InfoDescription, 999))
		infos, final := c.Infos(proto.OptInfo)
		require.Equal(t, proto.RepAck, final)
		require.Equal(t, "disk", string(infos[proto.InfoName]))
		require.Equal(t, "a disk", string(infos[proto.InfoDescription]))
		bs := infos[proto.InfoBlockSize]
		require.Len(t, bs, 12, "block sizes are sent even when not asked for")
		require.Equal(t, []uint32{1, 4096, 32 << 20},
			[]uint32{binary.BigEndian.Uint32(bs), binary.BigEndian.Uint32(bs[4:]), binary.BigEndian.Uint32(bs[8:])})
		size, flags := c.GoExport("")
		require.EqualValues(t, 1<<20, size)
		require.Equal(t, proto.FlagHasFlags|proto.FlagSendFlush|proto.FlagSendFUA|proto.FlagSendTrim|proto.FlagSendWriteZeroes|
			proto.FlagSendFastZero|proto.FlagCanMultiConn|proto.FlagSendCache, flags)
	})

	t.Run("export name with zeroes", func(t *testing.T) {
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Recv(18)
		c.Send(be32(proto.ClientFlagFixedNewstyle))
		c.Option(proto.OptStructuredReply, nil)
		typ, _ := c.OptReply(proto.OptStructuredReply)
		require.Equal(t, proto.RepAck, typ)
		c.Structured = true
		c.Option(proto.OptExportName, []byte("other"))
		b := c.Recv(proto.ExportNameReplySize + proto.ExportNamePadding)
		require.EqualValues(t, 1<<20, binary.BigEndian.Uint64(b))
		require.NotZero(t, binary.BigEndian.Uint16(b[8:])&proto.FlagSendDF, "DF with structured replies")
		require.Equal(t, make([]byte, proto.ExportNamePadding), b[proto.ExportNameReplySize:])
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 7, Offset: 4096, Length: 512}, nil)
		r := c.Reply()
		require.Equal(t, nbdtest.Reply{Cookie: 7, Data: make([]byte, 512), Chunks: []uint16{proto.ReplyTypeOffsetData}}, r)
	})
}

func TestTransmission(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			dev, mem := nbdtest.NewVolume(1<<20, 0x5a, volume.Options{})
			ts := startServer(t, Config{Exports: []Export{
				{Name: "disk", Device: dev},
				{Name: "plain", Device: volume.New(nbdtest.Plain{Backend: nbdtest.NewMem(1<<20, 0x5a)}, volume.Options{})},
			}})
			c := nbdtest.DialRaw(t, "unix", ts.Sock)
			c.Connect("disk", structured)
			payload := bytes.Repeat([]byte{0xab}, 8192)
			cookie := uint64(100)
			do := func(r proto.Request, data []byte) nbdtest.Reply {
				t.Helper()
				cookie++
				r.Cookie = cookie
				c.Request(r, data)
				got := c.Reply()
				require.Equal(t, cookie, got.Cookie)
				return got
			}

			require.Zero(t, do(proto.Request{Type: proto.CmdWrite, Offset: 4096, Length: 8192}, payload).Errno)
			require.Zero(t, do(proto.Request{Type: proto.CmdWrite, Flags: proto.CmdFlagFUA, Offset: 65536, Length: 8192}, payload).Errno)
			r := do(proto.Request{Type: proto.CmdRead, Offset: 4096, Length: 8192}, nil)
			require.Zero(t, r.Errno)
			require.Equal(t, payload, r.Data)
			require.Zero(t, do(proto.Request{Type: proto.CmdTrim, Offset: 4096, Length: 4096}, nil).Errno)
			require.Zero(t, do(proto.Request{Type: proto.CmdWriteZeroes, Flags: proto.CmdFlagNoHole, Offset: 8192, Length: 4096}, nil).Errno)
			require.Zero(t, do(proto.Request{Type: proto.CmdWriteZeroes, Flags: proto.CmdFlagFastZero | proto.CmdFlagFUA, Offset: 0, Length: 4096}, nil).Errno)
			require.Zero(t, do(proto.Request{Type: proto.CmdFlush}, nil).Errno)
			require.Zero(t, do(proto.Request{Type: proto.CmdCache, Offset: 0, Length: 1 << 20}, nil).Errno)
			r = do(proto.Request{Type: proto.CmdRead, Offset: 0, Length: 0}, nil)
			require.Zero(t, r.Errno)
			require.Empty(t, r.Data)
			if structured {
				require.Equal(t, []uint16{proto.ReplyTypeNone}, r.Chunks, "an empty read is one NONE chunk")
				r = do(proto.Request{Type: proto.CmdRead, Flags: proto.CmdFlagDF, Offset: 0, Length: 1 << 20}, nil)
				require.Equal(t, []uint16{proto.ReplyTypeOffsetData}, r.Chunks, "DF: one data chunk")
			}

			want := bytes.Repeat([]byte{0x5a}, 1<<20)
			clear(want[:4096*3])
			copy(want[65536:], payload)
			require.True(t, bytes.Equal(want, mem.Snapshot()), "device content")

			// A fast zero on a backend that cannot zero fast: the flag is not advertised.
			p := nbdtest.DialRaw(t, "tcp", ts.TCP)
			_, flags := p.Connect("plain", structured)
			require.Zero(t, flags&proto.FlagSendFastZero)
			require.Zero(t, flags&proto.FlagSendTrim)
			p.Request(proto.Request{Type: proto.CmdWriteZeroes, Flags: proto.CmdFlagFastZero, Cookie: 1, Length: 4096}, nil)
			require.Equal(t, proto.ErrnoInval, p.Reply().Errno)
			p.Request(proto.Request{Type: proto.CmdWriteZeroes, Cookie: 2, Length: 4096}, nil)
			require.Zero(t, p.Reply().Errno, "zeroes emulated with writes")
			p.Request(proto.Request{Type: proto.CmdDisc}, nil)
			p.ExpectClosed()

			c.Request(proto.Request{Type: proto.CmdDisc}, nil)
			c.ExpectClosed()
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
		{"read out of range", fmt.Errorf("x: %w", volume.ErrOutOfRange), proto.CmdRead, proto.ErrnoInval},
		{"cache out of range", volume.ErrOutOfRange, proto.CmdCache, proto.ErrnoInval},
		{"trim out of range", volume.ErrOutOfRange, proto.CmdTrim, proto.ErrnoInval},
		{"write out of range", volume.ErrOutOfRange, proto.CmdWrite, proto.ErrnoNoSpc},
		{"zeroes out of range", volume.ErrOutOfRange, proto.CmdWriteZeroes, proto.ErrnoNoSpc},
		{"read-only", volume.ErrReadOnly, proto.CmdWrite, proto.ErrnoPerm},
		{"not supported", volume.ErrNotSupported, proto.CmdWriteZeroes, proto.ErrnoNotSup},
		{"invalid", volume.ErrInvalid, proto.CmdRead, proto.ErrnoInval},
		{"disk full", &os.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC}, proto.CmdWrite, proto.ErrnoNoSpc},
		{"quota", syscall.EDQUOT, proto.CmdWrite, proto.ErrnoNoSpc},
		{"other", errors.New("disk on fire"), proto.CmdFlush, proto.ErrnoIO},
		{"other on read", fmt.Errorf("read /srv/disk.img: %w", syscall.EIO), proto.CmdRead, proto.ErrnoIO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, _ := nbdtest.NewVolume(1<<20, 0, volume.Options{})
			ts := startServer(t, Config{
				Exports: []Export{{Device: errDevice{Device: dev, err: tc.err}}},
				Logger:  slog.New(slog.DiscardHandler),
			})
			for _, structured := range []bool{false, true} {
				c := nbdtest.DialRaw(t, "unix", ts.Sock)
				c.Connect("", structured)
				var payload []byte
				r := proto.Request{Type: tc.cmd, Cookie: 9, Length: 4096}
				if tc.cmd == proto.CmdWrite {
					payload = make([]byte, 4096)
				}
				if tc.cmd == proto.CmdFlush {
					r.Length = 0
				}
				c.Request(r, payload)
				got := c.Reply()
				require.Equal(t, tc.want, got.Errno)
				require.Empty(t, got.Data)
				if structured {
					require.Equal(t, []uint16{proto.ReplyTypeError}, got.Chunks)
					require.Equal(t, deviceErrorMessages[tc.want], got.Msg)
					require.NotContains(t, got.Msg, tc.err.Error(), "the device's own error stays in the log")
					require.NotContains(t, got.Msg, "/srv", "no path of the server's")
				}
			}
		})
	}
}

// TestBadInput sends what a broken or hostile client might, and checks that the server answers
// with an error or closes that connection, writes nothing, and keeps serving others.
func TestBadInput(t *testing.T) {
	const size = 1 << 20
	dev, mem := nbdtest.NewVolume(size, 0x5a, volume.Options{})
	ts := startServer(t, Config{
		Exports: []Export{{Name: "disk", Device: dev}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	initial := mem.Snapshot()
	// transmission starts a connection in the transmission phase.
	transmission := func(structured bool, f func(*nbdtest.RawClient)) func(*nbdtest.RawClient) {
		return func(c *nbdtest.RawClient) {
			c.Connect("disk", structured)
			f(c)
		}
	}
	expectErr := func(r proto.Request, payload []byte, errno uint32) func(*nbdtest.RawClient) {
		return func(c *nbdtest.RawClient) {
			c.Request(r, payload)
			got := c.Reply()
			require.Equal(c.T, r.Cookie, got.Cookie)
			require.Equal(c.T, errno, got.Errno)
			require.Empty(c.T, got.Data)
			// The connection is still in step: a good request after the bad one works.
			c.Request(proto.Request{Type: proto.CmdRead, Cookie: 2, Offset: 0, Length: 4096}, nil)
			got = c.Reply()
			require.Zero(c.T, got.Errno)
			require.Equal(c.T, initial[:4096], got.Data)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(*nbdtest.RawClient)
	}{
		{"garbage instead of client flags", func(c *nbdtest.RawClient) {
			c.Recv(18)
			c.Send([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
			c.ExpectClosed()
		}},
		{"unknown client flags", func(c *nbdtest.RawClient) {
			c.Recv(18)
			c.Send(be32(proto.ClientFlagFixedNewstyle | 1<<7))
			c.ExpectClosed()
		}},
		{"garbage option magic", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Send(bytes.Repeat([]byte{0xff}, 64))
			c.ExpectClosed()
		}},
		{"oversized option length", func(c *nbdtest.RawClient) {
			c.Greet()
			var h [proto.OptionHeaderSize]byte
			proto.PutOptionHeader(h[:], proto.OptGo, 1<<31)
			c.Send(h[:])
			c.ExpectClosed()
		}},
		{"unknown options then go", func(c *nbdtest.RawClient) {
			c.Greet()
			for _, opt := range []uint32{proto.OptListMetaContext, proto.OptSetMetaContext, 11, 4, 0, 12345, 1 << 31} {
				c.Option(opt, []byte("some data"))
				typ, _ := c.OptReply(opt)
				require.Equal(c.T, proto.RepErrUnsup, typ)
			}
			c.Option(proto.OptGo, proto.AppendInfoRequest(nil, "disk"))
			_, final := c.Infos(proto.OptGo)
			require.Equal(c.T, proto.RepAck, final)
		}},
		{"malformed info requests", func(c *nbdtest.RawClient) {
			c.Greet()
			bad := [][]byte{
				nil,
				{0, 0, 0, 9, 'd', 'i', 's', 'k', 0, 0}, // name longer than the data
				append(proto.AppendInfoRequest(nil, "disk", 1), 0), // odd trailing byte
				proto.AppendInfoRequest(nil, "disk", 1)[:9],        // count says one, none follows
			}
			for _, data := range bad {
				c.Option(proto.OptInfo, data)
				_, final := c.Infos(proto.OptInfo)
				require.Equal(c.T, proto.RepErrInvalid, final)
			}
			c.Option(proto.OptList, []byte("x"))
			typ, _ := c.OptReply(proto.OptList)
			require.Equal(c.T, proto.RepErrInvalid, typ)
			c.Option(proto.OptStructuredReply, []byte("x"))
			typ, _ = c.OptReply(proto.OptStructuredReply)
			require.Equal(c.T, proto.RepErrInvalid, typ)
		}},
		{"unknown export with go, then the right one", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Option(proto.OptGo, proto.AppendInfoRequest(nil, "nope", proto.InfoBlockSize))
			infos, final := c.Infos(proto.OptGo)
			require.Equal(c.T, proto.RepErrUnknown, final)
			require.Empty(c.T, infos)
			c.Option(proto.OptGo, proto.AppendInfoRequest(nil, "disk"))
			_, final = c.Infos(proto.OptGo)
			require.Equal(c.T, proto.RepAck, final)
		}},
		{"unknown export with export name", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Option(proto.OptExportName, []byte("nope"))
			c.ExpectClosed()
		}},
		{"read past the end", transmission(false, expectErr(proto.Request{Type: proto.CmdRead, Cookie: 1, Offset: size - 512, Length: 4096}, nil, proto.ErrnoInval))},
		{"read at a huge offset", transmission(true, expectErr(proto.Request{Type: proto.CmdRead, Cookie: 1, Offset: 1 << 63, Length: 4096}, nil, proto.ErrnoInval))},
		{"write past the end", transmission(false, expectErr(proto.Request{Type: proto.CmdWrite, Cookie: 1, Offset: size - 512, Length: 4096}, make([]byte, 4096), proto.ErrnoNoSpc))},
		{"zeroes past the end", transmission(true, expectErr(proto.Request{Type: proto.CmdWriteZeroes, Cookie: 1, Offset: size, Length: 1}, nil, proto.ErrnoNoSpc))},
		{"trim past the end", transmission(false, expectErr(proto.Request{Type: proto.CmdTrim, Cookie: 1, Offset: ^uint64(0), Length: 1}, nil, proto.ErrnoInval))},
		{"cache past the end", transmission(false, expectErr(proto.Request{Type: proto.CmdCache, Cookie: 1, Offset: size, Length: 1}, nil, proto.ErrnoInval))},
		{"read over the maximum", transmission(true, expectErr(proto.Request{Type: proto.CmdRead, Cookie: 1, Length: 32<<20 + 1}, nil, proto.ErrnoOverflow))},
		{"write over the maximum", transmission(false, expectErr(proto.Request{Type: proto.CmdWrite, Cookie: 1, Length: 33 << 20}, make([]byte, 33<<20), proto.ErrnoOverflow))},
		{"cache over the maximum", transmission(false, expectErr(proto.Request{Type: proto.CmdCache, Cookie: 1, Length: 32<<20 + 4096}, nil, proto.ErrnoOverflow))},
		{"write over the hard cap", transmission(false, func(c *nbdtest.RawClient) {
			c.Request(proto.Request{Type: proto.CmdWrite, Cookie: 1, Length: 1 << 31}, nil)
			c.ExpectClosed()
		})},
		{"unknown command", transmission(true, expectErr(proto.Request{Type: 42, Cookie: 1, Length: 4096}, nil, proto.ErrnoInval))},
		{"block status", transmission(true, expectErr(proto.Request{Type: proto.CmdBlockStatus, Cookie: 1, Length: 4096}, nil, proto.ErrnoInval))},
		{"unknown flag", transmission(false, expectErr(proto.Request{Type: proto.CmdRead, Flags: 1 << 9, Cookie: 1, Length: 4096}, nil, proto.ErrnoInval))},
		{"DF without structured replies", transmission(false, expectErr(proto.Request{Type: proto.CmdRead, Flags: proto.CmdFlagDF, Cookie: 1, Length: 4096}, nil, proto.ErrnoInval))},
		{"no-hole on a write", transmission(false, expectErr(proto.Request{Type: proto.CmdWrite, Flags: proto.CmdFlagNoHole, Cookie: 1, Length: 4096}, make([]byte, 4096), proto.ErrnoInval))},
		{"bad request magic", transmission(false, func(c *nbdtest.RawClient) {
			c.Send(bytes.Repeat([]byte{0x25}, proto.RequestSize))
			c.ExpectClosed()
		})},
		{"client gone mid-payload", transmission(false, func(c *nbdtest.RawClient) {
			var h [proto.RequestSize]byte
			proto.PutRequest(h[:], proto.Request{Type: proto.CmdWrite, Cookie: 1, Length: 65536})
			c.Send(h[:], make([]byte, 1000))
		})},
		{"client gone mid-reply", transmission(true, func(c *nbdtest.RawClient) {
			for i := range 32 {
				c.Request(proto.Request{Type: proto.CmdRead, Cookie: uint64(i), Length: size}, nil)
			}
			c.Recv(100)
		})},
		{"client gone mid-handshake", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Send([]byte("IHAVEOPT"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := nbdtest.DialRaw(t, "unix", ts.Sock)
			tc.run(c)
			c.NC.Close()

			h := nbdtest.DialRaw(t, "tcp", ts.TCP)
			h.Connect("disk", true)
			h.Request(proto.Request{Type: proto.CmdRead, Cookie: 1, Length: size}, nil)
			require.True(t, bytes.Equal(initial, h.Reply().Data), "a second connection reads the data unchanged")
			require.True(t, bytes.Equal(initial, mem.Snapshot()), "nothing was written")
			h.Request(proto.Request{Type: proto.CmdDisc}, nil)
			h.ExpectClosed()
		})
	}
	ts.waitIdle(t)
}

func TestSilentClientTimesOut(t *testing.T) {
	dev, _ := nbdtest.NewVolume(4096, 0, volume.Options{})
	s, err := New(Config{Exports: []Export{{Device: dev}}, Logger: nbdtest.Logger(t, slog.LevelWarn)})
	require.NoError(t, err)
	s.handshakeTimeout = 50 * time.Millisecond
	ts := serve(t, s)
	for _, tc := range []struct {
		name string
		run  func(*nbdtest.RawClient)
	}{
		{"before the client flags", func(c *nbdtest.RawClient) { c.Recv(18) }},
		{"between options", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Option(proto.OptList, nil)
			for typ := uint32(0); typ != proto.RepAck; typ, _ = c.OptReply(proto.OptList) {
			}
		}},
		{"inside an option", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Send([]byte("IHAVEOPT"))
		}},
		{"options that trickle in", func(c *nbdtest.RawClient) {
			c.Greet()
			var h [proto.OptionHeaderSize]byte
			proto.PutOptionHeader(h[:], proto.OptList, 0)
			for range 16 { // four times the timeout in all, each option well within it
				time.Sleep(s.handshakeTimeout / 4)
				if _, err := c.NC.Write(h[:]); err != nil {
					return // closed: the deadline is the whole handshake's
				}
			}
			c.T.Error("the server took options for four times its handshake timeout")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := nbdtest.DialRaw(t, "unix", ts.Sock)
			tc.run(c)
			c.ExpectClosed()
		})
	}
	// Once in transmission, an idle client is left alone.
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", false)
	time.Sleep(4 * s.handshakeTimeout)
	c.Request(proto.Request{Type: proto.CmdFlush, Cookie: 1}, nil)
	require.Equal(t, nbdtest.Reply{Cookie: 1}, c.Reply())
}

// TestRepliesOutOfOrder: a read stuck in the device does not hold back the others on the same
// connection, and no more than MaxInFlight requests reach the device at once.
func TestRepliesOutOfOrder(t *testing.T) {
	const maxInFlight = 3
	vol, _ := nbdtest.NewVolume(1<<20, 0x11, volume.Options{})
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
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxInFlight: maxInFlight})
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", true)

	readsPastStuck(t, c, stuck, 10, "fast reads are answered while the slow one waits")
	// Flood the connection with reads that all block: the server must not run more than
	// maxInFlight of them at once.
	for i := range uint64(20) {
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 100 + i, Offset: 1<<19 + 4096*i, Length: 4096}, nil)
	}
	close(release)
	seen := map[uint64]bool{}
	for range 21 {
		r := c.Reply()
		require.Zero(t, r.Errno)
		require.Equal(t, bytes.Repeat([]byte{0x11}, 4096), r.Data)
		seen[r.Cookie] = true
	}
	require.Len(t, seen, 21)
	require.True(t, seen[1])
	require.LessOrEqual(t, peak.Load(), int32(maxInFlight))
}

// readsPastStuck sends a read of offset 0 (cookie 1), which the device holds until the test
// releases it, and once stuck is closed, n reads of other blocks, each of which must be answered
// while the first still waits.
func readsPastStuck(t *testing.T, c *nbdtest.RawClient, stuck <-chan struct{}, n uint64, msg string) {
	t.Helper()
	c.Request(proto.Request{Type: proto.CmdRead, Cookie: 1, Offset: 0, Length: 4096}, nil)
	<-stuck
	for i := range n {
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 10 + i, Offset: 4096 * (1 + i), Length: 4096}, nil)
		require.Equal(t, 10+i, c.Reply().Cookie, msg)
	}
}

// TestWatchdogHoldingAP: with Ps to spare the watchdog sleeps in a raw system call, holding its
// P; it must still rescue a stuck reader, and a garbage collection (which stops the world, so
// must stop the watchdog too) must still complete while it runs.
func TestWatchdogHoldingAP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(minProcsToHoldOne))
	vol, _ := nbdtest.NewVolume(1<<20, 0x22, volume.Options{})
	release := make(chan struct{})
	stuck := make(chan struct{})
	dev := &hookDevice{Device: vol, onRead: func(off int64) {
		if off == 0 {
			close(stuck)
			<-release
		}
	}}
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}})
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", true)

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
	require.Equal(t, uint64(1), c.Reply().Cookie)
}

// TestFlushWaitsForEarlierWrites: a FLUSH reaches the device only after the writes received before
// it completed, while writes received after it do not wait for it.
func TestFlushWaitsForEarlierWrites(t *testing.T) {
	vol, mem := nbdtest.NewVolume(1<<20, 0, volume.Options{})
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
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}})
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", false)

	block := bytes.Repeat([]byte{0xee}, 4096)
	c.Request(proto.Request{Type: proto.CmdWrite, Cookie: 1, Offset: 0, Length: 4096}, block)
	<-stuck
	c.Request(proto.Request{Type: proto.CmdFlush, Cookie: 2}, nil)
	c.Request(proto.Request{Type: proto.CmdWrite, Cookie: 3, Offset: 8192, Length: 4096}, block)
	require.Equal(t, uint64(3), c.Reply().Cookie, "a write after the flush is not held back")
	c.Request(proto.Request{Type: proto.CmdRead, Cookie: 4, Offset: 8192, Length: 4096}, nil)
	require.Equal(t, nbdtest.Reply{Cookie: 4, Data: block}, c.Reply())
	require.Zero(t, flushes.Load(), "flush ran while an earlier write was still in flight")

	close(release)
	// The write's worker marks it complete before it replies, so the flush's reply may overtake
	// the write's: NBD lets replies come in any order, and the write was on the device first.
	require.ElementsMatch(t, []uint64{1, 2}, []uint64{c.Reply().Cookie, c.Reply().Cookie})
	require.EqualValues(t, 1, flushes.Load())
	require.Zero(t, writingAtFlush.Load())
	require.Equal(t, block, mem.Snapshot()[:4096])
}

func TestReadOnlyExport(t *testing.T) {
	dev, mem := nbdtest.NewVolume(1<<20, 0x77, volume.Options{ReadOnly: true})
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, Logger: slog.New(slog.DiscardHandler)})
	initial := mem.Snapshot()
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	_, flags := c.Connect("", true)
	require.Equal(t, proto.FlagHasFlags|proto.FlagReadOnly|proto.FlagSendFlush|proto.FlagSendCache|proto.FlagSendDF, flags)
	for i, r := range []proto.Request{
		{Type: proto.CmdWrite, Length: 4096},
		{Type: proto.CmdTrim, Length: 4096},
		{Type: proto.CmdWriteZeroes, Length: 4096},
		{Type: proto.CmdWriteZeroes, Flags: proto.CmdFlagNoHole, Offset: 1 << 30, Length: 4096},
	} {
		r.Cookie = uint64(i)
		var payload []byte
		if r.Type == proto.CmdWrite {
			payload = make([]byte, r.Length)
		}
		c.Request(r, payload)
		got := c.Reply()
		require.Equal(t, proto.ErrnoPerm, got.Errno, "command %d", r.Type)
		require.Equal(t, []uint16{proto.ReplyTypeError}, got.Chunks)
	}
	c.Request(proto.Request{Type: proto.CmdFlush, Cookie: 10}, nil)
	require.Zero(t, c.Reply().Errno)
	c.Request(proto.Request{Type: proto.CmdRead, Cookie: 11, Length: 4096}, nil)
	require.Equal(t, initial[:4096], c.Reply().Data)
	require.True(t, bytes.Equal(initial, mem.Snapshot()))
}

func TestShutdown(t *testing.T) {
	t.Run("in-flight requests finish", func(t *testing.T) {
		vol, _ := nbdtest.NewVolume(1<<20, 0x33, volume.Options{})
		release, stuck := make(chan struct{}), make(chan struct{})
		dev := &hookDevice{Device: vol, onRead: func(int64) { close(stuck); <-release }}
		ts := startServer(t, Config{Exports: []Export{{Device: dev}}})
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Connect("", false)
		idle := nbdtest.DialRaw(t, "tcp", ts.TCP)
		idle.Connect("", true)
		shaking := nbdtest.DialRaw(t, "unix", ts.Sock)
		shaking.Greet()

		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 1, Length: 4096}, nil)
		<-stuck
		done := make(chan error, 1)
		go func() { done <- ts.s.Shutdown(context.Background()) }()
		shaking.ExpectClosed()
		idle.ExpectClosed()
		require.Eventually(t, func() bool {
			nc, err := net.Dial("unix", ts.Sock)
			if err == nil {
				nc.Close()
			}
			return err != nil
		}, 10*time.Second, time.Millisecond, "listener still accepting")

		close(release)
		require.Equal(t, nbdtest.Reply{Cookie: 1, Data: bytes.Repeat([]byte{0x33}, 4096)}, c.Reply())
		c.ExpectClosed()
		require.NoError(t, <-done)
	})

	t.Run("context ends first", func(t *testing.T) {
		vol, _ := nbdtest.NewVolume(1<<20, 0, volume.Options{})
		release, stuck := make(chan struct{}), make(chan struct{})
		dev := &hookDevice{Device: vol, onRead: func(int64) { close(stuck); <-release }}
		ts := startServer(t, Config{Exports: []Export{{Device: dev}}})
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Connect("", false)
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 1, Length: 4096}, nil)
		<-stuck
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, ts.s.Shutdown(ctx), context.DeadlineExceeded)
		c.ExpectClosed()
		close(release)
		ts.waitIdle(t)
	})

	t.Run("before serve", func(t *testing.T) {
		dev, _ := nbdtest.NewVolume(4096, 0, volume.Options{})
		s, err := New(Config{Exports: []Export{{Device: dev}}})
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
			dev, mem := nbdtest.NewVolume(size, 0, volume.Options{})
			ts := startServer(t, Config{Exports: []Export{{Device: dev}}})
			addr := ts.Sock
			if network == "tcp" {
				addr = ts.TCP
			}
			c := nbdtest.DialRaw(t, network, addr)
			c.Connect("", false)

			rng := rand.New(rand.NewPCG(5, 7))
			want := make([]byte, size)
			type step struct {
				r     proto.Request
				errno uint32
			}
			var steps []step
			var stream []byte
			add := func(r proto.Request, errno uint32) {
				r.Cookie = uint64(len(steps) + 1)
				var h [proto.RequestSize]byte
				proto.PutRequest(h[:], r)
				stream = append(stream, h[:]...)
				if r.Type == proto.CmdWrite {
					p := make([]byte, r.Length)
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					stream = append(stream, p...)
					if errno == 0 {
						copy(want[r.Offset:], p)
					}
				}
				c.SentRead(r)
				steps = append(steps, step{r, errno})
			}
			w := func(off uint64, n uint32) { add(proto.Request{Type: proto.CmdWrite, Offset: off, Length: n}, 0) }
			w(0, 64<<10)
			w(64<<10, 64<<10)
			w(128<<10, 64<<10)
			add(proto.Request{Type: proto.CmdRead, Offset: 4 << 20, Length: 64 << 10}, 0) // a read among the writes
			w(192<<10, 64<<10)
			w(256<<10, 32<<10)  // shorter than expected
			w(288<<10, 128<<10) // longer
			w(416<<10, 128<<10)
			add(proto.Request{Type: proto.CmdWrite, Offset: size - 4096, Length: 128 << 10}, proto.ErrnoNoSpc) // refused: skip its payload
			w(544<<10, 128<<10)
			add(proto.Request{Type: proto.CmdFlush}, 0)
			w(672<<10, 4096) // small, through br
			w(676<<10, 128<<10)
			w(1<<20, 1<<20)
			w(2<<20, 1<<20)
			first := len(stream)
			w(3<<20, 1<<20) // sent in pieces: its header split, then its payload
			add(proto.Request{Type: proto.CmdRead, Offset: 4<<20 + 4096, Length: 4096}, 0)

			sent := make(chan error, 1)
			go func() {
				_, err := c.NC.Write(stream[:first])
				for _, cut := range []int{first + 5, first + proto.RequestSize - 3, first + proto.RequestSize + 1000, len(stream)} {
					if err != nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
					_, err = c.NC.Write(stream[first:cut])
					first = cut
				}
				sent <- err
			}()
			for range steps {
				got := c.Reply()
				require.NotZero(t, got.Cookie)
				require.LessOrEqual(t, got.Cookie, uint64(len(steps)))
				s := steps[got.Cookie-1]
				require.Equal(t, s.errno, got.Errno, "request %d (%+v)", got.Cookie, s.r)
				if s.r.Type == proto.CmdRead {
					require.True(t, bytes.Equal(want[s.r.Offset:s.r.Offset+uint64(s.r.Length)], got.Data), "read %d", got.Cookie)
				}
			}
			require.NoError(t, <-sent)
			require.True(t, bytes.Equal(want, mem.Snapshot()), "device content")
			c.Request(proto.Request{Type: proto.CmdDisc}, nil)
			c.ExpectClosed()
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
	vol, _ := nbdtest.NewVolume(1<<20, 0x33, volume.Options{})
	dev := &asyncDevice{Device: vol, release: make(chan struct{}), failAt: 1<<19 + 4096}
	close(dev.release)
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxInFlight: batch})
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", true)
	for r := range uint64(rounds) {
		for i := range uint64(batch) {
			c.Request(proto.Request{Type: proto.CmdRead, Cookie: r*batch + i, Offset: 1<<19 + 4096*i, Length: 4096}, nil)
		}
		seen := map[uint64]bool{}
		for range batch {
			rep := c.Reply()
			require.False(t, seen[rep.Cookie], "cookie %d answered twice", rep.Cookie)
			seen[rep.Cookie] = true
			require.Equal(t, r, rep.Cookie/batch, "a reply from this round")
			if rep.Cookie%batch == 1 { // offset failAt
				require.Equal(t, proto.ErrnoIO, rep.Errno)
			} else {
				require.Zero(t, rep.Errno, "cookie %d", rep.Cookie)
				require.Equal(t, bytes.Repeat([]byte{0x33}, 4096), rep.Data)
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
	vol, _ := nbdtest.NewVolume(1<<20, 0x22, volume.Options{})
	dev := &asyncDevice{Device: vol, release: make(chan struct{}), failAt: 1<<19 + 3*4096}
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxInFlight: maxInFlight})
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", true)

	// Three held asynchronous reads, then synchronous ones: those are answered meanwhile.
	for i := range uint64(3) {
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 100 + i, Offset: 1<<19 + 4096*(i+1), Length: 4096}, nil)
	}
	for i := range uint64(5) {
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 10 + i, Offset: 4096 * i, Length: 4096}, nil)
		r := c.Reply()
		require.Equal(t, 10+i, r.Cookie, "a read behind asynchronous ones that have not ended")
		require.Equal(t, bytes.Repeat([]byte{0x22}, 4096), r.Data)
	}
	// More than MaxInFlight in all: the reader waits for a slot rather than start them.
	for i := range uint64(6) {
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 200 + i, Offset: 1<<19 + 4096*(i+10), Length: 4096}, nil)
	}
	c.Request(proto.Request{Type: proto.CmdDisc}, nil)
	require.Eventually(t, func() bool { return dev.started.Load() == maxInFlight }, 5*time.Second, time.Millisecond)
	close(dev.release)
	seen := map[uint64]bool{}
	for range 9 {
		r := c.Reply()
		if r.Cookie == 102 { // offset failAt
			require.Equal(t, proto.ErrnoIO, r.Errno, "the failed asynchronous read")
		} else {
			require.Zero(t, r.Errno, "cookie %d", r.Cookie)
			require.Equal(t, bytes.Repeat([]byte{0x22}, 4096), r.Data)
		}
		seen[r.Cookie] = true
	}
	require.Len(t, seen, 9, "every read answered before the connection closed")
	c.ExpectClosed()
	require.LessOrEqual(t, dev.peak.Load(), int32(maxInFlight))
	require.Equal(t, int32(9), dev.started.Load())
}

// asyncWriter starts the writes of the upper half of a volume asynchronously, holding each until
// the test releases it; the write at failAt fails. Flushes count the writes ended before them.
type asyncWriter struct {
	volume.Device
	release       chan struct{}
	failAt        int64
	started, fuas atomic.Int32
	ended         atomic.Int32
	endedAtFlush  []int32
	flushMu       sync.Mutex
}

func (d *asyncWriter) WriteAtAsync(p []byte, off int64, fua bool, done func(error)) bool {
	if off < 1<<19 {
		return false
	}
	d.started.Add(1)
	if fua {
		d.fuas.Add(1)
	}
	go func() {
		<-d.release
		err := d.Device.WriteAt(p, off, fua)
		if off == d.failAt {
			err = syscall.EIO
		}
		d.ended.Add(1)
		done(err)
	}()
	return true
}

func (d *asyncWriter) Flush() error {
	d.flushMu.Lock()
	d.endedAtFlush = append(d.endedAtFlush, d.ended.Load())
	d.flushMu.Unlock()
	return d.Device.Flush()
}

// TestAsyncWrites: writes a device starts asynchronously (backend.AsyncWriter, an iSCSI LUN)
// leave the reader free, are answered with success or their error once they end, land where they
// were sent, carry FUA through, and a FLUSH sent after them waits for them all.
func TestAsyncWrites(t *testing.T) {
	vol, mem := nbdtest.NewVolume(1<<20, 0, volume.Options{})
	dev := &asyncWriter{Device: vol, release: make(chan struct{}), failAt: 1<<19 + 2*4096}
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxInFlight: 16})
	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", true)

	for i := range uint64(4) {
		var flags uint16
		if i == 3 {
			flags = proto.CmdFlagFUA
		}
		c.Request(proto.Request{Type: proto.CmdWrite, Flags: flags, Cookie: 100 + i, Offset: 1<<19 + 4096*i, Length: 4096},
			bytes.Repeat([]byte{byte(0x40 + i)}, 4096))
	}
	c.Request(proto.Request{Type: proto.CmdFlush, Cookie: 200}, nil)
	// A synchronous write behind them is answered meanwhile.
	c.Request(proto.Request{Type: proto.CmdWrite, Cookie: 10, Offset: 0, Length: 4096}, bytes.Repeat([]byte{7}, 4096))
	r := c.Reply()
	require.Equal(t, uint64(10), r.Cookie, "a write behind asynchronous ones that have not ended")
	require.Eventually(t, func() bool { return dev.started.Load() == 4 }, 5*time.Second, time.Millisecond)
	require.Equal(t, int32(1), dev.fuas.Load())
	close(dev.release)
	seen := map[uint64]bool{}
	for range 5 {
		r := c.Reply()
		if r.Cookie == 102 { // offset failAt
			require.Equal(t, proto.ErrnoIO, r.Errno, "the failed asynchronous write")
		} else {
			require.Zero(t, r.Errno, "cookie %d", r.Cookie)
		}
		seen[r.Cookie] = true
	}
	dev.flushMu.Lock()
	require.Len(t, seen, 5)
	// Replies may come in any order (an ended write's waits for a replier, the FLUSH's worker
	// answers at once), but the device flushed only after the writes sent before the FLUSH ended.
	require.Equal(t, []int32{4}, dev.endedAtFlush)
	dev.flushMu.Unlock()
	for _, i := range []int{0, 1, 3} {
		require.Equal(t, bytes.Repeat([]byte{byte(0x40 + i)}, 4096), mem.Snapshot()[1<<19+4096*i:1<<19+4096*(i+1)])
	}
	c.Request(proto.Request{Type: proto.CmdDisc}, nil)
	c.ExpectClosed()
}

// TestMaxConnections: connections past MaxConnections are closed as they arrive, and one is taken
// again once another has gone.
func TestMaxConnections(t *testing.T) {
	dev, _ := nbdtest.NewVolume(4096, 0, volume.Options{})
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxConnections: 2, Logger: slog.New(slog.DiscardHandler)})
	a, b := nbdtest.DialRaw(t, "unix", ts.Sock), nbdtest.DialRaw(t, "unix", ts.Sock)
	a.Connect("", false)
	b.Connect("", false)
	extra := nbdtest.DialRaw(t, "unix", ts.Sock)
	extra.ExpectClosed()
	require.Equal(t, uint64(1), ts.s.RefusedConnections()[TooMany.String()])
	a.Request(proto.Request{Type: proto.CmdDisc}, nil)
	a.ExpectClosed()
	require.Eventually(t, func() bool {
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		defer c.NC.Close()
		c.NC.SetReadDeadline(time.Now().Add(time.Second))
		var greeting [18]byte
		_, err := io.ReadFull(c.NC, greeting[:])
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "a connection is served again once one has gone")
	b.Request(proto.Request{Type: proto.CmdFlush, Cookie: 1}, nil)
	require.Equal(t, nbdtest.Reply{Cookie: 1}, b.Reply())
}

// A client that did not ask for the block sizes may send requests over the 32 MiB it would have
// been told, as the protocol's reference test client does: up to maxPayload they are served; one
// that asked is held to what it was told.
func TestLargeRequestsWithoutBlockSizes(t *testing.T) {
	const size, big = 64 << 20, 48 << 20
	dev, mem := nbdtest.NewVolume(size, 0, volume.Options{})
	ts := startServer(t, Config{Exports: []Export{{Name: "disk", Device: dev}}, Logger: slog.New(slog.DiscardHandler)})
	data := nbdtest.Pattern(7, big)
	for _, tc := range []struct {
		name    string
		connect func(c *nbdtest.RawClient)
		errno   uint32
	}{
		{"export name", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Option(proto.OptExportName, []byte("disk"))
			c.Recv(proto.ExportNameReplySize)
		}, 0},
		{"go without block sizes", func(c *nbdtest.RawClient) {
			c.Greet()
			c.Option(proto.OptGo, proto.AppendInfoRequest(nil, "disk"))
			_, final := c.Infos(proto.OptGo)
			require.Equal(c.T, proto.RepAck, final)
		}, 0},
		{"go asking for them", func(c *nbdtest.RawClient) { c.Connect("disk", false) }, proto.ErrnoOverflow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := nbdtest.DialRaw(t, "unix", ts.Sock)
			tc.connect(c)
			off := uint64(4096)
			c.Request(proto.Request{Type: proto.CmdWrite, Cookie: 1, Offset: off, Length: big}, data)
			require.Equal(t, tc.errno, c.Reply().Errno)
			c.Request(proto.Request{Type: proto.CmdRead, Cookie: 2, Offset: off, Length: big}, nil)
			r := c.Reply()
			require.Equal(t, tc.errno, r.Errno)
			if tc.errno == 0 {
				require.True(t, bytes.Equal(data, r.Data), "the read returns the write")
				require.True(t, bytes.Equal(data, mem.Snapshot()[off:off+big]))
			}
			c.Request(proto.Request{Type: proto.CmdDisc}, nil)
			c.ExpectClosed()
		})
	}
}

// A client that sends large READs and never takes their replies holds at most the connection's
// payload budget of the server's memory (connShare of the server's), not MaxInFlight replies' worth; it
// stalls only itself: another client is served meanwhile.
func TestClientThatDoesNotRead(t *testing.T) {
	const size, each = 64 << 20, DefaultPayloadBytes / 4
	dev, _ := nbdtest.NewVolume(size, 0x5a, volume.Options{})
	ts := startServer(t, Config{Exports: []Export{{Name: "disk", Device: dev}}, Logger: slog.New(slog.DiscardHandler)})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("disk", false)
	for i := range defaultMaxInFlight {
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: uint64(i + 1), Offset: uint64(i%4) * each, Length: each}, nil)
	}
	time.Sleep(300 * time.Millisecond) // the server takes what it will

	h := nbdtest.DialRaw(t, "tcp", ts.TCP)
	h.Connect("disk", false)
	h.Request(proto.Request{Type: proto.CmdRead, Cookie: 1, Length: 4096}, nil)
	require.Zero(t, h.Reply().Errno, "another client is served")

	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapInuse) - int64(before.HeapInuse)
	require.Less(t, grew, int64(3*DefaultPayloadBytes/2), "the server holds %d MiB for a client that does not read", grew>>20)
	c.NC.Close()
	h.NC.Close()
	ts.waitIdle(t)
}

// TestMaxConnectionsPerPeer: TCP connections from one host past MaxConnectionsPerPeer are closed
// as they arrive, while unix-socket clients are not counted; one is taken again once another has
// gone.
func TestMaxConnectionsPerPeer(t *testing.T) {
	dev, _ := nbdtest.NewVolume(4096, 0, volume.Options{})
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxConnectionsPerPeer: 2, Logger: slog.New(slog.DiscardHandler)})
	a, b := nbdtest.DialRaw(t, "tcp", ts.TCP), nbdtest.DialRaw(t, "tcp", ts.TCP)
	a.Connect("", false)
	b.Connect("", false)
	nbdtest.DialRaw(t, "tcp", ts.TCP).ExpectClosed()
	require.Equal(t, uint64(1), ts.s.RefusedConnections()[TooManyFromHost.String()])
	for range 3 {
		nbdtest.DialRaw(t, "unix", ts.Sock).Connect("", false)
	}
	a.Request(proto.Request{Type: proto.CmdDisc}, nil)
	a.ExpectClosed()
	require.Eventually(t, func() bool {
		c := nbdtest.DialRaw(t, "tcp", ts.TCP)
		defer c.NC.Close()
		c.NC.SetReadDeadline(time.Now().Add(time.Second))
		var greeting [18]byte
		_, err := io.ReadFull(c.NC, greeting[:])
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "a connection from the host is served again once one has gone")
}

// plugDevice starts the reads and writes of the upper half of a volume asynchronously and, while
// plugged (backend.Plugger), holds them until the last Unplug, as an iSCSI LUN holds its commands:
// a server that waited for anything with requests held would wait for ever.
type plugDevice struct {
	volume.Device
	mu       sync.Mutex
	plugs    int
	held     []func()
	batches  []int // how many requests each Unplug that sent something sent
	started  atomic.Int32
	maxPlugs int
}

func (d *plugDevice) Plug() {
	d.mu.Lock()
	d.plugs++
	d.maxPlugs = max(d.maxPlugs, d.plugs)
	d.mu.Unlock()
}

func (d *plugDevice) Unplug() {
	d.mu.Lock()
	d.plugs--
	var run []func()
	if d.plugs == 0 && len(d.held) > 0 {
		run, d.held = d.held, nil
		d.batches = append(d.batches, len(run))
	}
	d.mu.Unlock()
	for _, f := range run {
		go f()
	}
}

func (d *plugDevice) start(off int64, f func()) bool {
	if off < 1<<19 {
		return false
	}
	d.started.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.plugs > 0 {
		d.held = append(d.held, f)
	} else {
		go f()
	}
	return true
}

func (d *plugDevice) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	return d.start(off, func() { done(d.Device.ReadAt(p, off)) })
}

func (d *plugDevice) WriteAtAsync(p []byte, off int64, fua bool, done func(error)) bool {
	return d.start(off, func() { done(d.Device.WriteAt(p, off, fua)) })
}

// TestPluggedBatches: requests a client pipelines reach a device that holds what it starts while
// plugged (backend.Plugger) as batches, and every one is answered, also where the reader must
// wait meanwhile: for a slot (MaxInFlight below the batch), for a request served on another path
// (the lower half is synchronous, and a FLUSH waits for the writes before it), for a WRITE's
// payload. The plug is always given back.
func TestPluggedBatches(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxInFlight int
		mixed       bool
	}{
		{"reads", 64, false},
		{"fewer slots than the batch", 4, false},
		{"mixed with synchronous requests and writes", 64, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const batch, rounds = 32, 16
			vol, _ := nbdtest.NewVolume(1<<20, 0x5a, volume.Options{})
			dev := &plugDevice{Device: vol}
			ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxInFlight: tc.maxInFlight})
			c := nbdtest.DialRaw(t, "unix", ts.Sock)
			c.Connect("", true)
			for r := range uint64(rounds) {
				for i := range uint64(batch) {
					req := proto.Request{Type: proto.CmdRead, Cookie: r*batch + i, Offset: 1<<19 + 4096*i, Length: 4096}
					var data []byte
					if tc.mixed && i%4 == 1 {
						req.Offset -= 1 << 19 // served synchronously
					}
					if tc.mixed && i%4 == 2 {
						req.Type, data = proto.CmdWrite, bytes.Repeat([]byte{0x5a}, 4096)
					}
					if tc.mixed && i%8 == 3 {
						req = proto.Request{Type: proto.CmdFlush, Cookie: req.Cookie} // waits for the writes before it
					}
					c.Request(req, data)
				}
				for range batch {
					rep := c.Reply()
					require.Zero(t, rep.Errno, "cookie %d", rep.Cookie)
					if rep.Data != nil {
						require.Equal(t, bytes.Repeat([]byte{0x5a}, 4096), rep.Data)
					}
				}
			}
			c.Request(proto.Request{Type: proto.CmdDisc}, nil)
			c.ExpectClosed()
			dev.mu.Lock()
			defer dev.mu.Unlock()
			require.Zero(t, dev.plugs, "every Plug has its Unplug")
			require.Empty(t, dev.held, "nothing left held")
			require.Equal(t, 1, dev.maxPlugs)
			require.NotEmpty(t, dev.batches, "pipelined requests were started plugged")
			require.LessOrEqual(t, slices.Max(dev.batches), max(tc.maxInFlight, maxUnflushed))
		})
	}
}

// runDevice ends the reads of the upper half of a volume in runs on one goroutine of its own, as
// an iSCSI session's reader does (backend.RunDeferrer): what AtRunEnd is given during a run is
// called at its end, on that goroutine. ran counts the runs it ended.
type runDevice struct {
	volume.Device
	mu       sync.Mutex
	queue    []func()
	wake     chan struct{}
	inRun    bool
	atEnd    []func()
	ran      atomic.Int32
	deferred atomic.Int32
}

func newRunDevice(t *testing.T, dev volume.Device) *runDevice {
	d := &runDevice{Device: dev, wake: make(chan struct{}, 1)}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case <-d.wake:
			case <-stop:
				return
			}
			d.mu.Lock()
			run := d.queue
			d.queue, d.inRun = nil, true
			d.mu.Unlock()
			for _, f := range run {
				f()
			}
			d.mu.Lock()
			fs := d.atEnd
			d.atEnd, d.inRun = nil, false
			d.mu.Unlock()
			for _, f := range fs {
				f()
			}
			d.ran.Add(1)
		}
	}()
	return d
}

func (d *runDevice) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	if off < 1<<19 {
		return false
	}
	d.mu.Lock()
	d.queue = append(d.queue, func() { done(d.Device.ReadAt(p, off)) })
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	return true
}

func (d *runDevice) AtRunEnd(f func()) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.inRun {
		return false
	}
	d.atEnd = append(d.atEnd, f)
	d.deferred.Add(1)
	return true
}

// TestRepliesAtRunEnd: reads a device ends in runs are answered at each run's end, on the device's
// goroutine, every one once; and a client that does not read its replies never holds that
// goroutine: another client of the device is served meanwhile, and the first gets every reply
// once it reads.
func TestRepliesAtRunEnd(t *testing.T) {
	vol, _ := nbdtest.NewVolume(1<<20, 0x6b, volume.Options{})
	dev := newRunDevice(t, vol)
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, MaxInFlight: 64, Logger: slog.New(slog.DiscardHandler)})
	want := bytes.Repeat([]byte{0x6b}, 4096)

	c := nbdtest.DialRaw(t, "unix", ts.Sock)
	c.Connect("", true)
	for r := range uint64(32) {
		for i := range uint64(16) {
			c.Request(proto.Request{Type: proto.CmdRead, Cookie: r*16 + i, Offset: 1<<19 + 4096*i, Length: 4096}, nil)
		}
		seen := map[uint64]bool{}
		for range 16 {
			rep := c.Reply()
			require.Zero(t, rep.Errno)
			require.False(t, seen[rep.Cookie], "cookie %d answered twice", rep.Cookie)
			seen[rep.Cookie] = true
			require.Equal(t, want, rep.Data)
		}
	}
	require.Positive(t, dev.deferred.Load(), "replies were left to the device's run ends")

	// A client that does not read: its socket fills with replies.
	const stuck = 2048 // 8 MiB of replies, far more than a socket buffers
	ranAlone := dev.ran.Load()
	s := nbdtest.DialRaw(t, "unix", ts.Sock)
	s.Connect("", true)
	go func() {
		for i := range uint64(stuck) {
			s.Request(proto.Request{Type: proto.CmdRead, Cookie: i, Offset: 1<<19 + 4096*(i%64), Length: 4096}, nil)
		}
	}()
	// Its reads stop ending once its socket is full and the server holds MaxInFlight of them.
	last := int32(-1)
	require.Eventually(t, func() bool {
		n := dev.ran.Load()
		stalled := n == last && n > ranAlone
		last = n
		return stalled
	}, 20*time.Second, 200*time.Millisecond)
	ranBefore := dev.ran.Load()
	for i := range uint64(64) {
		c.Request(proto.Request{Type: proto.CmdRead, Cookie: 1000 + i, Offset: 1<<19 + 4096*i, Length: 4096}, nil)
		rep := c.Reply()
		require.Equal(t, 1000+i, rep.Cookie, "another client of the device is served")
		require.Equal(t, want, rep.Data)
	}
	require.Greater(t, dev.ran.Load(), ranBefore)
	for range stuck {
		rep := s.Reply()
		require.Zero(t, rep.Errno)
		require.Equal(t, want, rep.Data)
	}
	s.Request(proto.Request{Type: proto.CmdDisc}, nil)
	s.ExpectClosed()
}

// The payloads all connections hold at once stay within Config.PayloadBytes: with the device
// holding every write, eight clients that each send 32 writes of 1 MiB get as many read from the
// socket as the budget takes and no more; once the device lets them go, every write is answered
// and the budget is free again.
func TestSharedPayloadBudget(t *testing.T) {
	const conns, each, budget = 8, 32, 8 << 20
	base, mem := nbdtest.NewVolume(64<<20, 0, volume.Options{})
	release := make(chan struct{})
	var inDevice atomic.Int32
	dev := &hookDevice{Device: base, onWrite: func(int64) func() {
		inDevice.Add(1)
		<-release
		return func() {}
	}}
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, PayloadBytes: budget, Logger: slog.New(slog.DiscardHandler)})
	clients := make([]*nbdtest.RawClient, conns)
	data := bytes.Repeat([]byte{0xa5}, 1<<20)
	for i := range clients {
		clients[i] = nbdtest.DialRaw(t, "unix", ts.Sock)
		clients[i].Connect("", false)
		go func(c *nbdtest.RawClient, i int) {
			for k := range each {
				c.Request(proto.Request{Type: proto.CmdWrite, Cookie: uint64(k + 1), Offset: uint64(i*each+k) << 20 % (64 << 20), Length: 1 << 20}, data)
			}
		}(clients[i], i)
	}
	// The writes that fit are in the device, waiting; the rest wait for room.
	require.Eventually(t, func() bool { return inDevice.Load() == budget>>20 }, 10*time.Second, time.Millisecond, "%d writes in the device", inDevice.Load())
	held, most := ts.s.PayloadBytes()
	require.Equal(t, int64(budget), most)
	require.Equal(t, int64(budget), held, "the payloads held are those of the writes in the device")
	close(release)
	for _, c := range clients {
		for range each {
			require.Zero(t, c.Reply().Errno)
		}
	}
	require.Eventually(t, func() bool { h, _ := ts.s.PayloadBytes(); return h == 0 }, time.Minute, time.Millisecond)
	require.Equal(t, data, mem.Snapshot()[:1<<20])
}
