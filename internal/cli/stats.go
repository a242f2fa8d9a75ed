package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/replica"
	"github.com/tierblk/tierblk/internal/units"
)

// statsTimeout bounds the whole request to the admin endpoint; a daemon that does not answer a
// snapshot in this time is reported rather than waited for.
const statsTimeout = 10 * time.Second

type statsOpts struct {
	admin  string
	json   bool
	export string
	stdout io.Writer
	// mrc prints the live curves in full (writeCurves).
	mrc bool
	// now is the clock that says how long ago a scrub ran; nil: time.Now.
	now func() time.Time
	// only, if not nil, is given the exports instead of their being printed (tierblk mrc).
	only func([]metrics.ExportStats) error
}

func newStatsCmd() *cobra.Command {
	o := statsOpts{}
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Print the cache statistics of a running daemon",
		Long: `Asks a running daemon's admin endpoint for a snapshot of every export's cache and prints, per
tier, hits, misses, occupancy, promotions, evictions and errors; the backend's traffic; dirty data
(write-back: dirty lines and bytes, what was destaged, throttled writes); blocks that failed their
checksums, lost data and the SSD tier's scrub, when there are any; and the request latency
quantiles, estimated from the latency histograms as Prometheus does.`,
		Example: `  tierblk stats --admin unix:/run/tierblk/admin.sock
  tierblk stats --admin 127.0.0.1:9810 --export nas --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stdout = cmd.OutOrStdout()
			return runStats(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.admin, "admin", "", "the daemon's admin endpoint: unix:/path/to.sock or a loopback HOST:PORT")
	f.BoolVar(&o.json, "json", false, "print the snapshot as JSON")
	f.StringVar(&o.export, "export", "", "only this export")
	f.BoolVar(&o.mrc, "mrc", false, "print the live miss-ratio curves in full: a table of every policy at every size, and a plot")
	return cmd
}

func runStats(ctx context.Context, o statsOpts) error {
	if o.admin == "" {
		return usageErrorf("--admin is required: the daemon's admin endpoint, unix:/path/to.sock or 127.0.0.1:PORT")
	}
	network, address, err := metrics.ParseAdminAddr(o.admin)
	if err != nil {
		return usageErrorf("--admin: %v", err)
	}
	resp, err := fetchStats(ctx, network, address)
	if err != nil {
		return fmt.Errorf("no tierblk admin endpoint at %s: %w", o.admin, err)
	}
	if o.export != "" {
		var names []string
		var only []metrics.ExportStats
		for _, e := range resp.Exports {
			names = append(names, e.Name)
			if e.Name == o.export {
				only = append(only, e)
			}
		}
		if len(only) == 0 {
			return fmt.Errorf("--export %q: the daemon at %s has no such export; it serves: %s", o.export, o.admin, strings.Join(names, ", "))
		}
		resp.Exports = only
	}
	if o.only != nil {
		return o.only(resp.Exports)
	}
	if o.json {
		enc := json.NewEncoder(o.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(resp)
	}
	now := time.Now
	if o.now != nil {
		now = o.now
	}
	for i, e := range resp.Exports {
		if i > 0 {
			fmt.Fprintln(o.stdout)
		}
		writeExportStats(o.stdout, e, now())
		if o.mrc && e.Curves != nil {
			writeCurves(o.stdout, e.Curves, false)
		}
	}
	writeDaemon(o.stdout, resp.Process, resp.Memory)
	return nil
}

// writeDaemon prints the daemon's own lines: its memory against its bound, by part, and what it
// asked of the kernel for itself; nothing from a daemon that does not report them.
func writeDaemon(w io.Writer, p *metrics.ProcessStats, m *metrics.MemoryStats) {
	if m != nil {
		fmt.Fprintf(w, "\nmemory: holds %s (peak %s) of its bound %s; resident %s (with the binary's pages)\n",
			humanBytes(m.Held), humanBytes(m.HeldPeak), humanBytes(m.Bound), humanBytes(m.RSS))
		fmt.Fprintf(w, "memory by part: RAM tier %s, index %s, metadata store %s at most, request buffers %s of %s, cache buffers %s at most, runtime %s\n",
			humanBytes(m.RAMTier), humanBytes(m.Index), humanBytes(m.Metadata), humanBytes(m.IO), humanBytes(m.IOMax),
			humanBytes(m.Work), humanBytes(m.Runtime))
		fmt.Fprintf(w, "memory of Go: heap %s, runtime %s\n", humanBytes(m.GoHeap), humanBytes(m.GoOther))
	}
	if p != nil {
		flusher := "yes"
		if !p.IOFlusher {
			why := p.IOFlusherError
			if why == "" { // a daemon that does not say
				why = "not root, or in a container"
			}
			flusher = "no (" + why + "): a writer on a device it serves may stall it"
		}
		locked := ""
		if p.MemoryLocked {
			locked = ", memory locked"
		}
		fmt.Fprintf(w, "process: I/O flusher %s, oom_score_adj %d%s\n", flusher, p.OOMScoreAdj, locked)
	}
}

// adminClient dials network/address whatever a request URL's host says, so one client serves
// both TCP and unix sockets.
// adminURL is the URL of path on the admin endpoint: over TCP it names the endpoint's address,
// as the endpoint requires (a loopback host: see metrics.guard); a unix socket's has any host.
func adminURL(network, address, path string) string {
	if network == "tcp" {
		return "http://" + address + "/" + path
	}
	return "http://tierblk-admin/" + path
}

func adminClient(network, address string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: statsTimeout}
			return d.DialContext(ctx, network, address)
		},
	}}
}

// statusError is an answer of the admin endpoint other than 200; Body is its explanation.
type statusError struct {
	Method, Path, Status, Body string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.Path, e.Status, e.Body)
}

// adminDo sends req to the admin endpoint and returns the response if its status is 200, else a
// *statusError.
func adminDo(client *http.Client, req *http.Request) (*http.Response, error) {
	resp, err := client.Do(req)
	if ue, ok := err.(*url.Error); ok {
		// The URL is made up (see adminClient); the dial error names the real address.
		return nil, ue.Err
	}
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, &statusError{Method: req.Method, Path: req.URL.Path, Status: resp.Status, Body: strings.TrimSpace(string(body))}
	}
	return resp, nil
}

// fetchStats gets /stats from the admin endpoint.
func fetchStats(ctx context.Context, network, address string) (metrics.StatsResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	client := adminClient(network, address)
	defer client.CloseIdleConnections()
	var out metrics.StatsResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL(network, address, "stats"), nil)
	if err != nil {
		return out, err
	}
	resp, err := adminDo(client, req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("GET /stats: the answer is not tierblk stats: %w", err)
	}
	return out, nil
}

// writeExportStats prints an export's stats; now says how long ago its scrub ran.
func writeExportStats(w io.Writer, e metrics.ExportStats, now time.Time) {
	s := e.Stats
	name := e.Name
	if name == "" {
		name = `"" (the default export)`
	}
	if s.Mode == cache.StatsModeNone {
		fmt.Fprintf(w, "export %s: no cache, its backend served as it is\n", name)
	} else {
		fmt.Fprintf(w, "export %s: mode %s, line size %s\n", name, s.Mode, units.FormatSize(int64(s.LineSize)))
		writeTiers(w, s.Tiers)
	}
	b := s.Backend
	fmt.Fprintf(w, "backend: %d reads (%s), %d writes (%s), %d errors\n",
		b.Reads, humanBytes(b.ReadBytes), b.Writes, humanBytes(b.WriteBytes), b.Errors)
	writeMisses(w, s)
	writeStored(w, s.Tiers)
	writeDirty(w, s.Dirty)
	writeReplicas(w, e.Replicas)
	writeChecksums(w, s.Tiers)
	writeLost(w, s.Lost)
	writeScrub(w, s.Scrub, now)
	fmt.Fprintf(w, "latency: read %s; write %s\n", latencySummary(s.ReadLatency), latencySummary(s.WriteLatency))
	if e.Curves != nil {
		writeAdvice(w, e.Curves)
	}
}

// writeMisses prints what read misses cost the backend against what clients read (the read
// amplification), and each tier's admission answers.
func writeMisses(w io.Writer, s cache.Stats) {
	if len(s.Tiers) == 0 {
		return // every read goes to the backend as asked
	}
	amp := "-"
	if s.ReadBytes > 0 {
		amp = fmt.Sprintf("%.2f", float64(s.FetchedBytes)/float64(s.ReadBytes))
	}
	fmt.Fprintf(w, "reads: %s asked, %s fetched by misses (amplification %s)", humanBytes(s.ReadBytes), humanBytes(s.FetchedBytes), amp)
	for _, t := range s.Tiers {
		fmt.Fprintf(w, "; %s admission %s: %d admitted, %d rejected", t.Name, t.Admission, t.Admitted, t.Rejected)
		if t.Congested > 0 || t.CongestedNow {
			fmt.Fprintf(w, " (%d while its device was congested)", t.Congested)
		}
		if t.DeviceLatency > 0 {
			now := ""
			if t.CongestedNow {
				now = ", congested"
			}
			fmt.Fprintf(w, ", device %.2f ms a request%s", t.DeviceLatency*1e3, now)
		}
	}
	fmt.Fprintln(w)
}

// maxRatioShown is the largest reduction ratio the stats line prints: a tier whose blocks are
// nearly all zeros, which take no room, would show millions.
const maxRatioShown = 100

// writeStored prints what each tier stores: the bytes of its valid blocks as clients read them
// (logical), those on its device (physical) and their ratio, with the SSD tier's reduction.
func writeStored(w io.Writer, tiers []cache.TierStats) {
	if len(tiers) == 0 {
		return
	}
	fmt.Fprint(w, "stored:")
	for i, t := range tiers {
		if i > 0 {
			fmt.Fprint(w, ";")
		}
		ratio := "-" // only zero blocks: no ratio
		switch {
		case t.ReductionRatio > maxRatioShown: // nearly all zero blocks: a figure of no use
			ratio = fmt.Sprintf(">%dx", maxRatioShown)
		case t.ReductionRatio > 0:
			ratio = fmt.Sprintf("%.2fx", t.ReductionRatio)
		}
		fmt.Fprintf(w, " %s %s logical, %s physical (%s", t.Name, humanBytes(t.LogicalBytes), humanBytes(t.PhysicalBytes), ratio)
		if t.Reduction != "" {
			fmt.Fprintf(w, ", reduction %s", t.Reduction)
		}
		if t.DedupeHits > 0 {
			fmt.Fprintf(w, ", %d blocks deduped", t.DedupeHits)
		}
		if t.DedupeCollisions > 0 { // hashes that named other bytes: caught, never shared
			fmt.Fprintf(w, ", %d hash collisions", t.DedupeCollisions)
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintln(w)
}

// writeDirty prints the write-back figures of a cache with an SSD tier (a cache without one has no
// watermarks, and never dirty data).
func writeDirty(w io.Writer, d cache.DirtyStats) {
	if d.Max == 0 {
		return
	}
	state := "idle"
	if d.Destaging {
		state = "destaging"
	}
	if d.Destaging || d.DestageRate > 0 {
		state += " at " + humanBytes(uint64(d.DestageRate)) + "/s"
	}
	fmt.Fprintf(w, "dirty: %d lines (%.1f%%; high %.0f%%, low %.0f%%, max %.0f%%), %s; %s, %s destaged, %d destage errors; %d throttled writes (%s), delay now %s a line%s\n",
		d.Lines, 100*d.Ratio, 100*d.High, 100*d.Low, 100*d.Max, humanBytes(d.Bytes), state,
		humanBytes(d.DestagedBytes), d.DestageErrors, d.ThrottledWrites,
		seconds(d.ThrottleSeconds).Round(time.Millisecond), seconds(d.ThrottleDelay), backendWaits(d.BackendWaits))
	if d.Order == cache.OrderFlush {
		fmt.Fprintf(w, "write-back order: flush; %s\n", behind(d))
	}
}

// writeReplicas prints each write-back replica's state, its lag and a FLUSH's round trip to it.
func writeReplicas(w io.Writer, rs []replica.PeerStats) {
	for _, r := range rs {
		rtt := "no flush yet"
		if r.Flushes > 0 {
			rtt = "flush " + time.Duration(r.FlushNS/r.Flushes).Round(time.Microsecond).String() + " on average"
		}
		fmt.Fprintf(w, "replica %s: %s; %s of log not released, %s; %d losses, %d resyncs", r.Name, r.State, humanBytes(uint64(r.LagBytes)), rtt, r.Losses, r.Resyncs)
		if r.LastError != "" {
			fmt.Fprintf(w, "; last error: %s", r.LastError)
		}
		fmt.Fprintln(w)
	}
}

// behind is how far the backend is behind the device in FLUSH order.
func behind(d cache.DirtyStats) string {
	if d.PendingEpochs == 0 {
		return "the backend holds every write"
	}
	s := fmt.Sprintf("%d epochs pending, the oldest %d: the backend is consistent as of %s ago",
		d.PendingEpochs, d.OldestEpoch, seconds(d.BackendBehind).Round(time.Millisecond))
	if d.Ghosts > 0 {
		s += fmt.Sprintf("; %d older versions of blocks written over kept for it (%s)", d.Ghosts, humanBytes(uint64(d.GhostBytes)))
	}
	if d.LostEpoch != 0 {
		s += fmt.Sprintf("; WRITE BACK HALTED at epoch %d, which lost a dirty block: the backend takes nothing of it or later (restart with write_back.order: address to write back the rest without it)", d.LostEpoch)
	}
	return s
}

// backendWaits is the dirty line's note of the retries of writes that waited for a failing
// backend: nothing when there were none (a healthy backend's case).
func backendWaits(n uint64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d retries of writes waiting for the backend", n)
}

// writeChecksums prints the blocks of each tier that failed their checksums, and the dirty ones
// taken as they were after an unclean stop: nothing while there are none (a sound SSD's case).
func writeChecksums(w io.Writer, tiers []cache.TierStats) {
	var parts []string
	for _, t := range tiers {
		var p []string
		if t.ChecksumErrors > 0 {
			p = append(p, fmt.Sprintf("%d blocks failed theirs (clean: read from the backend again; dirty: lost)", t.ChecksumErrors))
		}
		if t.Adopted > 0 {
			p = append(p, fmt.Sprintf("%d dirty blocks taken as they were after an unclean stop", t.Adopted))
		}
		if len(p) > 0 {
			parts = append(parts, t.Name+" "+strings.Join(p, ", "))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "checksums: %s\n", strings.Join(parts, "; "))
	}
}

// maxLostShown is how many lost ranges the stats line names; tierblk scrub and --json list them.
const maxLostShown = 3

// writeLost prints the lost ranges, if any: data the SSD tier damaged before it was written back.
func writeLost(w io.Writer, l cache.LostStats) {
	if l.Bytes == 0 {
		return
	}
	var listed uint64
	var shown []string
	for i, r := range l.Ranges {
		listed += uint64(r.Len)
		if i < maxLostShown {
			shown = append(shown, fmt.Sprintf("at %d, %s", r.Off, humanBytes(uint64(r.Len))))
		}
	}
	n := fmt.Sprintf("%d range", len(l.Ranges))
	if listed < l.Bytes {
		n = "over " + n
	}
	if len(l.Ranges) != 1 || listed < l.Bytes {
		n += "s"
	}
	if len(l.Ranges) > len(shown) {
		shown = append(shown, "...")
	}
	fmt.Fprintf(w, "LOST: %s in %s (%s): reads of them fail until they are written again; write them, or restore their data from a backup (tierblk scrub lists them)\n",
		humanBytes(l.Bytes), n, strings.Join(shown, "; "))
}

// writeScrub prints the SSD tier's scrub under way, or the last one's result and when it ended;
// nothing before the first.
func writeScrub(w io.Writer, s cache.ScrubStats, now time.Time) {
	if s.Started == 0 {
		return
	}
	when := func(unix float64) string {
		t := time.Unix(0, int64(unix*1e9))
		return fmt.Sprintf("%s (%s ago)", t.UTC().Format("2006-01-02 15:04:05 MST"), roughDuration(now.Sub(t)))
	}
	if s.Running {
		fmt.Fprintf(w, "scrub: running since %s: %d of %d lines (%s), %s read, %d damaged blocks so far\n",
			when(s.Started), s.Done, s.Lines, percent(s.Done, s.Lines), humanBytes(s.Bytes), s.Damaged)
		return
	}
	fmt.Fprintf(w, "scrub: last ended %s after %s: %d of %d lines, %s read, %d damaged blocks (%d lost), %d read errors",
		when(s.Ended), took(seconds(s.Ended-s.Started)), s.Done, s.Lines, humanBytes(s.Bytes), s.Damaged, s.Lost, s.Errors)
	if s.Err != "" {
		fmt.Fprintf(w, "; stopped: %s", s.Err)
	}
	fmt.Fprintln(w)
}

func writeTiers(w io.Writer, tiers []cache.TierStats) {
	if len(tiers) == 0 {
		fmt.Fprintln(w, "no cache tiers")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "tier\tpolicy\thits\tmisses\thit ratio\tlines/capacity\toccupancy\tbytes\tpromotions\tevictions\terrors\tstate")
	for _, t := range tiers {
		state := "ok"
		if t.Failed {
			state = fmt.Sprintf("BYPASSED (%d lines set aside; retry in %s)", t.SetAside,
				seconds(t.RetryIn).Round(time.Second))
			if t.Reason != "" {
				state += ": " + t.Reason
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d/%d\t%s\t%s\t%d\t%d\t%d\t%s\n",
			t.Name, t.Policy, t.Hits, t.Misses, percent(t.Hits, t.Hits+t.Misses),
			t.Lines, t.Capacity, percent(t.Lines, t.Capacity), humanBytes(t.LineBytes),
			t.Promotions, t.Evictions, t.Errors, state)
	}
	tw.Flush()
}

// percent prints n/of with one decimal, or "-" when of is 0 (no lookups yet, no capacity).
// seconds turns a figure of the stats, in seconds, into a duration to print.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond)
}

func percent(n, of uint64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// humanBytes prints n in the largest binary unit it fills, with one decimal unless the unit divides
// it exactly. units.FormatSize is exact instead, so it would print 2.5MiB as 2560KiB.
func humanBytes(n uint64) string {
	const unitNames = "KMGTPE"
	if n < 1024 {
		return strconv.FormatUint(n, 10) + "B"
	}
	i := 0
	for i < len(unitNames)-1 && n>>(10*(i+1)) >= 1024 {
		i++
	}
	unit := uint64(1) << (10 * (i + 1))
	if n%unit == 0 {
		return fmt.Sprintf("%d%ciB", n/unit, unitNames[i])
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(unit), unitNames[i])
}

func latencySummary(h cache.Histogram) string {
	if h.Count == 0 {
		return "no requests"
	}
	return fmt.Sprintf("p50 %s p99 %s (%d requests)", formatSeconds(h, 0.5), formatSeconds(h, 0.99), h.Count)
}

// formatSeconds prints the q-quantile of h to three significant digits, or ">LAST" when it lies
// above the last bucket bound and so cannot be estimated.
func formatSeconds(h cache.Histogram, q float64) string {
	v, ok := quantile(h, q)
	if !ok {
		return ">" + time.Duration(v*float64(time.Second)).String()
	}
	d := time.Duration(v * float64(time.Second))
	round := time.Duration(1)
	for d/round >= 1000 {
		round *= 10
	}
	return d.Round(round).String()
}

// quantile estimates the q-quantile of h as Prometheus' histogram_quantile does: find the bucket
// holding the rank q*count and interpolate linearly inside it, taking 0 as the lower edge of the
// first bucket. ok is false when the rank falls above the last bound; the value is then that bound.
func quantile(h cache.Histogram, q float64) (v float64, ok bool) {
	var total uint64
	for _, n := range h.Counts {
		total += n
	}
	if total == 0 || len(h.Bounds) == 0 {
		return 0, false
	}
	rank := q * float64(total)
	var below uint64
	for i, b := range h.Bounds {
		n := h.Counts[i]
		if float64(below+n) >= rank && n > 0 {
			lower := 0.0
			if i > 0 {
				lower = h.Bounds[i-1]
			}
			return lower + (b-lower)*(rank-float64(below))/float64(n), true
		}
		below += n
	}
	return h.Bounds[len(h.Bounds)-1], false
}
