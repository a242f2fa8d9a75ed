package bench

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/tierblk/tierblk/internal/tlsconf"
)

// GnuTLSPriorityFile is the file WriteTLS writes beside the certificates for fio's GnuTLS (libnbd's
// TLS), named by GNUTLS_SYSTEM_PRIORITY_FILE in fio's environment. Its overrides leave fio's client
// one TLS version and one cipher suite to offer, so that every server is measured with the same:
// by default libnbd's client gets TLS_AES_256_GCM_SHA384 from nbdkit (GnuTLS prefers it) but
// TLS_AES_128_GCM_SHA256 from tierblk (Go prefers it), and AES-128 costs both ends fewer rounds
// per byte. AES-256-GCM is the one kept: what nbdkit chooses anyway, so that only tierblk's
// choice is overridden.
const GnuTLSPriorityFile = "fio-gnutls-priority.conf"

// TLSCipher is the TLS version and cipher suite of every measurement over TLS.
const TLSCipher = "TLS 1.3, TLS_AES_256_GCM_SHA384"

// gnutlsPriority is GnuTLSPriorityFile's content: GnuTLS's system-wide overrides, which apply to
// every priority string (libnbd sets its own, "NORMAL").
const gnutlsPriority = `# fio's GnuTLS for tierblk bench: TLS 1.3 with AES-256-GCM only (` + TLSCipher + `).
[overrides]
disabled-version = TLS1.0
disabled-version = TLS1.1
disabled-version = TLS1.2
tls-disabled-cipher = AES-128-GCM
tls-disabled-cipher = AES-128-CCM
tls-disabled-cipher = AES-256-CCM
tls-disabled-cipher = CHACHA20-POLY1305
`

// tlsValid is how long WriteTLS's certificates are valid: longer than any run.
const tlsValid = 7 * 24 * time.Hour

// WriteTLS writes into dir (created if need be) a certificates directory in nbdkit's layout
// (internal/tlsconf's): a new CA's certificate (ca-cert.pem), and a server certificate it issued
// for 127.0.0.1 and localhost (server-cert.pem) with its key (server-key.pem), all ECDSA P-256;
// and GnuTLSPriorityFile. Every server of a run serves the same certificate; the CA's key is not
// kept.
func WriteTLS(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "tierblk bench CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(tlsValid),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(tlsValid),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{tlsconf.CACertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644},
		{tlsconf.ServerCertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644},
		{tlsconf.ServerKeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{GnuTLSPriorityFile, []byte(gnutlsPriority), 0o644},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// serial is a random certificate serial number of 128 bits.
func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	return n.Add(n, big.NewInt(1)) // positive
}

// FreePorts returns n distinct TCP ports of 127.0.0.1 that nothing listened on a moment ago: each
// is listened on (port 0: the kernel picks), and all are closed once all are picked. Another
// process may take one before the server it is meant for does; that server then fails to start.
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free TCP port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
