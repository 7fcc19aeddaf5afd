#!/usr/bin/env bash
# The GPU checks, run on the device machine (tools/gpu/build.sh first,
# here; carry tools/gpu/bin). Sections, in order, each printing a line per
# check and writing full logs under $OUT (or /tmp/keel-gpu):
#   warm   every kernel source compiled for this GPU into the kernel cache,
#          a keel device process a source (NVRTC 11.8 compiles one source
#          at a time in a process; a fresh machine otherwise compiles at
#          each source's first use)
#   tests  keel device; the kernels against the CPU kernels; the training
#          engine against the CPU engine; the rollout backend against the
#          training engine and the CPU rollout; keel rl on the GPU (exact
#          rollout, resume) (about 3 minutes)
#   e2e    keel sft and the quickstart's first RL steps on cpu and cuda
#   hf     keel's log-probs (fp32, bf16) against transformers on a
#          Qwen3-0.6B-shaped model of two layers and a 30B-A3B-shaped one
#          of one
#   speed  training tokens/s and MFU: keel (fp32, bf16) and PyTorch
#          (fp32, bf16 autocast) on the Qwen3-0.6B and 30B-A3B shapes
#   profile  bf16 training, issue 24's rows (Qwen3-0.6B at 8 x 2048 and
#          2 x 16384, the MoE shape): keel (with flash.cu's three forwards,
#          KEEL_FLASH_FWD=wideq (the default), narrow and wide, and on the first shape its one-stage
#          backward, KEEL_FLASH_BWD=single, and on both 0.6B shapes its
#          dK/dV pass with 16-query tiles, KEEL_FLASH_DKV=narrow, and its backward
#          from stored dS, KEEL_FLASH_DQ=stored; on the MoE shape its experts
#          grouped on the host, KEEL_MOE_GROUP=host; on the first shape its
#          buffers allocated every step, KEEL_CUDA_POOL=0, the LM head's
#          logits recomputed in the backward, KEEL_HEAD_KEEP=0, cuBLASLt's
#          candidates timed per plan, KEEL_BLAS_TUNE=1, and RMSNorm a block
#          a row, KEEL_ROW_KERNELS=block, and flash.cu's tiles each
#          sequence's from its last, KEEL_FLASH_ORDER=0, or head after head,
#          KEEL_FLASH_ORDER=headwise) and PyTorch, keel
#          again with KEEL_CUDA_PROFILE=1 (the time of every kernel and
#          product, and of the driver's allocation calls);
#          then a profiled bf16 decode at 256 sequences, Qwen3-0.6B and MoE shapes
#   gemm   keel's fp32 GEMM and cuBLASLt's bf16 on a 0.6B layer's shapes
#          (GFLOP/s; BenchmarkDeviceGemm, under a minute), and a decoding
#          step's draws at 256 rows, full and truncated (BenchmarkDeviceDraw)
#   flash  flash.cu's kernels alone on the Qwen3-0.6B shape's attention
#          (8 x 2048, 2 x 16384): each forward and backward kernel's
#          TFLOP/s, the tiles in FlashOrder's order ("ordered") or each
#          sequence's from its last (BenchmarkDeviceFlash, under a minute)
#   decode issue 25's decode rows: keel (exact, bf16) at 64 and 256
#          sequences on the Qwen3-0.6B shape and the MoE shape (2 layers)
#          with CUDA graphs, the deep decoding attention (KEEL_DECODE_ATTN=deep:
#          eight keys' rows in flight a warp) against the fast default, and
#          at 64 and 256 sequences of 32 + 1,024 tokens (the RL step's) the
#          fast attention against the deep one and the split to 8192 warps,
#          and transformers' generate beside them (about 5 minutes); with
#          KEEL_GPU_AB=all also the switches session 24 decided: graphs off,
#          the MoE layers grouped on the host (KEEL_MOE_GROUP=host), cuBLASLt's
#          candidates timed per plan (KEEL_BLAS_TUNE=1, then from its table),
#          the grouped attention (KEEL_DECODE_ATTN=grouped), the split to 8192
#          warps at 96 tokens, a warp per query head (KEEL_DECODE_ATTN=head)
#          and the unsplit attention (KEEL_DECODE_SPLIT=0, 64 sequences of
#          1,056 tokens)
#   fp8    the fp8 rollout's decode at 256 sequences with its products
#          emulated on the bf16 GEMM and on cuBLASLt's float8 product
#          (KEEL_FP8_GEMM=1), and TestDeviceFP8 under the latter
#   nsys   Nsight Systems on a bf16 decode at 256 sequences with graphs
#          on: each kernel's device time and the device's idle gaps (under
#          3 minutes)
#   ncu    Nsight Compute on one launch of each hot kernel configuration
#          (flash.cu narrow, wide and wideq, the LM head's row kernels, AdamW, the
#          grouped expert products and MoE grouping, the decoding step's
#          attention): speed of light, pipes, shared memory, warp stalls,
#          occupancy; the figures the next speed work needs (about 2 minutes)
#   sanitize  compute-sanitizer's memcheck, racecheck and synccheck on the
#          tests of the kernels with shared-memory tiles and pipelines
#          (flash.cu, gemm.cu, moe.cu, attn.cu): the races between threads
#          and the out-of-bounds accesses keel's CPU emulator cannot show
#          (about 3 minutes)
#   fit    bf16 training of the Qwen3-1.7B shape at 4 x 4096 tokens with
#          recomputation and without (issue 24: it fits one 80 GB card),
#          the activations' measured peak beside train/memplan's plan
#   learn  the README's quickstart (350 steps, seed 1) with both engines on
#          the GPU: its held-out avg@8 gain against the CPU's +6.5, +6.5,
#          +6.4 (README) and its step time (about 5 minutes)
#   rl     one RL step with both engines on the GPU, Qwen3-0.6B shape,
#          32 prompts x 8 samples of up to 1024 tokens (bf16 training,
#          bf16 rollout): where the step's time goes (issue 25's table);
#          then with KEEL_BLAS_TUNE=1, KEEL_DECODE_ATTN=grouped and
#          KEEL_DECODE_ATTN=deep
# profile and decode run only the defaults, the issues' rows and the A/Bs of
# settings no card has decided yet; KEEL_GPU_AB=all adds the decided ones
# (the settings session 24's H200 run left as they were).
# Usage: bash tools/gpu/check.sh [warm] [tests] [e2e] [hf] [speed] [profile] [gemm] [flash] [decode] [fp8] [nsys] [ncu] [sanitize] [fit] [learn] [rl]
#        (none: tests e2e hf speed)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/keel-gpu}
mkdir -p "$out"
export KEEL_CACHE_DIR=$out/cache KEEL_REQUIRE_CUDA=1 KEEL_REQUIRE_NVRTC=1
bin=tools/gpu/bin
sections=${*:-tests e2e hf speed}
status=0
# KEEL_GPU_AB=all adds the A/B rows of settings a card has decided already
# (profile, decode); by default only the defaults, the issues' rows and the
# A/Bs still open run, to spend the device's minutes on what is not known.
gpu_ab=${KEEL_GPU_AB:-open}

