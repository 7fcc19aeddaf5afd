#!/usr/bin/env bash
# Runs keel's GPU tests on the CUDA emulator: builds the emulator's
# libraries (build.sh), then the device tests of kernels/cuda, train/cuda
# and rollout/cuda, keel rl and keel serve on the GPU (cmd/keel's TestRLOnGPU,
# TestServeOnGPU), with
# KEEL_CUDA_LIBS pointing at them, so that every
# kernel and the engines' device code run on the CPU. No GPU figure comes
# out of this; what it shows is that the code is right where a GPU would
# run it. Arguments go to go test (e.g. -short, -run TestEngine).
# KEEL_CUDA_EMU_ORDER=reverse runs each block's threads last first.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=$(bash tools/cudaemu/build.sh)
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
# The emulator's own tests first: what it computes and what it refuses
# (the refusals print their messages; "ok" ends a passing run).
g++ -std=c++17 -O1 -Wall -o "$cache/selftest" tools/cudaemu/selftest.cc -ldl
"$cache/selftest" "$lib" 2> "$cache/selftest.log" || { cat "$cache/selftest.log"; exit 1; }
export KEEL_CUDA_LIBS=$lib KEEL_CACHE_DIR=$cache KEEL_REQUIRE_CUDA=1
go test -count=1 -timeout 30m "$@" ./kernels/cuda ./train/cuda ./rollout/cuda
# The grouped products' tensor-core path (gemm.cu's mma16816 tiles), which
# the emulator otherwise replaces by sums from shared memory: its
# fragments' indexing, through mma16816's stand-in (own cache: other images).
mkdir "$cache/mma"
KEEL_CUDA_EMU_MMA=1 KEEL_CACHE_DIR=$cache/mma go test -count=1 -timeout 30m "$@" \
  -run 'TestDeviceGemmGrouped|TestDeviceQuantGrouped' ./kernels/cuda
# keel rl end to end with both engines on the (emulated) GPU.
go test -count=1 -timeout 30m "$@" -run 'OnGPU|TestDeviceCommand' ./cmd/keel
