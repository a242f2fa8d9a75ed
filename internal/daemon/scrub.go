package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/units"
)

// scrubber is what a schedule scrubs: a cache with an SSD tier (cache.Cache.Scrub).
type scrubber interface {
	Scrub(ctx context.Context, rate int64) (cache.ScrubStats, error)
}

// scheduledScrub is one export's scrub schedule (config.Scrub): every every, at up to rate bytes a
// second (0: no limit).
type scheduledScrub struct {
	export string
	c      scrubber
	every  time.Duration
	rate   int64
}

// scrubSchedules returns the schedules of the exports whose caches have an SSD tier and a scrub
// every so often (cfg is valid; caches[i] is exports[i]'s cache, nil for one without).
func scrubSchedules(cfg config.Config, caches []*cache.Cache, log *slog.Logger) []scheduledScrub {
	var out []scheduledScrub
	for i, e := range cfg.Exports {
		if e.Cache == nil || e.Cache.SSD == "" || caches[i] == nil {
			continue
		}
		every, rate, err := e.Cache.Scrub.Schedule()
		if err != nil || every == 0 {
			log.Info("no scheduled scrub of the SSD tier", "export", e.Name)
			continue
		}
		limit := "none"
		if rate > 0 {
			limit = units.FormatSize(rate) + "/s"
		}
		log.Info("scrub of the SSD tier scheduled", "export", e.Name, "every", every, "rate", limit)
		out = append(out, scheduledScrub{export: e.Name, c: caches[i], every: every, rate: rate})
	}
	return out
}

// ticker is what a schedule waits on: time.NewTicker's channel, whose values are the times of the
// turns, and Stop; or a test's.
type ticker func(d time.Duration) (c <-chan time.Time, stop func())

func realTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// scheduleScrubs runs each schedule's scrubs, the first every after now and then every every,
// until stop, which cancels a scrub under way and waits for it to end. A turn that comes while a
// scrub runs (one started by hand, `tierblk scrub`, or the last turn's, still going) is skipped,
// not made up for later: a scrub reads the whole tier, and back to back they would leave the SSD
// no rest.
func scheduleScrubs(scrubs []scheduledScrub, tick ticker, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range scrubs {
		wg.Go(func() {
			turns, stopTicks := tick(s.every)
			defer stopTicks()
			var ended time.Time
			for {
				select {
				case <-ctx.Done():
					return
				case at := <-turns:
					if at.Before(ended) {
						log.Info("scheduled scrub skipped: the last one ran past its turn", "export", s.export)
						continue
					}
				}
				log.Info("scheduled scrub of the SSD tier", "export", s.export)
				st, err := s.c.Scrub(ctx, s.rate)
				switch {
				case ctx.Err() != nil:
					return
				case errors.Is(err, cache.ErrScrubRunning):
					log.Info("scheduled scrub skipped: a scrub of the SSD tier is already running", "export", s.export)
				case err != nil:
					log.Warn("scheduled scrub of the SSD tier failed", "export", s.export, "err", err)
				case st.Lost > 0:
					log.Error("scheduled scrub: dirty data on the SSD tier failed its checksums and is lost; tierblk stats lists the ranges",
						"export", s.export, "damaged_blocks", st.Damaged, "lost_blocks", st.Lost)
				case st.Damaged > 0:
					log.Warn("scheduled scrub: cached data on the SSD tier failed its checksums; it is read from the backend again. Check the SSD's health",
						"export", s.export, "damaged_blocks", st.Damaged)
				}
				// A turn that came while this one ran (a ticker keeps one) is skipped.
				ended = time.Now()
			}
		})
	}
	return sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})
}
