// Package tlsconf loads the X.509 certificates of an NBD peer from a directory in the layout that
// nbdkit, qemu and libnbd share (ca-cert.pem, server-cert.pem and server-key.pem for a server,
// client-cert.pem and client-key.pem for a client, and an optional ca-crl.pem), into a
// *tls.Config for the server (internal/nbd/server) or the client (internal/nbd/client). Both sides
// load through the same code and check their peer's certificate the same way: signed by the CA,
// for the right purpose, not revoked by the CRL, and, for a server with a name to check, issued
// for that name. Reloadable holds a configuration that is loaded again on SIGHUP.
//
// It offers X.509 only: Go's crypto/tls has no external pre-shared keys (nbdkit's --tls-psk).
// It must never decide when TLS is used or required (the server's and the URL's business), nor
// log, nor watch files: errors name the file and what is wrong with it, for the caller to report.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Mode is how a server offers TLS, in the NBD protocol's terms.
type Mode int

// The modes of a server.
const (
	// Off answers NBD_OPT_STARTTLS with NBD_REP_ERR_POLICY (the protocol's NOTLS mode).
	Off Mode = iota
	// On lets each client choose: plain, or TLS after NBD_OPT_STARTTLS (SELECTIVETLS, every
	// export available either way).
	On
	// Require refuses every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT until TLS is on
	// (FORCEDTLS).
	Require
)

var modeNames = [...]string{Off: "off", On: "on", Require: "require"}

func (m Mode) String() string { return modeNames[m] }

// ParseMode reads a mode's name: off, on or require.
func ParseMode(s string) (Mode, error) {
	for m, name := range modeNames {
		if s == name {
			return Mode(m), nil
		}
	}
	return Off, fmt.Errorf("%q is not a TLS mode; use off, on or require", s)
}

// The files of a certificates directory.
const (
	CACertFile     = "ca-cert.pem"
	CACRLFile      = "ca-crl.pem"
	ServerCertFile = "server-cert.pem"
	ServerKeyFile  = "server-key.pem"
	ClientCertFile = "client-cert.pem"
	ClientKeyFile  = "client-key.pem"
)

// Options say where one side's certificates are and how it checks its peer's.
type Options struct {
	// Dir is the certificates directory. A server needs one. A client without one presents no
	// certificate and checks the server's against the system's CAs.
	Dir string
	// VerifyPeer: a server requires every TLS client to present a certificate that the CA
	// signed; a client checks the server's certificate (libnbd's default).
	VerifyPeer bool
	// Hostname, for a client, is the name the server's certificate must be issued for. Empty:
	// only the CA's signature is checked, as for a Unix socket, which has no host name.
	Hostname string
}

// minVersion is TLS 1.2, the version the NBD protocol requires every implementation to have:
// nbd-client's default GnuTLS priority allows only 1.2; clients that offer 1.3 get it.
const minVersion = tls.VersionTLS12

// Server loads a server's configuration from o.Dir: its certificate and key, and with
// o.VerifyPeer the CA (and the CRL, if there is one) that clients' certificates are checked
// against.
func Server(o Options) (*tls.Config, error) {
	if o.Dir == "" {
		return nil, errors.New("no certificates directory: a TLS server needs " + ServerCertFile + " and " + ServerKeyFile)
	}
	if err := checkDir(o.Dir); err != nil {
		return nil, err
	}
	cert, err := loadKeyPair(o.Dir, ServerCertFile, ServerKeyFile, true)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: minVersion, Certificates: cert}
	if o.VerifyPeer {
		v, err := loadVerifier(o.Dir)
		if err != nil {
			return nil, err
		}
		// Any certificate is taken in the handshake, and checked by VerifyConnection, so that the
		// refusal says what is wrong with it. ClientCAs stays empty, which lets a client send
		// its certificate whoever signed it (an empty list of CAs means any): a client that does
		// not send one is refused as "did not provide a certificate", which says less.
		cfg.ClientAuth = tls.RequireAnyClientCert
		cfg.VerifyConnection = v.check("client", x509.ExtKeyUsageClientAuth, "")
	}
	return cfg, nil
}

// Client loads a client's configuration: its certificate and key from o.Dir if it has them, and
// with o.VerifyPeer the CA (o.Dir's, else the system's) and CRL that the server's certificate
// is checked against.
func Client(o Options) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion: minVersion,
		ServerName: o.Hostname, // sent as SNI, unless it is an IP address
		// The server's certificate is checked by VerifyConnection below, which also checks the
		// CRL and can check a certificate without a name to check it for; crypto/tls's own
		// check does neither.
		InsecureSkipVerify: true,
	}
	if o.Dir != "" {
		if err := checkDir(o.Dir); err != nil {
			return nil, err
		}
		cert, err := loadKeyPair(o.Dir, ClientCertFile, ClientKeyFile, false)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = cert
	}
	if o.VerifyPeer {
		v := &verifier{} // nil roots: the system's
		if o.Dir != "" {
			var err error
			if v, err = loadVerifier(o.Dir); err != nil {
				return nil, err
			}
		}
		cfg.VerifyConnection = v.check("server", x509.ExtKeyUsageServerAuth, o.Hostname)
	}
	return cfg, nil
}

