package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/tlsconf/tlstest"
	"github.com/tierblk/tierblk/internal/volume"
)

// Export names that a client without TLS must never see when TLS is required.
const (
	secretName = "secret-disk"
	secretDesc = "the payroll database"
)

// tlsServer serves an 8 MiB export named secretName with TLS in mode, the server's certificate
// signed by ca, clients' checked against ca when verifyPeer. The server's log goes to log.
func tlsServer(t *testing.T, ca *tlstest.CA, mode tlsconf.Mode, verifyPeer bool) (*Server, *nbdtest.Buffer) {
	t.Helper()
	dev, _ := nbdtest.NewVolume(8<<20, 0, volume.Options{MultiConn: true})
	return tlsServerOf(t, dev, ca, mode, verifyPeer)
}

// tlsServerOf is tlsServer with the export's device dev.
func tlsServerOf(t *testing.T, dev volume.Device, ca *tlstest.CA, mode tlsconf.Mode, verifyPeer bool) (*Server, *nbdtest.Buffer) {
	t.Helper()
	cfg, err := tlsconf.Server(tlsconf.Options{Dir: ca.ServerDir(t), VerifyPeer: verifyPeer})
	require.NoError(t, err)
	log := &nbdtest.Buffer{}
	s, err := New(Config{
		Exports: []Export{{Name: secretName, Description: secretDesc, Device: dev}},
		Logger:  slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn})),
		TLS:     TLS{Mode: mode, Config: func() *tls.Config { return cfg }},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", log)
		}
	})
	return s, log
}

// Every mode with a client that asks for TLS and one that does not, over a unix socket and over
// TCP, with tierblk's own client: TLS is used when asked for and offered, refused when off, and
// required when required; a client asked for TLS never goes on without it.
func TestTLSModes(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	clientDir := ca.ClientDir(t)
	for _, tc := range []struct {
		mode      tlsconf.Mode
		plainErr  string // "" for success
		tlsClient string
	}{
		{mode: tlsconf.Off, tlsClient: "the server does not offer it (NBD_OPT_STARTTLS: option error 2 (server says: \"TLS is not enabled on this server\")); the connection is not made without it"},
		{mode: tlsconf.On},
		{mode: tlsconf.Require, plainErr: "it requires TLS"},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			s, _ := tlsServer(t, ca, tc.mode, true)
			ts := serve(t, s)
			for _, network := range []string{"unix", "tcp"} {
				addr, host := ts.Sock, ""
				if network == "tcp" {
					addr, host = ts.TCP, "localhost"
				}
				cc, err := tlsconf.Client(tlsconf.Options{Dir: clientDir, VerifyPeer: true, Hostname: host})
				require.NoError(t, err)
				for _, c := range []struct {
					name string
					tls  *tls.Config
					err  string
				}{{"plain", nil, tc.plainErr}, {"TLS", cc, tc.tlsClient}} {
					t.Run(network+"/"+c.name, func(t *testing.T) {
						cfg := client.Config{Network: network, Address: addr, Export: secretName, TLS: c.tls, Connections: 2,
							Logger: nbdtest.Logger(t, slog.LevelWarn)}
						if c.err != "" {
							_, err := client.Dial(context.Background(), cfg)
							require.ErrorIs(t, err, client.ErrServerRefused)
							require.ErrorContains(t, err, c.err)
							return
						}
						ts.waitIdle(t) // the connections of the cases before have ended
						nbdtest.Exercise(t, nbdtest.Dial(t, cfg))
						// Served as plain clients are, on the detached socket (sock.go), and over
						// TLS only through the session.
						require.Eventually(t, func() bool {
							s.mu.Lock()
							defer s.mu.Unlock()
							for sc := range s.conns {
								sc.stopMu.Lock()
								detached := sc.sock != nil
								sc.stopMu.Unlock()
								if !detached {
									return false
								}
							}
							return true
						}, 5*time.Second, time.Millisecond, "the transmission phase runs on the detached socket")
						s.mu.Lock()
						defer s.mu.Unlock()
						for sc := range s.conns {
							sc.stopMu.Lock()
							overTLS := sc.wire != nil
							require.Equal(t, c.tls != nil, overTLS)
							require.Equal(t, overTLS, sc.plain == nil, "over TLS nothing reads or writes the socket past the session")
							if overTLS {
								require.Same(t, sc.sock, sc.wire.sock)
							}
							sc.stopMu.Unlock()
						}
					})
				}
			}
		})
	}
}

