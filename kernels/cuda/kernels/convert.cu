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
