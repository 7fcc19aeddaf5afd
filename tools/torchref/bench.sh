#!/bin/sh
# bench.sh: keel and PyTorch on the same shapes, 2 threads each, one after
# the other in one run, printed as one table with the ratio keel/PyTorch.
#
#   tools/torchref/bench.sh
#
# Rows: training step (forward, backward, clipping, AdamW) and forward-only
# tokens/s on 16 sequences x 128 tokens (tiny-dense, tiny-moe, small-moe at
# vocabulary 128, small-moe at 4096), and decoding (generated tokens/s, 64
# and 256 concurrent sequences, 32-token prompts, 96 new tokens,
# temperature 1; keel in exact precision).
#
# PyTorch gets its fast set-up: Debian's python3-torch 1.13 on OpenBLAS's
# OpenMP build (found first through LD_LIBRARY_PATH) with its AVX-512
# kernels (OPENBLAS_CORETYPE, which these machines set to Haswell, is
# unset) and tcmalloc preloaded. Missing packages are installed with
# apt-get (run as root). CI does not run this.
set -eu
cd "$(dirname "$0")/../.."
need=""
/usr/bin/python3 -c 'import torch' 2>/dev/null || need="$need python3-torch"
[ -e /usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3 ] || need="$need libopenblas0-openmp"
[ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] || need="$need libtcmalloc-minimal4"
if [ -n "$need" ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y $need >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/keel" ./cmd/keel
echo "keel..." >&2
GOMAXPROCS=2 "$tmp/keel" bench --no-gemm --json --presets tiny-dense,tiny-moe,small-moe --decode-precisions exact >"$tmp/keel.json"
GOMAXPROCS=2 "$tmp/keel" bench --no-gemm --json --presets small-moe --vocab 4096 --no-decode >"$tmp/keel4096.json"
echo "PyTorch..." >&2
(
	unset OPENBLAS_CORETYPE
	export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
	export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp
	export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
	/usr/bin/python3 tools/torchref/bench.py >"$tmp/torch.json"
)
/usr/bin/python3 - "$tmp/keel.json" "$tmp/keel4096.json" "$tmp/torch.json" <<'PY'
import json, sys
k, k4, t = (json.load(open(p)) for p in sys.argv[1:4])
rows = []
for r in k["train"] + k4["train"]:
    key = f'{r["Preset"]}/{128 if r in k["train"] else 4096}'
    rows.append((f"train {key}", r["TokensPerS"], t["train"][key]))
for r in k["train"] + k4["train"]:
    key = f'{r["Preset"]}/{128 if r in k["train"] else 4096}'
    rows.append((f"forward {key}", r["FwdTokensPerS"], t["forward"][key]))
for d in k["decode"]:
    key = f'{d["Preset"]}/{d["Slots"]}'
    rows.append((f"decode {key} seqs", d["TokensPerS"], t["decode"][key]))
print(f"PyTorch {t['torch']}, 2 threads, OpenBLAS (OpenMP, AVX-512) + tcmalloc; keel {k['cpu_path']}, 2 threads")
print(f"{'row (tokens/s)':32s} {'keel':>10s} {'PyTorch':>10s} {'keel/PyTorch':>13s}")
for name, a, b in rows:
    print(f"{name:32s} {a:10.0f} {b:10.0f} {a / b:12.2f}x")
PY
