package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/report"
)

func init() {
	register(command{name: "report", summary: "an HTML page of charts over RL runs (arms x seeds)", run: runReport})
}

const reportUsage = `usage: keel report RUN_DIR... [--out FILE.html] [--title T] [--compare A,B]...

Writes one self-contained HTML page (inline SVG, no network) with a chart
per measure — training reward, held-out avg@k, entropy, train-infer KL,
routing disagreement, staleness, surrogate validity (and turns and tool
calls per episode for runs of a multi-turn environment) — against gradient
steps, one curve per arm: runs named NAME-sSEED (as keel sweep names them)
are the seeds of arm NAME, drawn as their mean with their spread; a table
(on the page and printed here, in Markdown) sums each arm up. A
directory holding run directories (a sweep's --out) stands for them all.
A PNG of each chart goes to OUT-charts/ (OUT without .html).

--compare A,B (repeatable) pairs arms A and B by seed: per seed both ran,
the difference A - B of the held-out score at the last evaluation and of
the best one, in points; their mean, a 95% interval by Student's t over
the seeds' differences, the seeds each arm wins (ties apart), and a
verdict, "A above B" or "B above A" only where the interval excludes zero
("not established" otherwise; one seed is a direction, not a finding).
Seeds only one arm ran are listed as unpaired and left out. Each
comparison is printed as a Markdown table and shown on the page.
`

// compareFlag collects --compare A,B pairs of arms.
type compareFlag [][2]string

func (c *compareFlag) String() string {
	var s []string
	for _, p := range *c {
		s = append(s, p[0]+","+p[1])
	}
	return strings.Join(s, " ")
}

func (c *compareFlag) Set(v string) error {
	a, b, ok := strings.Cut(v, ",")
	a, b = strings.TrimSpace(a), strings.TrimSpace(b)
	if !ok || a == "" || b == "" || strings.Contains(b, ",") {
		return fmt.Errorf("want two arms, A,B: %q", v)
	}
	if a == b {
		return fmt.Errorf("an arm against itself: %q", v)
	}
	*c = append(*c, [2]string{a, b})
	return nil
}

func runReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), reportUsage); fs.PrintDefaults() }
	out := fs.String("out", "report.html", "the HTML file to write")
	title := fs.String("title", "keel runs", "page title")
	smooth := fs.Int("smooth", 10, "trailing mean over this many steps for per-step measures (1: none)")
	var compare compareFlag
	fs.Var(&compare, "compare", "`A,B`: compare arms A and B paired by seed (repeatable)")
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
	n, pngDir, err := writeReport(*title, runs, *out, *smooth, compare)
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
// It prints each arm's summary as a Markdown table, then a table per
// paired comparison of two arms (compare), which the page shows too.
func writeReport(title string, runs []string, out string, smooth int, compare [][2]string) (int, string, error) {
	rs, err := report.Load(runs)
	if err != nil {
		return 0, "", err
	}
	var paired []report.Paired
	for _, c := range compare {
		p, err := report.Compare(rs, c[0], c[1])
		if err != nil {
			return 0, "", err
		}
		paired = append(paired, p)
	}
	fmt.Print(report.Markdown(report.Summarize(rs)))
	for _, p := range paired {
		fmt.Print("\n" + report.PairedMarkdown(p))
	}
	charts := report.Standard(rs, smooth)
	page := report.HTML(title, rs, charts, paired...)
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

// paperComparisons are the paired comparisons of a grid's report: the two
// arms it runs at more seeds (MorePaths), and MiniRL against MiniRL
// without its IS correction wherever the grid has both (the paper's main
// finding); dirs are the grid's run directories.
func paperComparisons(g paperGrid, dirs []string) [][2]string {
	arms := map[string]bool{}
	for _, d := range dirs {
		arms[seedSuffix.ReplaceAllString(filepath.Base(filepath.Clean(d)), "")] = true
	}
	var out [][2]string
	add := func(a, b string) {
		if arms[a] && arms[b] && !slices.Contains(out, [2]string{a, b}) {
			out = append(out, [2]string{a, b})
		}
	}
	if len(g.MorePaths) == 2 {
		arm := func(p string) string { return strings.TrimSuffix(filepath.Base(p), filepath.Ext(p)) }
		add(arm(g.MorePaths[0]), arm(g.MorePaths[1]))
	}
	add("minirl", "minirl-no-is")
	return out
}

// seedSuffix is a run directory's -sSEED suffix (as keel sweep names runs).
var seedSuffix = regexp.MustCompile(`-s\d+$`)
