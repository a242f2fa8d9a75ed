package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/metrics"
)

// actionOpts are the flags shared by the commands that drive a running daemon's cache.
type actionOpts struct {
	admin  string
	export string
	stdout io.Writer
	// bar draws the progress as a bar redrawn in place (stdout is a terminal) rather than as lines.
	bar bool
	// now is the clock the progress's estimate of the time left reads; nil: time.Now.
	now func() time.Time
}

func (o *actionOpts) flags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.admin, "admin", "", "the daemon's admin endpoint: unix:/path/to.sock or a loopback HOST:PORT")
	f.StringVar(&o.export, "export", "", "the export (default: the default export, the first)")
}

// bind sets what a command prints to.
func (o *actionOpts) bind(cmd *cobra.Command) {
	o.stdout = cmd.OutOrStdout()
	o.bar = isTerminal(o.stdout)
}

func newFlushCmd() *cobra.Command {
	o := actionOpts{}
	cmd := &cobra.Command{
		Use:   "flush",
		Short: "Write the dirty data of a running daemon's cache back to the backend",
		Long: `Asks a running daemon to write the dirty data of an export's cache (write-back) back to the
backend and flush the backend, and shows the progress with an estimate of the time left. It exits
0 only once the backend holds every write the cache acknowledged before the flush started, e.g.
before taking a snapshot of the backend (stop the writers first for a consistent one). It ends
while clients keep writing: it writes back the data that was dirty when it started, not what is
written meanwhile, which the cache absorbs as before (it stays in its mode). Interrupting it stops
the flush; the dirty data stays safe on the SSD.`,
		Example: `  tierblk flush --admin unix:/run/tierblk/admin.sock
  tierblk flush --admin 127.0.0.1:9810 --export nas`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.bind(cmd)
			return runFlush(cmd.Context(), o)
		},
	}
	o.flags(cmd)
	return cmd
}

func runFlush(ctx context.Context, o actionOpts) error {
	final, err := doAction(ctx, o, "flush", nil, nil)
	if err != nil {
		return err
	}
	if final.Lost != nil && final.Lost.Bytes > 0 {
		writeLostRanges(o.stdout, *final.Lost)
		return fmt.Errorf("%s: dirty data written back, but for %s the SSD tier damaged before it could be: there the backend holds older data, and reads fail (EIO) until the ranges are written again",
			exportLabel(o.export), humanBytes(final.Lost.Bytes))
	}
	fmt.Fprintf(o.stdout, "%s: dirty data written back; the backend holds every write acknowledged before the flush\n", exportLabel(o.export))
	return nil
}

// runAction POSTs /path to the admin endpoint with query (and the export), shows the progress
// lines (bytes written back) and returns the final line's error.
func runAction(ctx context.Context, o actionOpts, path string, query url.Values) error {
	_, err := doAction(ctx, o, path, query, nil)
	return err
}

