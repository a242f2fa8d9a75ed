package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tierblk/tierblk/internal/cache"
)

// ActionLine is one line of the JSON-lines answer of POST /flush, POST /mode and POST /heal: progress lines
// {"done":N,"total":N} (of the bytes dirty when the flush started, total, those on the backend so
// far, done; the first line comes at the start, with done 0), then one final line,
// {"ok":true} or {"error":"..."}. An answer without a final line was cut short.
type ActionLine struct {
	Done  int64  `json:"done,omitempty"`
	Total int64  `json:"total,omitempty"`
	OK    bool   `json:"ok,omitempty"`
	Error string `json:"error,omitempty"`
}

// Final reports whether l ends an answer.
func (l ActionLine) Final() bool { return l.OK || l.Error != "" }

// action runs on a validated export; progress streams ActionLines.
type action func(ctx context.Context, s Source, progress func(done, total int64)) error

// handleActions serves the actions; flushes learns of every flush and mode switch while it runs
// (a mode switch may write every dirty line back too), for /metrics.
func handleActions(mux *http.ServeMux, sources func() []Source, flushes *flushTracker) {
	mux.Handle("POST /flush", actionHandler(sources, func(r *http.Request) (action, error) {
		return func(ctx context.Context, s Source, progress func(done, total int64)) error {
			defer flushes.begin(s.Export)()
			return s.FlushAll(ctx, progress)
		}, nil
	}))
	mux.Handle("POST /mode", actionHandler(sources, func(r *http.Request) (action, error) {
		name := r.URL.Query().Get("mode")
		if name == "" {
			return nil, errors.New("no mode given; use /mode?export=NAME&mode=writethrough|writearound|passthrough|writeback")
		}
		m, err := cache.ParseMode(name)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, s Source, progress func(done, total int64)) error {
			defer flushes.begin(s.Export)()
			return s.SetMode(ctx, m, progress)
		}, nil
	}))
	mux.Handle("POST /heal", actionHandler(sources, func(r *http.Request) (action, error) {
		return func(_ context.Context, s Source, _ func(done, total int64)) error {
			if s.Heal == nil {
				return errors.New("this export's cache cannot be healed")
			}
			return s.Heal()
		}, nil
	}))
	// The actions change the cache, so they are refused on any other method: a GET (a browser, a
	// crawler, a prefetch) must never flush, switch modes or bring a tier back.
	for _, path := range []string{"/flush", "/mode", "/heal"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, fmt.Sprintf("%s %s: %s changes the cache and takes POST only", r.Method, path, path), http.StatusMethodNotAllowed)
		})
	}
}

// actionHandler finds the export named by ?export= (absent: the default export, the first), checks
// it has a cache and runs the action parse makes of the request, streaming its progress. Errors
// found before the action starts are plain HTTP errors; once it has started, the status is 200 and
// the outcome is the final ActionLine.
func actionHandler(sources func() []Source, parse func(*http.Request) (action, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		src, code, err := findExport(sources(), r)
		if err != nil {
			http.Error(w, err.Error(), code)
			return
		}
		run, err := parse(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/jsonl")
		w.WriteHeader(http.StatusOK)
		flush := func() {
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
		flush() // the client learns at once that the action has started
		enc := json.NewEncoder(w)
		send := func(l ActionLine) {
			enc.Encode(l) // an error here is the client going away, which cancels r.Context()
			flush()
		}
		// A line per whole percent: enough for a progress bar, and a bounded answer however many
		// lines are written back.
		last := int64(-1)
		err = run(r.Context(), src, func(done, total int64) {
			pct := int64(100)
			if total > 0 {
				pct = done * 100 / total
			}
			if pct != last {
				last = pct
				send(ActionLine{Done: done, Total: total})
			}
		})
		if err != nil {
			send(ActionLine{Error: err.Error()})
			return
		}
		send(ActionLine{OK: true})
	})
}

func findExport(sources []Source, r *http.Request) (Source, int, error) {
	q := r.URL.Query()
	name, named := q.Get("export"), q.Has("export")
	var names []string
	for i, s := range sources {
		names = append(names, fmt.Sprintf("%q", s.Export))
		if s.Export != name && (named || i > 0) {
			continue
		}
		if s.Stats == nil || s.FlushAll == nil || s.SetMode == nil {
			return Source{}, http.StatusConflict, fmt.Errorf("export %q has no cache", s.Export)
		}
		return s, 0, nil
	}
	if len(sources) == 0 {
		return Source{}, http.StatusNotFound, errors.New("the daemon serves no exports")
	}
	return Source{}, http.StatusNotFound, fmt.Errorf("no export %q; the daemon serves %s", name, strings.Join(names, ", "))
}

// CacheSource is the Source of an export served through c.
func CacheSource(export string, c *cache.Cache) Source {
	return Source{Export: export, Stats: c.Stats, FlushAll: c.FlushAll, SetMode: c.SetMode, Heal: c.Heal}
}
