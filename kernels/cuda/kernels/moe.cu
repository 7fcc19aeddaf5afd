// The sparse MoE block's row kernels, in float32. The routing itself (top-k
// or replayed experts, gate weights, grouping tokens by expert) is done on
// the host with the CPU engine's own functions, so both engines route
// alike; these kernels move rows and combine the experts' outputs, each
// token's slots in slot order (no atomics).

// softmax_rows: z = softmax(z) in place, one block per row.
extern "C" __global__ void softmax_rows(float* z, int V) {
  __shared__ float s[32];
  __shared__ double sd[32];
  float* row = z + (i64)blockIdx.x * V;
  float mx = -__int_as_float(0x7f800000);
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = block_max(mx, s);
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(row[j] - mx);
  const float inv = (float)(1.0 / block_sum_f64(sum, sd));
  for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = expf(row[j] - mx) * inv;
}

// moe_combine: out[t] = resid[t] + sum_s gates[t*k+s] * yg[row[t*k+s]],
// the slots added in order. grid = T.
extern "C" __global__ void moe_combine(float* __restrict__ out, const float* __restrict__ resid,
                                       const float* __restrict__ yg, const float* __restrict__ gates,
                                       const int* __restrict__ row, int k, int H) {
  const i64 t = blockIdx.x;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < k; s++) {
      const float y = yg[(i64)row[t * k + s] * H + j];
      acc = s == 0 ? gates[t * k] * y : fmaf(gates[t * k + s], y, acc);
    }
    out[t * H + j] = resid[t * H + j] + acc;
  }
}

// moe_combine_bwd: for token t and slot s, the gate's gradient
// dgt[t*k+s] = dout[t].yg[r] and the expert output's gradient
// dy[r] = gate * dout[t], r = row[t*k+s]. grid = T.
extern "C" __global__ void moe_combine_bwd(float* __restrict__ dy, float* __restrict__ dgt,
                                           const float* __restrict__ dout, const float* __restrict__ yg,
                                           const float* __restrict__ gates, const int* __restrict__ row,
                                           int k, int H) {
  __shared__ double sd[32];
  const i64 t = blockIdx.x;
  for (int s = 0; s < k; s++) {
    const i64 r = row[t * k + s];
    const float g = gates[t * k + s];
    double dot = 0.0;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
      const float d = dout[t * H + j];
      dot += (double)d * (double)yg[r * H + j];
      dy[r * H + j] = g * d;
    }
    dot = block_sum_f64(dot, sd);
    if (threadIdx.x == 0) dgt[t * k + s] = (float)dot;
  }
}

// moe_gather_sum: dxn[t] = sum_s dxg[row[t*k+s]], slots in order. grid = T.
extern "C" __global__ void moe_gather_sum(float* __restrict__ dxn, const float* __restrict__ dxg,
                                          const int* __restrict__ row, int k, int H) {
  const i64 t = blockIdx.x;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float v = dxg[(i64)row[t * k] * H + j];
    for (int s = 1; s < k; s++) v += dxg[(i64)row[t * k + s] * H + j];
    dxn[t * H + j] = v;
  }
}
