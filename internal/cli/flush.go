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
		Short: "Write every dirty line of a running daemon's cache back to the backend",
		Long: `Asks a running daemon to write every dirty line of an export's cache (write-back) back to the
backend and flush the backend, and shows the progress. It exits 0 only once the backend holds
everything the cache has acknowledged, e.g. before taking a snapshot of the backend. The cache
stays in its mode: new writes are absorbed as before. Interrupting it stops the flush; the dirty
data stays safe on the SSD.`,
		Example: `  tierblk flush --admin unix:/run/tierblk/admin.sock
  tierblk flush --admin 127.0.0.1:9810 --export nas`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.bind(cmd)
			return runFlush(cmd.Context(), o)
		},
	}
	o.flags(cmd)
	return cmd
}

func runFlush(ctx context.Context, o actionOpts) error {
	if err := runAction(ctx, o, "flush", nil); err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "%s: every dirty line written back; the backend holds everything written\n", exportLabel(o.export))
	return nil
}

// runAction POSTs /path to the admin endpoint with query (and the export), shows the progress
// lines and returns the final line's error.
func runAction(ctx context.Context, o actionOpts, path string, query url.Values) error {
	if o.admin == "" {
		return usageErrorf("--admin is required: the daemon's admin endpoint, unix:/path/to.sock or 127.0.0.1:PORT")
	}
	network, address, err := metrics.ParseAdminAddr(o.admin)
	if err != nil {
		return usageErrorf("--admin: %v", err)
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
		return err
	}
	resp, err := adminDo(client, req)
	var se *statusError
	if errors.As(err, &se) {
		return fmt.Errorf("%s: %s", path, se.Body)
	}
	if err != nil {
		return fmt.Errorf("no tierblk admin endpoint at %s: %w", o.admin, err)
	}
	defer resp.Body.Close()
	p := progress{w: o.stdout, bar: o.bar}
	defer p.end()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l metrics.ActionLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("POST /%s: the answer is not tierblk's: %w", path, err)
		}
		switch {
		case l.OK:
			return nil
		case l.Error != "":
			return fmt.Errorf("%s: %s failed: %s", exportLabel(o.export), path, l.Error)
		default:
			p.show(l.Done, l.Total)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %s: the daemon stopped answering before it finished: %w", exportLabel(o.export), path, err)
	}
	return fmt.Errorf("%s: %s: the daemon stopped answering before it finished", exportLabel(o.export), path)
}

// exportLabel names an export in messages.
func exportLabel(export string) string {
	if export == "" {
		return "the default export"
	}
	return fmt.Sprintf("export %q", export)
}

// progress shows dirty bytes written back: a bar redrawn in place on a terminal, else a line each.
type progress struct {
	w     io.Writer
	bar   bool
	drawn bool
}

const barWidth = 40

func (p *progress) show(done, total int64) {
	pct := int64(100)
	if total > 0 {
		pct = done * 100 / total
	}
	if !p.bar {
		fmt.Fprintf(p.w, "written back %s of %s (%d%%)\n", humanBytes(uint64(done)), humanBytes(uint64(total)), pct)
		return
	}
	n := int(pct * barWidth / 100)
	fmt.Fprintf(p.w, "\r[%s%s] %3d%% %s of %s", strings.Repeat("#", n), strings.Repeat(" ", barWidth-n), pct,
		humanBytes(uint64(done)), humanBytes(uint64(total)))
	p.drawn = true
}

// end leaves the line of the bar, so what follows starts on its own.
func (p *progress) end() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
