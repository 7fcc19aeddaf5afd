package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/report"
)

func init() {
	register(command{name: "report", summary: "an HTML page of charts over RL runs (arms x seeds)", run: runReport})
}

const reportUsage = `usage: keel report RUN_DIR... [--out FILE.html] [--title T]

Writes one self-contained HTML page (inline SVG, no network) with a chart
per measure — training reward, held-out avg@k, entropy, train-infer KL,
routing disagreement, staleness, surrogate validity — against gradient
steps, one curve per arm: runs named NAME-sSEED (as keel sweep names them)
are the seeds of arm NAME, drawn as their mean with their spread; a table
(on the page and printed here, in Markdown) sums each arm up. A
directory holding run directories (a sweep's --out) stands for them all.
A PNG of each chart goes to OUT-charts/ (OUT without .html).
`

func runReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), reportUsage); fs.PrintDefaults() }
	out := fs.String("out", "report.html", "the HTML file to write")
	title := fs.String("title", "keel runs", "page title")
	smooth := fs.Int("smooth", 10, "trailing mean over this many steps for per-step measures (1: none)")
	dirs, help, err := parseInterleaved(fs, args)
	if help || err != nil {
		return err
	}
	if len(dirs) == 0 {
		return errors.New("usage: keel report RUN_DIR... (see keel report -h)")
	}
	runs, err := runDirs(dirs)
	if err != nil {
		return err
	}
	n, pngDir, err := writeReport(*title, runs, *out, *smooth)
	if err != nil {
		return err
	}
	fmt.Printf("%d runs -> %s (charts as PNG in %s)\n", n, *out, pngDir)
	return nil
}

// runDirs expands the arguments of keel report: run directories, and
// directories of runs (a sweep's --out) standing for the runs inside.
func runDirs(dirs []string) ([]string, error) {
	var runs []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "metrics.jsonl")); err == nil {
			runs = append(runs, d)
			continue
		}
		m, _ := filepath.Glob(filepath.Join(d, "*", "metrics.jsonl"))
		if len(m) == 0 {
			return nil, fmt.Errorf("%s: neither a run directory (no metrics.jsonl) nor a directory of runs", d)
		}
		for _, f := range m {
			runs = append(runs, filepath.Dir(f))
		}
	}
	return runs, nil
}

// writeReport writes the page of charts over runs to out and a PNG of each
// chart to OUT-charts/, returning the number of runs and that directory.
// It prints each arm's summary as a Markdown table.
func writeReport(title string, runs []string, out string, smooth int) (int, string, error) {
	rs, err := report.Load(runs)
	if err != nil {
		return 0, "", err
	}
	fmt.Print(report.Markdown(report.Summarize(rs)))
	charts := report.Standard(rs, smooth)
	page := report.HTML(title, rs, charts)
	if err := atomicfile.Write(out, func(w io.Writer) error {
		_, err := w.Write(page)
		return err
	}); err != nil {
		return 0, "", err
	}
	// A PNG of each chart beside the page: OUT without .html, then -charts/.
	pngDir := strings.TrimSuffix(out, filepath.Ext(out)) + "-charts"
	if err := os.MkdirAll(pngDir, 0o755); err != nil {
		return 0, "", err
	}
	for i, c := range charts {
		b, err := c.PNG(800, 360)
		if err != nil {
			return 0, "", err
		}
		name := fmt.Sprintf("%02d-%s.png", i+1, strings.NewReplacer("/", "-", "@", "at").Replace(c.Metric))
		if err := atomicfile.Write(filepath.Join(pngDir, name), func(w io.Writer) error {
			_, err := w.Write(b)
			return err
		}); err != nil {
			return 0, "", err
		}
	}
	return len(rs), pngDir, nil
}
