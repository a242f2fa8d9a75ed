package metrics

import (
	"context"
	"errors"
	"fmt"
	"github.com/tierblk/tierblk/internal/listen"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// ShutdownTimeout bounds how long Serve waits for requests in flight once its context is cancelled.
const ShutdownTimeout = 5 * time.Second

// Serve listens on addr (see ParseAdminAddr) and serves h until ctx is cancelled, then shuts the
// server down and removes its unix socket. bound is the address actually listened on, in the form
// ParseAdminAddr accepts (with the real port if addr asked for port 0). wait blocks until the
// server has stopped and returns why it stopped early, or the shutdown's error; nil after a clean
// stop. Requests in flight see their context cancelled with ctx. A stale unix socket left by a
// dead process is replaced; a live one is refused.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (bound string, wait func() error, err error) {
	network, address, err := ParseAdminAddr(addr)
	if err != nil {
		return "", nil, err
	}
	return serve(ctx, "admin endpoint", network, address, h, log)
}

// ServeMetrics is Serve for the metrics endpoint (Handlers.Metrics), on an address that
// ParseMetricsAddr accepts: any host.
func ServeMetrics(ctx context.Context, addr string, h http.Handler, log *slog.Logger) (bound string, wait func() error, err error) {
	network, address, err := ParseMetricsAddr(addr)
	if err != nil {
		return "", nil, err
	}
	return serve(ctx, "metrics endpoint", network, address, h, log)
}

func serve(ctx context.Context, what, network, address string, h http.Handler, log *slog.Logger) (bound string, wait func() error, err error) {
	l, err := listen.Listen(network, address)
	if err != nil {
		return "", nil, fmt.Errorf("%s %s: %w", what, address, err)
	}
	bound = "unix:" + address
	if network == "tcp" {
		bound = l.Addr().String()
	}

	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// Requests see ctx cancelled when the endpoint stops, so a long flush or mode switch gives
		// up at once rather than hold the shutdown, and never runs on into a cache being closed.
		BaseContext: func(net.Listener) context.Context { return ctx },
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	done := make(chan error, 1)
	go func() {
		select {
		case err := <-serveErr:
			// Serve has closed the listener, which removes a unix socket.
			done <- fmt.Errorf("%s %s: %w", what, bound, err)
			return
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		err := srv.Shutdown(sctx) // closes the listener, which removes a unix socket
		if serr := <-serveErr; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		if err != nil {
			err = fmt.Errorf("%s %s: shutdown: %w", what, bound, err)
		}
		done <- err
	}()
	log.Info(what+" listening", "addr", bound)
	return bound, sync.OnceValue(func() error { return <-done }), nil
}

// Endpoints are the addresses of the admin endpoint (ParseAdminAddr) and the metrics endpoint
// (ParseMetricsAddr); an empty one is not served.
type Endpoints struct{ Admin, Metrics string }

// Serve serves h.Admin and h.Metrics at e's addresses until stop is called, which shuts them
// down. An error names the endpoint (admin: or metrics:), and leaves nothing listening.
func (e Endpoints) Serve(h Handlers, log *slog.Logger) (stop func() error, err error) {
	var stops []func() error
	stop = func() error {
		var errs []error
		for _, s := range stops {
			errs = append(errs, s())
		}
		return errors.Join(errs...)
	}
	for _, ep := range []struct {
		name, addr, paths string
		h                 http.Handler
		serve             func(context.Context, string, http.Handler, *slog.Logger) (string, func() error, error)
	}{
		{"admin", e.Admin, "/metrics /stats /flush /mode /heal /scrub", h.Admin, Serve},
		{"metrics", e.Metrics, "/metrics /stats", h.Metrics, ServeMetrics},
	} {
		if ep.addr == "" {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		bound, wait, err := ep.serve(ctx, ep.addr, ep.h, log)
		if err != nil {
			cancel()
			return nil, errors.Join(fmt.Errorf("%s: %w", ep.name, err), stop())
		}
		log.Info(ep.name+" endpoint", "addr", bound, "paths", ep.paths)
		stops = append(stops, func() error { cancel(); return wait() })
	}
	return stop, nil
}
