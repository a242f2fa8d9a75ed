package sim

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// CheckPlotPath reports whether Plot can write path, before any work is done.
func CheckPlotPath(path string) error {
	if ext := strings.ToLower(filepath.Ext(path)); ext != ".png" && ext != ".svg" {
		return fmt.Errorf("%s: the plot file must end in .png or .svg", path)
	}
	return nil
}

// Plot draws the miss-ratio curve of every policy over the cache sizes into path (.png or .svg).
func Plot(path, title string, rs []Result) error {
	if err := CheckPlotPath(path); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "cache size (objects)"
	p.Y.Label.Text = "miss ratio"
	p.Add(plotter.NewGrid())
	byPolicy := map[string]plotter.XYs{}
	var names []string
	for _, r := range rs {
		name := policyLabel(r)
		if _, ok := byPolicy[name]; !ok {
			names = append(names, name)
		}
		byPolicy[name] = append(byPolicy[name], plotter.XY{X: float64(r.CacheSize), Y: r.MissRatio})
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
	if p.X.Min > 0 && p.X.Max/p.X.Min >= 10 {
		// Cache sizes are usually swept over orders of magnitude.
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.X.Label.Text += ", log scale"
	}
	p.Legend.Left = true
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}
