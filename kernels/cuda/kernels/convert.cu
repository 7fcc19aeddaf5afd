// Conversions and copies: float32 <-> bfloat16 (round to nearest even) and
// the embedding's gather and its deterministic backward.

extern "C" __global__ void f32_to_bf16(bf16_t* __restrict__ out, const float* __restrict__ in, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = f32_to_bf16(in[i]);
}

extern "C" __global__ void bf16_to_f32(float* __restrict__ out, const bf16_t* __restrict__ in, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = bf16_to_f32(in[i]);
}

// embed_fwd: x[t] = table[tokens[t]] (rows of H). grid = T.
extern "C" __global__ void embed_fwd(float* __restrict__ x, const float* __restrict__ table,
                                     const int* __restrict__ tokens, int H) {
  const i64 t = blockIdx.x;
  const float* src = table + (i64)tokens[t] * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) x[t * H + j] = src[j];
}

// gather_bf16: x[t] = table[idx[t]] for rows of n bf16 (an MoE layer's
// bf16 input rows grouped by expert). grid = rows.
extern "C" __global__ void gather_bf16(bf16_t* __restrict__ x, const bf16_t* __restrict__ table,
                                       const int* __restrict__ idx, int n) {
  const i64 t = blockIdx.x;
  const bf16_t* src = table + (i64)idx[t] * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x) x[t * n + j] = src[j];
}

// embed_bwd adds the rows of dx to the embedding gradient without atomics:
// the host groups the token rows by token (uniq[u] is a token, its rows
// are rows[offs[u]..offs[u+1]) in increasing order), and each block adds
// one token's rows in that order, as the CPU engine does. grid = #uniq.
extern "C" __global__ void embed_bwd(float* __restrict__ dtable, const float* __restrict__ dx,
                                     const int* __restrict__ uniq, const int* __restrict__ offs,
                                     const int* __restrict__ rows, int H) {
  const int u = blockIdx.x;
  float* dst = dtable + (i64)uniq[u] * H;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float v = dst[j];
    for (int k = offs[u]; k < offs[u + 1]; k++) v += dx[(i64)rows[k] * H + j];
    dst[j] = v;
  }
}

// f32_to_bf16_2d: out [rows, cols] (contiguous) = bf16(in), in's rows ld
// apart: a product's operand taken out of a wider matrix. grid = rows.
extern "C" __global__ void f32_to_bf16_2d(bf16_t* __restrict__ out, const float* __restrict__ in, int cols, i64 ld) {
  const i64 r = blockIdx.x;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) out[r * cols + j] = f32_to_bf16(in[r * ld + j]);
}

// f32_to_bf16_2d_out: out's rows ldo apart = bf16(in [rows, cols],
// contiguous): a gradient rounded into a column span of a wider operand.
// grid = rows.
extern "C" __global__ void f32_to_bf16_2d_out(bf16_t* __restrict__ out, const float* __restrict__ in, int cols, i64 ldo) {
  const i64 r = blockIdx.x;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) out[r * ldo + j] = f32_to_bf16(in[r * cols + j]);
}

// bf16_to_f32_2d: out [rows, cols] (contiguous) = in widened, in's rows
// ld apart: a column span of a wider bf16 matrix as float32. grid = rows.
extern "C" __global__ void bf16_to_f32_2d(float* __restrict__ out, const bf16_t* __restrict__ in, int cols, i64 ld) {
  const i64 r = blockIdx.x;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) out[r * cols + j] = bf16_to_f32(in[r * ld + j]);
}

// round_e4m3 rounds x to the nearest float8 e4m3 value, ties to even,
// saturating at +-448, NaN kept, as kernels.RoundE4M3 does (bit for bit).
__device__ __forceinline__ float round_e4m3(float x) {
  const u32 u = __float_as_uint(x);
  const u32 sign = u & 0x80000000u;
  u32 a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return x;  // NaN
  if (a >= 0x43e00000u) {
    a = 0x43e00000u;  // |x| >= 448: saturate
  } else if (a < 0x3c800000u) {
    // |x| < 2^-6: a multiple of 2^-9, to nearest even through float32's
    // step in [2^14, 2^15).
    const float f = __fadd_rn(__uint_as_float(a), 16384.f);
    a = __float_as_uint(__fsub_rn(f, 16384.f));
  } else {
    a += 0x7ffffu + ((a >> 20) & 1u);
    a &= ~0xfffffu;
  }
  return __uint_as_float(sign | a);
}

