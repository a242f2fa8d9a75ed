package integration

// TLS with real peers and certificates made by certtool: libnbd's nbdinfo and nbdcopy and qemu's
// qemu-io and qemu-img against `tierblk serve --tls`; clients whose certificates the server must
// refuse, and a server certificate clients refuse, each with the line tierblk logs; a reload on
// SIGHUP; and tierblk's NBD backend over TLS against nbdkit.

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// tlsURIs are libnbd's URIs of a daemon's default export over TLS, on its unix socket and on its
// TCP port by the name its certificates are issued for, with the certificates directory certs.
func tlsURIs(d *daemon, certs string) map[string]string {
	_, port, _ := net.SplitHostPort(d.TCP)
	return map[string]string{
		"unix": "nbds+unix:///?socket=" + d.Unix + "&tls-certificates=" + certs,
		"tcp":  "nbds://localhost:" + port + "/?tls-certificates=" + certs,
	}
}

// qemuTLS is the start of qemu-io's or qemu-img's arguments for a daemon's default export over
// TLS, with the certificates directory certs: over TCP, or over the unix socket, which gives no
// host name for qemu to check the certificate against, so it is given one.
func qemuTLS(d *daemon, network, certs string) []string {
	server := "server.type=unix,server.path=" + d.Unix + ",tls-hostname=localhost"
	if network == "tcp" {
		_, port, _ := net.SplitHostPort(d.TCP)
		server = "server.type=inet,server.host=localhost,server.port=" + port
	}
	return []string{"--object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + certs,
		"--image-opts", "driver=nbd," + server + ",tls-creds=tls0"}
}

// Real clients over TLS against `tierblk serve --tls require --tls-verify-peer`, on the unix
// socket and over TCP; a client without TLS learns nothing.
func TestTLSClients(t *testing.T) {
	requireTools(t, "nbdinfo", "nbdcopy", "qemu-io", "qemu-img")
	ca := newPKI(t, "tierblk test CA")
	cli := ca.issue(clientCert, false, ca)
	d := startServe(t, "--backend", "mem://16MiB", "--tls", "require", "--tls-certificates", ca.issue(serverCert, false, ca), "--tls-verify-peer")
	uris := tlsURIs(d, cli)

	for network, uri := range uris {
		out := mustRunTool(t, "nbdinfo", uri)
		require.Contains(t, out, "with TLS", network)
		require.Contains(t, out, "export-size: 16777216", network)
	}

	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	data := nbdtest.Pattern(21, 16<<20)
	require.NoError(t, os.WriteFile(in, data, 0o600))
	mustRunTool(t, "nbdcopy", in, uris["unix"])
	mustRunTool(t, "nbdcopy", uris["tcp"], out)
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got), "nbdcopy in over the unix socket, out over TCP: the data differs")

	for i, network := range []string{"unix", "tcp"} {
		off := strconv.Itoa(i << 20)
		args := append(qemuTLS(d, network, cli), "-c", "write -P 0xa"+strconv.Itoa(i)+" "+off+" 64k", "-c", "read -P 0xa"+strconv.Itoa(i)+" "+off+" 64k")
		o := mustRunTool(t, "qemu-io", args...)
		require.NotContains(t, o, "failed", network)
	}
	info := mustRunTool(t, "qemu-img", append([]string{"info"}, qemuTLS(d, "tcp", cli)...)...)
	require.Contains(t, info, "virtual size: 16 MiB")

	// Without TLS, an error and nothing else: the server requires it.
	o, err := runTool(t, "nbdinfo", "--list", tcpURI(d.TCP, ""))
	require.Error(t, err, "plain nbdinfo against --tls require:\n%s", o)
	require.NotContains(t, o, "export-size")
	require.Contains(t, d.output.String(), "refusing options until the client starts TLS, which the server requires")
}

// What the server refuses, and what clients refuse of it, each with a line in tierblk's log that
// names the client's address and says why.
func TestTLSRefusals(t *testing.T) {
	requireTools(t, "nbdinfo")
	ca, other := newPKI(t, "tierblk test CA"), newPKI(t, "another CA")
	srv := ca.issue(serverCert, false, ca)
	revoked := ca.issue(clientCert, false, ca)
	ca.writeCRL(srv, revoked)
	d := startServe(t, "--backend", "mem://1MiB", "--tls", "require", "--tls-certificates", srv, "--tls-verify-peer")

	for _, tc := range []struct {
		name  string
		certs string // the client's certificates directory
		log   string // what tierblk logs
	}{
		{"client that trusts another CA", ca.issue(clientCert, false, other),
			"TLS handshake failed: the client hung up during it"},
		{"client certificate of another CA", other.issue(clientCert, false, ca),
			"TLS handshake failed: the client's certificate (CN=client): x509: certificate signed by unknown authority"},
		{"expired client certificate", ca.issue(clientCert, true, ca),
			"TLS handshake failed: the client's certificate (CN=client): x509: certificate has expired or is not yet valid"},
		{"revoked client certificate", revoked,
			"TLS handshake failed: the client's certificate (CN=client): CN=client (serial "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(d.output.String())
			out, err := runTool(t, "nbdinfo", tlsURIs(d, tc.certs)["tcp"])
			require.Error(t, err, "nbdinfo:\n%s", out)
			require.NotContains(t, out, "export-size")
			requireLogLine(t, d, before, tc.log, "remote=127.0.0.1:")
		})
	}

	t.Run("expired server certificate", func(t *testing.T) {
		// With TLS on, clients without TLS still get in.
		expired := startServe(t, "--backend", "mem://1MiB", "--tls", "on", "--tls-certificates", ca.issue(serverCert, true, ca))
		require.Contains(t, expired.output.String(), "the server's certificate has expired, and clients that check it will refuse it")
		out, err := runTool(t, "nbdinfo", tlsURIs(expired, ca.issue(clientCert, false, ca))["tcp"])
		require.Error(t, err, "nbdinfo:\n%s", out)
		requireLogLine(t, expired, 0, "TLS handshake failed: the client hung up during it", "remote=127.0.0.1:")
		out = mustRunTool(t, "nbdinfo", tcpURI(expired.TCP, ""))
		require.Contains(t, out, "without TLS")
	})
}

