#!/bin/bash
# Runs the three jobs whose outputs a refactor must leave byte for byte as
# they were, with the keel binary BIN, into OUT (deleted first):
#   - the quickstart at 20 steps (keel rl --set train.steps=20),
#   - a remote run over two keel serve processes (fp8, 8 steps, no eval),
#   - keel sft on a 12-step recipe.
# Then compare.sh BASE_OUT NEW_OUT says which files differ. About 3 minutes
# on 2 cores. Usage: tools/samebytes/run.sh BIN OUT
set -u
BIN=$(realpath "$1"); OUT=$2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$OUT"; mkdir -p "$OUT"; cd "$OUT"
"$BIN" rl --set train.steps=20 --name qs > qs.log 2>&1; echo "qs rc=$?" >> rc
cp -r "$REPO/models/tiny-moe-base" srvbase
"$BIN" serve --model srvbase --precision fp8 --addr 127.0.0.1:31001 > s1.log 2>&1 & P1=$!
"$BIN" serve --model srvbase --precision fp8 --addr 127.0.0.1:31002 > s2.log 2>&1 & P2=$!
sleep 3
"$BIN" rl --set train.steps=8 --set eval.skip=true --set train.prompts_per_step=8 --name rem \
  --servers http://127.0.0.1:31001,http://127.0.0.1:31002 --set rollout.precision= > rem.log 2>&1; echo "rem rc=$?" >> rc
kill $P1 $P2; wait
cat > sft.yaml <<'Y'
out: sftrun
model: {preset: tiny-moe, vocab: 128, seed: 1, max_len: 384}
data:
  generate: {tasks: [arithmetic, countdown, linear], n: 2000, difficulty: 1-3, style: mixed, seed: 1}
train: {steps: 12, batch_tokens: 16384, lr: 3.0e-3, min_lr: 3.0e-4, warmup: 4, schedule: cosine, weight_decay: 0.01, clip_norm: 1.0, aux_loss: 0.01, seed: 1}
log: {every: 2, checkpoint_every: 5}
eval: {n: 20, k: 2, difficulty: 2-4, max_new_tokens: 100}
Y
"$BIN" sft --recipe sft.yaml > sft.log 2>&1; echo "sft rc=$?" >> rc
cat rc