// e4m3_code is the float8 e4m3 byte of an e4m3 value v (round_e4m3's
// outputs: exact): sign, 4 exponent bits (bias 7), 3 mantissa bits;
// below 2^-6 a multiple of 2^-9 (a subnormal); NaN S.1111.111.
__device__ __forceinline__ unsigned char e4m3_code(float v) {
  const u32 u = __float_as_uint(v);
  const u32 sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned char)(sign | 0x7fu);
  if (a < 0x3c800000u) return (unsigned char)(sign | (u32)(__uint_as_float(a) * 512.f));
  return (unsigned char)(sign | ((a >> 23) - 120u) << 3 | ((a >> 20) & 7u));
}

// quant_e4m3_row quantises row r of src as quant_e4m3_rows describes,
// handing put(j, v) each quantised value v (an e4m3 value, exact).
template <class P>
__device__ void quant_e4m3_row(float* scale, const float* src, int cols, i64 ld, P put) {
  __shared__ u32 sm[32];
  const i64 r = blockIdx.x;
  const float* row = src + r * ld;
  u32 mx = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) mx = max(mx, __float_as_uint(row[j]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) sm[w] = mx;
  __syncthreads();
  mx = l < (int)(blockDim.x >> 5) ? sm[l] : 0u;
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float s = __uint_as_float(mx) / 448.f;
  if (threadIdx.x == 0) scale[r] = s;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) put(j, s == 0.f ? 0.f : round_e4m3(row[j] / s));
}

// quant_e4m3_rows quantises each row of src (rows ld apart, cols wide) to
// e4m3 with one scale per row, as kernels.QuantizeE4M3Rows does: scale =
// max|row| / 448 (a NaN or Inf in the row makes it non-finite), out =
// round_e4m3(x / scale) stored as bf16 (exact), zeros when the scale is 0.
// grid = rows, block = KEEL_THREADS.
extern "C" __global__ void quant_e4m3_rows(bf16_t* __restrict__ out, float* __restrict__ scale,
                                           const float* __restrict__ src, int cols, i64 ld) {
  bf16_t* o = out + (i64)blockIdx.x * cols;
  quant_e4m3_row(scale, src, cols, ld, [&](int j, float v) { o[j] = f32_to_bf16(v); });
}

// quant_e4m3_rows8 is quant_e4m3_rows writing each value's e4m3 byte
// (e4m3_code: cuBLASLt's CUDA_R_8F_E4M3, the float8 product's operand).
extern "C" __global__ void quant_e4m3_rows8(unsigned char* __restrict__ out, float* __restrict__ scale,
                                            const float* __restrict__ src, int cols, i64 ld) {
  unsigned char* o = out + (i64)blockIdx.x * cols;
  quant_e4m3_row(scale, src, cols, ld, [&](int j, float v) { o[j] = e4m3_code(v); });
}

// bf16_e4m3 writes the e4m3 bytes of n bf16 values that are e4m3 values
// (quant_e4m3_rows's outputs: the fp8 weights' bf16 copy).
extern "C" __global__ void bf16_e4m3(unsigned char* __restrict__ out, const bf16_t* __restrict__ in, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = e4m3_code(bf16_to_f32(in[i]));
}

// scale_rows_cols: y[r, c] = (y[r, c] * sw[c]) * sx[r], the fp8 product's
// epilogue (the per-channel, then the per-token scale, in the CPU's
// order). grid = rows.
extern "C" __global__ void scale_rows_cols(float* __restrict__ y, const float* __restrict__ sx,
                                           const float* __restrict__ sw, int cols, i64 ldy) {
  const i64 r = blockIdx.x;
  const float a = sx[r];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[r * ldy + c] = y[r * ldy + c] * sw[c] * a;
}

