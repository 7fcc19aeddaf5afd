package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keel-rl/keel/bench"
	"github.com/keel-rl/keel/kernels"
	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	rollcuda "github.com/keel-rl/keel/rollout/cuda"
	rolldevice "github.com/keel-rl/keel/rollout/device"
	"github.com/keel-rl/keel/train/device"
)

func init() {
	register(command{name: "bench", summary: "measure GEMM GFLOP/s and training tokens/s on the model presets", run: runBench})
}

type benchReport struct {
	Device         string               `json:"device,omitempty"` // the GPU, for --device cuda
	TrainPrecision string               `json:"train_precision,omitempty"`
	CPU            string               `json:"cpu_path"`
	Threads        int                  `json:"threads"`
	Gemm           []benchGemmRow       `json:"gemm"`
	PeakGFLOPS     float64              `json:"peak_gflops"`             // keel's float32 GEMM at 1024³, or the card's bf16 peak (--device cuda)
	PeakGBPerS     float64              `json:"peak_gb_per_s,omitempty"` // the card's memory bandwidth (--device cuda)
	Train          []bench.TrainResult  `json:"train"`
	Utilisation    map[string]float64   `json:"mfu"`
	Decode         []benchDecodeRow     `json:"decode,omitempty"`
	RL             []bench.RLStepResult `json:"rl_step,omitempty"`
	Serve          []bench.ServeResult  `json:"serve,omitempty"`
}

type benchDecodeRow struct {
	rollout.DecodeResult
	PrecisionName string  `json:"precision_name"`
	VsForward     float64 `json:"vs_forward"` // decode tokens/s over the training engine's forward tokens/s
	// On a GPU: the weights and KV cache a decoding step reads
	// (rollout/cuda.StepBytes, at the mean context) times the steps per
	// second (generated tokens/s over the sequences), and that over the
	// card's bandwidth (--peak-gbps).
	GBPerS    float64 `json:"gb_per_s,omitempty"`
	Bandwidth float64 `json:"bandwidth,omitempty"`
	// The same for the full decoding steps alone (DecodeResult.StepMS, at
	// their own mean context): the measure, bytes a step reads
	// over the step's time, without the batch's ramps and prefill.
	StepGBPerS    float64 `json:"step_gb_per_s,omitempty"`
	StepBandwidth float64 `json:"step_bandwidth,omitempty"`
}

type benchGemmRow struct {
	M, K, N int
	F32     float64 `json:"f32_gflops"`
	BF16    float64 `json:"bf16_gflops"`
}

// benchOptions are keel bench's flags, checked.
type benchOptions struct {
	presets             []string
	vocab, seqs, seqLen int
	dur                 time.Duration
	quick, noGemm, json bool
	noDecode, noRL      bool
	noServe             bool
	decodeSlots         []int
	decodePrecs         []rollout.Precision
	decodeGroup         int
	decodePrompt        int // prompt tokens of the decode table's sequences
	decodeNew           int // new tokens of each
	rlPrec, servePrec   rollout.Precision
	rlMaxNew            int
	device, trainPrec   string
	recompute           bool
	gpuDecode           bool
	layers              int
	peakTFLOPS          float64
	peakGBPerS          float64
	serveClients        int
}

func runBench(args []string) error {
	o, err := parseBenchFlags(args)
	if err != nil {
		return err
	}
	rep, err := measure(o)
	if err != nil {
		return err
	}
	if o.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printBench(os.Stdout, rep)
}