# gotest NAME BINARY TIMEOUT [ARGS]: runs a test binary, prints its verdicts
# and failure lines, and records a failure.
gotest() {
  local name=$1 binary=$2 limit=$3
  shift 3
  timeout "$limit" "$bin/$binary" -test.v "$@" > "$out/$name.log" 2>&1
  gotest_report "$name" $?
}

# gotest_report NAME RC: gotest's verdicts and failure lines from
# $out/NAME.log, for a test binary that exited RC.
gotest_report() {
  local name=$1 rc=$2
  grep -E '^(\s*--- |ok|FAIL|PASS)' "$out/$name.log" | sed 's/^/  /'
  grep -E '^\s+\S+_test.go:[0-9]+:' "$out/$name.log" | head -40 | sed 's/^/  /'
  echo "== $name exit $rc"
  [ $rc -eq 0 ] || status=1
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; } > "$out/gpu.txt" 2>&1
echo "== $(head -1 "$out/gpu.txt") (sections: $sections)"

if [[ " $sections " == *" warm "* ]]; then
  echo "== the kernel cache: every kernel source compiled for this GPU, a keel device process each (NVRTC compiles one source at a time in a process)"
  pids=() names=()
  for f in kernels/cuda/kernels/*.cu; do
    timeout 120 $bin/keel device --sources "${f##*/}" > "$out/warm-${f##*/}.txt" 2>&1 &
    pids+=($!) names+=("${f##*/}")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    log="$out/warm-${names[$i]}.txt"
    if [ $rc -eq 0 ]; then
      grep -h '^kernels' "$log" | sed 's/^/  /'
    else
      echo "  keel device --sources ${names[$i]}: exit $rc"
      tail -3 "$log" | sed 's/^/    /'
      status=1
    fi
  done
fi

if [[ " $sections " == *" tests "* ]]; then
  echo "== keel device"
  timeout 60 $bin/keel device 2>&1 | tee "$out/device.txt"
  # TestEveryKernelCompiles (every source for sm_80, sm_90 and PTX, with
  # NVRTC 13's warnings) is the host's work alone, and took past the
  # section's 100 s on an H200 (2026-11-27), so that the engines' tests
  # never ran: it runs in the background, beside the tests on the GPU,
  # and reports last.
  timeout 170 $bin/cuda.test -test.v -test.run 'Compiles' > "$out/compiles.log" 2>&1 &
  compiles=$!
  echo "== kernels against the CPU kernels (kernels/cuda)"
  gotest kernels cuda.test 180 -test.run 'Device|NoDriver'
  echo "== the CUDA training engine against the CPU engine (train/cuda)"
  gotest engine traincuda.test 180
  echo "== the CUDA rollout backend: exact against the GPU training engine, and against the CPU rollout (rollout/cuda)"
  gotest rollout rolloutcuda.test 120
  echo "== keel rl on the GPU: exact rollout = trainer on every token, resume bit for bit, resume on the CPU (cmd/keel)"
  gotest rlgpu keelcmd.test 120 -test.run 'OnGPU'
  echo "== every embedded kernel source compiles with this machine's NVRTC (sm_80, sm_90, PTX; in the background since the section began)"
  wait $compiles
  gotest_report compiles $?
fi

if [[ " $sections " == *" e2e "* ]]; then
  echo "== keel sft on a tiny dense model, train.device cpu against cuda (20 steps)"
  for d in cpu cuda; do
    sed "s#^out: .*#out: $out/sft-$d#; /^train:/a\\  device: $d" tools/gpu/sft-dense.yaml > "$out/sft-$d.yaml"
    timeout 120 $bin/keel sft --quiet --recipe "$out/sft-$d.yaml" > "$out/sft-$d.log" 2>&1 || status=1
    echo "  $d: $(tail -1 "$out/sft-$d.log")"
  done
  python3 - "$out" <<'PY'
import json, sys
try:
    rows = {d: [json.loads(l) for l in open(f"{sys.argv[1]}/sft-{d}/metrics.jsonl")] for d in ("cpu", "cuda")}
except OSError as e:
    print("  no metrics:", e)
    sys.exit(0)
for k in ("loss", "grad_norm"):
    diffs = [abs(a[k] - b[k]) / max(1e-9, abs(a[k])) for a, b in zip(rows["cpu"], rows["cuda"])]
    print(f"  {k}: {len(diffs)} steps, largest relative difference {max(diffs):.2e} (step {diffs.index(max(diffs)) + 1})")
PY
  echo "== keel probe on the GPU (exact, bf16, fp8, fp4 against the GPU training engine) and on the CPU"
  python3 -c "import random, json; r=random.Random(5); [print(json.dumps({'tokens': [1] + [r.randrange(3, 120) for _ in range(20)]})) for _ in range(32)]" > "$out/probe-prompts.jsonl"
  for d in cuda cpu; do
    timeout 120 $bin/keel probe --model models/tiny-moe-base --input "$out/probe-prompts.jsonl" --device $d --precision exact,bf16,fp8,fp4 \
      > "$out/probe-$d.txt" 2>&1 || status=1
    echo "  $d:"; sed 's/^/    /' "$out/probe-$d.txt"
  done
  echo "== keel rl, the built-in quickstart (fp8 rollout) for 4 steps, device cpu against cuda"
  for d in cpu cuda; do
    timeout 200 $bin/keel rl --set device=$d --set train.steps=4 --set train.warmup=0 \
      --set eval.skip=true --set out=$out/rl-$d > "$out/rl-$d.log" 2>&1 || status=1
    echo "  $d: $(tail -1 "$out/rl-$d.log")"
  done
  python3 - "$out" <<'PY'
import json, sys
rows = {}
for d in ("cpu", "cuda"):
    try:
        rows[d] = [json.loads(l) for l in open(f"{sys.argv[1]}/rl-{d}/metrics.jsonl")]
    except OSError as e:
        print("  no metrics for", d, e)
        sys.exit(0)
for a, b in zip(rows["cpu"], rows["cuda"]):
    print("  step %d  reward %.4f / %.4f  grad_norm %.5f / %.5f  k3 %.2e / %.2e  step time %.2f s / %.2f s" % (
        a["step"], a["reward/mean"], b["reward/mean"], a["grad_norm"], b["grad_norm"],
        a.get("train_infer/k3", 0), b.get("train_infer/k3", 0), a["time/step"], b["time/step"]))
PY
  echo "== issue 25's exact step: the quickstart's 32 prompts x 8 samples with the exact rollout on the GPU, 2 steps: log mu = log pi_old on every token (k3, the largest |diff| and the routes' disagreement exactly 0)"
  timeout 200 $bin/keel rl --set device=cuda --set rollout.precision=exact --set train.steps=2 --set train.warmup=0 \
    --set eval.skip=true --set out=$out/rl-exact > "$out/rl-exact.log" 2>&1 || status=1
  echo "  $(tail -1 "$out/rl-exact.log")"
  python3 - "$out/rl-exact/metrics.jsonl" <<'PY' || status=1
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except OSError as e:
    print("  no metrics:", e)
    sys.exit(1)
bad = 0
for r in rows:
    vals = {k: r.get(k) for k in ("train_infer/k3", "train_infer/abs_diff_max", "routing/infer_vs_old")}
    ok = all(v == 0 for v in vals.values())
    bad += not ok
    print("  step %d: %s: %s" % (r["step"], ", ".join("%s %r" % kv for kv in vals.items()), "exact" if ok else "NOT EXACT"))
sys.exit(1 if bad or not rows else 0)
PY
fi

if [[ " $sections " == *" hf "* ]]; then
  echo "== keel against Hugging Face transformers: log-probs of 8 random sequences of 256 tokens"
  python3 -c "import random, json; r=random.Random(3); [print(json.dumps({'tokens': [r.randrange(151936) for _ in range(256)]})) for _ in range(8)]" > "$out/hf-tokens.jsonl"
  for pl in qwen3-0.6b:2 qwen3-30b-a3b:1; do
    p=${pl%:*} layers=${pl#*:}
    timeout 120 $bin/keel init --preset $p --layers $layers --vocab 151936 --out "$out/hf-$p" --force > "$out/hf-$p-init.log" 2>&1 || { status=1; echo "  $p: keel init failed: $(tail -1 "$out/hf-$p-init.log")"; continue; }
    ok=1
    for prec in fp32 bf16; do
      timeout 120 $bin/keel logprobs --model "$out/hf-$p" --input "$out/hf-tokens.jsonl" --device cuda --precision $prec \
        --output "$out/hf-$p-keel-$prec.jsonl" > "$out/hf-$p-keel-$prec.log" 2>&1 || { ok=0; status=1; echo "  $p keel $prec: $(tail -1 "$out/hf-$p-keel-$prec.log")"; }
    done
    [ $ok -eq 1 ] || continue
    echo "  $p ($layers layers):"
    timeout 200 python3 tools/gpu/hf_logprobs.py "$out/hf-$p" "$out/hf-tokens.jsonl" "$out/hf-$p-keel-fp32.jsonl" "$out/hf-$p-keel-bf16.jsonl" 2>"$out/hf-$p.err" \
      | tee "$out/hf-$p.txt" || { status=1; tail -3 "$out/hf-$p.err"; }
  done
fi

# The card's memory bandwidth for the decode table's roofline (SXM figures).
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H200*) peakgb=4800 ;;
  *H100*PCIe*) peakgb=2000 ;;
  *) peakgb=3350 ;;
