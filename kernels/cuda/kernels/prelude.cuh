// keel's CUDA prelude, put before every kernel source: NVRTC compiles one
// string with no include path, so what the kernels share lives here. No
// CUDA header is included, so the sources compile with any NVRTC from
// CUDA 11.8 on.
//
// Batch invariance: every reduction below adds in an order fixed by the
// block's shape and the row's length alone, never by how many rows a
// launch holds or by timing (no atomics on floats), so a row's result is
// the same bits alone or inside any batch.

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef long long i64;

// KEEL_DYNAMIC_SHARED(T, name) declares name, a T*, as the block's dynamic
// shared memory (the launch's shared bytes; above 48 KiB a kernel needs
// Function.SetMaxDynamicShared first). keel's CUDA emulator hands it a
// buffer of its own instead of an extern __shared__ array.
#ifdef KEEL_CUDA_EMU
#define KEEL_DYNAMIC_SHARED(T, name) T* name = (T*)keel_emu::dyn_shared
#else
#define KEEL_DYNAMIC_SHARED(T, name) \
  extern __shared__ T keel_dyn_##name[]; \
  T* name = keel_dyn_##name
#endif

// KEEL_THREADS is the block size of the row kernels: rows of any length
// are reduced by this many threads, so the order of additions depends on
// the row length only.
#define KEEL_THREADS 256

__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
  return __uint_as_float(((u32)h) << 16);
}

// f32_to_bf16 rounds to nearest, ties to even (as the CPU kernels and
// PyTorch do); a NaN stays a (quiet) NaN.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}

// put stores an output element: float32, or rounded to bf16 where the
// element is a bf16 product's operand (the fused kernels' outputs).
__device__ __forceinline__ void put(float* p, float v) { *p = v; }
__device__ __forceinline__ void put(bf16_t* p, float v) { *p = f32_to_bf16(v); }

// warp_sum returns the sum of v over the warp to every lane, by a fixed
// butterfly: each step adds the same two values on both lanes of a pair,
// so all lanes hold the same bits.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// block_sum returns the sum of v over the block (a multiple of 32 threads,
// at most 1024) to every thread: warp sums, then the warp sums summed by
// each warp in the same order. s is shared scratch of 32 floats; the
// barriers make back-to-back calls safe.
__device__ float block_sum(float v, float* s) {
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) s[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x >> 5) ? s[l] : 0.f;
  return warp_sum(v);
}

__device__ float block_max(float v, float* s) {
  v = warp_max(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) s[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x >> 5) ? s[l] : -__int_as_float(0x7f800000);
  return warp_max(v);
}

__device__ double block_sum_f64(double v, double* s) {
  v = warp_sum_f64(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) s[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x >> 5) ? s[l] : 0.0;
  return warp_sum_f64(v);
}

// row_offset is where row r starts in a matrix whose rows come per to a
// group of stride elements (per = 1, stride = n for plain rows; per =
// heads, stride = a token's row for per-head rows inside a wider matrix).
__device__ __forceinline__ i64 row_offset(i64 r, int n, int per, i64 stride) {
  return (r / per) * stride + (r % per) * (i64)n;
}
