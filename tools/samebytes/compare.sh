#!/bin/bash
# Compares two outputs of run.sh: model files, checkpoints (weights and
# optimiser state), metrics without timings, samples and eval.json.
# Usage: tools/samebytes/compare.sh BASE_OUT NEW_OUT
set -u
A=$1; B=$2; bad=0
for d in runs/qs runs/rem sftrun; do
  for f in $(cd "$A/$d" && find model checkpoints samples eval.json -type f \( -name '*.safetensors' -o -name '*.json' -o -name '*.jsonl' \) 2>/dev/null | grep -v state.json | sort); do
    if cmp -s "$A/$d/$f" "$B/$d/$f"; then echo "same  $d/$f"; else echo "DIFF  $d/$f"; bad=1; fi
  done
  if python3 - "$A/$d/metrics.jsonl" "$B/$d/metrics.jsonl" <<'P'
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if not (k.startswith('time/') or k.startswith('tokens_per_s') or k == 'elapsed_s')} for l in open(p)]
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)
P
  then echo "same  $d/metrics.jsonl (timings aside)"; else echo "DIFF  $d/metrics.jsonl"; bad=1; fi
done
exit $bad
