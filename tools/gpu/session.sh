#!/usr/bin/env bash
# Runs check.sh's sections on the device machine within one deadline, and
# packs every log (not the kernel cache, not the weights) into one archive,
# $OUT/logs.tgz, after each section: the device tool returns at most 8 files,
# and a call stopped at its limit still returns what was packed.
# Usage: bash tools/gpu/session.sh DEADLINE_S SECTION:CAP_S...
#   e.g. bash tools/gpu/session.sh 330 tests:270 hf:120
# A section written SECTION&:CAP_S starts in the background and runs beside
# the sections after it (for one whose figures the others' load does not
# change, like learn's held-out gain, beside checks that time nothing:
# warm, tests, fit, hf); its output is printed when it ends, and the
# call waits for it before it returns.
set -uo pipefail
cd "$(dirname "$0")/../.."
deadline=$(( $(date +%s) + $1 ))
shift
dest=${OUT:-/tmp/keel-gpu-out}
export OUT=/tmp/keel-gpu
mkdir -p "$OUT" "$dest"
# tools/gpu/build.sh packs the binaries; carry tools/gpu/bin.tgz.
[ -f tools/gpu/bin.tgz ] && tar xzf tools/gpu/bin.tgz -C tools/gpu
pack() {
  tar czf "$dest/logs.tgz" -C "$OUT" --exclude=./cache --exclude='*.safetensors' --exclude='*.nsys-rep' --exclude='*.sqlite' . 2>/dev/null
}
# strays ends what a foreground section's timeouts left running (they start
# process groups of their own), sparing the background sections' processes,
# which carry KEEL_GPU_BACKGROUND=1 in their environment; strays all, at
# the end, spares none (a background section cut at its limit leaves its
# own timeouts' groups behind too).
strays() {
  local p
  for p in $(pgrep -f 'tools/gpu/(bin/|[a-z_]+\.py)|nsys (profile|stats)'); do
    [ "${1:-}" = all ] || ! tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx KEEL_GPU_BACKGROUND=1 || continue
    kill -KILL "$p" 2>/dev/null
  done
}
bg_pids=() bg_names=()
rc=0
for spec in "$@"; do
  section=${spec%:*} limit=${spec#*:}
  background=
  [[ $section == *'&' ]] && { background=1; section=${section%&}; }
  left=$(( deadline - $(date +%s) ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then echo "== section $section skipped: ${left}s left"; continue; fi
  start=$(date +%s)
  if [[ -n $background ]]; then
    KEEL_GPU_BACKGROUND=1 bash -c 'timeout -k 5 "$1" bash tools/gpu/check.sh "$2" > "$3" 2>&1; r=$?
      echo "== section $2 (background) exit $r, took $(( $(date +%s) - $4 )) s (limit $1 s)" >> "$3"' \
      _ "$limit" "$section" "$OUT/background-$section.out" "$start" &
    bg_pids+=($!) bg_names+=("$section")
    echo "== section $section started in the background (limit $limit s)"
    continue
  fi
  timeout -k 5 "$limit" bash tools/gpu/check.sh "$section" || { echo "== section $section exit $?"; rc=1; }
  strays
  echo "== section $section took $(( $(date +%s) - start )) s (limit $limit s)"
  pack
done
# The background sections end by their own limits, within the deadline.
for i in "${!bg_pids[@]}"; do
  wait "${bg_pids[$i]}"
  echo "== background section ${bg_names[$i]}:"
  cat "$OUT/background-${bg_names[$i]}.out"
  grep -q "^== section ${bg_names[$i]} (background) exit 0," "$OUT/background-${bg_names[$i]}.out" || rc=1
done
strays all
pack
exit $rc