// parseBenchFlags reads and checks keel bench's flags.
func parseBenchFlags(args []string) (*benchOptions, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	presets := fs.String("presets", "tiny-dense,tiny-moe,small-moe", "comma-separated model presets to time")
	vocab := fs.Int("vocab", 128, "vocabulary size of the benchmarked models")
	seqs := fs.Int("seqs", 16, "sequences per training step")
	seqLen := fs.Int("len", 128, "tokens per sequence")
	dur := fs.Duration("time", 2*time.Second, "time spent on each measurement")
	quick := fs.Bool("quick", false, "short measurements (0.3 s each): a smoke test, not a benchmark")
	noGemm := fs.Bool("no-gemm", false, "skip the GEMM table (utilisation is then not reported)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	noDecode := fs.Bool("no-decode", false, "skip the rollout engine's decode table")
	decodeSlots := fs.String("decode-slots", "64,256", "comma-separated concurrent sequences for the decode table")
	decodePrec := fs.String("decode-precisions", "exact,fp32,bf16,fp8", "comma-separated rollout precisions for the decode table")
	decodeGroup := fs.Int("decode-group", 1, "samples per prompt in the decode table (RL's group size G; the samples of a prompt share its prefill)")
	decodePrompt := fs.Int("decode-prompt", 32, "prompt tokens of each sequence in the decode table")
	decodeNew := fs.Int("decode-new", 96, "new tokens of each sequence in the decode table (long ones measure decoding at long contexts)")
	noRL := fs.Bool("no-rl", false, "skip the RL-step table")
	rlPrec := fs.String("rl-precision", "fp8", "rollout precision of the RL-step table")
	rlMaxNew := fs.Int("rl-max-new", 96, "response budget of the RL-step table (32 prompts x 8 samples of 32-token prompts)")
	noServe := fs.Bool("no-serve", false, "skip the keel serve table")
	servePrec := fs.String("serve-precision", "fp8", "rollout precision of the keel serve table")
	serveClients := fs.Int("serve-clients", 64, "concurrent requests in the keel serve table")
	dev := fs.String("device", "cpu", "where the engines run: cpu, or cuda / cuda:N (then the training table with MFU against --peak-tflops, the GPU rollout's decode table and the RL-step table with both engines on the GPU)")
	layers := fs.Int("layers", 0, "decoder layers of the benchmarked presets (0: each preset's)")
	trainPrec := fs.String("train-precision", "fp32", "the training engine's products: fp32, or bf16 (with --device cuda)")
	recompute := fs.Bool("recompute", false, "with --device cuda: activation checkpointing in the training table")
	peak := fs.Float64("peak-tflops", 989.4, "with --device cuda: the card's dense bf16 peak, TFLOP/s, for MFU (H100 and H200 SXM: 989.4)")
	peakGB := fs.Float64("peak-gbps", 3350, "with --device cuda: the card's memory bandwidth, GB/s, for the decode table (H100 SXM: 3350, H200: 4800)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o := &benchOptions{vocab: *vocab, seqs: *seqs, seqLen: *seqLen, dur: *dur, quick: *quick, noGemm: *noGemm, json: *asJSON,
		noDecode: *noDecode, noRL: *noRL, noServe: *noServe, decodeGroup: *decodeGroup, decodePrompt: *decodePrompt, decodeNew: *decodeNew, serveClients: *serveClients,
		device: *dev, layers: *layers, peakTFLOPS: *peak, peakGBPerS: *peakGB, trainPrec: *trainPrec, rlMaxNew: *rlMaxNew}
	gpu, err := kc.ParseDevice(*dev)
	if err != nil {
		return nil, fmt.Errorf("--device: %w", err)
	}
	if err := (device.Options{Device: *dev, Precision: *trainPrec, Recompute: *recompute}).Check(); err != nil {
		return nil, fmt.Errorf("--train-precision/--recompute: %w", err)
	}
	o.recompute = *recompute
	if gpu >= 0 {
		// On a GPU: the training table, unless --no-decode the decode
		// table (the GPU rollout backend, in --decode-precisions but the
		// CPU's own fp32), and unless --no-rl the RL-step table with both
		// engines on the GPU.
		o.gpuDecode = !o.noDecode
		o.noGemm, o.noDecode, o.noServe = true, true, true
	}
	if *layers < 0 || !(*peak > 0) || !(*peakGB > 0) || *rlMaxNew < 1 {
		return nil, fmt.Errorf("--layers must be >= 0, --rl-max-new at least 1, and --peak-tflops and --peak-gbps positive")
	}
	for _, p := range strings.Split(*presets, ",") {
		o.presets = append(o.presets, strings.TrimSpace(p))
	}
	if o.quick {
		o.dur = 300 * time.Millisecond
	}
	if o.seqLen < 2 || o.seqs < 1 {
		return nil, fmt.Errorf("--len must be at least 2 and --seqs at least 1")
	}
	if o.decodePrecs, err = parsePrecisions(*decodePrec, "--decode-precisions"); err != nil {
		return nil, err
	}
	if o.decodePrompt < 1 || o.decodeNew < 1 {
		return nil, fmt.Errorf("--decode-prompt %d, --decode-new %d: both must be at least 1", o.decodePrompt, o.decodeNew)
	}
	for _, f := range strings.Split(*decodeSlots, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(f), &n); err != nil || n < 1 {
			return nil, fmt.Errorf("--decode-slots: %q is not a positive count", f)
		}
		if o.decodeGroup < 1 || n%o.decodeGroup != 0 {
			return nil, fmt.Errorf("--decode-group %d does not divide --decode-slots %d", o.decodeGroup, n)
		}
		o.decodeSlots = append(o.decodeSlots, n)
	}
	// Checked up front, so that a typo fails before minutes of tables.
	for _, f := range []struct {
		flag, v string
		dst     *rollout.Precision
	}{{"--rl-precision", *rlPrec, &o.rlPrec}, {"--serve-precision", *servePrec, &o.servePrec}} {
		ps, err := parsePrecisions(f.v, f.flag)
		if err != nil {
			return nil, err
		}
		*f.dst = ps[0]
	}
	return o, nil
}

