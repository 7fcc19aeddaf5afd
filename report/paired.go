package report

import (
	"fmt"
	"html"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Paired compares two arms run at the same seeds: for each seed both arms
// ran (and scored on the held-out set), the difference A - B of the
// held-out score at the last evaluation and of the best evaluation.
type Paired struct {
	A, B string
	// Seeds are the paired seeds, ascending.
	Seeds []int
	// Unpaired names the runs left out: a seed only one arm ran, a run
	// without a -sSEED suffix or without a held-out score.
	Unpaired []string
	// Final and Best are the differences of the held-out score at the
	// last evaluation and of the best evaluation, in Seeds' order.
	Final, Best Diff
}

// Diff is a paired difference A - B over seeds: the per-seed differences
// (in score units), their mean, the 95% interval of the mean by Student's
// t over the differences (NaN bounds for fewer than two), and the seeds
// each arm wins (ties apart).
type Diff struct {
	D                  []float64
	Mean, Lo, Hi       float64
	WinsA, WinsB, Ties int
}

// DiffOf computes a Diff from per-seed differences A - B.
func DiffOf(d []float64) Diff {
	out := Diff{D: d, Mean: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	for _, x := range d {
		switch {
		case x > 0:
			out.WinsA++
		case x < 0:
			out.WinsB++
		default:
			out.Ties++
		}
	}
	n := len(d)
	if n == 0 {
		return out
	}
	out.Mean = meanOf(d)
	if n < 2 {
		return out
	}
	var ss float64
	for _, x := range d {
		ss += (x - out.Mean) * (x - out.Mean)
	}
	half := tCrit95(n-1) * math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	out.Lo, out.Hi = out.Mean-half, out.Mean+half
	return out
}

// Verdict reads the interval: "A above B" or "B above A" only when it
// excludes zero, "not established" when it holds zero, and for one paired
// seed "n = 1: a direction, not a finding" (none: "no paired seeds").
func (d Diff) Verdict() string {
	switch {
	case len(d.D) == 0:
		return "no paired seeds"
	case len(d.D) == 1:
		return "n = 1: a direction, not a finding"
	case d.Lo > 0:
		return "A above B"
	case d.Hi < 0:
		return "B above A"
	}
	return "not established"
}

// tCrit95 is the 97.5% quantile of Student's t with df degrees of freedom
// (df >= 1), the half-width factor of a two-sided 95% interval: the root
// of P(|T| < t) = 0.95 by bisection on the closed form of the t
// distribution for integer df (Abramowitz and Stegun 26.7.3-4).
func tCrit95(df int) float64 {
	lo, hi := 0.0, 1e3
	for range 200 {
		mid := (lo + hi) / 2
		if tCentral(mid, df) < 0.95 {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// tCentral is P(|T| < t) for Student's t with df >= 1 degrees of freedom.
func tCentral(t float64, df int) float64 {
	th := math.Atan(t / math.Sqrt(float64(df)))
	s, c := math.Sin(th), math.Cos(th)
	c2 := c * c
	if df%2 == 1 {
		// (2/pi) [th + sin th (cos th + 2/3 cos^3 th + ... up to cos^(df-2))]
		var sum float64
		term := c
		for k := 1; 2*k+1 <= df; k++ {
			sum += term
			term *= c2 * float64(2*k) / float64(2*k+1)
		}
		return 2 / math.Pi * (th + s*sum)
	}
	// sin th [1 + 1/2 cos^2 th + 1*3/(2*4) cos^4 th + ... up to cos^(df-2)]
	var sum float64
	term := 1.0
	for k := 1; 2*k <= df; k++ {
		sum += term
		term *= c2 * float64(2*k-1) / float64(2*k)
	}
	return s * sum
}

// seedOf is a run's seed from its directory's -sSEED suffix.
func seedOf(r Run) (int, bool) {
	m := seedSuffix.FindString(filepath.Base(filepath.Clean(r.Dir)))
	if m == "" {
		return 0, false
	}
	s, err := strconv.Atoi(m[2:])
	return s, err == nil
}

// heldOut lists a run's held-out scores (eval/avg@k) in step order.
func heldOut(r Run) []float64 {
	var evals []float64
	for _, p := range r.Steps {
		for k, v := range p.Values {
			if strings.HasPrefix(k, "eval/avg@") && strings.Count(k, "/") == 1 && !math.IsNaN(v) {
				evals = append(evals, v)
			}
		}
	}
	return evals
}

// Compare pairs arms a and b of runs by seed. It fails when an arm has no
// runs or runs one seed twice.
func Compare(runs []Run, a, b string) (Paired, error) {
	names, arms := byArm(runs)
	p := Paired{A: a, B: b}
	if a == b {
		return p, fmt.Errorf("compare %s with itself", a)
	}
	bySeed := func(arm string) (map[int][]float64, error) {
		group, ok := arms[arm]
		if !ok {
			return nil, fmt.Errorf("compare: no runs of arm %q (arms: %s)", arm, strings.Join(names, ", "))
		}
		out := map[int][]float64{}
		for _, r := range group {
			name := filepath.Base(filepath.Clean(r.Dir))
			s, ok := seedOf(r)
			ev := heldOut(r)
			if !ok || len(ev) == 0 {
				p.Unpaired = append(p.Unpaired, name)
				continue
			}
			if _, dup := out[s]; dup {
				return nil, fmt.Errorf("compare: arm %s has seed %d twice (%s)", arm, s, r.Dir)
			}
			out[s] = ev
		}
		return out, nil
	}
	ea, err := bySeed(a)
	if err != nil {
		return p, err
	}
	eb, err := bySeed(b)
	if err != nil {
		return p, err
	}
	for s := range ea {
		if _, ok := eb[s]; ok {
			p.Seeds = append(p.Seeds, s)
		} else {
			p.Unpaired = append(p.Unpaired, fmt.Sprintf("%s-s%d", a, s))
		}
	}
	for s := range eb {
		if _, ok := ea[s]; !ok {
			p.Unpaired = append(p.Unpaired, fmt.Sprintf("%s-s%d", b, s))
		}
	}
	sort.Ints(p.Seeds)
	sort.Strings(p.Unpaired)
	var final, best []float64
	for _, s := range p.Seeds {
		va, vb := ea[s], eb[s]
		final = append(final, va[len(va)-1]-vb[len(vb)-1])
		best = append(best, maxOf(va)-maxOf(vb))
	}
	p.Final, p.Best = DiffOf(final), DiffOf(best)
	return p, nil
}

// PairedColumns name a paired comparison's table columns, in order.
var PairedColumns = []string{"arm A", "arm B", "held-out", "seeds paired", "A - B per seed (points)",
	"mean", "95% t interval", "wins A / B / ties", "verdict"}

// points formats a difference in score units as signed points.
func points(v float64) string { return fmt.Sprintf("%+.2f", 100*v) }

func (p Paired) rows() [][]string {
	row := func(measure string, d Diff) []string {
		per := make([]string, len(d.D))
		for i, x := range d.D {
			per[i] = fmt.Sprintf("s%d %s", p.Seeds[i], points(x))
		}
		mean, ci := "-", "-"
		if len(d.D) > 0 {
			mean = points(d.Mean)
		}
		switch {
		case len(d.D) == 1:
			ci = "undefined"
		case len(d.D) > 1:
			ci = fmt.Sprintf("[%s, %s]", points(d.Lo), points(d.Hi))
		}
		perS := strings.Join(per, ", ")
		if perS == "" {
			perS = "-"
		}
		return []string{p.A, p.B, measure, fmt.Sprint(len(d.D)), perS, mean, ci,
			fmt.Sprintf("%d / %d / %d", d.WinsA, d.WinsB, d.Ties), d.Verdict()}
	}
	return [][]string{row("final", p.Final), row("best", p.Best)}
}

// unpairedNote says which runs a comparison left out ("" for none).
func (p Paired) unpairedNote() string {
	if len(p.Unpaired) == 0 {
		return ""
	}
	return "unpaired, left out: " + strings.Join(p.Unpaired, ", ")
}

// PairedMarkdown renders a comparison as a Markdown table (a row for the
// held-out score at the last evaluation, one for the best), differences
// A - B in points (100 x score), then the runs left out unpaired.
func PairedMarkdown(p Paired) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Paired: %s vs %s (held-out avg@k, A - B in points)\n\n", p.A, p.B)
	b.WriteString("| " + strings.Join(PairedColumns, " | ") + " |\n")
	b.WriteString("|---|---|---|---:|---|---:|---|---|---|\n")
	for _, r := range p.rows() {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	if n := p.unpairedNote(); n != "" {
		b.WriteString("\n" + n + "\n")
	}
	return b.String()
}

// pairedHTML renders comparisons as one HTML table and their notes.
func pairedHTML(ps []Paired) string {
	if len(ps) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("<p>Paired comparisons at the same seeds: held-out avg@k, A - B in points (100 x score), mean and 95% interval by Student's t over the seeds' differences; a verdict only where the interval excludes zero.</p>\n<table><tr>")
	for _, c := range PairedColumns {
		fmt.Fprintf(&b, "<th>%s</th>", html.EscapeString(c))
	}
	b.WriteString("</tr>\n")
	for _, p := range ps {
		for _, r := range p.rows() {
			b.WriteString("<tr>")
			for _, c := range r {
				fmt.Fprintf(&b, "<td>%s</td>", html.EscapeString(c))
			}
			b.WriteString("</tr>\n")
		}
	}
	b.WriteString("</table>\n")
	for _, p := range ps {
		if n := p.unpairedNote(); n != "" {
			fmt.Fprintf(&b, "<p>%s vs %s: %s</p>\n", html.EscapeString(p.A), html.EscapeString(p.B), html.EscapeString(n))
		}
	}
	return b.String()
}