// requireLogLine waits for a line of d's output, after its first skip bytes, that holds every one
// of parts.
func requireLogLine(t *testing.T, d *daemon, skip int, parts ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(d.output.String()[skip:], "\n") {
			found := true
			for _, p := range parts {
				found = found && strings.Contains(line, p)
			}
			if found {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "no line of tierblk's output holds %q:\n%s", parts, d.output.String())
}

// SIGHUP loads the certificates again: renewed ones serve the next clients, and ones that do not
// load leave the old in use, with an error in the log.
func TestTLSReload(t *testing.T) {
	requireTools(t, "nbdinfo")
	ca, renewed := newPKI(t, "tierblk test CA"), newPKI(t, "renewed CA")
	srv := ca.issue(serverCert, false, ca)
	d := startServe(t, "--backend", "mem://1MiB", "--tls", "require", "--tls-certificates", srv)
	oldClient, newClient := ca.issue(clientCert, false, ca), renewed.issue(clientCert, false, renewed)
	mustRunTool(t, "nbdinfo", tlsURIs(d, oldClient)["tcp"])

	fresh := renewed.issue(serverCert, false, renewed)
	for _, name := range []string{"server-cert.pem", "server-key.pem"} {
		b, err := os.ReadFile(filepath.Join(fresh, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(srv, name), b, 0o600))
	}
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGHUP))
	requireLogLine(t, d, 0, "TLS certificates reloaded")
	mustRunTool(t, "nbdinfo", tlsURIs(d, newClient)["tcp"])
	_, err := runTool(t, "nbdinfo", tlsURIs(d, oldClient)["tcp"])
	require.Error(t, err, "a client that trusts only the old CA")

	require.NoError(t, os.WriteFile(filepath.Join(srv, "server-key.pem"), []byte("truncated"), 0o600))
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGHUP))
	requireLogLine(t, d, 0, "TLS certificates not reloaded: the ones loaded before stay in use", "server-key.pem")
	mustRunTool(t, "nbdinfo", tlsURIs(d, newClient)["unix"])
}

// tierblk's NBD backend over TLS against nbdkit, which checks tierblk's client certificate: the
// conformance suite in this process, and `tierblk serve` with an nbds+unix:// backend. Against a
// server without TLS, a URL asking for it fails, saying so, and never falls back to plain.
func TestTLSBackend(t *testing.T) {
	ca := newPKI(t, "tierblk test CA")
	nbdkitCerts := ca.issue(serverCert, false, ca)
	cli := ca.issue(clientCert, false, ca)
	nbdkitTLS := func(t *testing.T, size int64) string {
		return nbdkitSocket(t, "--tls=require", "--tls-certificates="+nbdkitCerts, "--tls-verify-peer", "memory", strconv.FormatInt(size, 10))
	}
	backendURL := func(sock string) string { return "nbds+unix:///?socket=" + sock + "&tls-certificates=" + cli }

	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		return openBackend(t, backendURL(nbdkitTLS(t, size)), backend.Options{})
	})

	t.Run("serve", func(t *testing.T) {
		d := startServe(t, "--backend", backendURL(nbdkitTLS(t, 64<<20)), "--ram", "8MiB")
		mustQemuIO(t, unixURI(d.Unix, ""), "write -P 0x5c 1M 256k", "read -P 0x5c 1M 256k")
	})

	t.Run("server without TLS", func(t *testing.T) {
		sock := nbdkitSocket(t, "memory", "1M")
		_, err := registry.Default().Open(backendURL(sock), backend.Options{})
		require.ErrorIs(t, err, client.ErrServerRefused)
		require.ErrorContains(t, err, "TLS was asked for, and the server does not offer it")
		// The same export opens without TLS when the URL does not ask for it.
		require.NoError(t, openBackend(t, unixURI(sock, ""), backend.Options{}).Close())
	})

	t.Run("client not trusted by the server", func(t *testing.T) {
		other := newPKI(t, "another CA")
		_, err := registry.Default().Open("nbds+unix:///?socket="+nbdkitTLS(t, 1<<20)+"&tls-certificates="+other.issue(clientCert, false, ca), backend.Options{})
		require.ErrorContains(t, err, "over TLS (a server that refuses this client's certificate ends the session so)")
	})
}