// measure runs the tables o asks for.
func measure(o *benchOptions) (*benchReport, error) {
	rep := &benchReport{CPU: kernels.Features(), Threads: runtime.GOMAXPROCS(0), Utilisation: map[string]float64{}}
	if !o.noGemm {
		for _, s := range bench.GemmShapes {
			row := benchGemmRow{M: s.M, K: s.K, N: s.N}
			row.F32 = kernels.BenchGemm(s.M, s.K, s.N, o.dur)
			row.BF16 = kernels.BenchGemmBF16(s.M, s.K, s.N, o.dur)
			if s == (bench.GemmShape{M: 1024, K: 1024, N: 1024}) {
				rep.PeakGFLOPS = row.F32
			}
			rep.Gemm = append(rep.Gemm, row)
		}
	}
	if gpu, _ := kc.ParseDevice(o.device); gpu >= 0 {
		d, err := kc.Open(gpu)
		if err != nil {
			return nil, fmt.Errorf("--device %s: %w", o.device, err)
		}
		rep.Device, rep.TrainPrecision = d.String(), o.trainPrec
		if d.Emulated {
			rep.Device += " [emulated on the CPU: no GPU figure]"
		}
		d.Close()
		rep.PeakGFLOPS = o.peakTFLOPS * 1000
	}
	for _, p := range o.presets {
		r, err := bench.TrainOn(bench.TrainSpec{Device: o.device, Precision: o.trainPrec, Recompute: o.recompute, Preset: p, Layers: o.layers, Vocab: o.vocab, Seqs: o.seqs, SeqLen: o.seqLen, Time: o.dur})
		if err != nil {
			return nil, err
		}
		rep.Train = append(rep.Train, r)
		if rep.PeakGFLOPS > 0 {
			rep.Utilisation[r.Preset] = r.TrainGFLOPS / rep.PeakGFLOPS
		}
	}
	if gpu, _ := kc.ParseDevice(o.device); gpu >= 0 && o.gpuDecode {
		rep.PeakGBPerS = o.peakGBPerS
		for _, p := range o.presets {
			for _, n := range o.decodeSlots {
				for _, prec := range o.decodePrecs {
					if prec == rollout.FP32 {
						continue // the CPU engine's own kernels: no GPU form
					}
					row, err := benchGPUDecode(o, p, prec, n)
					if err != nil {
						return nil, err
					}
					for _, t := range rep.Train {
						if t.Preset == p && t.FwdTokensPerS > 0 {
							row.VsForward = row.TokensPerS / t.FwdTokensPerS
						}
					}
					rep.Decode = append(rep.Decode, row)
				}
			}
		}
	}
	for _, tr := range rep.Train {
		if o.noDecode {
			break
		}
		for _, n := range o.decodeSlots {
			for _, p := range o.decodePrecs {
				r, err := rollout.BenchDecodeGroups(tr.Preset, o.vocab, p, n, o.decodeGroup, o.decodePrompt, o.decodeNew, o.dur)
				if err != nil {
					return nil, err
				}
				rep.Decode = append(rep.Decode, benchDecodeRow{DecodeResult: r, PrecisionName: p.String(), VsForward: r.TokensPerS / tr.FwdTokensPerS})
			}
		}
	}
	steps := 3
	if o.quick {
		steps = 1
	}
	for _, tr := range rep.Train {
		if o.noRL {
			break
		}
		r, err := bench.RLStep(bench.RLStepSpec{Preset: tr.Preset, Vocab: o.vocab, Layers: o.layers, Rollout: o.rlPrec,
			Prompts: 32, Group: 8, MaxNew: o.rlMaxNew, Steps: steps, Device: o.device, TrainPrecision: o.trainPrec, Recompute: o.recompute})
		if err != nil {
			return nil, err
		}
		rep.RL = append(rep.RL, r)
	}
	for _, tr := range rep.Train {
		if o.noServe {
			break
		}
		r, err := bench.Serve(tr.Preset, o.vocab, o.servePrec, o.serveClients, 32, 96, 2*o.dur)
		if err != nil {
			return nil, err
		}
		rep.Serve = append(rep.Serve, r)
	}
	return rep, nil
}

