package report

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The report page as a browser shows it: headless Chromium (Debian's
// chromium; .ci/run installs it) loads the file with no network, builds
// one SVG per chart and paints the curves. Skipped where Chromium is
// absent.
func TestPageInChromium(t *testing.T) {
	bin := ""
	for _, b := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(b); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("no headless Chromium on this machine (apt-get install chromium)")
	}
	root := t.TempDir()
	for _, arm := range []string{"a-s1", "a-s2", "b-s1"} {
		var recs []map[string]any
		for s := 1; s <= 20; s++ {
			v := float64(s) / 20
			if arm == "a-s2" {
				v += 0.1
			}
			recs = append(recs, map[string]any{"step": s, "reward/mean": v, "entropy": 1 - v, "train_infer/k3": 1e-3 * v,
				"eval/avg@8": v / 2, "routing/infer_vs_old": 0.01, "staleness/mb0": 0.0, "surrogate/gap": 0.01 * v})
		}
		writeRun(t, filepath.Join(root, arm), recs)
	}
	runs, err := Load([]string{filepath.Join(root, "a-s1"), filepath.Join(root, "a-s2"), filepath.Join(root, "b-s1")})
	if err != nil {
		t.Fatal(err)
	}
	charts := Standard(runs, 3)
	page := filepath.Join(root, "report.html")
	if err := os.WriteFile(page, HTML("chromium test", runs, charts), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + filepath.Join(root, "profile")}
	dom, err := exec.CommandContext(ctx, bin, append(args, "--dump-dom", "file://"+page)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	if n := strings.Count(string(dom), "<svg"); n != len(charts) {
		t.Fatalf("the browser built %d SVG charts, want %d", n, len(charts))
	}
	if n := strings.Count(string(dom), `class="mean"`); n < 2*len(charts) {
		t.Fatalf("the browser has %d mean lines, want at least %d (two arms per chart)", n, 2*len(charts))
	}
	shot := filepath.Join(root, "shot.png")
	if err := exec.CommandContext(ctx, bin, append(args, "--window-size=1400,1400", "--screenshot="+shot, "file://"+page)...).Run(); err != nil {
		t.Fatalf("chromium --screenshot: %v", err)
	}
	b, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	// The first curve's colour (#0072B2) appears on the painted page.
	want := hexColor(palette[0])
	found := false
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y && !found; y += 2 {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if uint8(r>>8) == want.R && uint8(g>>8) == want.G && uint8(b>>8) == want.B {
				found = true
				break
			}
		}
	}
	if !found {
		t.Fatal("no pixel of the first curve's colour in the screenshot")
	}
}
