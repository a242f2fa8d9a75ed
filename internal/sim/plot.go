package sim

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/tierblk/tierblk/internal/units"
)

// CheckPlotPath reports whether Plot can write path, before any work is done.
func CheckPlotPath(path string) error {
	if ext := strings.ToLower(filepath.Ext(path)); ext != ".png" && ext != ".svg" {
		return fmt.Errorf("%s: the plot file must end in .png or .svg", path)
	}
	return nil
}

// Plot draws the miss-ratio curve of every policy over the cache sizes into path (.png or .svg).
// keys names what a cache size counts ("objects", "64KiB lines"), for the axis' label; where every
// size was given in bytes, the axis is in bytes instead, marked in binary units, since those are
// the sizes the user asked about (with data reduction a cache of 1GiB holds more keys than 1GiB of
// them).
//
// mark, if not nil, draws a vertical line at a size (in the axis' unit) with its label: today's
// size of a live tier.
func Plot(path, title, keys string, rs []Result, mark *Mark) error {
	if err := CheckPlotPath(path); err != nil {
		return err
	}
	inBytes := len(rs) > 0
	for _, r := range rs {
		inBytes = inBytes && r.SizeBytes > 0
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "cache size (" + keys + ")"
	if inBytes {
		p.X.Label.Text = "cache size"
	}
	p.Y.Label.Text = "miss ratio"
	p.Add(plotter.NewGrid())
	byPolicy := map[string]plotter.XYs{}
	var names []string
	for _, r := range rs {
		name := policyLabel(r)
		if _, ok := byPolicy[name]; !ok {
			names = append(names, name)
		}
		x := float64(r.CacheSize)
		if inBytes {
			x = float64(r.SizeBytes)
		}
		byPolicy[name] = append(byPolicy[name], plotter.XY{X: x, Y: r.MissRatio})
	}
	for i, name := range names {
		pts := byPolicy[name]
		sort.Slice(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / 7)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(name, line, points)
	}
	// Miss ratios of competing policies differ by little: zoom on them rather than show 0 to 1.
	p.Y.Min, p.Y.Max = max(p.Y.Min-0.02, 0), min(p.Y.Max+0.02, 1)
	if mark != nil {
		line, err := plotter.NewLine(plotter.XYs{{X: mark.X, Y: p.Y.Min}, {X: mark.X, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(line)
		p.Legend.Add(mark.Label, line)
	}
	if inBytes && p.X.Min == p.X.Max {
		// One size: an axis from half to twice it, so that its ticks are round sizes around it.
		p.X.Min, p.X.Max = p.X.Min/2, p.X.Max*2
	}
	logScale := p.X.Min > 0 && p.X.Max/p.X.Min >= 10
	if logScale {
		// Cache sizes are usually swept over orders of magnitude.
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.X.Label.Text += ", log scale"
	}
	if inBytes {
		p.X.Tick.Marker = byteTicks{log: logScale}
	}
	p.Legend.Left = true
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}

// Mark is a size a plot marks with a vertical line.
type Mark struct {
	X     float64
	Label string
}

// byteTicks marks an axis of bytes in binary units (1GiB, not 1.074e+09): at the powers of two on
// a log scale, at the multiples of a power of two on a linear one.
type byteTicks struct{ log bool }

// maxByteLabels is about the most tick labels that fit under an 8-inch plot.
const maxByteLabels = 8

func (t byteTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	if t.log {
		e0, e1 := int(math.Floor(math.Log2(lo))), int(math.Ceil(math.Log2(hi)))
		every := max(1, (e1-e0+maxByteLabels)/maxByteLabels) // label one power in every
		for e := e0; e <= e1; e++ {
			tk := plot.Tick{Value: math.Ldexp(1, e)}
			if e%every == 0 {
				tk.Label = units.FormatSize(int64(tk.Value))
			}
			ticks = append(ticks, tk)
		}
		return ticks
	}
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: units.FormatSize(int64(lo))}}
	}
	step := max(1, math.Ldexp(1, int(math.Ceil(math.Log2((hi-lo)/maxByteLabels)))))
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: units.FormatSize(int64(v))})
	}
	return ticks
}
