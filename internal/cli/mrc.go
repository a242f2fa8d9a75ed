package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/sim"
	"github.com/tierblk/tierblk/internal/units"
)

type mrcOpts struct {
	admin, export, plot string
	reads               bool
	stdout              io.Writer
}

func newMRCCmd() *cobra.Command {
	o := mrcOpts{}
	cmd := &cobra.Command{
		Use:   "mrc",
		Short: "Print or plot a running daemon's live miss-ratio curves",
		Long: `Asks a running daemon's admin endpoint for the live miss-ratio curves of every export whose
cache keeps them (cache.curves, on by default): the miss ratio each policy would have at 37 sizes
from 1/64 to 8 times the cache's last tier (the SSD tier, else the RAM tier), estimated over the
last minutes of requests from a sample of the lines. It prints them as a table and a small plot,
with the tier's size and policy marked and what the curves advise; --plot draws them into a PNG
or SVG file instead, as 'tierblk sim --plot' does.`,
		Example: `  tierblk mrc --admin unix:/run/tierblk/admin.sock
  tierblk mrc --admin 127.0.0.1:9810 --export nas --plot nas.png`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stdout = cmd.OutOrStdout()
			return runMRC(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.admin, "admin", "", "the daemon's admin endpoint: unix:/path/to.sock or a loopback HOST:PORT")
	f.StringVar(&o.export, "export", "", "only this export (needed with --plot when several keep curves)")
	f.StringVar(&o.plot, "plot", "", "draw the curves into this file (.png or .svg)")
	f.BoolVar(&o.reads, "reads", false, "the curves of reads only (default: all requests)")
	return cmd
}

func runMRC(ctx context.Context, o mrcOpts) error {
	if o.plot != "" {
		if err := sim.CheckPlotPath(o.plot); err != nil {
			return usageErrorf("--plot %v", err)
		}
	}
	var out strings.Builder
	err := runStats(ctx, statsOpts{admin: o.admin, export: o.export, stdout: &out, only: func(es []metrics.ExportStats) error {
		var with []metrics.ExportStats
		for _, e := range es {
			if e.Curves != nil {
				with = append(with, e)
			}
		}
		switch {
		case len(with) == 0:
			return errors.New("no export of the daemon keeps live curves: they need a cache with curves on (cache.curves, --curves)")
		case o.plot != "" && len(with) > 1:
			return usageErrorf("--plot draws one export's curves: give --export")
		}
		for i, e := range with {
			if i > 0 {
				fmt.Fprintln(o.stdout)
			}
			if o.plot != "" {
				return plotCurves(o.plot, e, o.reads)
			}
			name := e.Name
			if name == "" {
				name = `"" (the default export)`
			}
			fmt.Fprintf(o.stdout, "export %s:\n", name)
			writeCurves(o.stdout, e.Curves, o.reads)
		}
		return nil
	}})
	return err
}

// plotCurves draws an export's curves with the tier's size marked.
func plotCurves(path string, e metrics.ExportStats, reads bool) error {
	c := e.Curves
	what := "all requests"
	if reads {
		what = "reads"
	}
	name := e.Name
	if name == "" {
		name = `""`
	}
	title := fmt.Sprintf("export %s, live, %s over %s (%s lines, %s)", name, what, windowText(c), units.FormatSize(c.LineSize), c.Admission)
	mark := &sim.Mark{X: float64(int64(c.Lines) * c.LineSize), Label: fmt.Sprintf("today: %s, %s", units.FormatSize(int64(c.Lines)*c.LineSize), c.Policy)}
	return sim.Plot(path, title, units.FormatSize(c.LineSize)+" lines", c.Results(reads), mark)
}

func windowText(c *sim.Curves) string {
	return fmt.Sprintf("%.0fs", math.Round(c.Window))
}

// writeAdvice prints what the curves say: the tier's hit ratio against half and twice its size, the
// sizes that reach 90, 95 and 99 % of the best hit ratio up to 8 times it, and the best policy; on
// a line of its own the same for a RAM tier in front of it.
func writeAdvice(w io.Writer, c *sim.Curves) {
	sizeOf := func(today int) func(int) string {
		return func(lines int) string {
			if lines == 0 {
				return "more than " + units.Approx(8*int64(today)*c.LineSize)
			}
			return units.Approx(int64(lines) * c.LineSize)
		}
	}
	size := sizeOf(c.Lines)
	var ramSize func(int) string
	if c.RAM != nil {
		ramSize = sizeOf(c.RAM.Lines)
	}
	a := c.Advice
	fmt.Fprintf(w, "curves (last %s, %d requests): %s at %s hits %.1f%% (half the size %.1f%%, twice %.1f%%; the most at up to 8 times %.1f%%)\n",
		windowText(c), c.Requests[0], c.Policy, units.FormatSize(int64(c.Lines)*c.LineSize), 100*a.Target, 100*a.Half, 100*a.Double, 100*c.BestHit[0])
	fmt.Fprintf(w, "  size for 90%% of that: %s; 95%%: %s; 99%%: %s", size(a.For90), size(a.For95), size(a.For99))
	if b := c.Best(); b.Policy != c.Policy {
		fmt.Fprintf(w, "; best policy at this size: %s (%.1f%%)", b.Policy, 100*(1-b.MissRatio[c.Today()]))
	}
	fmt.Fprintln(w)
	if r := c.RAM; r != nil {
		fmt.Fprintf(w, "  ram tier (LRU's curve) at %s hits %.1f%% (half the size %.1f%%, twice %.1f%%; the most at up to 8 times %.1f%%); size for 90%%: %s; 95%%: %s; 99%%: %s\n",
			units.Approx(int64(r.Lines)*c.LineSize), 100*r.Advice.Target, 100*r.Advice.Half, 100*r.Advice.Double, 100*r.BestHit,
			ramSize(r.Advice.For90), ramSize(r.Advice.For95), ramSize(r.Advice.For99))
	}
	if c.Sampled > 0 && c.Dropped*100 > c.Sampled {
		fmt.Fprintf(w, "  the estimator fell behind: %d of %d sampled requests dropped\n", c.Dropped, c.Sampled+c.Dropped)
	}
}

// writeCurves prints the curves as a table, one row per size and a column per policy, a small
// plot of the tier's policy (and the best other one), and the advice.
func writeCurves(w io.Writer, c *sim.Curves, reads bool) {
	curves := c.All
	if reads {
		curves = c.Reads
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "size\t")
	for _, cv := range curves {
		fmt.Fprintf(tw, "%s\t", cv.Label())
	}
	fmt.Fprintln(tw)
	today := c.Today()
	for i, size := range c.Sizes {
		label := humanBytes(uint64(size) * uint64(c.LineSize))
		if i == today {
			label = "today " + label
		}
		fmt.Fprintf(tw, "%s\t", label)
		for _, cv := range curves {
			fmt.Fprintf(tw, "%.4f\t", cv.MissRatio[i])
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	writeTextPlot(w, c, curves)
	writeAdvice(w, c)
}

// textPlotRows is the height of the plot in the terminal.
const textPlotRows = 10

// writeTextPlot draws the miss ratio of the tier's policy ('*') and of the best policy at its size
// ('o', where another) against the sizes, one column a size, '|' at the tier's size.
func writeTextPlot(w io.Writer, c *sim.Curves, curves []sim.Curve) {
	var mine sim.Curve
	for _, cv := range curves {
		if cv.Policy == c.Policy && cv.Method == "mini" {
			mine = cv
		}
	}
	if mine.MissRatio == nil {
		return
	}
	best := c.Best()
	for _, cv := range curves {
		if cv.Policy == best.Policy && cv.Method == "mini" {
			best = cv
		}
	}
	lo, hi := 1.0, 0.0
	for _, cv := range []sim.Curve{mine, best} {
		for _, m := range cv.MissRatio {
			lo, hi = min(lo, m), max(hi, m)
		}
	}
	if hi-lo < 0.01 {
		lo, hi = max(0, lo-0.005), min(1, hi+0.005)
	}
	row := func(m float64) int {
		return int(math.Round((hi - m) / (hi - lo) * (textPlotRows - 1)))
	}
	grid := make([][]byte, textPlotRows)
	for r := range grid {
		grid[r] = []byte(strings.Repeat(" ", len(c.Sizes)))
		grid[r][c.Today()] = '|'
	}
	for i := range c.Sizes {
		if best.Policy != mine.Policy {
			grid[row(best.MissRatio[i])][i] = 'o'
		}
		grid[row(mine.MissRatio[i])][i] = '*'
	}
	fmt.Fprintf(w, "miss ratio: * %s", mine.Policy)
	if best.Policy != mine.Policy {
		fmt.Fprintf(w, ", o %s", best.Policy)
	}
	fmt.Fprintln(w, ", | today's size")
	for r, line := range grid {
		fmt.Fprintf(w, "%6.3f %s\n", hi-(hi-lo)*float64(r)/(textPlotRows-1), line)
	}
	first, last := humanBytes(uint64(c.Sizes[0])*uint64(c.LineSize)), humanBytes(uint64(c.Sizes[len(c.Sizes)-1])*uint64(c.LineSize))
	fmt.Fprintf(w, "       %s%s%s\n", first, strings.Repeat(" ", max(1, len(c.Sizes)-len(first)-len(last))), last)
}
