// Package tlstest makes certificates for tests (internal/tlsconf/pki's, failing the test on an
// error): a CA, certificates it issues for servers and clients, its CRLs, and certificates
// directories in the layout internal/tlsconf loads. The integration tests make theirs with
// GnuTLS's certtool instead, as users do.
//
// It is for tests only: nothing the daemon builds may import it.
package tlstest

import (
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/tlsconf/pki"
)

// CA is a certificate authority (internal/tlsconf/pki's) whose calls fail the test on an error.
type CA struct{ *pki.CA }

// Leaf is a certificate the CA issued, and its key.
type Leaf = pki.Leaf

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := pki.NewCA(name, Valid)
	require.NoError(t, err)
	return &CA{ca}
}

// Issue makes a certificate for name (also valid for localhost and 127.0.0.1), for a client or a
// server, valid until notAfter (in the past for an expired one).
func (ca *CA) Issue(t testing.TB, name string, client bool, notAfter time.Time) Leaf {
	t.Helper()
	l, err := ca.CA.Issue(name, client, notAfter)
	require.NoError(t, err)
	return l
}

// CRL makes a CRL of the CA that revokes the given serial numbers.
func (ca *CA) CRL(t testing.TB, revoked ...*big.Int) []byte {
	t.Helper()
	crl, err := ca.CA.CRL(revoked...)
	require.NoError(t, err)
	return crl
}

// Valid is how long the certificates of ServerDir and ClientDir are valid.
const Valid = 24 * time.Hour

// ServerDir writes a server's certificates directory: the CA's certificate, and a server
// certificate it issued, with its key.
func (ca *CA) ServerDir(t testing.TB) string {
	t.Helper()
	l := ca.Issue(t, "server", false, time.Now().Add(Valid))
	return WriteDir(t, map[string][]byte{tlsconf.CACertFile: ca.PEM, tlsconf.ServerCertFile: l.CertPEM, tlsconf.ServerKeyFile: l.KeyPEM})
}

// ClientDir writes a client's certificates directory: the CA's certificate, and a client
// certificate it issued, with its key.
func (ca *CA) ClientDir(t testing.TB) string {
	t.Helper()
	l := ca.Issue(t, "client", true, time.Now().Add(Valid))
	return WriteDir(t, map[string][]byte{tlsconf.CACertFile: ca.PEM, tlsconf.ClientCertFile: l.CertPEM, tlsconf.ClientKeyFile: l.KeyPEM})
}

// WriteDir writes files (name to content) into a new directory and returns its path.
func WriteDir(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
	return dir
}
