#!/usr/bin/env bash
# Builds, on this machine (Go, no GPU), what the GPU machine runs: the CUDA
# package's test binary and keel itself, into tools/gpu/bin (git-ignored;
# pass it to the device tool's carry). The GPU machine has no Go.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p tools/gpu/bin
export CGO_ENABLED=0
go test -c -ldflags='-s -w' -o tools/gpu/bin/cuda.test ./kernels/cuda
go test -c -ldflags='-s -w' -o tools/gpu/bin/traincuda.test ./train/cuda
go test -c -ldflags='-s -w' -o tools/gpu/bin/rolloutcuda.test ./rollout/cuda
go test -c -ldflags='-s -w' -o tools/gpu/bin/keelcmd.test ./cmd/keel
go build -ldflags='-s -w' -o tools/gpu/bin/keel ./cmd/keel
# Every kernel compiles here first (NVRTC from Debian's libnvrtc11.2).
KEEL_REQUIRE_NVRTC=1 tools/gpu/bin/cuda.test -test.run 'TestEveryKernelCompiles' >/dev/null
du -sh tools/gpu/bin/*
tar czf tools/gpu/bin.tgz -C tools/gpu bin   # what the device tool carries (its limit is 64 MiB with the tree)
du -sh tools/gpu/bin.tgz