// startTLS sends NBD_OPT_STARTTLS, expects NBD_REP_ACK and runs the TLS handshake with cfg; the
// raw client then speaks over TLS.
func startTLS(t *testing.T, c *nbdtest.RawClient, cfg *tls.Config) {
	t.Helper()
	c.Option(proto.OptStartTLS, nil)
	typ, _ := c.OptReply(proto.OptStartTLS)
	require.Equal(t, proto.RepAck, typ)
	tc := tls.Client(c.NC, cfg)
	require.NoError(t, tc.Handshake())
	c.NC = tc
}

// The negotiation with TLS required, byte by byte with crypto/tls: every option but STARTTLS and
// ABORT is refused with NBD_REP_ERR_TLS_REQD and no word of the exports before TLS; after it the
// negotiation starts afresh; a second STARTTLS is invalid.
func TestStartTLSRequired(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	s, log := tlsServer(t, ca, tlsconf.Require, false)
	ts := serve(t, s)
	cc, err := tlsconf.Client(tlsconf.Options{Dir: ca.ClientDir(t), VerifyPeer: true})
	require.NoError(t, err)

	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			addr := map[string]string{"unix": ts.Sock, "tcp": ts.TCP}[network]
			c := nbdtest.DialRaw(t, network, addr)
			c.Greet()
			for _, o := range []struct {
				opt  uint32
				data []byte
			}{
				{proto.OptList, nil},
				{proto.OptInfo, proto.AppendInfoRequest(nil, secretName, proto.InfoName, proto.InfoDescription)},
				{proto.OptInfo, proto.AppendInfoRequest(nil, "")},
				{proto.OptGo, proto.AppendInfoRequest(nil, secretName)},
				{proto.OptGo, proto.AppendInfoRequest(nil, "nonexistent")},
				{proto.OptStructuredReply, nil},
				{proto.OptListMetaContext, nil},
				{12345, []byte("anything")},
			} {
				c.Option(o.opt, o.data)
				typ, data := c.OptReply(o.opt)
				require.Equal(t, proto.RepErrTLSReqd, typ, "option %d", o.opt)
				require.NotContains(t, string(data), secretName)
				require.NotContains(t, string(data), secretDesc)
			}
			c.Option(proto.OptStartTLS, []byte("x"))
			typ, _ := c.OptReply(proto.OptStartTLS)
			require.Equal(t, proto.RepErrInvalid, typ, "STARTTLS with data")

			startTLS(t, c, cc)
			c.Option(proto.OptList, nil)
			typ, data := c.OptReply(proto.OptList)
			require.Equal(t, proto.RepServer, typ)
			require.Contains(t, string(data), secretName)
			typ, _ = c.OptReply(proto.OptList)
			require.Equal(t, proto.RepAck, typ)

			c.Option(proto.OptStartTLS, nil)
			typ, _ = c.OptReply(proto.OptStartTLS)
			require.Equal(t, proto.RepErrInvalid, typ, "a second STARTTLS")

			size, _ := c.GoExport(secretName)
			require.EqualValues(t, 8<<20, size)
			c.Request(proto.Request{Type: proto.CmdWrite, Cookie: 1, Offset: 4096, Length: 5}, []byte("hello"))
			require.Equal(t, nbdtest.Reply{Cookie: 1}, c.Reply())
			c.Request(proto.Request{Type: proto.CmdRead, Cookie: 2, Offset: 4096, Length: 5}, nil)
			require.Equal(t, []byte("hello"), c.Reply().Data)
			c.Request(proto.Request{Type: proto.CmdDisc}, nil)
			c.ExpectClosed()
		})
	}
	require.Contains(t, log.String(), "refusing options until the client starts TLS")

	t.Run("abort before TLS", func(t *testing.T) {
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Greet()
		c.Option(proto.OptAbort, nil)
		typ, _ := c.OptReply(proto.OptAbort)
		require.Equal(t, proto.RepAck, typ)
		c.ExpectClosed()
	})
	t.Run("export name before TLS", func(t *testing.T) {
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Greet()
		c.Option(proto.OptExportName, []byte(secretName))
		b, _ := readAll(c.NC)
		require.Empty(t, b, "the server closes without a word")
		require.Eventually(t, func() bool {
			return bytes.Contains([]byte(log.String()), []byte("asked for an export without it (NBD_OPT_EXPORT_NAME)"))
		}, 10*time.Second, 10*time.Millisecond)
	})
	t.Run("client without fixed newstyle", func(t *testing.T) {
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Recv(18)
		c.Send(be32(proto.ClientFlagNoZeroes))
		b, _ := readAll(c.NC)
		require.Empty(t, b)
	})
	t.Run("bytes after STARTTLS", func(t *testing.T) {
		// Sent before the ACK, they would be read as if they came over TLS.
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Greet()
		var h [proto.OptionHeaderSize]byte
		proto.PutOptionHeader(h[:], proto.OptStartTLS, 0)
		c.Send(append(h[:], "IHAVEOPT"...)) // one write: the server reads both at once
		b, _ := readAll(c.NC)
		require.Empty(t, b, "no ACK")
	})
}