esac

# decode_rows JSON: one line per row of a keel bench --json decode table.
decode_rows() {
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print('    %s %s, %d sequences: %.0f tok/s, %.0f GB/s of weights and KV read, %.0f%% of the bandwidth; full steps: %d, median %.3f ms, %.0f GB/s, %.0f%%' % (d['Preset'], d['precision_name'], d['Slots'], d['TokensPerS'], d.get('gb_per_s', 0), 100*d.get('bandwidth', 0), d.get('FullSteps', 0), d.get('StepMS', 0), d.get('step_gb_per_s', 0), 100*d.get('step_bandwidth', 0))) for d in r.get('decode') or []]" "$1" 2>/dev/null
}

# tune_table prints KEEL_BLAS_TUNE's table (kernels/cuda/blastune.go): per
# product shape of at most 512 rows, the heuristic's first algorithm's time
# against the fastest candidate's, and copies it out of the cache.
tune_table() {
  for f in "$KEEL_CACHE_DIR"/cuda/blas-tune-*.txt; do
    [ -f "$f" ] || continue
    cp "$f" "$out/"
    python3 - "$f" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) != 20 or line.startswith('#'):
        continue
    try:
        m, n, k = int(f[2]), int(f[3]), int(f[4])
        if n <= 512:
            rows.append((float(f[15]) - float(f[16]), m, n, k, float(f[15]), float(f[16]), int(f[17]), int(f[18]), int(f[19])))
    except ValueError:  # the header line, or damage
        continue
rows.sort(reverse=True)
print('    KEEL_BLAS_TUNE table: %d shapes of at most 512 rows; the most gained:' % len(rows))
for saved, m, n, k, h, b, c, s, i in rows[:24]:
    print('      %5d x %4d x %5d: heuristic %7.1f us, best %7.1f us (algorithm %d, split %d, of %d candidates)' % (m, n, k, h, b, i, s, c))
PY
  done
}

if [[ " $sections " == *" gemm "* ]]; then
  echo "== products on this card: keel's batch-invariant fp32 GEMM (exact rollout, fp32 training) and cuBLASLt bf16, Qwen3-0.6B layer shapes"
  timeout 120 $bin/cuda.test -test.run '^$' -test.bench 'DeviceGemm$' -test.benchtime 20x > "$out/gemm.log" 2>&1
  echo "  exit $?"
  grep -E 'GFLOP/s' "$out/gemm.log" | awk '{print "    " $1 " " $(NF-1) " GFLOP/s"}'
  tune_table
  echo "== the MoE experts' forward products, 30B-A3B shape, a decoding step's 256 tokens and a training micro-batch's 4,096: 32 x 32 warps against the few-row warps (BenchmarkDeviceExperts)"
  timeout 60 $bin/cuda.test -test.run '^$' -test.bench DeviceExperts -test.benchtime 20x > "$out/experts.log" 2>&1
  echo "  exit $?"
  grep -E 'us/call' "$out/experts.log" | awk '{print "    " $1 " " $(NF-3) " us/call " $(NF-1) " weight GB/s"}'
  echo "== a decoding step's draws on this card, 256 rows of 151,936 tokens: full, top-k, top-p, top-p + 20 top log-probs (BenchmarkDeviceDraw)"
  timeout 60 $bin/cuda.test -test.run '^$' -test.bench DeviceDraw -test.benchtime 20x > "$out/draw.log" 2>&1
  echo "  exit $?"
  grep -E 'us/step' "$out/draw.log" | awk '{print "    " $1 " " $(NF-1) " us/step"}'
fi

if [[ " $sections " == *" flash "* ]]; then
  echo "== flash.cu on this card, the Qwen3-0.6B shape's attention at 8 x 2048 and 2 x 16384 tokens: each forward and backward kernel, TFLOP/s of the causal attention (BenchmarkDeviceFlash)"
  timeout 120 $bin/cuda.test -test.run '^$' -test.bench DeviceFlash -test.benchtime 20x > "$out/flash.log" 2>&1
  echo "  exit $?"
  grep -E 'TFLOP/s' "$out/flash.log" | awk '{print "    " $1 " " $5 " TFLOP/s " $7 " ms/call"}'
fi

