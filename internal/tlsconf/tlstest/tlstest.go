// Package tlstest makes certificates for tests with crypto/x509: a CA, certificates it issues
// for servers and clients, its CRLs, and certificates directories in the layout internal/tlsconf
// loads. The integration tests make theirs with GnuTLS's certtool instead, as users do.
//
// It is for tests only: nothing the daemon builds may import it.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/tlsconf"
)

// CA is a certificate authority.
type CA struct {
	Cert   *x509.Certificate
	PEM    []byte // Cert, PEM-encoded
	key    *ecdsa.PrivateKey
	serial int64
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca := &CA{key: newKey(t), serial: 1}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ca.key.PublicKey, ca.key)
	require.NoError(t, err)
	ca.Cert, err = x509.ParseCertificate(der)
	require.NoError(t, err)
	ca.PEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return ca
}

// Leaf is a certificate the CA issued, and its key.
type Leaf struct {
	Serial  *big.Int
	CertPEM []byte
	KeyPEM  []byte
}

// Issue makes a certificate for name (also valid for localhost and 127.0.0.1), for a client or a
// server, valid until notAfter (in the past for an expired one).
func (ca *CA) Issue(t testing.TB, name string, client bool, notAfter time.Time) Leaf {
	t.Helper()
	key := newKey(t)
	ca.serial++
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    notAfter.Add(-2 * Valid),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return Leaf{
		Serial:  tmpl.SerialNumber,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
}

// CRL makes a CRL of the CA that revokes the given serial numbers.
func (ca *CA) CRL(t testing.TB, revoked ...*big.Int) []byte {
	t.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now().Add(-time.Hour), NextUpdate: time.Now().Add(24 * time.Hour)}
	for _, s := range revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
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

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}