// doAction is runAction with the progress lines described by describe (nil: bytes written back,
// see progress), returning the final line too.
func doAction(ctx context.Context, o actionOpts, path string, query url.Values,
	describe func(l metrics.ActionLine, pct int64) (line, bar string)) (metrics.ActionLine, error) {
	if o.admin == "" {
		return metrics.ActionLine{}, usageErrorf("--admin is required: the daemon's admin endpoint, unix:/path/to.sock or 127.0.0.1:PORT")
	}
	network, address, err := metrics.ParseAdminAddr(o.admin)
	if err != nil {
		return metrics.ActionLine{}, usageErrorf("--admin: %v", err)
	}
	if query == nil {
		query = url.Values{}
	}
	if o.export != "" {
		query.Set("export", o.export)
	}
	client := adminClient(network, address)
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, adminURL(network, address, path+"?"+query.Encode()), nil)
	if err != nil {
		return metrics.ActionLine{}, err
	}
	resp, err := adminDo(client, req)
	var se *statusError
	if errors.As(err, &se) {
		return metrics.ActionLine{}, fmt.Errorf("%s: %s", path, se.Body)
	}
	if err != nil {
		return metrics.ActionLine{}, fmt.Errorf("no tierblk admin endpoint at %s: %w", o.admin, err)
	}
	defer resp.Body.Close()
	p := progress{w: o.stdout, bar: o.bar, now: o.now, describe: describe}
	defer p.end()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l metrics.ActionLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return metrics.ActionLine{}, fmt.Errorf("POST /%s: the answer is not tierblk's: %w", path, err)
		}
		switch {
		case l.OK:
			return l, nil
		case l.Error != "":
			return l, fmt.Errorf("%s: %s failed: %s", exportLabel(o.export), path, l.Error)
		default:
			p.show(l)
		}
	}
	if err := sc.Err(); err != nil {
		return metrics.ActionLine{}, fmt.Errorf("%s: %s: the daemon stopped answering before it finished: %w", exportLabel(o.export), path, err)
	}
	return metrics.ActionLine{}, fmt.Errorf("%s: %s: the daemon stopped answering before it finished", exportLabel(o.export), path)
}

// exportLabel names an export in messages.
func exportLabel(export string) string {
	if export == "" {
		return "the default export"
	}
	return fmt.Sprintf("export %q", export)
}

// progress shows an action's progress, dirty bytes written back unless describe says otherwise,
// with an estimate of the time left from the rate measured since the first report: a bar redrawn
// in place on a terminal, else a line each.
type progress struct {
	w   io.Writer
	bar bool
	now func() time.Time
	// describe says what a progress line reports: as a line of its own (before the estimate), and
	// after the bar's percentage; nil: bytes written back.
	describe func(l metrics.ActionLine, pct int64) (line, bar string)
	drawn    int // the length of the bar's line last drawn, 0 if none

	started bool
	t0      time.Time
	done0   int64
}

const barWidth = 40

func (p *progress) show(l metrics.ActionLine) {
	done, total := l.Done, l.Total
	pct := int64(100)
	if total > 0 {
		pct = done * 100 / total
	}
	eta := p.eta(done, total)
	describe := p.describe
	if describe == nil {
		describe = writtenBack
	}
	text, barText := describe(l, pct)
	if !p.bar {
		fmt.Fprintf(p.w, "%s%s\n", text, eta)
		return
	}
	n := int(pct * barWidth / 100)
	line := fmt.Sprintf("[%s%s] %3d%% %s%s", strings.Repeat("#", n), strings.Repeat(" ", barWidth-n), pct, barText, eta)
	// Spaces over what is left of a longer line drawn before (its estimate).
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", max(0, p.drawn-len(line))))
	p.drawn = len(line)
}

// writtenBack describes the progress of a flush (or a mode switch): bytes written back.
func writtenBack(l metrics.ActionLine, pct int64) (line, bar string) {
	of := humanBytes(uint64(l.Done)) + " of " + humanBytes(uint64(l.Total))
	return fmt.Sprintf("written back %s (%d%%)", of, pct), of
}

// eta is ", about D left" from the rate since the first report, or nothing before there is one
// (the first report, no progress yet) or once done.
func (p *progress) eta(done, total int64) string {
	now := time.Now
	if p.now != nil {
		now = p.now
	}
	t := now()
	if !p.started {
		p.started, p.t0, p.done0 = true, t, done
		return ""
	}
	elapsed := t.Sub(p.t0)
	if done >= total || done <= p.done0 || elapsed <= 0 {
		return ""
	}
	left := time.Duration(float64(elapsed) * float64(total-done) / float64(done-p.done0))
	return ", about " + roughDuration(left) + " left"
}

// roughDuration rounds d for an estimate: to seconds, to minutes from an hour on.
func roughDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return "1s"
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

// end leaves the line of the bar, so what follows starts on its own.
func (p *progress) end() {
	if p.drawn > 0 {
		fmt.Fprintln(p.w)
	}
}
