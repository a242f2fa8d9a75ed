package tlsconf_test

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/tlsconf/tlstest"
)

func TestParseMode(t *testing.T) {
	for s, want := range map[string]tlsconf.Mode{"off": tlsconf.Off, "on": tlsconf.On, "require": tlsconf.Require} {
		m, err := tlsconf.ParseMode(s)
		require.NoError(t, err)
		require.Equal(t, want, m)
		require.Equal(t, s, m.String())
	}
	for _, s := range []string{"", "yes", "Require", "true"} {
		_, err := tlsconf.ParseMode(s)
		require.ErrorContains(t, err, "use off, on or require", s)
	}
}

// Every file a directory may hold, missing or bad, gets an error that names it.
func TestLoadErrors(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	other := tlstest.NewCA(t, "other")
	srv := ca.Issue(t, "server", false, time.Now().Add(time.Hour))
	cli := ca.Issue(t, "client", true, time.Now().Add(time.Hour))
	good := map[string][]byte{
		tlsconf.CACertFile: ca.PEM, tlsconf.CACRLFile: ca.CRL(t),
		tlsconf.ServerCertFile: srv.CertPEM, tlsconf.ServerKeyFile: srv.KeyPEM,
		tlsconf.ClientCertFile: cli.CertPEM, tlsconf.ClientKeyFile: cli.KeyPEM,
	}
	// with is good with the named files replaced (nil: removed).
	with := func(change map[string][]byte) map[string][]byte {
		files := map[string][]byte{}
		for k, v := range good {
			files[k] = v
		}
		for k, v := range change {
			if v == nil {
				delete(files, k)
			} else {
				files[k] = v
			}
		}
		return files
	}
	garbage := []byte("not PEM at all\n")
	for _, tc := range []struct {
		name   string
		files  map[string][]byte
		client bool
		opts   tlsconf.Options
		err    string // "" for success
	}{
		{name: "server", files: good},
		{name: "server verifying", files: good, opts: tlsconf.Options{VerifyPeer: true}},
		{name: "server without CA or CRL", files: with(map[string][]byte{tlsconf.CACertFile: nil, tlsconf.CACRLFile: nil})},
		{name: "server cert missing", files: with(map[string][]byte{tlsconf.ServerCertFile: nil}), err: "server-cert.pem is missing"},
		{name: "server key missing", files: with(map[string][]byte{tlsconf.ServerKeyFile: nil}), err: "server-key.pem is missing"},
		{name: "server cert bad", files: with(map[string][]byte{tlsconf.ServerCertFile: garbage}), err: "server-cert.pem with"},
		{name: "server key of another cert", files: with(map[string][]byte{tlsconf.ServerKeyFile: cli.KeyPEM}), err: "private key does not match"},
		{name: "CA missing", files: with(map[string][]byte{tlsconf.CACertFile: nil}), opts: tlsconf.Options{VerifyPeer: true}, err: "ca-cert.pem is missing"},
		{name: "CA bad", files: with(map[string][]byte{tlsconf.CACertFile: garbage}), opts: tlsconf.Options{VerifyPeer: true}, err: "ca-cert.pem: no PEM certificate"},
		{name: "CRL bad", files: with(map[string][]byte{tlsconf.CACRLFile: garbage}), opts: tlsconf.Options{VerifyPeer: true}, err: "ca-crl.pem: no PEM CRL"},
		{name: "CRL of another CA", files: with(map[string][]byte{tlsconf.CACRLFile: other.CRL(t)}), opts: tlsconf.Options{VerifyPeer: true}, err: "ca-crl.pem: not signed by the CA"},

		{name: "client", files: good, client: true, opts: tlsconf.Options{VerifyPeer: true}},
		{name: "client without a certificate", files: with(map[string][]byte{tlsconf.ClientCertFile: nil, tlsconf.ClientKeyFile: nil}), client: true, opts: tlsconf.Options{VerifyPeer: true}},
		{name: "client not verifying, no CA", files: with(map[string][]byte{tlsconf.CACertFile: nil}), client: true},
		{name: "client key missing", files: with(map[string][]byte{tlsconf.ClientKeyFile: nil}), client: true, err: "client-key.pem is missing"},
		{name: "client cert missing", files: with(map[string][]byte{tlsconf.ClientCertFile: nil}), client: true, err: "client-cert.pem is missing"},
		{name: "client CA missing", files: with(map[string][]byte{tlsconf.CACertFile: nil}), client: true, opts: tlsconf.Options{VerifyPeer: true}, err: "ca-cert.pem is missing"},
		{name: "client CRL bad", files: with(map[string][]byte{tlsconf.CACRLFile: garbage}), client: true, opts: tlsconf.Options{VerifyPeer: true}, err: "ca-crl.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.Dir = tlstest.WriteDir(t, tc.files)
			load := tlsconf.Server
			if tc.client {
				load = tlsconf.Client
			}
			cfg, err := load(o)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)
		})
	}
	_, err := tlsconf.Server(tlsconf.Options{})
	require.ErrorContains(t, err, "no certificates directory")
	for _, load := range []func(tlsconf.Options) (*tls.Config, error){tlsconf.Server, tlsconf.Client} {
		_, err = load(tlsconf.Options{Dir: "/nonexistent/pki"})
		require.ErrorContains(t, err, "certificates directory: stat /nonexistent/pki: no such file or directory")
		_, err = load(tlsconf.Options{Dir: "tlsconf_test.go"})
		require.ErrorContains(t, err, "certificates directory tlsconf_test.go is not a directory")
	}
}

