// Package pki makes certificates with crypto/x509: a CA, the server and client certificates it
// issues, and its CRLs, PEM-encoded for the certificates directories internal/tlsconf loads. The
// benchmarks serve TLS with them, and the tests (through internal/tlsconf/tlstest) check against
// them what tierblk accepts and refuses.
//
// It must never decide what the daemon trusts: that is internal/tlsconf's, from the files a user
// gave it. Its keys live in memory only.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"time"
)

// CA is a certificate authority whose key is in memory.
type CA struct {
	Cert   *x509.Certificate
	PEM    []byte // Cert, PEM-encoded
	key    *ecdsa.PrivateKey
	serial int64
}

// NewCA makes a self-signed CA named name, valid from an hour ago for valid.
func NewCA(name string, valid time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(valid),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, PEM: encode("CERTIFICATE", der), key: key, serial: 1}, nil
}

// Leaf is a certificate the CA issued, and its key.
type Leaf struct {
	Serial  *big.Int
	CertPEM []byte
	KeyPEM  []byte
}

// Issue makes a certificate for name (also valid for localhost and 127.0.0.1), for a client or a
// server, valid until notAfter (in the past for an expired one).
func (ca *CA) Issue(name string, client bool, notAfter time.Time) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	ca.serial++
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	from := time.Now()
	if notAfter.Before(from) {
		from = notAfter
	}
	names := []string{name}
	if name != "localhost" {
		names = append(names, "localhost")
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     names,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    from.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Leaf{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{Serial: tmpl.SerialNumber, CertPEM: encode("CERTIFICATE", der), KeyPEM: encode("PRIVATE KEY", keyDER)}, nil
}

// CRL makes a CRL of the CA that revokes the given serial numbers.
func (ca *CA) CRL(revoked ...*big.Int) ([]byte, error) {
	now := time.Now()
	tmpl := &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: now.Add(-time.Hour), NextUpdate: now.Add(24 * time.Hour)}
	for _, s := range revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: now})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.key)
	if err != nil {
		return nil, err
	}
	return encode("X509 CRL", der), nil
}

func encode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
