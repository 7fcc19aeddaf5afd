// Package report turns RL runs into one self-contained HTML page: a chart
// per measure (training reward, entropy, train-infer KL, held-out avg@k,
// routing disagreement, staleness, surrogate validity) against gradient
// steps, one curve per arm with the mean over its seeds and their spread
// as a band. Charts are inline SVG; the page needs no network.
package report

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/keel-rl/keel/run"
)

// Run is one run directory's metrics.
type Run struct {
	Dir   string
	Arm   string // the run's name without its -sSEED suffix
	Steps []Point
	// GradPerStep is the optimiser steps per global step (mini-batches).
	GradPerStep int
}

// Point is one metrics record: its step and numeric fields.
type Point struct {
	Step   int
	Values map[string]float64
}

var seedSuffix = regexp.MustCompile(`-s\d+$`)

// Load reads run directories (metrics.jsonl and recipe.yaml).
func Load(dirs []string) ([]Run, error) {
	var out []Run
	for _, d := range dirs {
		recs, err := run.ReadMetrics(filepath.Join(d, run.MetricsFile))
		if err != nil {
			return nil, err
		}
		r := Run{Dir: d, Arm: seedSuffix.ReplaceAllString(filepath.Base(filepath.Clean(d)), ""), GradPerStep: 1}
		mb, err := miniBatches(filepath.Join(d, run.RecipeFile))
		if err != nil {
			return nil, err
		}
		if mb > 0 {
			r.GradPerStep = mb
		}
		for _, m := range recs {
			s, ok := m["step"].(float64)
			if !ok {
				continue
			}
			p := Point{Step: int(s), Values: map[string]float64{}}
			for k, v := range m {
				if f, ok := v.(float64); ok {
					p.Values[k] = f
				}
			}
			r.Steps = append(r.Steps, p)
		}
		out = append(out, r)
	}
	return out, nil
}

// miniBatches reads train.mini_batches from a run's resolved recipe (0
// when the file or the key is absent: a run of keel sft, one optimiser
// step a step). The rest of the recipe is the trainer's business.
func miniBatches(path string) (int, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var rec struct {
		Train struct {
			MiniBatches int `yaml:"mini_batches"`
		} `yaml:"train"`
	}
	if err := yaml.Unmarshal(b, &rec); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if rec.Train.MiniBatches < 0 {
		return 0, fmt.Errorf("%s: train.mini_batches = %d", path, rec.Train.MiniBatches)
	}
	return rec.Train.MiniBatches, nil
}

// Series is one arm's curve: the mean over its runs at each x, and the
// lowest and highest run there.
type Series struct {
	Name         string
	X, Y, Lo, Hi []float64
	Runs         int
}

// Chart is one measure against gradient steps.
type Chart struct {
	Title, Metric string
	LogY          bool
	Series        []Series
}

// value extracts a measure from a record: a metric name, or "staleness"
// for the mean of the staleness/mbI entries.
func value(p Point, metric string) (float64, bool) {
	if metric == "staleness" {
		var sum float64
		n := 0
		for k, v := range p.Values {
			if strings.HasPrefix(k, "staleness/mb") && !math.IsNaN(v) {
				sum += v
				n++
			}
		}
		return sum / float64(max(n, 1)), n > 0
	}
	v, ok := p.Values[metric]
	return v, ok
}

// Build makes the chart of one measure over runs grouped by arm. Only the
// x values every run of an arm has are drawn.
func Build(runs []Run, title, metric string, logY bool) Chart {
	c := Chart{Title: title, Metric: metric, LogY: logY}
	names, arms := byArm(runs)
	for _, name := range names {
		group := arms[name]
		byX := map[float64][]float64{}
		for _, r := range group {
			for _, p := range r.Steps {
				v, ok := value(p, metric)
				if !ok || math.IsNaN(v) || (logY && !(v > 0)) {
					continue
				}
				x := float64(p.Step * r.GradPerStep)
				byX[x] = append(byX[x], v)
			}
		}
		s := Series{Name: name, Runs: len(group)}
		var xs []float64
		for x, vs := range byX {
			if len(vs) == len(group) {
				xs = append(xs, x)
			}
		}
		sort.Float64s(xs)
		for _, x := range xs {
			vs := byX[x]
			lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
			for _, v := range vs {
				lo, hi, sum = math.Min(lo, v), math.Max(hi, v), sum+v
			}
			s.X, s.Y, s.Lo, s.Hi = append(s.X, x), append(s.Y, sum/float64(len(vs))), append(s.Lo, lo), append(s.Hi, hi)
		}
		if len(s.X) > 0 {
			c.Series = append(c.Series, s)
		}
	}
	return c
}