if [[ " $sections " == *" decode "* ]]; then
  echo "== decode on this card, 32-token prompts and 96 new tokens: keel with CUDA graphs (the default; with KEEL_GPU_AB=all also without, KEEL_CUDA_GRAPHS=0), then transformers generate (static cache, eager)"
  graphs="1"; [ $gpu_ab = all ] && graphs="1 0"
  for spec in "qwen3-0.6b 0 exact,bf16" "qwen3-30b-a3b 2 bf16"; do
    set -- $spec
    for g in $graphs; do
      KEEL_CUDA_GRAPHS=$g timeout 200 $bin/keel bench --device cuda --presets $1 --layers $2 --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
        --no-rl --decode-precisions $3 --decode-slots 64,256 --peak-gbps $peakgb > "$out/decode-keel-$1-graphs$g.json" 2> "$out/decode-keel-$1-graphs$g.err"
      echo "  keel $1 (layers $2), KEEL_CUDA_GRAPHS=$g: exit $?"
      decode_rows "$out/decode-keel-$1-graphs$g.json" || tail -2 "$out/decode-keel-$1-graphs$g.err"
    done
  done
  # The A/Bs a card has decided (session 24) with KEEL_GPU_AB=all only:
  # cuBLASLt's candidates timed, the grouped attention, the split to 8192
  # warps at 96 tokens, the MoE shape grouped on the host, a warp per
  # query head, the unsplit attention at 1,024 tokens.
  if [ $gpu_ab = all ]; then
    # cuBLASLt's plans with each plan's candidates timed (KEEL_BLAS_TUNE=1)
    # against the default, the heuristic's first algorithm.
    KEEL_BLAS_TUNE=1 timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 64,256 --peak-gbps $peakgb > "$out/decode-keel-tuned.json" 2> "$out/decode-keel-tuned.err"
    echo "  keel qwen3-0.6b, KEEL_BLAS_TUNE=1: exit $?"
    decode_rows "$out/decode-keel-tuned.json" || tail -2 "$out/decode-keel-tuned.err"
    # Again: every shape's algorithm now comes from the table on disk, no
    # timing in the run (a later run's rate).
    KEEL_BLAS_TUNE=1 timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 64,256 --peak-gbps $peakgb > "$out/decode-keel-tuned2.json" 2> "$out/decode-keel-tuned2.err"
    echo "  keel qwen3-0.6b, KEEL_BLAS_TUNE=1, algorithms from the table: exit $?"
    decode_rows "$out/decode-keel-tuned2.json" || tail -2 "$out/decode-keel-tuned2.err"
    tune_table
    # The grouped decoding attention (KEEL_DECODE_ATTN=grouped, the default
    # before 2026-11-27) against the fast one (the default: adjacent
    # elements a lane, four keys' scores summed together, a third of the
    # instructions a key), at 64 and 256 sequences and at 64 sequences of
    # 32 + 1,024 tokens (beside the KEEL_DECODE_SPLIT rows below, which run
    # the default), where the cache is most of a step's reads.
    KEEL_DECODE_ATTN=grouped timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 64,256 --peak-gbps $peakgb > "$out/decode-keel-grouped.json" 2> "$out/decode-keel-grouped.err"
    echo "  keel qwen3-0.6b, KEEL_DECODE_ATTN=grouped: exit $?"
    decode_rows "$out/decode-keel-grouped.json" || tail -2 "$out/decode-keel-grouped.err"
    KEEL_DECODE_ATTN=grouped timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 64 --decode-new 1024 --peak-gbps $peakgb > "$out/decode-keel-long-grouped.json" 2> "$out/decode-keel-long-grouped.err"
    echo "  keel qwen3-0.6b, 32 + 1024 tokens, KEEL_DECODE_ATTN=grouped: exit $?"
    decode_rows "$out/decode-keel-long-grouped.json" || tail -2 "$out/decode-keel-long-grouped.err"
  fi
  # Rollout-length contexts at 64 and 256 sequences (32 + 1,024 tokens:
  # the RL step's, where the cache is most of a step's reads and issue
  # 25's bandwidth goal is within reach): the default (KEEL_DECODE_ATTN=fast: four
  # keys' rows in flight a warp), the deep kernels (eight:
  # KEEL_DECODE_ATTN=deep, the same bits), and the attention split to
  # reach 8192 warps.
  for ab in KEEL_DECODE_ATTN=fast KEEL_DECODE_ATTN=deep KEEL_DECODE_SPLIT_WARPS=8192; do
    tag=${ab#*=}
    env $ab timeout 150 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 64,256 --decode-new 1024 --peak-gbps $peakgb > "$out/decode-keel-rl-$tag.json" 2> "$out/decode-keel-rl-$tag.err"
    echo "  keel qwen3-0.6b, 32 + 1024 tokens, $ab: exit $?"
    decode_rows "$out/decode-keel-rl-$tag.json" || tail -2 "$out/decode-keel-rl-$tag.err"
  done
  KEEL_DECODE_ATTN=deep timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
    --no-rl --decode-precisions bf16 --decode-slots 64,256 --peak-gbps $peakgb > "$out/decode-keel-deep.json" 2> "$out/decode-keel-deep.err"
  echo "  keel qwen3-0.6b, KEEL_DECODE_ATTN=deep: exit $?"
  decode_rows "$out/decode-keel-deep.json" || tail -2 "$out/decode-keel-deep.err"
  if [ $gpu_ab = all ]; then
    # The decoding attention split to reach 8192 warps (4 runs a row at 256
    # sequences, 16 at 64) against the default 2048 (unsplit at 256).
    KEEL_DECODE_SPLIT_WARPS=8192 timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 64,256 --peak-gbps $peakgb > "$out/decode-keel-splitwarps.json" 2> "$out/decode-keel-splitwarps.err"
    echo "  keel qwen3-0.6b, KEEL_DECODE_SPLIT_WARPS=8192: exit $?"
    decode_rows "$out/decode-keel-splitwarps.json" || tail -2 "$out/decode-keel-splitwarps.err"
    # The MoE layers grouped on the host, a cuBLASLt product per expert and
    # no graphs (the old path), against the grouped default above.
    KEEL_MOE_GROUP=host timeout 150 $bin/keel bench --device cuda --presets qwen3-30b-a3b --layers 2 --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 64,256 --peak-gbps $peakgb > "$out/decode-keel-moehost.json" 2> "$out/decode-keel-moehost.err"
    echo "  keel qwen3-30b-a3b (layers 2), KEEL_MOE_GROUP=host: exit $?"
    decode_rows "$out/decode-keel-moehost.json" || tail -2 "$out/decode-keel-moehost.err"
    # The decoding attention a warp per query head (KEEL_DECODE_ATTN=head:
    # the oldest kernels, not the fast ones) against the grouped kernels (a
    # warp per KV head; the KEEL_DECODE_ATTN=grouped row above), with graphs.
    KEEL_DECODE_ATTN=head timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 256 --peak-gbps $peakgb > "$out/decode-keel-perhead.json" 2> "$out/decode-keel-perhead.err"
    echo "  keel qwen3-0.6b, KEEL_DECODE_ATTN=head: exit $?"
    decode_rows "$out/decode-keel-perhead.json" || tail -2 "$out/decode-keel-perhead.err"
    # Long contexts (1,024 new tokens) at 64 sequences: the split attention
    # (flash-decoding, 4 runs a row; the default) against each row's keys in
    # one run (KEEL_DECODE_SPLIT=0, the old kernels), with graphs.
    for sp in 1 0; do
      KEEL_DECODE_SPLIT=$sp timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
        --no-rl --decode-precisions bf16 --decode-slots 64 --decode-new 1024 --peak-gbps $peakgb > "$out/decode-keel-long-split$sp.json" 2> "$out/decode-keel-long-split$sp.err"
      echo "  keel qwen3-0.6b, 32 + 1024 tokens, KEEL_DECODE_SPLIT=$sp: exit $?"
      decode_rows "$out/decode-keel-long-split$sp.json" || tail -2 "$out/decode-keel-long-split$sp.err"
    done
  fi
  for v in "qwen3-0.6b 0 256" "qwen3-0.6b 0 64" "qwen3-30b-a3b 2 256" "qwen3-30b-a3b 2 64"; do
    set -- $v
    timeout 200 python3 tools/gpu/torch_decode.py --preset $1 --layers $2 --batch $3 --dtype bf16 --compile off > "$out/decode-torch-$1-$3.json" 2> "$out/decode-torch-$1-$3.err"
    echo "  transformers $1 (layers $2) bf16, $3 sequences: exit $? $(tail -1 "$out/decode-torch-$1-$3.json" 2>/dev/null || tail -1 "$out/decode-torch-$1-$3.err")"
  done
fi

if [[ " $sections " == *" fp8 "* ]]; then
  echo "== the fp8 rollout's products on this card: emulated on the bf16 GEMM (the default) and cuBLASLt's float8 product (KEEL_FP8_GEMM=1), Qwen3-0.6B shape, 256 sequences"
  KEEL_FP8_GEMM=1 timeout 60 $bin/cuda.test -test.run 'TestDeviceFP8$' -test.v > "$out/fp8-test.log" 2>&1
  echo "  TestDeviceFP8 (the float8 product within float32 error of the quantised operands'): exit $?"
  grep -E 'float8|FAIL|ok' "$out/fp8-test.log" | head -5 | sed 's/^/    /'
  for f in 0 1; do
    KEEL_FP8_GEMM=$f timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions fp8 --decode-slots 256 --peak-gbps $peakgb > "$out/decode-keel-fp8gemm$f.json" 2> "$out/decode-keel-fp8gemm$f.err"
    echo "  keel qwen3-0.6b fp8, KEEL_FP8_GEMM=$f: exit $?"
    decode_rows "$out/decode-keel-fp8gemm$f.json" || tail -2 "$out/decode-keel-fp8gemm$f.err"
    grep -h float8 "$out/decode-keel-fp8gemm$f.err" | head -2 | sed 's/^/    /'
  done
fi

if [[ " $sections " == *" speed "* ]]; then
  echo "== training speed on this card: keel and PyTorch (transformers + SDPA, fused AdamW), same shapes"
  for spec in "qwen3-0.6b 0 8 2048 4" "qwen3-30b-a3b 2 2 2048 2"; do
    set -- $spec
    for prec in bf16 fp32; do
      nodec=--no-decode
      [ $prec = bf16 ] && [ $1 = qwen3-0.6b ] && nodec=
      timeout 240 $bin/keel bench --device cuda --train-precision $prec --presets $1 --layers $2 --vocab 151936 --seqs $3 --len $4 --time 1ms --json $nodec --no-rl --decode-precisions exact,bf16 --peak-gbps $peakgb \
        > "$out/bench-keel-$1-$prec.json" 2> "$out/bench-keel-$1-$prec.err"
      echo "  keel $1 $prec, layers $2, $3 x $4: exit $? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['train'][0]; print('%.0f train tok/s, %.0f forward tok/s, MFU %.1f%% of bf16 peak' % (t['TokensPerS'], t['FwdTokensPerS'], 100*r['mfu'][t['Preset']])); [print('    decode %s, %d sequences: %.0f tok/s, %.0f GB/s of weights and KV read, %.0f%% of the bandwidth' % (d['precision_name'], d['Slots'], d['TokensPerS'], d.get('gb_per_s', 0), 100*d.get('bandwidth', 0))) for d in r.get('decode') or []]" "$out/bench-keel-$1-$prec.json" 2>/dev/null || tail -1 "$out/bench-keel-$1-$prec.err")"
      timeout 150 python3 tools/gpu/torch_train.py --preset $1 --layers $2 --seqs $3 --len $4 --mode $prec --micro $5 \
        > "$out/bench-torch-$1-$prec.json" 2> "$out/bench-torch-$1-$prec.err"
      echo "  torch $1 $prec: exit $? $(tail -1 "$out/bench-torch-$1-$prec.json" 2>/dev/null || tail -1 "$out/bench-torch-$1-$prec.err")"
    done
  done
  echo "== decode: transformers generate (static cache; eager, then its own torch.compile), 32-token prompts, 96 new tokens (keel's rows above)"
  for v in "bf16 256 off" "bf16 64 off" "fp32 256 off" "bf16 256 auto"; do
    set -- $v
    timeout 240 python3 tools/gpu/torch_decode.py --preset qwen3-0.6b --batch $2 --dtype $1 --compile $3 > "$out/decode-torch-$1-$2-$3.json" 2> "$out/decode-torch-$1-$2-$3.err"
    echo "  torch qwen3-0.6b $1, $2 sequences, compile $3: exit $? $(tail -1 "$out/decode-torch-$1-$2-$3.json" 2>/dev/null || tail -1 "$out/decode-torch-$1-$2-$3.err")"
  done