// printBench writes the report's tables and what each measured to out.
func printBench(out io.Writer, rep *benchReport) error {
	if rep.Device != "" {
		fmt.Fprintf(out, "keel bench: %s (the GPU engine, %s products; MFU against the card's bf16 peak)\n\n", rep.Device, rep.TrainPrecision)
	} else {
		fmt.Fprintf(out, "keel bench: kernels %s, %d threads\n\n", rep.CPU, rep.Threads)
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(rep.Gemm) > 0 {
		fmt.Fprintln(w, "GEMM M\tK\tN\tf32 GFLOP/s\tbf16 GFLOP/s\tbf16/f32\t")
		for _, g := range rep.Gemm {
			fmt.Fprintf(w, "%d\t%d\t%d\t%.1f\t%.1f\t%.2fx\t\n", g.M, g.K, g.N, g.F32, g.BF16, g.BF16/g.F32)
		}
		fmt.Fprintln(w)
	}
	act := rep.Device != "" // the GPU engine measures its activations' memory
	head := "model\tparams\ttokens/step\tforward tok/s\ttrain tok/s\ttrain GFLOP/s\tMFU\t"
	if act {
		head += "activations GiB\tplanned GiB\t"
	}
	fmt.Fprintln(w, head)
	for _, r := range rep.Train {
		mfu := "-"
		if u, ok := rep.Utilisation[r.Preset]; ok {
			mfu = fmt.Sprintf("%.0f%%", 100*u)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%.0f\t%.0f\t%.1f\t%s\t", r.Preset, r.Params, r.Tokens, r.FwdTokensPerS, r.TokensPerS, r.TrainGFLOPS, mfu)
		if act {
			fmt.Fprintf(w, "%.2f\t%.2f\t", float64(r.ActivationBytes)/(1<<30), float64(r.PlannedActivationBytes)/(1<<30))
		}
		fmt.Fprintln(w)
	}
	printBenchTables(w, rep)
	if err := w.Flush(); err != nil {
		return err
	}
	printBenchNotes(out, rep)
	return nil
}

// benchGPUDecode measures one decode row on the GPU rollout backend, with
// the bandwidth its steps reach.
func benchGPUDecode(o *benchOptions, preset string, prec rollout.Precision, slots int) (benchDecodeRow, error) {
	promptLen, newTokens := o.decodePrompt, o.decodeNew
	var cfg model.Config
	r, err := rollout.BenchDecodeOn(rollout.DecodeSpec{Preset: preset, Layers: o.layers, Vocab: o.vocab, Precision: prec,
		Slots: slots, Group: o.decodeGroup, PromptLen: promptLen, NewTokens: newTokens, Time: o.dur,
		NewEngine: func(m *model.Model, opt rollout.Options) (*rollout.Engine, error) {
			cfg = m.Config
			return rolldevice.Engine(o.device, m, opt)
		}})
	if err != nil {
		return benchDecodeRow{}, err
	}
	row := benchDecodeRow{DecodeResult: r, PrecisionName: prec.String()}
	step, err := rollcuda.StepBytes(&cfg, prec, slots, promptLen+newTokens/2)
	if err != nil {
		return row, err
	}
	row.GBPerS = step * r.TokensPerS / float64(slots) / 1e9
	row.Bandwidth = row.GBPerS / o.peakGBPerS
	if r.FullSteps > 0 && r.StepMS > 0 {
		full, err := rollcuda.StepBytes(&cfg, prec, slots, int(math.Round(r.StepContext)))
		if err != nil {
			return row, err
		}
		row.StepGBPerS = full / (r.StepMS / 1e3) / 1e9
		row.StepBandwidth = row.StepGBPerS / o.peakGBPerS
	}
	return row, nil
}

// printBenchTables writes the decode, RL-step and serve tables.
func printBenchTables(w io.Writer, rep *benchReport) {
	if len(rep.Decode) > 0 {
		fmt.Fprintln(w)
		if rep.PeakGBPerS > 0 {
			fmt.Fprintln(w, "decode model\tsequences\tper prompt\tprecision\tgenerated tok/s\tvs forward\tweights+KV GB/s\tof bandwidth\tfull step ms\tits GB/s\tof bandwidth\t")
		} else {
			fmt.Fprintln(w, "decode model\tsequences\tper prompt\tprecision\tgenerated tok/s\tvs forward\t")
		}
		for _, d := range rep.Decode {
			fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%.0f\t%.0f%%\t", d.Preset, d.Slots, d.SamplesPerPrompt, d.PrecisionName, d.TokensPerS, 100*d.VsForward)
			switch {
			case rep.PeakGBPerS > 0 && d.FullSteps > 0:
				fmt.Fprintf(w, "%.0f\t%.1f%%\t%.3f\t%.0f\t%.1f%%\t", d.GBPerS, 100*d.Bandwidth, d.StepMS, d.StepGBPerS, 100*d.StepBandwidth)
			case rep.PeakGBPerS > 0: // no step with every sequence decoding
				fmt.Fprintf(w, "%.0f\t%.1f%%\t-\t-\t-\t", d.GBPerS, 100*d.Bandwidth)
			}
			fmt.Fprintln(w)
		}
	}
	if len(rep.RL) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "RL step\tprecision\tstep s\trollout\tscoring\tpi_old\tupdates\tweight push\tother\tloop overhead\t")
		for _, r := range rep.RL {
			pc := func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v/r.Step) }
			fmt.Fprintf(w, "%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Preset, r.Precision, r.Step, pc(r.Rollout), pc(r.Score), pc(r.PiOld), pc(r.Update), pc(r.Push), pc(r.Other), pc(r.LoopOverhead))
		}
	}
	if len(rep.Serve) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "keel serve	precision	clients	engine tok/s	/generate tok/s	vs engine	p50 s	p99 s	streamed tok/s	vs engine	p50 s	p99 s	failed	weight write s	weight load s	")
		for _, r := range rep.Serve {
			fmt.Fprintf(w, "%s	%s	%d	%.0f	%.0f	%.0f%%	%.3f	%.3f	%.0f	%.0f%%	%.3f	%.3f	%d/%d	%.3f	%.3f	\n", r.Preset, r.Precision, r.Clients,
				r.EngineTokensPerS, r.GenerateTokensPerS, 100*r.GenerateTokensPerS/r.EngineTokensPerS, r.GenerateP50, r.GenerateP99,
				r.StreamTokensPerS, 100*r.StreamTokensPerS/r.EngineTokensPerS, r.StreamP50, r.StreamP99, r.Failed, r.Requests, r.WeightWrite, r.WeightLoad)
		}
	}
}