// handshake runs a TLS handshake between the two configurations over loopback TCP (whose
// buffers let both sides send their alerts, where a net.Pipe would have them wait for each other)
// and returns each side's error.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	b, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	a, err := l.Accept()
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(10 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, server)
		err := s.Handshake()
		if err == nil {
			// In TLS 1.3 the client finishes first and learns of a refusal of its certificate
			// at its first read: give it one.
			_, err = s.Write([]byte{1})
		}
		a.Close()
		done <- err
	}()
	c := tls.Client(b, client)
	clientErr = c.Handshake()
	if clientErr == nil {
		_, clientErr = c.Read(make([]byte, 1))
	}
	b.Close()
	return <-done, clientErr
}

// What each side accepts of the other's certificate: the CA, the purpose, the dates, the name
// and the CRL are all checked, on both sides and with TLS 1.2 as with 1.3.
func TestVerify(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	other := tlstest.NewCA(t, "other")
	later := time.Now().Add(time.Hour)
	srv := ca.Issue(t, "nbd.example", false, later)
	cli := ca.Issue(t, "alice", true, later)
	revoked := ca.Issue(t, "mallory", true, later)
	expired := ca.Issue(t, "old", true, time.Now().Add(-time.Minute))
	expiredSrv := ca.Issue(t, "nbd.example", false, time.Now().Add(-time.Minute))
	foreign := other.Issue(t, "eve", true, later)
	crl := ca.CRL(t, revoked.Serial)

	serverDir := func(l tlstest.Leaf) string {
		return tlstest.WriteDir(t, map[string][]byte{tlsconf.CACertFile: ca.PEM, tlsconf.CACRLFile: crl, tlsconf.ServerCertFile: l.CertPEM, tlsconf.ServerKeyFile: l.KeyPEM})
	}
	clientDir := func(caPEM []byte, l *tlstest.Leaf) string {
		files := map[string][]byte{tlsconf.CACertFile: caPEM}
		if l != nil {
			files[tlsconf.ClientCertFile], files[tlsconf.ClientKeyFile] = l.CertPEM, l.KeyPEM
		}
		return tlstest.WriteDir(t, files)
	}
	for _, tc := range []struct {
		name            string
		server          tlsconf.Options
		client          tlsconf.Options
		serverErr, cErr string // "" for success
	}{
		{name: "server checked by name", server: tlsconf.Options{Dir: serverDir(srv)}, client: tlsconf.Options{Dir: clientDir(ca.PEM, nil), VerifyPeer: true, Hostname: "nbd.example"}},
		{name: "server checked by IP", server: tlsconf.Options{Dir: serverDir(srv)}, client: tlsconf.Options{Dir: clientDir(ca.PEM, nil), VerifyPeer: true, Hostname: "127.0.0.1"}},
		{name: "server checked by CA only", server: tlsconf.Options{Dir: serverDir(srv)}, client: tlsconf.Options{Dir: clientDir(ca.PEM, nil), VerifyPeer: true}},
		{name: "server not checked", server: tlsconf.Options{Dir: serverDir(srv)}, client: tlsconf.Options{Dir: clientDir(other.PEM, nil), Hostname: "wrong.example"}},
		{name: "server of another CA", server: tlsconf.Options{Dir: serverDir(srv)}, client: tlsconf.Options{Dir: clientDir(other.PEM, nil), VerifyPeer: true},
			cErr: "the server's certificate (CN=nbd.example): x509: certificate signed by unknown authority"},
		{name: "server of another name", server: tlsconf.Options{Dir: serverDir(srv)}, client: tlsconf.Options{Dir: clientDir(ca.PEM, nil), VerifyPeer: true, Hostname: "nas.example"},
			cErr: "certificate is valid for nbd.example, localhost, not nas.example"},
		{name: "server expired", server: tlsconf.Options{Dir: serverDir(expiredSrv)}, client: tlsconf.Options{Dir: clientDir(ca.PEM, nil), VerifyPeer: true},
			cErr: "certificate has expired"},
		{name: "server with a client's certificate", server: tlsconf.Options{Dir: serverDir(cli)}, client: tlsconf.Options{Dir: clientDir(ca.PEM, nil), VerifyPeer: true},
			cErr: "incompatible key usage"},

		{name: "client checked", server: tlsconf.Options{Dir: serverDir(srv), VerifyPeer: true}, client: tlsconf.Options{Dir: clientDir(ca.PEM, &cli), VerifyPeer: true}},
		{name: "client without a certificate", server: tlsconf.Options{Dir: serverDir(srv), VerifyPeer: true}, client: tlsconf.Options{Dir: clientDir(ca.PEM, nil), VerifyPeer: true},
			serverErr: "didn't provide a certificate"},
		{name: "client of another CA", server: tlsconf.Options{Dir: serverDir(srv), VerifyPeer: true}, client: tlsconf.Options{Dir: clientDir(ca.PEM, &foreign)},
			serverErr: "the client's certificate (CN=eve): x509: certificate signed by unknown authority"},
		{name: "client expired", server: tlsconf.Options{Dir: serverDir(srv), VerifyPeer: true}, client: tlsconf.Options{Dir: clientDir(ca.PEM, &expired)},
			serverErr: "the client's certificate (CN=old): x509: certificate has expired"},
		{name: "client revoked", server: tlsconf.Options{Dir: serverDir(srv), VerifyPeer: true}, client: tlsconf.Options{Dir: clientDir(ca.PEM, &revoked)},
			serverErr: "the client's certificate (CN=mallory): CN=mallory (serial 4) is revoked by"},
		{name: "client with a server's certificate", server: tlsconf.Options{Dir: serverDir(srv), VerifyPeer: true}, client: tlsconf.Options{Dir: clientDir(ca.PEM, &srv)},
			serverErr: "incompatible key usage"},
		{name: "client not asked", server: tlsconf.Options{Dir: serverDir(srv)}, client: tlsconf.Options{Dir: clientDir(ca.PEM, &foreign)}},
	} {
		for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			t.Run(tc.name+"/"+tls.VersionName(version), func(t *testing.T) {
				sc, err := tlsconf.Server(tc.server)
				require.NoError(t, err)
				cc, err := tlsconf.Client(tc.client)
				require.NoError(t, err)
				cc.MaxVersion = version
				serverErr, clientErr := handshake(t, sc, cc)
				switch {
				case tc.serverErr != "":
					require.ErrorContains(t, serverErr, tc.serverErr)
					require.Error(t, clientErr)
				case tc.cErr != "":
					require.ErrorContains(t, clientErr, tc.cErr)
					require.Error(t, serverErr)
				default:
					require.NoError(t, serverErr)
					require.NoError(t, clientErr)
				}
			})
		}
	}
}

// A reload takes new certificates; one that fails keeps the old.
func TestReloadable(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	dir := ca.ServerDir(t)
	r, err := tlsconf.NewReloadable(func() (*tls.Config, error) { return tlsconf.Server(tlsconf.Options{Dir: dir}) })
	require.NoError(t, err)
	first := r.Config()
	require.NotNil(t, first)

	renewed := ca.Issue(t, "renewed", false, time.Now().Add(time.Hour))
	require.NoError(t, os.WriteFile(filepath.Join(dir, tlsconf.ServerCertFile), renewed.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, tlsconf.ServerKeyFile), renewed.KeyPEM, 0o600))
	require.NoError(t, r.Reload())
	second := r.Config()
	require.Equal(t, "renewed", second.Certificates[0].Leaf.Subject.CommonName)

	require.NoError(t, os.Remove(filepath.Join(dir, tlsconf.ServerKeyFile)))
	require.ErrorContains(t, r.Reload(), "server-key.pem is missing")
	require.Same(t, second, r.Config())

	_, err = tlsconf.NewReloadable(func() (*tls.Config, error) { return tlsconf.Server(tlsconf.Options{Dir: dir}) })
	require.ErrorContains(t, err, "server-key.pem is missing")
}
