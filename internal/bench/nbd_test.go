package bench

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/tlsconf"
)

func TestEndpointURI(t *testing.T) {
	for _, tc := range []struct {
		ep   Endpoint
		uri  string
		env  []string
		conf client.Config
	}{
		{Endpoint{Sock: "/w/s.sock"}, "nbd+unix:///?socket=/w/s.sock", nil, client.Config{Network: "unix", Address: "/w/s.sock"}},
		{Endpoint{Addr: "127.0.0.1:10809"}, "nbd://127.0.0.1:10809/", nil, client.Config{Network: "tcp", Address: "127.0.0.1:10809"}},
		// fio's nbd engine refuses tls-certificates= (libnbd's nbd_set_uri_allow_local_file).
		{Endpoint{Addr: "127.0.0.1:10809", TLSDir: "/w/tls"}, "nbds://127.0.0.1:10809/?tls-verify-peer=false",
			[]string{"GNUTLS_SYSTEM_PRIORITY_FILE=/w/tls/" + GnuTLSPriorityFile}, client.Config{}},
	} {
		require.Equal(t, tc.uri, tc.ep.URI())
		require.Equal(t, tc.env, tc.ep.fioEnv(), tc.uri)
		require.Equal(t, []string{"--name=bench", "--ioengine=nbd", "--uri=" + tc.uri}, fioArgs(tc.ep.URI(), "1m", 0, 0, nil)[:3])
		if tc.ep.TLSDir != "" {
			// A directory that is not there: the error names it, before any server starts.
			_, err := tc.ep.clientConfig()
			require.ErrorContains(t, err, "/w/tls")
			continue
		}
		cfg, err := tc.ep.clientConfig()
		require.NoError(t, err)
		require.Equal(t, tc.conf, cfg)
	}
}

func TestTargetEndpoint(t *testing.T) {
	require.Equal(t, Endpoint{Sock: "/w/s.sock"}, Target{}.endpoint("/w/s.sock"))
	ep := Endpoint{Addr: "127.0.0.1:1", TLSDir: "/d"}
	require.Equal(t, ep, Target{Listen: &ep}.endpoint("/w/s.sock"))
}

// TestWriteTLS: the files are in nbdkit's layout, the key private, and a handshake between a
// server and tierblk's client loaded from them succeeds for 127.0.0.1 (what Endpoint dials) and
// localhost, and fails against another run's CA.
func TestWriteTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	require.NoError(t, WriteTLS(dir))
	for name, mode := range map[string]os.FileMode{tlsconf.CACertFile: 0o644, tlsconf.ServerCertFile: 0o644, tlsconf.ServerKeyFile: 0o600, GnuTLSPriorityFile: 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err, name)
		require.Equal(t, mode, fi.Mode().Perm(), name)
	}
	data, err := os.ReadFile(filepath.Join(dir, tlsconf.ServerCertFile))
	require.NoError(t, err)
	b, _ := pem.Decode(data)
	cert, err := x509.ParseCertificate(b.Bytes)
	require.NoError(t, err)
	require.Equal(t, []string{"localhost"}, cert.DNSNames)
	require.True(t, cert.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)))
	require.Equal(t, "ecdsa", strings.ToLower(cert.PublicKeyAlgorithm.String()))
	require.Greater(t, time.Until(cert.NotAfter), 24*time.Hour)

	srv, err := tlsconf.Server(tlsconf.Options{Dir: dir})
	require.NoError(t, err)
	l, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	handshake := func(ep Endpoint) error {
		cfg, err := ep.clientConfig()
		require.NoError(t, err)
		require.Equal(t, "tcp", cfg.Network)
		c, err := tls.Dial("tcp", "127.0.0.1:"+port, cfg.TLS)
		if err == nil {
			c.Close()
		}
		return err
	}
	require.NoError(t, handshake(Endpoint{Addr: "127.0.0.1:" + port, TLSDir: dir}))
	require.NoError(t, handshake(Endpoint{Addr: "localhost:" + port, TLSDir: dir}))
	other := filepath.Join(t.TempDir(), "other")
	require.NoError(t, WriteTLS(other))
	require.ErrorContains(t, handshake(Endpoint{Addr: "127.0.0.1:" + port, TLSDir: other}), "certificate signed by unknown authority")

	prio, err := os.ReadFile(filepath.Join(dir, GnuTLSPriorityFile))
	require.NoError(t, err)
	require.Contains(t, string(prio), "[overrides]\n")
	require.Contains(t, string(prio), "tls-disabled-cipher = AES-128-GCM\n")
	require.Contains(t, string(prio), "disabled-version = TLS1.2\n")
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(3)
	require.NoError(t, err)
	require.Len(t, ports, 3)
	require.NotEqual(t, ports[0], ports[1])
	require.NotEqual(t, ports[1], ports[2])
	require.NotEqual(t, ports[0], ports[2])
	for _, p := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		require.NoError(t, err, "port %d is closed again", p)
		l.Close()
	}
}