// printBenchNotes says to out what each table measured.
func printBenchNotes(out io.Writer, rep *benchReport) {
	if len(rep.Serve) > 0 {
		fmt.Fprintln(out, "\nkeel serve: a preset with random weights served on loopback; rounds of CLIENTS concurrent requests (32-token prompts, 96 new tokens, one sample each) as POST /generate and as streamed /v1/completions, alternated with the same batch on an in-process engine; tok/s = generated tokens per second of a round, best round; latencies over all requests; then one weight sync: the model written as a Hugging Face directory (float32) and loaded with /update_weights_from_disk.")
	}
	if len(rep.RL) > 0 {
		r := rep.RL[0]
		fmt.Fprintf(out, "\nRL step: MiniRL, %d random 32-token prompts x %d samples of up to %d tokens, one mini-batch, a synthetic reward; phases as shares of the step; loop overhead = the step less the two engines and the weight push (scoring, coefficients, metrics).\n", r.Prompts, r.Group, r.MaxNew)
	}
	if len(rep.Decode) > 0 {
		d := rep.Decode[0]
		fmt.Fprintf(out, "\ndecode: %d-token prompts, %d new tokens each at temperature 1, all sequences concurrent, \"per prompt\" samples sharing each prompt's prefill; tokens/s counts generated tokens (prefill time included); vs forward = over the forward tok/s above.\n", d.PromptLen, d.NewTokens)
		if rep.PeakGBPerS > 0 {
			fmt.Fprintf(out, "weights+KV GB/s: the bytes one decoding step reads (the weights in the precision's storage, MoE experts in the share the step's tokens route to, every sequence's keys and values at the mean context of %d positions) times steps per second; of bandwidth: over --peak-gbps (%.0f GB/s). Prefill time counts, so both are lower bounds. full step ms: the median wall time of the steps where every sequence decodes (no prompt row; the batch's ramps left out), with the bytes such a step reads at their own mean context over it, and that over --peak-gbps.\n", d.PromptLen+d.NewTokens/2, rep.PeakGBPerS)
		}
	}
	switch {
	case rep.Device != "":
		fmt.Fprintf(out, "\nMFU: model FLOPs of a training step (3 × forward, GEMMs and attention) per second over the card's dense bf16 peak given by --peak-tflops (%.1f TFLOP/s).\n", rep.PeakGFLOPS/1000)
		fmt.Fprintf(out, "activations: the bytes a training step's activations and scratch took at their peak (the engine's buffers as asked of its allocator, logits kept for the backward, the bf16 operand scratch; weights, gradients and AdamW state apart; --json's ActivationHeldBytes adds the allocator's rounding); planned: train/memplan's plan for them, which the engine checks before a step.\n")
	case rep.PeakGFLOPS > 0:
		fmt.Fprintf(out, "\nMFU: model FLOPs of a training step (3 × forward, GEMMs and attention) per second over keel's float32 GEMM at 1024³ (%.1f GFLOP/s) in this run.\n", rep.PeakGFLOPS)
	}
}