// scale_rows_cols_grouped is scale_rows_cols over an MoE layer's rows
// grouped by expert: row r of expert e (off[e] <= r < off[e+1]) takes
// expert e's channel scales, sw + e*sstride. grid = rows.
extern "C" __global__ void scale_rows_cols_grouped(float* __restrict__ y, const float* __restrict__ sx,
                                                   const float* __restrict__ sw, const int* __restrict__ off, int E,
                                                   int cols, i64 ldy, i64 sstride) {
  const int r = blockIdx.x;
  int lo = 0, hi = E;  // the last expert whose rows start at or before r: off[lo] <= r < off[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (off[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const float a = sx[r];
  const float* w = sw + lo * sstride;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[(i64)r * ldy + c] = y[(i64)r * ldy + c] * w[c] * a;
}

// round_e2m1 rounds x to the nearest float4 e2m1 value (0, 0.5, 1, 1.5, 2,
// 3, 4, 6), ties to even, saturating at 6, NaN kept: kernels.RoundE2M1.
__device__ __forceinline__ float round_e2m1(float x) {
  if (x != x) return x;
  const double a = fabs((double)x);
  double q;
  if (a <= 0.25) q = 0;
  else if (a < 0.75) q = 0.5;
  else if (a <= 1.25) q = 1;
  else if (a < 1.75) q = 1.5;
  else if (a <= 2.5) q = 2;
  else if (a < 3.5) q = 3;
  else if (a <= 5) q = 4;
  else q = 6;
  return (float)copysign(q, (double)x);
}

// quant_nvfp4_rows quantises each row of src (rows ld apart, cols wide)
// NVFP4-style as kernels.PackNVFP4 does (the fp4 rollout's weights): the
// row's power-of-two scale s = 2^ceil(log2(max|row| / (6·448))) (1 for an
// all-zero row, NaN with zeros for a row holding NaN or Inf), per block of
// 16 inputs an e4m3 scale bs = round_e4m3(max|block| / 6 / s), and values
// round_e2m1(x / (bs·s))·bs, stored as bf16 (exact). grid = rows.
extern "C" __global__ void quant_nvfp4_rows(bf16_t* __restrict__ out, float* __restrict__ scale,
                                            const float* __restrict__ src, int cols, i64 ld) {
  __shared__ u32 sm[32];
  __shared__ int bad[1];
  const i64 r = blockIdx.x;
  const float* row = src + r * ld;
  bf16_t* o = out + r * cols;
  if (threadIdx.x == 0) bad[0] = 0;
  __syncthreads();
  u32 mx = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const u32 a = __float_as_uint(row[j]) & 0x7fffffffu;
    if (a >= 0x7f800000u) bad[0] = 1;  // NaN or Inf: any thread may set it
    mx = max(mx, a);
  }
  for (int q = 16; q > 0; q >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, q));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) sm[w] = mx;
  __syncthreads();
  mx = l < (int)(blockDim.x >> 5) ? sm[l] : 0u;
  for (int q = 16; q > 0; q >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, q));
  if (bad[0] || mx == 0) {
    if (threadIdx.x == 0) scale[r] = bad[0] ? __int_as_float(0x7fffffff) : 1.f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) o[j] = 0;
    return;
  }
  // ceil(log2(x)) exactly, from x's binary exponent: x = f·2^e, f in
  // [0.5, 1), so log2 x is in [e-1, e) and equals e-1 only for f = 0.5.
  int e;
  const double f = frexp((double)__uint_as_float(mx) / (6.0 * 448.0), &e);
  const float s = (float)ldexp(1.0, f == 0.5 ? e - 1 : e);
  if (threadIdx.x == 0) scale[r] = s;
  for (int b0 = threadIdx.x * 16; b0 < cols; b0 += blockDim.x * 16) {
    const int b1 = min(b0 + 16, cols);
    float bm = 0.f;
    for (int j = b0; j < b1; j++) bm = fmaxf(bm, fabsf(row[j]));
    const float bs = round_e4m3(bm / 6.f / s);
    for (int j = b0; j < b1; j++) {
      const float q = bs != 0.f ? round_e2m1(row[j] / (bs * s)) * bs : 0.f;
      o[j] = f32_to_bf16(q);
    }
  }
}