// byArm groups runs by arm, returning the arms' names in order.
func byArm(runs []Run) ([]string, map[string][]Run) {
	arms := map[string][]Run{}
	var names []string
	for _, r := range runs {
		if _, ok := arms[r.Arm]; !ok {
			names = append(names, r.Arm)
		}
		arms[r.Arm] = append(arms[r.Arm], r)
	}
	sort.Strings(names)
	return names, arms
}

// palette holds the curves' colours (colour-blind safe, Okabe-Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}

// Margins of a chart's plot area, in pixels; the right one grows with the
// longest legend entry (about 7 pixels a character) so names are not cut.
const marginLeft, marginRight, marginTop, marginBottom = 60, 160, 30, 40

// legendWidth is the right margin the chart's legend needs on a chart w
// pixels wide: at most half of it, so the plot keeps room (a longer name
// is cut at the edge).
func (c Chart) legendWidth(w int) int {
	r := marginRight
	for _, s := range c.Series {
		r = max(r, 40+7*len(legendLabel(s)))
	}
	return min(r, max(marginRight, w/2))
}

// legendLabel is a series' legend entry: its name and how many runs it holds.
func legendLabel(s Series) string { return fmt.Sprintf("%s (%d)", s.Name, s.Runs) }

// geom maps data to pixels for a chart of w by h pixels.
type geom struct {
	w, h               int
	right              int // the right margin (legend)
	pw, ph             float64
	xmin, xmax, y0, y1 float64 // y0, y1 on the transformed (log) scale
	logY               bool
}

// geometry returns the chart's mapping, false when it has no data.
func (c Chart) geometry(w, h int) (geom, bool) {
	right := c.legendWidth(w)
	g := geom{w: w, h: h, right: right, pw: float64(w - marginLeft - right), ph: float64(h - marginTop - marginBottom), logY: c.LogY}
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Lo[i]), math.Max(ymax, s.Hi[i])
		}
	}
	if len(c.Series) == 0 || math.IsInf(xmin, 0) {
		return g, false
	}
	g.y0, g.y1 = g.ty(ymin), g.ty(ymax)
	if g.y1 == g.y0 {
		g.y0, g.y1 = g.y0-1, g.y1+1
	}
	if xmax == xmin {
		xmin, xmax = xmin-1, xmax+1
	}
	g.xmin, g.xmax = xmin, xmax
	return g, true
}

func (g geom) ty(v float64) float64 {
	if g.logY {
		return math.Log10(v)
	}
	return v
}

func (g geom) px(x float64) float64 { return marginLeft + (x-g.xmin)/(g.xmax-g.xmin)*g.pw }
func (g geom) py(y float64) float64 { return marginTop + (1-(g.ty(y)-g.y0)/(g.y1-g.y0))*g.ph }

// tick i of 4 on each axis: the x value and its pixel, the y value and
// its pixel.
func (g geom) tick(i int) (fx, x, fy, y float64) {
	fx = g.xmin + (g.xmax-g.xmin)*float64(i)/4
	if g.xmax-g.xmin >= 8 {
		fx = math.Round(fx)
	}
	t := g.y0 + (g.y1-g.y0)*float64(i)/4
	fy = t
	if g.logY {
		fy = math.Pow(10, t)
	}
	return fx, g.px(fx), fy, marginTop + (1-float64(i)/4)*g.ph
}

// SVG draws the chart, w by h pixels: axes with ticks, a band of the
// spread and a line of the mean per series, and a legend.
func (c Chart) SVG(w, h int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`, w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`, w, h)
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="13" font-weight="bold">%s</text>`, marginLeft, html.EscapeString(c.Title))
	g, ok := c.geometry(w, h)
	if !ok {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no data for %s</text></svg>`, marginLeft, marginTop+20, html.EscapeString(c.Metric))
		return b.String()
	}
	left, top := marginLeft, marginTop
	fmt.Fprintf(&b, `<path d="M%d %d V%d H%d" stroke="#444" fill="none"/>`, left, top, top+int(g.ph), left+int(g.pw))
	for i := 0; i <= 4; i++ {
		fx, x, fy, y := g.tick(i)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, top+int(g.ph)+15, tick(fx))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`, left-5, y+4, tick(fy))
		fmt.Fprintf(&b, `<path d="M%d %.1f H%d" stroke="#ddd"/>`, left, y, left+int(g.pw))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">gradient steps</text>`, float64(left)+g.pw/2, h-5)
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		if s.Runs > 1 {
			var band strings.Builder
			for j := range s.X {
				fmt.Fprintf(&band, "%.1f,%.1f ", g.px(s.X[j]), g.py(s.Hi[j]))
			}
			for j := len(s.X) - 1; j >= 0; j-- {
				fmt.Fprintf(&band, "%.1f,%.1f ", g.px(s.X[j]), g.py(s.Lo[j]))
			}
			fmt.Fprintf(&b, `<polygon class="band" points="%s" fill="%s" fill-opacity="0.15" stroke="none"/>`, strings.TrimSpace(band.String()), col)
		}
		var line strings.Builder
		for j := range s.X {
			fmt.Fprintf(&line, "%.1f,%.1f ", g.px(s.X[j]), g.py(s.Y[j]))
		}
		fmt.Fprintf(&b, `<polyline class="mean" data-series="%s" points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`, html.EscapeString(s.Name), strings.TrimSpace(line.String()), col)
		ly := top + 14*i
		fmt.Fprintf(&b, `<path d="M%d %d h16" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`,
			w-g.right+10, ly+10, col, w-g.right+30, ly+14, html.EscapeString(legendLabel(s)))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// tick formats an axis value compactly.
