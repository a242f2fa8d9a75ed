package bench

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/tlsconf/pki"
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
	ca, err := pki.NewCA("tierblk bench CA", tlsValid)
	if err != nil {
		return err
	}
	srv, err := ca.Issue("localhost", false, time.Now().Add(tlsValid))
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
		{tlsconf.CACertFile, ca.PEM, 0o644},
		{tlsconf.ServerCertFile, srv.CertPEM, 0o644},
		{tlsconf.ServerKeyFile, srv.KeyPEM, 0o600},
		{GnuTLSPriorityFile, []byte(gnutlsPriority), 0o644},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
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
