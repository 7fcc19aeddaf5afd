package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/rollout"
	rolldevice "github.com/keel-rl/keel/rollout/device"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/device"
)

func init() {
	register(command{
		name:    "probe",
		summary: "measure the training-inference discrepancy of each rollout precision",
		run:     runProbe,
	})
}

const probeUsage = `usage: keel probe --model DIR --input FILE.jsonl [--precision exact,fp32,bf16,fp8,fp4] [--json FILE] [flags]

The discrepancy analysis to run before RL. For each rollout precision it
samples responses to the prompts of FILE.jsonl ({"tokens": [ids]} lines),
recomputes their log-probabilities with the training engine (log pi_old)
and reports (docs/method.md §6): train-infer KL estimators k1 and k3, mean and
max |log mu - log pi_old|, the fractions of tokens with |delta| above 0.1
and 1.0, the perplexity gap, the surrogate-validity gap (mean over
sequences of |prod(1+d_t) - 1 - sum d_t|) and, for MoE models, the
fraction of expert choices that differ per MoE layer. exact reports zeros.

flags:
`

// probeRow is one precision's measures.
type probeRow struct {
	Precision    string  `json:"precision"`
	Samples      int     `json:"samples"`
	Tokens       int     `json:"tokens"`
	K1           float64 `json:"k1"`
	K3           float64 `json:"k3"`
	MeanAbsDelta float64 `json:"mean_abs_delta"`
	MaxAbsDelta  float64 `json:"max_abs_delta"`
	FracAbove01  float64 `json:"frac_abs_delta_above_0.1"`
	FracAbove1   float64 `json:"frac_abs_delta_above_1"`
	PPLGap       float64 `json:"ppl_gap"`
	SurrogateGap float64 `json:"surrogate_gap"`
	// RoutingDisagree is SPEC §5's routing agreement measure per MoE
	// layer: the fraction of (position, slot) expert ids of the rollout
	// engine that the training engine did not choose at that position.
	RoutingDisagree []float64 `json:"routing_disagreement,omitempty"`
	// RoutingSetDiffers is, per MoE layer, the fraction of positions whose
	// expert set differs at all: how many tokens a replay (R3) changes.
	RoutingSetDiffers []float64 `json:"routing_set_differs,omitempty"`
}

func runProbe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), probeUsage)
		fs.PrintDefaults()
	}
	dir := fs.String("model", "", "Hugging Face model directory")
	in := fs.String("input", "", `JSONL file of {"tokens": [ids]} prompts`)
	precs := fs.String("precision", "exact,fp32,bf16,fp8,fp4", "comma-separated rollout precisions to measure")
	jsonOut := fs.String("json", "", "also write the measures to this JSON file")
	dev := fs.String("device", "cpu", "where both engines run: cpu, or cuda / cuda:N (the GPU rollout has exact, bf16, fp8 and fp4)")
	var sf sampleFlags
	sf.register(fs)
	fs.Lookup("n").DefValue, sf.n = "4", 4
	fs.Lookup("max-new-tokens").DefValue, sf.maxNew = "64", 64
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *dir == "":
		return errors.New("--model is required")
	case *in == "":
		return errors.New("--input is required")
	}
	modes, err := parsePrecisions(*precs, "--precision")
	if err != nil {
		return err
	}
	for _, p := range modes {
		if err := rolldevice.Check(*dev, p); err != nil {
			return fmt.Errorf("--device %s --precision %s: %w", *dev, p, err)
		}
	}
	sp, err := sf.sampling()
	if err != nil {
		return err
	}
	m, err := model.Load(*dir)
	if err != nil {
		return err
	}
	prompts, err := lpReadInput(*in, &m.Config)
	if err != nil {
		return err
	}
	var rows []probeRow
	for _, p := range modes {
		row, err := probeMode(*dev, m, prompts, p, &sf, sp)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		rows = append(rows, row)
	}
	printProbe(os.Stdout, rows)
	if *jsonOut != "" {
		return writeJSONFile(*jsonOut, rows)
	}
	return nil
}

// probeMode samples with one precision and compares with the training
// engine (float32) on the same tokens (rl.Probe), both on device dev.
func probeMode(dev string, m *model.Model, prompts [][]int32, p rollout.Precision, sf *sampleFlags, sp rollout.Sampling) (probeRow, error) {
	row := probeRow{Precision: p.String()}
	e, err := rolldevice.Engine(dev, m, sf.engineOptions(&m.Config, prompts, p))
	if err != nil {
		return row, err
	}
	defer e.Close()
	var t train.Trainer = train.New(m)
	if dev != "cpu" {
		if t, err = device.Trainer(device.Options{Device: dev}, m, train.DefaultAdamWConfig(), nil); err != nil {
			return row, err
		}
		defer t.Close()
	}
	r, err := rl.Probe(t, e, prompts, sf.n, sp, 8192)
	if err != nil {
		return row, err
	}
	d := r.Discrepancy
	row.Samples, row.Tokens = r.Samples, d.Tokens
	row.K1, row.K3, row.MeanAbsDelta, row.MaxAbsDelta = d.K1, d.K3, d.MeanAbs, d.MaxAbs
	row.FracAbove01, row.FracAbove1, row.PPLGap, row.SurrogateGap = d.Above01, d.Above1, d.PPLGap, d.SurrogateGap
	row.RoutingDisagree, row.RoutingSetDiffers = r.RoutingDisagree, r.RoutingSetDiffers
	return row, nil
}

func printProbe(w io.Writer, rows []probeRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "precision\ttokens\tk1\tk3\tmean|Δ|\tmax|Δ|\t>0.1\t>1.0\tppl gap\tsurrogate gap\texperts differ (per MoE layer)\tsets differ\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%.3g\t%.3g\t%.3g\t%.3g\t%.4f\t%.4f\t%.3g\t%.3g\t%s\t%s\t\n",
			r.Precision, r.Tokens, r.K1, r.K3, r.MeanAbsDelta, r.MaxAbsDelta, r.FracAbove01, r.FracAbove1, r.PPLGap, r.SurrogateGap,
			joinFloats(r.RoutingDisagree), joinFloats(r.RoutingSetDiffers))
	}
	tw.Flush()
}

// joinFloats prints per-layer fractions side by side ("-" for none).
func joinFloats(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	f := make([]string, len(v))
	for i, x := range v {
		f[i] = fmt.Sprintf("%.4f", x)
	}
	return strings.Join(f, " ")
}
