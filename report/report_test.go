package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func writeRun(t *testing.T, dir string, recs []map[string]any) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, r := range recs {
		j, _ := json.Marshal(r)
		b.Write(j)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Two seeds of arm a and one of arm b: the mean and spread per step, arms
// grouped by name without the seed suffix.
func TestBuildMeanAndSpread(t *testing.T) {
	root := t.TempDir()
	writeRun(t, filepath.Join(root, "a-s1"), []map[string]any{{"step": 1, "reward/mean": 0.2, "staleness/mb0": 0.0, "staleness/mb1": 0.2}, {"step": 2, "reward/mean": 0.4}})
	writeRun(t, filepath.Join(root, "a-s2"), []map[string]any{{"step": 1, "reward/mean": 0.4, "staleness/mb0": 0.0, "staleness/mb1": 0.4}})
	writeRun(t, filepath.Join(root, "b-s1"), []map[string]any{{"step": 1, "reward/mean": 0.9, "train_infer/k3": 0.0}, {"step": 2, "train_infer/k3": 1e-3}})
	runs, err := Load([]string{filepath.Join(root, "a-s1"), filepath.Join(root, "a-s2"), filepath.Join(root, "b-s1")})
	if err != nil {
		t.Fatal(err)
	}
	c := Build(runs, "reward", "reward/mean", false)
	if len(c.Series) != 2 || c.Series[0].Name != "a" || c.Series[1].Name != "b" {
		t.Fatalf("series %+v", c.Series)
	}
	a := c.Series[0]
	// Step 2 exists in one seed of a only: not drawn.
	if len(a.X) != 1 || a.X[0] != 1 || math.Abs(a.Y[0]-0.3) > 1e-12 || a.Lo[0] != 0.2 || a.Hi[0] != 0.4 || a.Runs != 2 {
		t.Fatalf("arm a: %+v", a)
	}
	st := Build(runs, "staleness", "staleness", false).Series[0]
	if math.Abs(st.Y[0]-0.15) > 1e-12 { // mean over mini-batches (0.1, 0.2), then over seeds
		t.Fatalf("staleness %+v", st)
	}
	kl := Build(runs, "k3", "train_infer/k3", true)
	if len(kl.Series) != 1 || len(kl.Series[0].X) != 1 || kl.Series[0].X[0] != 2 {
		t.Fatalf("log chart keeps only positive values: %+v", kl.Series)
	}
}

// The x axis counts gradient steps: global steps times mini-batches.
func TestGradientSteps(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "off-s1")
	writeRun(t, dir, []map[string]any{{"step": 3, "reward/mean": 0.5}})
	recipe := "model: {path: m}\ndata: {tasks: [linear]}\neval: {skip: true}\ntrain: {prompts_per_step: 8, mini_batches: 4}\n"
	if err := os.WriteFile(filepath.Join(dir, "recipe.yaml"), []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	runs, err := Load([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	if x := Build(runs, "r", "reward/mean", false).Series[0].X[0]; x != 12 {
		t.Fatalf("step 3 of 4 mini-batches at x = %v, want 12", x)
	}
}

type svgDoc struct {
	Polylines []struct {
		Series string `xml:"data-series,attr"`
		Points string `xml:"points,attr"`
	} `xml:"polyline"`
	Polygons []struct {
		Points string `xml:"points,attr"`
	} `xml:"polygon"`
}

// The SVG is well-formed XML with one mean line per arm (a point per x,
// left to right) and a spread band for arms of several runs.
func TestSVG(t *testing.T) {
	c := Chart{Title: "t <&>", Metric: "m", Series: []Series{
		{Name: "a", X: []float64{0, 10, 20}, Y: []float64{1, 2, 3}, Lo: []float64{0.5, 1.5, 2.5}, Hi: []float64{1.5, 2.5, 3.5}, Runs: 3},
		{Name: "b", X: []float64{0, 20}, Y: []float64{3, 1}, Lo: []float64{3, 1}, Hi: []float64{3, 1}, Runs: 1},
	}}
	var doc svgDoc
	if err := xml.Unmarshal([]byte(c.SVG(640, 300)), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Polylines) != 2 || len(doc.Polygons) != 1 {
		t.Fatalf("%d lines and %d bands, want 2 and 1", len(doc.Polylines), len(doc.Polygons))
	}
	pts := strings.Fields(doc.Polylines[0].Points)
	if len(pts) != 3 {
		t.Fatalf("line a has %d points", len(pts))
	}
	var prevX, prevY float64
	for i, p := range pts {
		var x, y float64
		if _, err := fmtSscan(p, &x, &y); err != nil {
			t.Fatal(err)
		}
		if i > 0 && !(x > prevX && y < prevY) { // rising values go up the page
			t.Fatalf("point %d (%v, %v) after (%v, %v)", i, x, y, prevX, prevY)
		}
		prevX, prevY = x, y
	}
	page := string(HTML("report", nil, []Chart{c}))
	if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), "http") {
		t.Fatal("the page refers to the network")
	}
}

func fmtSscan(p string, x, y *float64) (int, error) {
	xs, ys, _ := strings.Cut(p, ",")
	var err error
	if *x, err = strconv.ParseFloat(xs, 64); err != nil {
		return 0, err
	}
	if *y, err = strconv.ParseFloat(ys, 64); err != nil {
		return 1, err
	}
	return 2, nil
}

func TestSmooth(t *testing.T) {
	c := Chart{Series: []Series{{X: []float64{1, 2, 3, 4}, Y: []float64{0, 2, 4, 6}, Lo: []float64{0, 2, 4, 6}, Hi: []float64{0, 2, 4, 6}}}}
	got := c.Smooth(2).Series[0].Y
	for i, w := range []float64{0, 1, 3, 5} {
		if got[i] != w {
			t.Fatalf("smoothed %v, want [0 1 3 5]", got)
		}
	}
	if c.Series[0].Y[1] != 2 {
		t.Fatal("Smooth changed its receiver")
	}
}

// The PNG is the chart's picture: decodable, of the asked size, with the
// series' colour on its mean line and white away from it.
func TestPNG(t *testing.T) {
	c := Chart{Title: "t", Metric: "m", Series: []Series{
		{Name: "a", X: []float64{0, 10}, Y: []float64{1, 1}, Lo: []float64{1, 1}, Hi: []float64{1, 1}, Runs: 1},
		{Name: "b", X: []float64{0, 10}, Y: []float64{0, 0}, Lo: []float64{0, 0}, Hi: []float64{0, 0}, Runs: 1},
	}}
	b, err := c.PNG(640, 300)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds().Dx() != 640 || img.Bounds().Dy() != 300 {
		t.Fatalf("size %v", img.Bounds())
	}
	g, _ := c.geometry(640, 300)
	want := hexColor(palette[0])
	// The line is anti-aliased: the most covered of the rows around it
	// carries the colour, within the blend of a partly covered pixel.
	best := 1 << 30
	var got [3]int
	for y := int(g.py(1)) - 1; y <= int(g.py(1))+1; y++ {
		r, gr, bl, _ := img.At(int(g.px(5)), y).RGBA()
		if sum := int(r>>8) + int(gr>>8) + int(bl>>8); sum < best {
			best, got = sum, [3]int{int(r >> 8), int(gr >> 8), int(bl >> 8)}
		}
	}
	for i, w := range []uint8{want.R, want.G, want.B} {
		if d := got[i] - int(w); d > 0x40 || d < -0x40 {
			t.Fatalf("pixel on series a's line is %02x%02x%02x, want about %v", got[0], got[1], got[2], palette[0])
		}
	}
	if r, g2, b2, _ := img.At(int(g.px(5)), int(g.py(0.4))).RGBA(); r>>8 != 0xff || g2>>8 != 0xff || b2>>8 != 0xff {
		t.Fatal("a pixel between the lines is not white")
	}
}

// TestLegendFits checks that a long arm name widens the legend margin so
// that its entry (about 7 pixels a character) ends inside the chart, and
// that a very long one cannot take more than half the chart.
func TestLegendFits(t *testing.T) {
	one := []float64{1}
	series := func(name string) Chart {
		return Chart{Series: []Series{{Name: name, Runs: 3, X: one, Y: one, Lo: one, Hi: one}}}
	}
	if got := series("a").legendWidth(800); got != marginRight {
		t.Errorf("short names: legend width %d, want the default %d", got, marginRight)
	}
	// "minirl-lennorm-r3 (3)" is 21 characters: 40 + 7*21 = 187 pixels.
	g, ok := series("minirl-lennorm-r3").geometry(800, 300)
	if !ok {
		t.Fatal("no geometry")
	}
	if g.right != 187 || g.pw != 800-marginLeft-187 {
		t.Errorf("legend margin %d, plot width %v; want 187 and %d", g.right, g.pw, 800-marginLeft-187)
	}
	g, _ = series(strings.Repeat("x", 200)).geometry(640, 300)
	if g.right != 320 || g.pw <= 0 {
		t.Errorf("a 200-character name: legend margin %d, plot width %v; want 320 and a positive width", g.right, g.pw)
	}
}

// Runs of episodes get two more charts, after the standard ones.
func TestStandardEpisodeCharts(t *testing.T) {
	one := []Run{{Dir: "a-s1", Arm: "a", GradPerStep: 1, Steps: []Point{{Step: 1, Values: map[string]float64{"reward/mean": 0.5}}}}}
	multi := []Run{{Dir: "b-s1", Arm: "b", GradPerStep: 1, Steps: []Point{{Step: 1, Values: map[string]float64{"reward/mean": 0.5, "env/turns": 2, "env/tool_calls": 1}}}}}
	if n := len(Standard(one, 1)); n != 7 {
		t.Fatalf("one-turn runs: %d charts, want 7", n)
	}
	c := Standard(multi, 1)
	if len(c) != 9 || c[7].Metric != "env/turns" || c[8].Metric != "env/tool_calls" {
		t.Fatalf("episode runs: %d charts (%v)", len(c), c[len(c)-1].Metric)
	}
}
