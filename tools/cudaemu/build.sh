#!/usr/bin/env bash
# Builds the CUDA emulator's three libraries into tools/cudaemu/lib (with
# the header its NVRTC compiles kernels against). Needs g++ (x86-64 Linux).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/lib
mkdir -p "$out"
flags=(-std=c++17 -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wno-unknown-pragmas)
g++ "${flags[@]}" -o "$out/libcuda.so.1" "$here/cuda.cc" -ldl
g++ "${flags[@]}" -o "$out/libnvrtc.so.13" "$here/nvrtc.cc" -ldl
g++ "${flags[@]}" -o "$out/libcublasLt.so.13" "$here/cublaslt.cc" -ldl
cp "$here/keel_cuda_emu.h" "$out/"
echo "$out"