// checkDir reports a certificates directory that is not one, rather than each file as missing.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("certificates directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("certificates directory %s is not a directory", dir)
	}
	return nil
}

// loadKeyPair loads the certificate (with any intermediates after it) and key of one side. Both
// files are needed when required; otherwise both or neither.
func loadKeyPair(dir, certName, keyName string, required bool) ([]tls.Certificate, error) {
	certPath, keyPath := filepath.Join(dir, certName), filepath.Join(dir, keyName)
	certPEM, certErr := readFile(certPath)
	keyPEM, keyErr := readFile(keyPath)
	if !required && errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist) {
		return nil, nil
	}
	if err := errors.Join(certErr, keyErr); err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s with %s: %w", certPath, keyPath, err)
	}
	return []tls.Certificate{cert}, nil
}

// readFile reads one file of the directory; a missing one is reported as such.
func readFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, missing(path)
	}
	return b, err
}

// missing is the path of a file of the directory that is not there.
type missing string

func (m missing) Error() string        { return string(m) + " is missing" }
func (m missing) Is(target error) bool { return target == fs.ErrNotExist }

// verifier checks a peer's certificate against the CA, and the CRL if there is one.
type verifier struct {
	roots   *x509.CertPool // nil: the system's
	crl     *x509.RevocationList
	revoked map[string]bool // the CRL's serial numbers, in decimal
	crlPath string
}

// loadVerifier loads dir's CA certificates, and its CRL if there is one, which one of them must
// have signed.
func loadVerifier(dir string) (*verifier, error) {
	caPath := filepath.Join(dir, CACertFile)
	data, err := readFile(caPath)
	if err != nil {
		return nil, err
	}
	cas, err := parseCertificates(caPath, data)
	if err != nil {
		return nil, err
	}
	v := &verifier{roots: x509.NewCertPool()}
	for _, ca := range cas {
		v.roots.AddCert(ca)
	}
	v.crlPath = filepath.Join(dir, CACRLFile)
	data, err = os.ReadFile(v.crlPath)
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return nil, err
	}
	if v.crl, err = parseCRL(v.crlPath, data, cas); err != nil {
		return nil, err
	}
	v.revoked = map[string]bool{}
	for _, r := range v.crl.RevokedCertificateEntries {
		v.revoked[r.SerialNumber.String()] = true
	}
	return v, nil
}

// parseCertificates reads every certificate of a PEM file; it must hold at least one.
func parseCertificates(path string, data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %w", path, len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s: no PEM certificate in it (\"-----BEGIN CERTIFICATE-----\")", path)
	}
	return certs, nil
}

// parseCRL reads a PEM CRL and checks that one of cas signed it: a CRL from another CA would
// revoke nothing this CA issued, and one nobody signed would let anyone revoke certificates.
func parseCRL(path string, data []byte, cas []*x509.Certificate) (*x509.RevocationList, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "X509 CRL" {
		return nil, fmt.Errorf("%s: no PEM CRL in it (\"-----BEGIN X509 CRL-----\")", path)
	}
	crl, err := x509.ParseRevocationList(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, ca := range cas {
		if crl.CheckSignatureFrom(ca) == nil {
			return crl, nil
		}
	}
	return nil, fmt.Errorf("%s: not signed by the CA of %s (its issuer is %s)", path, CACertFile, crl.Issuer)
}

// check returns a tls.Config.VerifyConnection that requires the peer's certificate to chain to
// the roots, be meant for usage and, when host is set, be issued for host; and no certificate of
// the chain to be revoked.
func (v *verifier) check(peer string, usage x509.ExtKeyUsage, host string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("the %s presented no certificate", peer)
		}
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		chains, err := leaf.Verify(x509.VerifyOptions{
			Roots: v.roots, Intermediates: inter, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage},
		})
		if err != nil {
			return fmt.Errorf("the %s's certificate (%s): %w", peer, leaf.Subject, err)
		}
		for _, chain := range chains {
			for _, c := range chain {
				if v.isRevoked(c) {
					return fmt.Errorf("the %s's certificate (%s): %s (serial %s) is revoked by %s",
						peer, leaf.Subject, c.Subject, c.SerialNumber, v.crlPath)
				}
			}
		}
		return nil
	}
}

// isRevoked reports whether the CRL revokes c.
func (v *verifier) isRevoked(c *x509.Certificate) bool {
	return v.crl != nil && string(c.RawIssuer) == string(v.crl.RawIssuer) && v.revoked[c.SerialNumber.String()]
}