fi
if [[ " $sections " == *" profile "* ]]; then
  echo "== bf16 training on this card: keel, PyTorch, and where keel's time goes (KEEL_CUDA_PROFILE=1 synchronises every launch: read shares)"
  # preset, layers, sequences x length, keel's recomputation, PyTorch's
  # micro-batch (its gradients accumulate) and checkpointing, profile?
  # The 2 x 16384 shape also without recomputation on both sides (keel's
  # plan: 56 GiB, 64 with the stored dS; PyTorch's may not fit).
  for spec in "qwen3-0.6b 0 8 2048 no 4 no yes" "qwen3-0.6b 0 2 16384 yes 1 yes no" "qwen3-30b-a3b 2 2 2048 no 2 no yes" "qwen3-0.6b 0 2 16384 no 1 no no"; do
    set -- $spec
    rc=; [ $5 = yes ] && rc=--recompute
    ck=; [ $7 = yes ] && ck=--checkpoint
    tag=$1-$3x$4
    [ $4 = 16384 ] && [ $5 = no ] && tag=$tag-norecompute
    args="--device cuda --train-precision bf16 $rc --presets $1 --layers $2 --vocab 151936 --seqs $3 --len $4 --time 1ms --json --no-decode --no-rl"
    # flash.cu's forward (wideq, the default; narrow, wide) and backward
    # (two stages, the default; one stage on the first shape only).
    # On the MoE shape also KEEL_MOE_GROUP=host (the training engine still
    # groups on the device, but brings the offsets to the host and runs a
    # cuBLASLt product per expert) against the grouped products.
    # On the first shape also the training engine's buffers allocated and
    # freed on the device every step (KEEL_CUDA_POOL=0) against its Pool.
    # On the first shape also the LM head's logits recomputed in the
    # backward (KEEL_HEAD_KEEP=0) against kept from the forward.
    # On the first shape also cuBLASLt's plans with their candidates
    # timed (KEEL_BLAS_TUNE=1) against the heuristic's first.
    # On the 0.6B shapes also the dK/dV pass's 16-query tiles
    # (KEEL_FLASH_DKV=narrow, backward "dkv16") against 32 (the default),
    # and the backward from stored dS (KEEL_FLASH_DQ=stored, backward
    # "stored") against recomputing it.
    # The A/Bs a card has decided already (session 24: the defaults won)
    # run with KEEL_GPU_AB=all only.
    variants="wideq/two/device/1/1/0"
    [ $gpu_ab = all ] && variants="$variants narrow/two/device/1/1/0 wide/two/device/1/1/0"
    [ $1 = qwen3-0.6b ] && variants="$variants wideq/stored/device/1/1/0"
    [ $1 = qwen3-0.6b ] && [ $gpu_ab = all ] && variants="$variants wideq/dkv16/device/1/1/0"
    [ $tag = qwen3-0.6b-8x2048 ] && variants="$variants wideq/two/device/1/1/1"
    [ $tag = qwen3-0.6b-8x2048 ] && [ $gpu_ab = all ] && variants="$variants wideq/single/device/1/1/0 wideq/two/device/0/1/0 wideq/two/device/1/0/0"
    [ $1 = qwen3-30b-a3b ] && [ $gpu_ab = all ] && variants="$variants wideq/two/host/1/1/0"
    [ $tag = qwen3-0.6b-2x16384-norecompute ] && variants="wideq/two/device/1/1/0 wideq/stored/device/1/1/0"
    for v in $variants; do
      IFS=/ read -r fwd bwd grp pool keep tune <<< "$v"
      vt=$fwd-$bwd-$grp-pool$pool-keep$keep-tune$tune
      dkv=; [ $bwd = dkv16 ] && dkv=narrow  # the two-stage backward with the 16-query dK/dV pass
      dq=; [ $bwd = stored ] && dq=stored
      KEEL_FLASH_FWD=$fwd KEEL_FLASH_BWD=$bwd KEEL_FLASH_DKV=$dkv KEEL_FLASH_DQ=$dq KEEL_MOE_GROUP=$grp KEEL_CUDA_POOL=$pool KEEL_HEAD_KEEP=$keep KEEL_BLAS_TUNE=$tune timeout 150 $bin/keel bench $args > "$out/bench-keel-$tag-$vt.json" 2> "$out/bench-keel-$tag-$vt.err"
      echo "  keel $1 bf16, layers $2, $3 x $4 ${rc:-}, flash forward $fwd, backward $bwd stage(s), KEEL_MOE_GROUP=$grp, KEEL_CUDA_POOL=$pool, KEEL_HEAD_KEEP=$keep, KEEL_BLAS_TUNE=$tune: exit $? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['train'][0]; print('%.0f train tok/s, %.0f forward tok/s, MFU %.1f%% of bf16 peak' % (t['TokensPerS'], t['FwdTokensPerS'], 100*r['mfu'][t['Preset']]))" "$out/bench-keel-$tag-$vt.json" 2>/dev/null || tail -1 "$out/bench-keel-$tag-$vt.err")"
    done
    # On the first shape also the defaults but RMSNorm's forward and
    # backward a block a row or chunk (KEEL_ROW_KERNELS=block, before the
    # warp kernels), and flash.cu's tiles each sequence's from its last
    # (KEEL_FLASH_ORDER=0, before FlashOrder's heaviest first over every
    # sequence and head) or FlashOrder's head after head but for the last
    # few (KEEL_FLASH_ORDER=headwise): the same bits either way.
    if [ $tag = qwen3-0.6b-8x2048 ]; then
      for setting in KEEL_ROW_KERNELS=block KEEL_FLASH_ORDER=0 KEEL_FLASH_ORDER=headwise; do
        st=${setting,,}; st=${st#keel_}; st=${st//[=_]/-}
        env $setting timeout 150 $bin/keel bench $args > "$out/bench-keel-$tag-$st.json" 2> "$out/bench-keel-$tag-$st.err"
        echo "  keel $1 bf16, layers $2, $3 x $4, the defaults but $setting: exit $? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['train'][0]; print('%.0f train tok/s, %.0f forward tok/s, MFU %.1f%% of bf16 peak' % (t['TokensPerS'], t['FwdTokensPerS'], 100*r['mfu'][t['Preset']]))" "$out/bench-keel-$tag-$st.json" 2>/dev/null || tail -1 "$out/bench-keel-$tag-$st.err")"
      done
    fi
    timeout 150 python3 tools/gpu/torch_train.py --preset $1 --layers $2 --seqs $3 --len $4 --mode bf16 --micro $6 $ck \
      > "$out/bench-torch-$tag.json" 2> "$out/bench-torch-$tag.err"
    echo "  torch $1 bf16, micro-batches of $6 ${ck:-}: exit $? $(tail -1 "$out/bench-torch-$tag.json" 2>/dev/null || tail -1 "$out/bench-torch-$tag.err")"
    if [ $8 = yes ]; then
      KEEL_CUDA_PROFILE=1 timeout 150 $bin/keel bench $args > "$out/profile-$tag.json" 2> "$out/profile-$tag.txt"
      grep -A25 KEEL_CUDA_PROFILE "$out/profile-$tag.txt" | sed 's/^/    /'
    fi
  done
  echo "== where decoding's time goes: bf16 rollout, 256 sequences, Qwen3-0.6B shape (a one-sequence training table first)"
  KEEL_CUDA_PROFILE=1 timeout 120 $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms \
    --no-rl --decode-precisions bf16 --decode-slots 256 > "$out/profile-decode.txt" 2>&1
  grep -B2 -A25 'KEEL_CUDA_PROFILE' "$out/profile-decode.txt" | tail -28 | sed 's/^/    /'
  echo "== the same for the MoE shape (30B-A3B, 2 layers): the grouping and the grouped expert products' share"
  KEEL_CUDA_PROFILE=1 timeout 120 $bin/keel bench --device cuda --presets qwen3-30b-a3b --layers 2 --vocab 151936 --seqs 1 --len 64 --time 1ms \
    --no-rl --decode-precisions bf16 --decode-slots 256 > "$out/profile-decode-moe.txt" 2>&1
  grep -B2 -A25 'KEEL_CUDA_PROFILE' "$out/profile-decode-moe.txt" | tail -28 | sed 's/^/    /'
