package sim

import (
	"fmt"
	"io"
	"time"

	"github.com/tierblk/tierblk/internal/trace"
)

// progressEvery is how often a progress line is redrawn (a variable for tests).
var progressEvery = time.Second

// startProgress redraws a line on w every progressEvery while a pass runs: what it does, the
// requests done, the rate, and where r reports its position in a file of known size, the share
// read and the time left. The returned stop ends it, with a last line counting total requests if
// any line was drawn. A nil w shows nothing.
func startProgress(w io.Writer, what string, r trace.Reader, done interface{ Load() int64 }) (stop func(total int64)) {
	if w == nil {
		return func(int64) {}
	}
	pos, _ := r.(trace.Positioner)
	start := time.Now()
	quit, exited := make(chan struct{}), make(chan struct{})
	drawn := false
	go func() {
		defer close(exited)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			n := done.Load()
			elapsed := time.Since(start)
			line := fmt.Sprintf("%s: %s requests, %.1fM/s", what, count(n), float64(n)/elapsed.Seconds()/1e6)
			if pos != nil {
				if read, size := pos.Position(); size > 0 && read > 0 {
					frac := min(float64(read)/float64(size), 1)
					left := time.Duration(float64(elapsed) * (1 - frac) / frac)
					line += fmt.Sprintf(", %.0f%%, %s left", 100*frac, left.Round(time.Second))
				}
			}
			fmt.Fprintf(w, "\r%-78s", line)
			drawn = true
		}
	}()
	return func(total int64) {
		close(quit)
		<-exited
		if drawn {
			elapsed := time.Since(start)
			fmt.Fprintf(w, "\r%-78s\n", fmt.Sprintf("%s: %s requests in %s, %.1fM/s", what, count(total),
				elapsed.Round(100*time.Millisecond), float64(total)/elapsed.Seconds()/1e6))
		}
	}
}

// count writes n in the shortest of units, thousands or millions.
func count(n int64) string {
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