func readAll(nc net.Conn) ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(nc)
	return b.Bytes(), err
}

// With TLS on, a client may negotiate in plain first; what it negotiated before STARTTLS does not
// hold after (structured replies here), as the protocol says. With TLS off, STARTTLS gets
// NBD_REP_ERR_POLICY and the negotiation goes on in plain.
func TestStartTLSOnAndOff(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	cc, err := tlsconf.Client(tlsconf.Options{Dir: ca.ClientDir(t), VerifyPeer: true})
	require.NoError(t, err)

	s, _ := tlsServer(t, ca, tlsconf.On, false)
	ts := serve(t, s)
	c := nbdtest.DialRaw(t, "tcp", ts.TCP)
	c.Greet()
	c.Option(proto.OptStructuredReply, nil)
	typ, _ := c.OptReply(proto.OptStructuredReply)
	require.Equal(t, proto.RepAck, typ)
	startTLS(t, c, cc)
	_, flags := c.GoExport(secretName)
	require.Zero(t, flags&proto.FlagSendDF, "structured replies were negotiated before TLS only")
	c.Request(proto.Request{Type: proto.CmdRead, Cookie: 3, Offset: 0, Length: 4096}, nil)
	require.Equal(t, nbdtest.Reply{Cookie: 3, Data: make([]byte, 4096)}, c.Reply())

	s, _ = tlsServer(t, ca, tlsconf.Off, false)
	ts = serve(t, s)
	c = nbdtest.DialRaw(t, "tcp", ts.TCP)
	c.Greet()
	c.Option(proto.OptStartTLS, nil)
	typ, _ = c.OptReply(proto.OptStartTLS)
	require.Equal(t, proto.RepErrPolicy, typ)
	size, _ := c.GoExport(secretName)
	require.EqualValues(t, 8<<20, size)
}