fi
# nvtool NAME: the path of an Nsight Compute or compute-sanitizer binary
# (on the PATH, or in a CUDA toolkit's or Nsight's own folders), or nothing.
nvtool() {
  command -v "$1" 2>/dev/null && return
  ls -d /usr/local/cuda/bin/"$1" /usr/local/cuda*/bin/"$1" /opt/nvidia/nsight-compute/*/"$1" \
    /opt/nvidia/nsight-systems/*/bin/"$1" /usr/local/cuda*/compute-sanitizer/"$1" 2>/dev/null | sort -V | tail -1
}

if [[ " $sections " == *" nsys "* ]]; then
  # KEEL_CUDA_PROFILE times each launch with events and turns the graphs
  # off, which is not the step a rollout runs: Nsight Systems reads the
  # device's own timestamps of every kernel, graph nodes included. The
  # summary cuts the trace into decoding steps at each step's last draw
  # kernel and takes the steps near the median (the training table, the
  # compiles, prefill and the graphs' recording fall outside): a step's
  # time on the device's clock from the previous step's draw, the part
  # with a kernel running, and each kernel's time a step. What is left is
  # the host's (and the copies').
  echo "== Nsight Systems: a bf16 decode of 256 sequences, Qwen3-0.6B shape, graphs on: a step's kernels and the device's idle share"
  nsys=$(nvtool nsys)
  if [ -z "$nsys" ]; then
    echo "  no nsys found"
  else
    rm -f "$out"/nsys*
    timeout 65 "$nsys" profile --trace=cuda --cuda-graph-trace=node --force-overwrite=true -o "$out/nsys-decode" \
      $bin/keel bench --device cuda --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 --time 1ms --json \
      --no-rl --decode-precisions bf16 --decode-slots 256 --peak-gbps $peakgb > "$out/nsys-decode.log" 2>&1
    echo "  exit $?"
    timeout 30 "$nsys" stats --force-overwrite=true --force-export=true --report cuda_gpu_trace --format csv --output "$out/nsys" \
      "$out/nsys-decode.nsys-rep" > "$out/nsys-stats.log" 2>&1
    echo "  stats exit $?"
    python3 - "$out" <<'PY'