func TestNBDTargets(t *testing.T) {
	plain, err := NBDTargets(NBDPlain, "/bin/tierblk", t.TempDir())
	require.NoError(t, err)
	defer plain.Close() // nothing to stop
	require.Equal(t, "unix socket", plain.Transport)
	require.Equal(t, "a 1 GiB RAM disk", plain.Disk)
	require.Equal(t, DefaultRows(), plain.Rows)
	require.Empty(t, plain.Watch)
	require.Len(t, plain.Targets, 2)
	require.Equal(t, "/bin/tierblk serve --backend mem://1GiB --nbd unix:/t.sock --log-level warn", strings.Join(plain.Targets[0].Command("/t.sock").Args, " "))
	require.Equal(t, "nbdkit -f -U /t.sock memory 1G", strings.Join(plain.Targets[1].Command("/t.sock").Args, " "))
	for _, tg := range plain.Targets {
		require.Nil(t, tg.Listen, tg.Name)
	}

	work := t.TempDir()
	s, err := NBDTargets(NBDTLS, "/bin/tierblk", work)
	require.NoError(t, err)
	require.Equal(t, "TCP on 127.0.0.1 with TLS 1.3, TLS_AES_256_GCM_SHA384", s.Transport)
	require.Equal(t, DefaultRows(), s.Rows)
	dir := filepath.Join(work, "tls")
	require.FileExists(t, filepath.Join(dir, tlsconf.ServerKeyFile))
	require.Len(t, s.Targets, 2)
	tb, nk := s.Targets[0], s.Targets[1]
	require.Equal(t, []string{"tierblk", "nbdkit"}, []string{tb.Name, nk.Name}, "the same names as the plain part's")
	require.NotEqual(t, tb.Listen.Addr, nk.Listen.Addr)
	_, nkPort, err := net.SplitHostPort(nk.Listen.Addr)
	require.NoError(t, err)
	require.Equal(t, "/bin/tierblk serve --backend mem://1GiB --nbd "+tb.Listen.Addr+" --tls require --tls-certificates "+dir+" --log-level warn",
		strings.Join(tb.Command("/unused.sock").Args, " "))
	require.Equal(t, "nbdkit -f -i 127.0.0.1 -p "+nkPort+" --tls=require --tls-certificates="+dir+" memory 1G",
		strings.Join(nk.Command("/unused.sock").Args, " "))
	for _, tg := range s.Targets {
		require.Equal(t, dir, tg.Listen.TLSDir, tg.Name)
		require.True(t, strings.HasPrefix(tg.Listen.Addr, "127.0.0.1:"), tg.Listen.Addr)
	}

	_, err = NBDTargets("udp", "/bin/tierblk", work)
	require.ErrorContains(t, err, `unknown part "udp"`)
}

func TestNBDParts(t *testing.T) {
	require.Equal(t, []string{"plain", "tls", "iscsi"}, NBDParts())
	require.Equal(t, []string{"plain", "tls"}, NBDDefaultParts(), "iscsi needs root: not by default")
}

// TestISCSITargets: the command lines of the iSCSI part's servers, on the same LUN URL, and its
// rows: DefaultRows and 1M sequential writes.
func TestISCSITargets(t *testing.T) {
	url := iscsiURL("127.0.0.1:3260", ISCSIIQN, 1)
	require.Equal(t, "iscsi://127.0.0.1:3260/iqn.2026-11.org.tierblk:bench/1", url)
	ts := iscsiTargets("/bin/tierblk", url)
	require.Len(t, ts, 2)
	require.Equal(t, []string{"tierblk", "qemu-nbd"}, []string{ts[0].Name, ts[1].Name})
	require.Equal(t, "/bin/tierblk serve --backend "+url+" --nbd unix:/t.sock --log-level warn", strings.Join(ts[0].Command("/t.sock").Args, " "))
	require.Equal(t, "qemu-nbd -t -f raw --cache=none -k /q.sock "+url, strings.Join(ts[1].Command("/q.sock").Args, " "))
	for _, tg := range ts {
		require.Nil(t, tg.Listen, tg.Name)
	}

	rows := ISCSIRows()
	require.Equal(t, DefaultRows(), rows[:len(DefaultRows())])
	require.Len(t, rows, len(DefaultRows())+1)
	require.Equal(t, Row{Name: "1M sequential write, QD8", FioArgs: []string{"--rw=write", "--bs=1M", "--iodepth=8"}, Unit: "MiB/s"}, rows[3])
	require.Len(t, DefaultRows(), 3, "other parts keep their rows")
}

func TestNBDTable(t *testing.T) {
	var b bytes.Buffer
	s := NBDSetup{Targets: []Target{{Name: "tierblk"}, {Name: "nbdkit"}}}
	s.Table(&b, []Result{{Row: "4K", Unit: "IOPS", Samples: map[string][]float64{"tierblk": {110, 90, 300}, "nbdkit": {100, 100, 100}}}})
	require.Equal(t, "| workload | tierblk | nbdkit | tierblk / nbdkit (min-max) |\n|---|---:|---:|---:|\n"+
		"| 4K | 110 IOPS | 100 IOPS | 1.10 (0.90-3.00) |\n", b.String())

	b.Reset()
	s = NBDSetup{Targets: []Target{{Name: "tierblk"}, {Name: "qemu-nbd"}}}
	s.Table(&b, []Result{{Row: "1M", Unit: "MiB/s", Samples: map[string][]float64{"tierblk": {50}, "qemu-nbd": {100}}}})
	require.Equal(t, "| workload | tierblk | qemu-nbd | tierblk / qemu-nbd (min-max) |\n|---|---:|---:|---:|\n"+
		"| 1M | 50 MiB/s | 100 MiB/s | 0.50 (0.50-0.50) |\n", b.String())
}
