package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pki is a certificate authority made with GnuTLS's certtool, as a user makes one for tierblk,
// nbdkit, qemu and libnbd (docs/operations.md#tls): it writes certificates directories in their
// shared layout (ca-cert.pem; server-cert.pem and server-key.pem, or client-cert.pem and
// client-key.pem; ca-crl.pem).
type pki struct {
	t      *testing.T
	dir    string // the CA's own files
	caCert string // its ca-cert.pem
}

// newPKI makes a CA named name.
func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	requireTools(t, "certtool")
	p := &pki{t: t, dir: t.TempDir()}
	p.caCert = filepath.Join(p.dir, "ca-cert.pem")
	p.certtool("--generate-privkey", "--key-type=ecdsa", "--outfile", p.path("ca-key.pem"))
	p.certtool("--generate-self-signed", "--load-privkey", p.path("ca-key.pem"),
		"--template", p.template("ca", "cn = \""+name+"\"", "ca", "cert_signing_key", "crl_signing_key", "expiration_days = 2"),
		"--outfile", p.caCert)
	return p
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// template writes a certtool template of lines and returns its path.
func (p *pki) template(name string, lines ...string) string {
	p.t.Helper()
	path := p.path(name + ".info")
	require.NoError(p.t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

func (p *pki) certtool(args ...string) {
	p.t.Helper()
	mustRunTool(p.t, "certtool", args...)
}

// Kinds of certificates the CA issues.
const (
	serverCert = "server" // for localhost and 127.0.0.1
	clientCert = "client"
)

// issue writes a new directory holding a certificate of kind that the CA signed, with its key,
// valid for two days or, when expired, for 2019 only; and trust's ca-cert.pem, which its holder
// checks the other side's certificate against.
func (p *pki) issue(kind string, expired bool, trust *pki) string {
	p.t.Helper()
	dir := shortTempDir(p.t)
	key, cert := filepath.Join(dir, kind+"-key.pem"), filepath.Join(dir, kind+"-cert.pem")
	lines := []string{"cn = \"" + kind + "\"", "encryption_key", "signing_key"}
	if kind == serverCert {
		lines = append(lines, "dns_name = \"localhost\"", "ip_address = \"127.0.0.1\"", "tls_www_server")
	} else {
		lines = append(lines, "tls_www_client")
	}
	if expired {
		lines = append(lines, "activation_date = \"2019-01-01 00:00:00 UTC\"", "expiration_date = \"2020-01-01 00:00:00 UTC\"")
	} else {
		lines = append(lines, "expiration_days = 2")
	}
	p.certtool("--generate-privkey", "--key-type=ecdsa", "--outfile", key)
	p.certtool("--generate-certificate", "--load-privkey", key, "--load-ca-certificate", p.caCert,
		"--load-ca-privkey", p.path("ca-key.pem"), "--template", p.template(kind, lines...), "--outfile", cert)
	b, err := os.ReadFile(trust.caCert)
	require.NoError(p.t, err)
	require.NoError(p.t, os.WriteFile(filepath.Join(dir, "ca-cert.pem"), b, 0o600))
	return dir
}

// writeCRL writes into dir, as ca-crl.pem, a CRL of the CA that revokes the client certificates
// of the directories revoked (which issue wrote).
func (p *pki) writeCRL(dir string, revoked ...string) {
	p.t.Helper()
	var certs []byte
	for _, d := range revoked {
		b, err := os.ReadFile(filepath.Join(d, clientCert+"-cert.pem"))
		require.NoError(p.t, err)
		certs = append(certs, b...)
	}
	list := p.path("revoked.pem")
	require.NoError(p.t, os.WriteFile(list, certs, 0o600))
	p.certtool("--generate-crl", "--load-ca-privkey", p.path("ca-key.pem"), "--load-ca-certificate", p.caCert,
		"--load-certificate", list, "--template", p.template("crl", "crl_next_update = 2", "crl_number = 1"),
		"--outfile", filepath.Join(dir, "ca-crl.pem"))
}