import collections, csv, glob, statistics, sys
files = glob.glob(sys.argv[1] + "/nsys*gpu_trace*.csv")
if not files:
    print("  no trace csv"); sys.exit(0)
rows = list(csv.DictReader(open(files[0])))
col = lambda key: next((k for k in rows[0] if key in k), None) if rows else None
start, dur, name = col("Start"), col("Duration"), col("Name")
if not (start and dur and name):
    print("  columns:", list(rows[0]) if rows else "none"); sys.exit(0)
ks = sorted((int(float(r[start])), int(float(r[dur])), r[name]) for r in rows
            if "memcpy" not in r[name].lower() and "memset" not in r[name].lower())
# A decoding step ends with its last draw kernel (the split draw's pick,
# or a block a row's draw_rows_raw / draw_rows).
ends = [i for i, (_, _, n) in enumerate(ks) if n.startswith(("draw_chunk_pick", "draw_rows_raw", "draw_rows"))
        and not n.startswith("draw_rows_trunc")]
steps = []
for a, b in zip(ends, ends[1:]):
    t0 = ks[a][0] + ks[a][1]
    busy, end, per = 0, t0, collections.Counter()
    for s, d, n in ks[a + 1:b + 1]:
        busy += max(0, s + d - max(s, end))
        end = max(end, s + d)
        per[n[:60]] += d
    steps.append((end - t0, busy, per))
if len(steps) < 5:
    print("  %d steps found among %d kernels" % (len(steps), len(ks))); sys.exit(0)
med = statistics.median(s for s, _, _ in steps)
keep = [x for x in steps if 0.75 * med <= x[0] <= 1.25 * med]
span = statistics.median(s for s, _, _ in keep)
busy = statistics.median(b for _, b, _ in keep)
print("  %d steps (%d within 25%% of the median): a step %.3f ms on the device's clock, kernels running %.3f ms (%.0f%%), none %.3f ms" %
      (len(steps), len(keep), span / 1e6, busy / 1e6, 100 * busy / span, (span - busy) / 1e6))
tot = collections.Counter()
for _, _, per in keep:
    tot.update(per)
for n, d in tot.most_common(25):
    print("    %-60s %8.1f us a step %5.1f%%" % (n, d / 1e3 / len(keep), 100 * d / len(keep) / busy))
PY
  fi
fi

if [[ " $sections " == *" ncu "* ]]; then
  echo "== Nsight Compute: one launch of each hot kernel configuration (speed of light, pipes, shared memory, warp stalls)"
  ncu=$(nvtool ncu)
  if [ -z "$ncu" ]; then
    echo "  no ncu found"
  else
    "$ncu" --version | tail -1 | sed 's/^/  /'
    # --filter-mode per-launch-config with -c 1: each kernel's first launch
    # with a given grid, block and shared memory, once; at boost clocks
    # (--clock-control none) as the timed runs.
    # The sections this ncu has, of those wanted (an unknown one stops it).
    nargs="--clock-control none --target-processes all --filter-mode per-launch-config -c 1"
    "$ncu" --list-sections > "$out/ncu-sections.txt" 2>&1
    for sec in SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables \
      WarpStateStats Occupancy LaunchStats SchedulerStats InstructionStats; do
      grep -q "^$sec " "$out/ncu-sections.txt" && nargs="$nargs --section $sec"
    done
    # And a few raw metrics (those this ncu knows for the card's chip): the
    # tensor pipe's share, shared memory's wavefronts and bank conflicts,
    # and why warps stall.
    chip=gh100  # the H100 and the H200 alike
    "$ncu" --query-metrics --chip $chip > "$out/ncu-metrics.txt" 2>&1
    metrics=
    for m in sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      l1tex__data_pipe_lsu_wavefronts_mem_shared.sum l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
      smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio \
      smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio \
      smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio \
      smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio \
      smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio \
      smsp__average_warps_issue_stalled_wait_per_issue_active.ratio \
      smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio; do
      grep -q "^${m%%.*} " "$out/ncu-metrics.txt" && metrics="$metrics${metrics:+,}$m"
    done
    [ -n "$metrics" ] && nargs="$nargs --metrics $metrics"
    echo "  $nargs"
    train="--device cuda --train-precision bf16 --vocab 151936 --time 1ms --no-decode --no-rl"
    # name preset layers seqs len KEEL_FLASH_FWD kernels
    for spec in "dense qwen3-0.6b 2 4 2048 narrow ^(flash_fwd|flash_bwd|head_stats_bf16|head_grad_bf16_saved|adamw|rmsnorm|swiglu)" \
      "wide qwen3-0.6b 2 4 2048 wide ^flash_fwd_wide" "wideq qwen3-0.6b 2 4 2048 wideq ^flash_fwd_wq" \
      "moe qwen3-30b-a3b 1 2 2048 narrow ^(gemm_bf16_grouped|moe_|gather_bf16|adamw)"; do
      set -- $spec
      KEEL_FLASH_FWD=$6 timeout 150 "$ncu" $nargs -k "regex:$7" $bin/keel bench $train --presets $2 --layers $3 --seqs $4 --len $5 \
        > "$out/ncu-$1.txt" 2> "$out/ncu-$1.err"
      echo "  $1 ($2, $3 layers, $4 x $5, flash forward $6): exit $?, $(grep -c 'Section: GPU Speed Of Light' "$out/ncu-$1.txt") kernels profiled"
      # Per kernel: duration, compute and memory throughput, and the pipes'
      # and shared memory's figures, one line each.
      awk '/^  [a-z_0-9]+(<.*>)? \(/ {k=$1} /Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|No Eligible|hmma|bank_conflicts|stalled/ {printf "%s %s\n", k, $0}' \
        "$out/ncu-$1.txt" | sed 's/  */ /g; s/^/    /' | head -200
    done
    echo "  decoding step (bf16, 256 sequences, in its graph): attention and the fused row kernels"
    # One decoding step's launches past the prefill (each step's row count
    # is a launch configuration of its own: per-launch-config kept
    # profiling new ones until the section's time ran out).
    dargs=${nargs/--filter-mode per-launch-config -c 1/--launch-skip 300 --launch-count 13}
    timeout 120 "$ncu" $dargs -k "regex:^(attn_decode|norm_rope_kv|rmsnorm_fwd_bf16|swiglu_fwd_bf16|draw_rows|logsoftmax)" \
      $bin/keel bench --device cuda --presets qwen3-0.6b --layers 2 --vocab 151936 --seqs 1 --len 64 --time 1ms --no-rl \
      --decode-precisions bf16 --decode-slots 256 > "$out/ncu-decode.txt" 2> "$out/ncu-decode.err"
    echo "  exit $?, $(grep -c 'Section: GPU Speed Of Light' "$out/ncu-decode.txt") kernels profiled"
    awk '/^  [a-z_0-9]+(<.*>)? \(/ {k=$1} /Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy/ {printf "%s %s\n", k, $0}' \
      "$out/ncu-decode.txt" | sed 's/  */ /g; s/^/    /' | head -60
  fi