func tick(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1e4 || a < 1e-2:
		return fmt.Sprintf("%.0e", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// Smooth replaces every series' values by their trailing mean over window
// points (1: unchanged), so that per-step curves read as trends.
func (c Chart) Smooth(window int) Chart {
	if window <= 1 {
		return c
	}
	out := c
	out.Series = make([]Series, len(c.Series))
	for i, s := range c.Series {
		t := s
		t.Y, t.Lo, t.Hi = trailing(s.Y, window), trailing(s.Lo, window), trailing(s.Hi, window)
		out.Series[i] = t
	}
	return out
}

func trailing(v []float64, w int) []float64 {
	out := make([]float64, len(v))
	var sum float64
	for i, x := range v {
		sum += x
		if i >= w {
			sum -= v[i-w]
		}
		out[i] = sum / float64(min(i+1, w))
	}
	return out
}

// Standard lists the charts of a report: the measures the paper's figures
// show, then the stability measures; per-step measures are smoothed over
// smooth steps (held-out scores are not).
func Standard(runs []Run, smooth int) []Chart {
	k := "eval/avg@8"
	for _, r := range runs {
		for _, p := range r.Steps {
			for key := range p.Values {
				if strings.HasPrefix(key, "eval/avg@") && strings.Count(key, "/") == 1 {
					k = key
				}
			}
		}
	}
	charts := []Chart{
		Build(runs, "training reward", "reward/mean", false).Smooth(smooth),
		Build(runs, "held-out "+strings.TrimPrefix(k, "eval/"), k, false),
		Build(runs, "entropy", "entropy", false).Smooth(smooth),
		Build(runs, "train-infer KL (k3, log scale)", "train_infer/k3", true).Smooth(smooth),
		Build(runs, "routing disagreement, rollout vs pi_old", "routing/infer_vs_old", false).Smooth(smooth),
		Build(runs, "staleness |log pi_theta - log pi_old|", "staleness", false).Smooth(smooth),
		Build(runs, "surrogate-validity gap (pi_theta vs mu_old)", "surrogate/gap", true).Smooth(smooth),
	}
	// Runs of multi-turn episodes: how long they are and how often the
	// model calls its tools.
	for _, m := range []struct{ title, key string }{{"model turns per episode", "env/turns"}, {"tool calls per episode", "env/tool_calls"}} {
		if logs(runs, m.key) {
			charts = append(charts, Build(runs, m.title, m.key, false).Smooth(smooth))
		}
	}
	return charts
}

// logs reports whether some run logs key.
func logs(runs []Run, key string) bool {
	for _, r := range runs {
		for _, p := range r.Steps {
			if _, ok := p.Values[key]; ok {
				return true
			}
		}
	}
	return false
}

// HTML renders charts into one self-contained page, with the arms'
// summary and any paired comparisons above the charts.
func HTML(title string, runs []Run, charts []Chart, paired ...Paired) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>", html.EscapeString(title))
	b.WriteString(`<style>body{font-family:sans-serif;margin:20px;max-width:1400px}figure{display:inline-block;margin:8px}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>`)
	fmt.Fprintf(&b, "<h1>%s</h1><p>%d runs:", html.EscapeString(title), len(runs))
	for _, r := range runs {
		fmt.Fprintf(&b, " <code>%s</code>", html.EscapeString(r.Dir))
	}
	b.WriteString(". Lines: the mean over an arm's seeds; bands: their lowest and highest.</p>\n")
	b.WriteString("<p>Each arm over its seeds: mean [lowest, highest].</p>\n")
	b.WriteString(summaryHTML(Summarize(runs)))
	b.WriteString(pairedHTML(paired))
	for _, c := range charts {
		fmt.Fprintf(&b, "<figure id=\"%s\">%s</figure>\n", html.EscapeString(c.Metric), c.SVG(640, 300))
	}
	b.WriteString("</body></html>\n")
	return []byte(b.String())
}
