package daemon

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/nbd/client"
	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/tlsconf/tlstest"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// The daemon serves with TLS required, and SIGHUP loads its certificates again: a renewed
// certificate serves the next clients, and one that does not load leaves the old in use.
func TestTLSAndReload(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	certs := ca.ServerDir(t)
	sock := filepath.Join(t.TempDir(), "t.sock")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Name: "disk", Backend: "mem://1MiB"}}
	cfg.Listen = []string{"unix:" + sock}
	cfg.TLS = config.TLS{Mode: "require", Certificates: certs}
	log := &nbdtest.Buffer{}
	startLogging(t, cfg, log)
	require.Contains(t, log.String(), "TLS certificates loaded")

	// dial connects trusting trusted's certificates, and returns the error.
	dial := func(trusted *tlstest.CA) error {
		cc, err := tlsconf.Client(tlsconf.Options{Dir: trusted.ClientDir(t), VerifyPeer: true})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, client.Config{Network: "unix", Address: sock, Export: "disk", TLS: cc,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err == nil {
			c.Close()
		}
		return err
	}
	require.NoError(t, dial(ca))
	_, err := client.Dial(context.Background(), client.Config{Network: "unix", Address: sock, Export: "disk"})
	require.ErrorContains(t, err, "it requires TLS")

	renewed := tlstest.NewCA(t, "renewed")
	l := renewed.Issue(t, "server", false, time.Now().Add(time.Hour))
	write := func(name string, data []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(certs, name), data, 0o600))
	}
	write(tlsconf.ServerCertFile, l.CertPEM)
	write(tlsconf.ServerKeyFile, l.KeyPEM)
	require.Error(t, dial(renewed), "the new certificate is not loaded before SIGHUP")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return dial(renewed) == nil }, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, log.String(), "TLS certificates reloaded")

	write(tlsconf.ServerKeyFile, []byte("half a key"))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(log.String()), []byte("TLS certificates not reloaded: the ones loaded before stay in use"))
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, dial(renewed))
}

// Certificates that do not load stop the daemon before it serves, naming the file.
func TestTLSCertificatesMissing(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Name: "disk", Backend: "mem://1MiB"}}
	cfg.Listen = []string{"unix:" + filepath.Join(dir, "t.sock")}
	cfg.TLS = config.TLS{Mode: "on", Certificates: dir}
	err := Run(context.Background(), cfg, registry.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	require.ErrorContains(t, err, "tls.certificates: "+filepath.Join(dir, "server-cert.pem")+" is missing")
}

// TestHangupWithoutTLS: a SIGHUP to a daemon without TLS is logged and changes nothing; without
// the daemon's handler its default action would end the process (this test's too).
func TestHangupWithoutTLS(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "t.sock")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Name: "disk", Backend: "mem://1MiB"}}
	cfg.Listen = []string{"unix:" + sock}
	log := &nbdtest.Buffer{}
	d := startLogging(t, cfg, log)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "SIGHUP: nothing to reload") }, 10*time.Second, 10*time.Millisecond)
	c := dial(t, sock, "disk")
	require.EqualValues(t, 1<<20, c.Size(), "still serving")
	c.Close()
	require.NoError(t, d.stop())
}
