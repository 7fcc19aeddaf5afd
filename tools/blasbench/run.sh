#!/bin/sh
# run.sh compares keel's float32 GEMM with OpenBLAS's sgemm on the same
# shapes, two threads each, and prints one table side by side. It installs
# OpenBLAS with apt-get when missing (run as root). CI does not run it.
#
# Usage: tools/blasbench/run.sh [count]   (count: keel benchmark repetitions, default 5)
set -eu
cd "$(dirname "$0")/../.."
count=${1:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -e /usr/include/x86_64-linux-gnu/cblas.h ] && [ ! -e /usr/include/cblas.h ] && ! ls /usr/include/*/cblas.h >/dev/null 2>&1; then
	apt-get install -y libopenblas-dev >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y libopenblas-dev >/dev/null; }
fi
inc=$(dirname "$(ls /usr/include/x86_64-linux-gnu/openblas*/cblas.h /usr/include/openblas/cblas.h /usr/include/cblas.h 2>/dev/null | head -1)")
gcc -O2 -I"$inc" -o "$tmp/blasbench" tools/blasbench/blasbench.c -lopenblas

# The machines export OPENBLAS_CORETYPE=Haswell, which holds OpenBLAS to
# AVX2: let it pick its AVX-512 kernels.
unset OPENBLAS_CORETYPE
export OPENBLAS_NUM_THREADS=2
"$tmp/blasbench" >"$tmp/blas.txt"

GOMAXPROCS=2 go test -run '^$' -bench '^BenchmarkGemm$' -benchtime 0.3s -count "$count" ./kernels |
	awk '/GFLOP/ { split($1, p, "/"); key = p[2] " " p[3]; sub(/-[0-9]+$/, "", key);
		for (i = 2; i < NF; i++) if ($(i+1) == "GFLOP/s" && $i > best[key]) best[key] = $i }
		END { for (k in best) print k, best[k] }' >"$tmp/keel.txt"

printf '%-4s %-16s %10s %10s %7s\n' op MxKxN OpenBLAS keel ratio
while read -r op shape blas; do
	keel=$(awk -v o="$op" -v s="$shape" '$1 == o && $2 == s { print $3 }' "$tmp/keel.txt")
	awk -v o="$op" -v s="$shape" -v b="$blas" -v k="${keel:-0}" \
		'BEGIN { printf "%-4s %-16s %10.1f %10.1f %6.0f%%\n", o, s, b, k, (b > 0 ? 100 * k / b : 0) }'
done <"$tmp/blas.txt"
