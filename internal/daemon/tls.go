package daemon

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/tlsconf"
)

// serverTLS loads the NBD server's TLS configuration as cfg says, and loads it again at each
// SIGHUP (renewed certificates) until stop is called; a reload that fails keeps the configuration
// loaded before. With TLS off it returns the zero server.TLS, and a SIGHUP is logged and
// otherwise ignored: its default action would end the daemon without its clean stop (a closed
// terminal, a habit of sending SIGHUP to reload).
func serverTLS(cfg config.TLS, log *slog.Logger) (_ server.TLS, stop func(), _ error) {
	mode, err := tlsconf.ParseMode(cfg.Mode)
	if err != nil {
		return server.TLS{}, nil, err
	}
	if mode == tlsconf.Off {
		return server.TLS{}, OnHangup(func() {
			log.Info("SIGHUP: nothing to reload (a SIGHUP reloads the TLS certificates, and TLS is off)")
		}), nil
	}
	opts := tlsconf.Options{Dir: cfg.Certificates, VerifyPeer: cfg.VerifyPeer}
	certs, err := tlsconf.NewReloadable(func() (*tls.Config, error) { return tlsconf.Server(opts) })
	if err != nil {
		return server.TLS{}, nil, fmt.Errorf("tls.certificates: %w", err)
	}
	logCertificate(log, "TLS certificates loaded", certs.Config(), "mode", mode.String(), "dir", cfg.Certificates, "verify_peer", cfg.VerifyPeer)

	stop = OnHangup(func() {
		if err := certs.Reload(); err != nil {
			log.Error("TLS certificates not reloaded: the ones loaded before stay in use", "dir", cfg.Certificates, "err", err)
			return
		}
		logCertificate(log, "TLS certificates reloaded", certs.Config(), "dir", cfg.Certificates)
	})
	return server.TLS{Mode: mode, Config: certs.Config}, stop, nil
}

// OnHangup runs do at each SIGHUP until stop is called; meanwhile a SIGHUP does not end the
// process (its default action).
func OnHangup(do func()) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
				do()
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}

// logCertificate logs msg with the server certificate's subject and expiry, as a warning when the
// certificate is out of its dates: every client that checks it will refuse it.
func logCertificate(log *slog.Logger, msg string, c *tls.Config, args ...any) {
	leaf := c.Certificates[0].Leaf
	args = append(args, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter.Format(time.RFC3339))
	switch now := time.Now(); {
	case now.After(leaf.NotAfter):
		log.Warn(msg+"; the server's certificate has expired, and clients that check it will refuse it", args...)
	case now.Before(leaf.NotBefore):
		log.Warn(msg+"; the server's certificate is not valid yet, and clients that check it will refuse it", args...)
	default:
		log.Info(msg, args...)
	}
}
