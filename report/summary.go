package report

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Stat is one measure of an arm over its seeds: their mean, lowest and
// highest, and how many runs had it.
type Stat struct {
	Mean, Lo, Hi float64
	N            int
}

// String is "mean [lo, hi]" with three digits, or the mean alone for one
// run, or "-" for none.
func (s Stat) String() string {
	switch s.N {
	case 0:
		return "-"
	case 1:
		return num(s.Mean)
	}
	return fmt.Sprintf("%s [%s, %s]", num(s.Mean), num(s.Lo), num(s.Hi))
}

func num(v float64) string {
	if a := math.Abs(v); a != 0 && (a < 0.01 || a >= 1e4) {
		return fmt.Sprintf("%.2e", v)
	}
	return fmt.Sprintf("%.3f", v)
}

// Summary is one arm's numbers: the figures a write-up quotes, each over
// the arm's seeds.
type Summary struct {
	Arm  string
	Runs int
	// Held-out avg@k before training, at the last evaluation, and the
	// best evaluation of each run.
	EvalStart, EvalFinal, EvalBest Stat
	// Training reward and entropy over the last tenth of each run's steps
	// (at least one step): where a collapse shows.
	RewardEnd, EntropyEnd Stat
	// The lowest entropy of each run, smoothed over a tenth of its steps.
	EntropyMin Stat
	// Train-infer k3 and routing disagreement (rollout vs pi_old), means
	// over each run.
	K3, Routing Stat
}

// SummaryColumns name Summary's figures, in table order.
var SummaryColumns = []string{"arm", "seeds", "held-out start", "held-out final", "held-out best",
	"reward (last 10%)", "entropy (last 10%)", "entropy (lowest)", "train-infer k3", "routing differs"}

// Summarize computes each arm's Summary, arms in name order.
func Summarize(runs []Run) []Summary {
	names, arms := byArm(runs)
	var out []Summary
	for _, name := range names {
		group := arms[name]
		s := Summary{Arm: name, Runs: len(group)}
		var start, final, best, rew, ent, entMin, k3, rout []float64
		for _, r := range group {
			var evals []float64
			var stepRew, stepEnt []float64
			var sk3, srout []float64
			for _, p := range r.Steps {
				for k, v := range p.Values {
					if strings.HasPrefix(k, "eval/avg@") && strings.Count(k, "/") == 1 && !math.IsNaN(v) {
						evals = append(evals, v)
					}
				}
				if v, ok := p.Values["reward/mean"]; ok && !math.IsNaN(v) {
					stepRew = append(stepRew, v)
				}
				if v, ok := p.Values["entropy"]; ok && !math.IsNaN(v) {
					stepEnt = append(stepEnt, v)
				}
				if v, ok := p.Values["train_infer/k3"]; ok && !math.IsNaN(v) {
					sk3 = append(sk3, v)
				}
				if v, ok := p.Values["routing/infer_vs_old"]; ok && !math.IsNaN(v) {
					srout = append(srout, v)
				}
			}
			if len(evals) > 0 {
				start = append(start, evals[0])
				final = append(final, evals[len(evals)-1])
				best = append(best, maxOf(evals))
			}
			if len(stepRew) > 0 {
				rew = append(rew, meanOf(lastTenth(stepRew)))
			}
			if len(stepEnt) > 0 {
				ent = append(ent, meanOf(lastTenth(stepEnt)))
				w := max(1, len(stepEnt)/10)
				entMin = append(entMin, minOf(trailing(stepEnt, w)[w-1:]))
			}
			if len(sk3) > 0 {
				k3 = append(k3, meanOf(sk3))
			}
			if len(srout) > 0 {
				rout = append(rout, meanOf(srout))
			}
		}
		s.EvalStart, s.EvalFinal, s.EvalBest = StatOf(start), StatOf(final), StatOf(best)
		s.RewardEnd, s.EntropyEnd, s.EntropyMin = StatOf(rew), StatOf(ent), StatOf(entMin)
		s.K3, s.Routing = StatOf(k3), StatOf(rout)
		out = append(out, s)
	}
	return out
}

func (s Summary) cells() []string {
	return []string{s.Arm, fmt.Sprint(s.Runs), s.EvalStart.String(), s.EvalFinal.String(), s.EvalBest.String(),
		s.RewardEnd.String(), s.EntropyEnd.String(), s.EntropyMin.String(), s.K3.String(), s.Routing.String()}
}

// Markdown renders summaries as a Markdown table, the form REPRODUCTION.md
// quotes.
func Markdown(sums []Summary) string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(SummaryColumns, " | ") + " |\n|")
	for i := range SummaryColumns {
		if i < 2 {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, s := range sums {
		b.WriteString("| " + strings.Join(s.cells(), " | ") + " |\n")
	}
	return b.String()
}

// summaryHTML renders summaries as an HTML table.
func summaryHTML(sums []Summary) string {
	var b strings.Builder
	b.WriteString("<table><tr>")
	for _, c := range SummaryColumns {
		fmt.Fprintf(&b, "<th>%s</th>", html.EscapeString(c))
	}
	b.WriteString("</tr>\n")
	for _, s := range sums {
		b.WriteString("<tr>")
		for _, c := range s.cells() {
			fmt.Fprintf(&b, "<td>%s</td>", html.EscapeString(c))
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</table>\n")
	return b.String()
}

// StatOf sums values up over seeds (N = 0 for none).
func StatOf(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	return Stat{Mean: meanOf(v), Lo: minOf(v), Hi: maxOf(v), N: len(v)}
}

func lastTenth(v []float64) []float64 { return v[len(v)-max(1, len(v)/10):] }

func meanOf(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func minOf(v []float64) float64 {
	m := math.Inf(1)
	for _, x := range v {
		m = math.Min(m, x)
	}
	return m
}

func maxOf(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = math.Max(m, x)
	}
	return m
}
