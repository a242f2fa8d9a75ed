package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/units"
)

// ActionLine is one line of the JSON-lines answer of POST /flush, /mode, /heal and /scrub:
// progress lines {"done":N,"total":N} (flush and mode: of the bytes dirty when the flush started,
// total, those on the backend so far, done; the first line comes at the start, with done 0;
// scrub: of the lines the SSD tier held when it started, those checked so far, with the scrub's
// figures so far in scrub), then one final line, {"ok":true} (scrub: with its figures in scrub
// and the lost ranges after it in lost) or {"error":"..."}. An answer without a final line was cut
// short.
type ActionLine struct {
	Done  int64  `json:"done,omitempty"`
	Total int64  `json:"total,omitempty"`
	OK    bool   `json:"ok,omitempty"`
	Error string `json:"error,omitempty"`
	// Scrub is POST /scrub's (see above); Lost is POST /scrub's, and POST /flush's when data is
	// lost (the backend then holds older data in the ranges).
	Scrub *cache.ScrubStats `json:"scrub,omitempty"`
	Lost  *cache.LostStats  `json:"lost,omitempty"`
}

// Final reports whether l ends an answer.
func (l ActionLine) Final() bool { return l.OK || l.Error != "" }

// action runs on a validated export; progress streams its progress lines (Done and Total, and
// what else the action reports). On success, what final holds goes in the final line.
type action func(ctx context.Context, s Source, progress func(ActionLine)) (final ActionLine, err error)

// byteProgress is the progress func of a flush, which reports bytes written back.
func byteProgress(progress func(ActionLine)) func(done, total int64) {
	return func(done, total int64) { progress(ActionLine{Done: done, Total: total}) }
}

// refusal is an error found before an action starts that is not the request's fault (400) but
// the export's: it answers with code.
type refusal struct {
	code int
	err  error
}

func (r *refusal) Error() string { return r.err.Error() }

// scrubPoll is how often POST /scrub reads the scrub's progress (the cache reports it in its
// stats, not through a callback): a progress line at most each time.
var scrubPoll = time.Second

// handleActions serves the actions; flushes learns of every flush and mode switch while it runs
// (a mode switch may write every dirty line back too), for /metrics.
func handleActions(mux *http.ServeMux, sources func() []Source, flushes *flushTracker) {
	mux.Handle("POST /flush", actionHandler(sources, func(*http.Request, Source) (action, error) {
		return func(ctx context.Context, s Source, progress func(ActionLine)) (ActionLine, error) {
			defer flushes.begin(s.Export)()
			if err := s.FlushAll(ctx, byteProgress(progress)); err != nil {
				return ActionLine{}, err
			}
			// What the SSD tier damaged before it was written back is not on the backend: the
			// final line says so (tierblk flush then fails).
			var final ActionLine
			if lost := s.Stats().Lost; lost.Bytes > 0 {
				final.Lost = &lost
			}
			return final, nil
		}, nil
	}))
	mux.Handle("POST /mode", actionHandler(sources, func(r *http.Request, _ Source) (action, error) {
		name := r.URL.Query().Get("mode")
		if name == "" {
			return nil, errors.New("no mode given; use /mode?export=NAME&mode=writethrough|writearound|passthrough|writeback")
		}
		m, err := cache.ParseMode(name)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, s Source, progress func(ActionLine)) (ActionLine, error) {
			defer flushes.begin(s.Export)()
			return ActionLine{}, s.SetMode(ctx, m, byteProgress(progress))
		}, nil
	}))
	mux.Handle("POST /heal", actionHandler(sources, func(*http.Request, Source) (action, error) {
		return func(_ context.Context, s Source, _ func(ActionLine)) (ActionLine, error) {
			if s.Heal == nil {
				return ActionLine{}, errors.New("this export's cache cannot be healed")
			}
			return ActionLine{}, s.Heal()
		}, nil
	}))
	mux.Handle("POST /scrub", actionHandler(sources, parseScrub))
	// The actions change the cache, so they are refused on any other method: a GET (a browser, a
	// crawler, a prefetch) must never flush, switch modes, bring a tier back or start a scrub.
	for _, path := range []string{"/flush", "/mode", "/heal", "/scrub"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, fmt.Sprintf("%s %s: %s changes the cache and takes POST only", r.Method, path, path), http.StatusMethodNotAllowed)
		})
	}
}

