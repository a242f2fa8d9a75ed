// Package metrics is tierblk's admin HTTP endpoint: Prometheus metrics at /metrics and a JSON
// snapshot of every export's cache at /stats, both built from cache.Stats snapshots taken at request
// time (and the NBD server's refused connections, counted by reason), and the admin actions POST
// /flush, /mode, /heal and /scrub (see actions.go).
//
// The admin endpoint has no authentication, so it must never listen anywhere but on loopback or a
// unix socket. It must never change a cache but through those actions, which the cache makes safe
// at any time, and never on a GET. The metrics endpoint (NewHandlers' Metrics) serves only GET
// /metrics and /stats, which change nothing, and may listen on any address, for a Prometheus on
// another host.
package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/replica"
	"github.com/tierblk/tierblk/internal/sim"
)

// Source is one export. Its funcs are called on every request and must be safe to call
// concurrently. Stats is nil for an export without a cache: such an export is left out of /metrics
// and /stats, and its admin actions answer that it has no cache.
type Source struct {
	Export string
	Stats  func() cache.Stats
	// FlushAll, SetMode, Heal and Scrub are the cache's (see cache.Cache); the admin actions call
	// them.
	FlushAll func(ctx context.Context, progress func(done, total int64)) error
	SetMode  func(ctx context.Context, m cache.Mode, progress func(done, total int64)) error
	Heal     func() error
	Scrub    func(ctx context.Context, rate int64) (cache.ScrubStats, error)
	// Replicas are the states of a replicated export's replicas (nil: none).
	Replicas func() []replica.PeerStats
	// Curves are the export's live miss-ratio curves (nil: curves off).
	Curves func() *sim.Curves
}

// StatsResponse is the body of GET /stats.
type StatsResponse struct {
	Exports []ExportStats `json:"exports"`
	// Process and Memory are the daemon's own (DaemonStats), where the handlers have them.
	Process *ProcessStats `json:"process,omitempty"`
	Memory  *MemoryStats  `json:"memory,omitempty"`
}

// ExportStats is one export's entry in StatsResponse.
type ExportStats struct {
	Name     string              `json:"name"`
	Stats    cache.Stats         `json:"stats"`
	Replicas []replica.PeerStats `json:"replicas,omitempty"`
	Curves   *sim.Curves         `json:"curves,omitempty"`
}

// ParseMetricsAddr splits a metrics endpoint's address, unix:/path or [HOST]:PORT with any host
// (":9810" listens on every address), into net.Listen's network and address.
func ParseMetricsAddr(s string) (network, address string, err error) {
	if p, ok := strings.CutPrefix(s, "unix:"); ok {
		if p == "" {
			return "", "", fmt.Errorf("metrics address %q has no socket path; write unix:/path/to.sock", s)
		}
		return "unix", p, nil
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", "", fmt.Errorf("metrics address %q is neither unix:/path/to.sock nor HOST:PORT (:PORT for every address)", s)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", "", fmt.Errorf("metrics address %q: port %q is not a number from 0 to 65535", s, port)
	}
	return "tcp", s, nil
}

// ParseAdminAddr splits an admin address, unix:/path or HOST:PORT, into net.Listen's network and
// address. HOST must be a loopback IP or localhost: the endpoint has no authentication.
func ParseAdminAddr(s string) (network, address string, err error) {
	if p, ok := strings.CutPrefix(s, "unix:"); ok {
		if p == "" {
			return "", "", fmt.Errorf("admin address %q has no socket path; write unix:/path/to.sock", s)
		}
		return "unix", p, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", "", fmt.Errorf("admin address %q is neither unix:/path/to.sock nor HOST:PORT", s)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", "", fmt.Errorf("admin address %q: port %q is not a number from 0 to 65535", s, port)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", "", fmt.Errorf("admin address %q: the admin endpoint listens on loopback (127.0.0.1:PORT, [::1]:PORT, localhost:PORT) or a unix socket (unix:/path) only, since it has no authentication", s)
	}
	return "tcp", s, nil
}

// Handlers are the two endpoints of one set of sources. Admin serves GET /metrics (Prometheus
// text format), GET /stats (StatsResponse as JSON), the admin actions, Go's profiles under
// /debug/pprof/ and a short index at /: loopback or a unix socket only. Metrics serves GET
// /metrics and /stats alone, for any address. Both count the same flushes in progress.
type Handlers struct{ Admin, Metrics http.Handler }

// NewHandlers makes the handlers of sources, which is called on every request, so exports may
// come and go. more are further collectors for /metrics, such as RefusedConnections; DaemonStats
// among them shows in /stats too.
func NewHandlers(sources func() []Source, more ...prometheus.Collector) Handlers {
	flushes := newFlushTracker()
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		cacheCollector{sources: sources, flushes: flushes},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	reg.MustRegister(more...)
	var daemon func() Daemon
	for _, c := range more {
		if d, ok := c.(daemonCollector); ok {
			daemon = d.read
		}
	}
	// A "GET" pattern also matches HEAD; ServeMux answers other methods with 405 and other paths
	// with 404.
	readOnly := func(mux *http.ServeMux) {
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
			resp := StatsResponse{Exports: []ExportStats{}}
			for _, s := range sources() {
				if s.Stats == nil {
					continue
				}
				es := ExportStats{Name: s.Export, Stats: s.Stats()}
				if s.Replicas != nil {
					es.Replicas = s.Replicas()
				}
				if s.Curves != nil {
					es.Curves = s.Curves()
				}
				resp.Exports = append(resp.Exports, es)
			}
			if daemon != nil {
				d := daemon()
				resp.Process, resp.Memory = &d.Process, &d.Memory
			}
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(resp) // an error here is the client going away; nothing to tell it
		})
	}
	const index = "/metrics  Prometheus metrics\n/stats    cache statistics of every export, as JSON (tierblk stats prints them)\n"
	admin := http.NewServeMux()
	readOnly(admin)
	admin.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "tierblk admin endpoint\n\n"+index+
			"POST /flush?export=NAME         write every dirty line back and flush the backend (tierblk flush)\n"+
			"POST /mode?export=NAME&mode=M   switch the cache's mode (tierblk mode)\n"+
			"POST /heal?export=NAME          retry a bypassed SSD tier now (tierblk heal)\n"+
			"POST /scrub?export=NAME&rate=R  read and check every block of the SSD tier (tierblk scrub)\n"+
			"/debug/pprof/                   Go profiles: CPU, heap, goroutines, mutex contention (go tool pprof)\n")
	})
	handleActions(admin, sources, flushes)
	handleProfiles(admin)
	public := http.NewServeMux()
	readOnly(public)
	public.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "tierblk metrics endpoint\n\n"+index)
	})
	return Handlers{Admin: guard(admin), Metrics: public}
}

// NewHandler is NewHandlers' admin handler.
func NewHandler(sources func() []Source, more ...prometheus.Collector) http.Handler {
	return NewHandlers(sources, more...).Admin
}

// handleProfiles serves Go's profiles (net/http/pprof) under /debug/pprof/, for finding where the
// daemon spends its time and which locks it waits on (tierblk serve samples mutex contention); the
// endpoint is loopback or a unix socket only (ListenAddr).
func handleProfiles(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