fi

if [[ " $sections " == *" sanitize "* ]]; then
  echo "== compute-sanitizer on the tiled kernels' tests (memcheck, racecheck, synccheck)"
  cs=$(nvtool compute-sanitizer)
  if [ -z "$cs" ]; then
    echo "  no compute-sanitizer found"
  else
    # racecheck (shared memory hazards, the slowest) on the tiled and
    # pipelined kernels; memcheck and synccheck on every kernel test. The
    # driver's API errors are not reported: TestDeviceModuleCache asks for
    # twice the card's memory on purpose (its clear error is the check).
    tiled='TestDeviceFlashAttention|TestDeviceGemmGrouped|TestDeviceMoEGroup|TestDeviceAttention|TestDeviceGemm$|TestDeviceQuantGrouped|TestDeviceHead'
    for spec in "memcheck TestDevice" "racecheck $tiled" "synccheck TestDevice"; do
      set -- $spec
      tool=$1
      timeout 150 "$cs" --tool $tool --report-api-errors no --error-exitcode 3 --print-limit 20 $bin/cuda.test -test.v -test.run "$2" > "$out/sanitize-$tool.log" 2>&1
      rc=$?
      echo "  $tool: exit $rc ($(grep -c '^--- PASS' "$out/sanitize-$tool.log") tests passed, $(grep -c '^--- FAIL' "$out/sanitize-$tool.log") failed); $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$tool.log" | tail -1)"
      grep -E '^========= (Invalid|Race|Barrier|Error|  +at )' "$out/sanitize-$tool.log" | head -12 | sed 's/^/    /'
      [ $rc -eq 0 ] || status=1
    done
  fi
fi

if [[ " $sections " == *" fit "* ]]; then
  echo "== full-parameter bf16 training of the Qwen3-1.7B shape at 4 x 4096 tokens, the memory plan against the card (logits not kept: KEEL_HEAD_KEEP=0, which the plan leaves out)"
  # recompute or not, and train/memplan's total and activations for it
  for spec in "--recompute 38.98 10.10" "none 66.86 37.99"; do
    set -- $spec
    rc=$1; [ $rc = none ] && rc=
    tag=1.7b${rc:+-recompute}
    echo "  ${rc:-no recompute}: train/memplan plans $2 GiB, activations $3 GiB"
    KEEL_HEAD_KEEP=0 timeout 200 $bin/keel bench --device cuda --train-precision bf16 $rc --presets qwen3-1.7b --vocab 151936 --seqs 4 --len 4096 \
      --time 1ms --json --no-decode --no-rl > "$out/bench-keel-$tag.json" 2> "$out/bench-keel-$tag.err"
    echo "  exit $? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=r['train'][0]; print('%d parameters, %.0f train tok/s, MFU %.1f%%, activations %.2f GiB (planned %.2f; held by the Pool %.2f)' % (t['Params'], t['TokensPerS'], 100*r['mfu'][t['Preset']], t.get('ActivationBytes', 0)/2**30, t.get('PlannedActivationBytes', 0)/2**30, t.get('ActivationHeldBytes', 0)/2**30))" "$out/bench-keel-$tag.json" 2>/dev/null || tail -2 "$out/bench-keel-$tag.err")"
  done
  nvidia-smi --query-gpu=memory.total --format=csv,noheader | sed 's/^/  card memory: /'
fi

if [[ " $sections " == *" learn "* ]]; then
  echo "== the quickstart with both engines on the GPU (fp32 training, fp8 rollout), seed 1; CPU: +6.5, +6.5, +6.4 (README)"
  timeout 600 $bin/keel rl --set device=cuda --set out=$out/learn-cuda > "$out/learn-cuda.log" 2>&1 || status=1
  grep -i 'held-out\|avg@8\|trained' "$out/learn-cuda.log" | tail -4 | sed 's/^/  /'
  python3 - "$out/learn-cuda/metrics.jsonl" <<'PY'
import json, statistics, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except OSError as e:
    print("  no metrics:", e)
    sys.exit(0)
steps = [r["time/step"] for r in rows if "time/step" in r]
if steps:
    print("  %d steps, median step %.3f s (rollout %.3f, updates %.3f)" % (len(steps), statistics.median(steps),
          statistics.median(r.get("time/rollout", 0) for r in rows), statistics.median(r.get("time/update", 0) for r in rows)))
    # Run in the background (session.sh's learn&), the first steps share the
    # GPU with the foreground's checks: the last quarter's median is the
    # likelier alone.
    q = steps[len(steps) * 3 // 4:]
    print("  the last %d steps: median %.3f s, fastest %.3f s" % (len(q), statistics.median(q), min(q)))
PY
fi

if [[ " $sections " == *" rl "* ]]; then
  echo "== an RL step on the GPU (both engines), Qwen3-0.6B shape, 32 prompts x 8 samples of up to 1024 tokens"
  timeout 400 $bin/keel bench --device cuda --train-precision bf16 --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 \
    --quick --no-decode --rl-precision bf16 --rl-max-new 1024 > "$out/rl-step.txt" 2>&1 || status=1
  sed 's/^/  /' "$out/rl-step.txt" | tail -12
  # Again with cuBLASLt's tuned algorithms, with the grouped decoding
  # attention (the default before the fast one) and with the deep one
  # (eight keys' rows in flight a warp): a rollout of 1,024-token
  # samples reads mostly its cache.
  for ab in KEEL_BLAS_TUNE=1 KEEL_DECODE_ATTN=grouped KEEL_DECODE_ATTN=deep; do
    env $ab timeout 400 $bin/keel bench --device cuda --train-precision bf16 --presets qwen3-0.6b --vocab 151936 --seqs 1 --len 64 \
      --quick --no-decode --rl-precision bf16 --rl-max-new 1024 > "$out/rl-step-${ab//=/-}.txt" 2>&1
    echo "  $ab: exit $?"
    grep -A1 'RL step.*precision' "$out/rl-step-${ab//=/-}.txt" | sed 's/^/  /'
  done
fi
exit $status
