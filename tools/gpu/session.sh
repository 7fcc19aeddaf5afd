#!/usr/bin/env bash
# Runs check.sh's sections on the device machine within one deadline, and
# packs every log (not the kernel cache, not the weights) into one archive,
# $OUT/logs.tgz, after each section: the device tool returns at most 8 files,
# and a call stopped at its limit still returns what was packed.
# Usage: bash tools/gpu/session.sh DEADLINE_S SECTION:CAP_S...
#   e.g. bash tools/gpu/session.sh 330 tests:270 hf:120
set -uo pipefail
cd "$(dirname "$0")/../.."
deadline=$(( $(date +%s) + $1 ))
shift
dest=${OUT:-/tmp/keel-gpu-out}
export OUT=/tmp/keel-gpu
mkdir -p "$OUT" "$dest"
# tools/gpu/build.sh packs the binaries; carry tools/gpu/bin.tgz.
[ -f tools/gpu/bin.tgz ] && tar xzf tools/gpu/bin.tgz -C tools/gpu
rc=0
for spec in "$@"; do
  section=${spec%:*} limit=${spec#*:}
  left=$(( deadline - $(date +%s) ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then echo "== section $section skipped: ${left}s left"; continue; fi
  start=$(date +%s)
  timeout -k 5 "$limit" bash tools/gpu/check.sh "$section" || { echo "== section $section exit $?"; rc=1; }
  # check.sh's own timeouts start process groups of their own: end them too.
  pkill -KILL -f 'tools/gpu/(bin/|[a-z_]+\.py)|nsys (profile|stats)' 2>/dev/null
  echo "== section $section took $(( $(date +%s) - start )) s (limit $limit s)"
  tar czf "$dest/logs.tgz" -C "$OUT" --exclude=./cache --exclude='*.safetensors' --exclude='*.nsys-rep' --exclude='*.sqlite' . 2>/dev/null
done
exit $rc