// parseScrub makes POST /scrub's action: a scrub of the export's SSD tier at up to ?rate= bytes a
// second (absent or 0: as fast as the SSD goes). An export that cannot be scrubbed now, or at all,
// is refused before the answer starts, so that the status says so.
func parseScrub(r *http.Request, s Source) (action, error) {
	var rate int64
	if q := r.URL.Query(); q.Has("rate") {
		var err error
		if rate, err = units.ParseRate(q.Get("rate")); err != nil {
			return nil, err
		}
	}
	if s.Scrub == nil {
		return nil, &refusal{http.StatusConflict, fmt.Errorf("export %q: its cache cannot be scrubbed", s.Export)}
	}
	st := s.Stats()
	if !slices.ContainsFunc(st.Tiers, func(t cache.TierStats) bool { return t.Name == "ssd" }) {
		return nil, &refusal{http.StatusConflict, fmt.Errorf("export %q has no SSD tier to scrub: only the SSD tier keeps checksums of its blocks", s.Export)}
	}
	if sc := st.Scrub; sc.Running {
		return nil, &refusal{http.StatusConflict, fmt.Errorf("export %q: a scrub of its SSD tier is already running (%d of %d lines checked); wait for it to end (tierblk stats shows it)",
			s.Export, sc.Done, sc.Lines)}
	}
	return func(ctx context.Context, s Source, progress func(ActionLine)) (ActionLine, error) {
		return runScrub(ctx, s, rate, progress)
	}, nil
}

// runScrub runs the scrub and reports its progress from the cache's stats, a line whenever it has
// moved since the last; its final line has the scrub's figures and the lost ranges after it.
func runScrub(ctx context.Context, s Source, rate int64, progress func(ActionLine)) (ActionLine, error) {
	type result struct {
		st  cache.ScrubStats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := s.Scrub(ctx, rate)
		done <- result{st, err}
	}()
	tick := time.NewTicker(scrubPoll)
	defer tick.Stop()
	var last cache.ScrubStats
	for {
		select {
		case r := <-done:
			if r.err != nil {
				return ActionLine{}, r.err
			}
			lost := s.Stats().Lost
			return ActionLine{Scrub: &r.st, Lost: &lost}, nil
		case <-tick.C:
			// Not running: not started yet, or just ended (the result is on its way).
			if st := s.Stats().Scrub; st.Running && st != last {
				last = st
				progress(ActionLine{Done: int64(st.Done), Total: int64(st.Lines), Scrub: &st})
			}
		}
	}
}

// actionHandler finds the export named by ?export= (absent: the default export, the first), checks
// it has a cache and runs the action parse makes of the request, streaming its progress. Errors
// found before the action starts are plain HTTP errors; once it has started, the status is 200 and
// the outcome is the final ActionLine.
func actionHandler(sources func() []Source, parse func(*http.Request, Source) (action, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		src, code, err := findExport(sources(), r)
		if err != nil {
			http.Error(w, err.Error(), code)
			return
		}
		run, err := parse(r, src)
		if err != nil {
			code := http.StatusBadRequest
			var ref *refusal
			if errors.As(err, &ref) {
				code = ref.code
			}
			http.Error(w, err.Error(), code)
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
		// lines are written back. A scrub's lines come at most once a scrubPoll, each with
		// figures of its own (damaged blocks found), and all go.
		last := int64(-1)
		final, err := run(r.Context(), src, func(l ActionLine) {
			pct := int64(100)
			if l.Total > 0 {
				pct = l.Done * 100 / l.Total
			}
			if pct != last || l.Scrub != nil {
				last = pct
				send(l)
			}
		})
		if err != nil {
			send(ActionLine{Error: err.Error()})
			return
		}
		final.OK = true
		send(final)
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
		if s.FlushAll == nil || s.SetMode == nil { // an export served without a cache
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
	return Source{Export: export, Stats: c.Stats, FlushAll: c.FlushAll, SetMode: c.SetMode, Heal: c.Heal, Scrub: c.Scrub}
}