// A TLS handshake that fails ends the connection with a warning that names the client and says
// why; one that does not finish is bound by the handshake's deadline.
func TestTLSHandshakeFailures(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	other := tlstest.NewCA(t, "other")
	s, log := tlsServer(t, ca, tlsconf.Require, true)
	s.handshakeTimeout = 500 * time.Millisecond
	ts := serve(t, s)

	for _, tc := range []struct {
		name string
		cfg  tlsconf.Options
		want string // in the server's log
	}{
		{"client of another CA", tlsconf.Options{Dir: other.ClientDir(t)},
			`TLS handshake failed: the client's certificate (CN=client): x509: certificate signed by unknown authority`},
		{"client without a certificate", tlsconf.Options{},
			`TLS handshake failed: tls: client didn't provide a certificate`},
		{"client that does not trust the server", tlsconf.Options{Dir: other.ClientDir(t), VerifyPeer: true},
			`TLS handshake failed: the client refused it (tls: bad certificate)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := nbdtest.DialRaw(t, "tcp", ts.TCP)
			c.Greet()
			c.Option(proto.OptStartTLS, nil)
			typ, _ := c.OptReply(proto.OptStartTLS)
			require.Equal(t, proto.RepAck, typ)
			cfg, err := tlsconf.Client(tc.cfg)
			require.NoError(t, err)
			cfg.MaxVersion = tls.VersionTLS12 // so that the client learns of a refusal in the handshake
			require.Error(t, tls.Client(c.NC, cfg).Handshake())
			require.Eventually(t, func() bool { return bytes.Contains([]byte(log.String()), []byte(tc.want)) },
				10*time.Second, 10*time.Millisecond, "want %q in the log", tc.want)
			require.Contains(t, log.String(), "remote=127.0.0.1:")
		})
	}
	t.Run("silent after the ACK", func(t *testing.T) {
		c := nbdtest.DialRaw(t, "unix", ts.Sock)
		c.Greet()
		c.Option(proto.OptStartTLS, nil)
		typ, _ := c.OptReply(proto.OptStartTLS)
		require.Equal(t, proto.RepAck, typ)
		c.ExpectClosed()
		require.Contains(t, log.String(), "handshake not finished within 500ms")
	})
}

// The kernel's NBD client gets the server's local connections, which need no TLS, whatever the
// server requires of the others.
func TestServeLocalConnWithoutTLS(t *testing.T) {
	s, _ := tlsServer(t, tlstest.NewCA(t, "ca"), tlsconf.Require, true)
	clientEnd, serverEnd := socketPair(t)
	done := make(chan struct{})
	go func() {
		s.ServeLocalConn(serverEnd, "local")
		close(done)
	}()
	c := nbdtest.NewRawClient(t, clientEnd)
	size, _ := c.Connect(secretName, false)
	require.EqualValues(t, 8<<20, size)
	c.Request(proto.Request{Type: proto.CmdDisc}, nil)
	c.ExpectClosed()
	<-done
}

// Shutdown over TLS as without: connections in the handshake (the TLS one included) and idle
// ones are closed at once, a request in flight is answered, then its connection closed; when the
// context ends first, every connection is hung up on.
func TestShutdownTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	cc, err := tlsconf.Client(tlsconf.Options{Dir: ca.ClientDir(t), VerifyPeer: true})
	require.NoError(t, err)
	// connect negotiates over TLS up to the transmission phase.
	connect := func(ts *testServer) *nbdtest.RawClient {
		c := nbdtest.DialRaw(t, "tcp", ts.TCP)
		c.Greet()
		startTLS(t, c, cc)
		c.GoExport(secretName)
		return c
	}
	for _, ctxEnds := range []bool{false, true} {
		t.Run(fmt.Sprintf("context ends first %v", ctxEnds), func(t *testing.T) {
			vol, _ := nbdtest.NewVolume(1<<20, 0x33, volume.Options{})
			release, stuck := make(chan struct{}), make(chan struct{})
			dev := &hookDevice{Device: vol, onRead: func(int64) { close(stuck); <-release }}
			s, _ := tlsServerOf(t, dev, ca, tlsconf.Require, false)
			ts := serve(t, s)
			c, idle := connect(ts), connect(ts)
			shaking := nbdtest.DialRaw(t, "unix", ts.Sock)
			shaking.Greet()
			shaking.Option(proto.OptStartTLS, nil)
			typ, _ := shaking.OptReply(proto.OptStartTLS)
			require.Equal(t, proto.RepAck, typ)

			c.Request(proto.Request{Type: proto.CmdRead, Cookie: 1, Length: 4096}, nil)
			<-stuck
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Shutdown(ctx) }()
			shaking.ExpectClosed()
			idle.ExpectClosed()
			if ctxEnds {
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
				c.ExpectClosed()
				close(release)
				ts.waitIdle(t)
				return
			}
			close(release)
			require.Equal(t, nbdtest.Reply{Cookie: 1, Data: bytes.Repeat([]byte{0x33}, 4096)}, c.Reply())
			c.ExpectClosed()
			require.NoError(t, <-done)
		})
	}
}
