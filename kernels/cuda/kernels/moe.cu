// The sparse MoE block's kernels, in float32: the router's softmax, the
// choice of experts and gates (moe_route, the same scans as model.TopK and
// model.GateWeights, so every engine routes alike), the probability mass
// of the load-balancing loss, the combination of the experts' outputs in
// slot order (no atomics) and the backward of all of it, the router's
// gradient as train.RouterBackRow computes it. The host only groups the
// (token, slot) pairs by expert, from the experts' ids.

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

// moe_route chooses each token's experts and their gate weights on the
// device, as model.TopK and model.GateWeights do on the host (one thread
// per token, the same sequential scans, so the same experts and the same
// bits): the k largest router probabilities in descending order, ties to
// the lower expert, a NaN below every number; or, when replay is not null
// and holds experts for the token (its first slot >= 0; -1 for a token
// routed live), the replayed ones. Gates: p_id / (sum of the chosen p in
// slot order) when norm, else p_id. grid*block >= T.
extern "C" __global__ void moe_route(int* __restrict__ ids, float* __restrict__ gates,
                                     const float* __restrict__ probs, const int* __restrict__ replay,
                                     int T, int E, int k, int norm) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* p = probs + (i64)t * E;
  int* id = ids + (i64)t * k;
  const bool replayed = replay && replay[(i64)t * k] >= 0;
  for (int s = 0; s < k; s++) {
    if (replayed) {
      id[s] = replay[(i64)t * k + s];
      continue;
    }
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int q = 0; q < s; q++) taken = taken || id[q] == e;
      if (taken) continue;
      const float v = p[e];
      if (best < 0 || v > p[best] || (p[best] != p[best] && v == v)) best = e;
    }
    id[s] = best;
  }
  float* g = gates + (i64)t * k;
  if (!norm) {
    for (int s = 0; s < k; s++) g[s] = p[id[s]];
    return;
  }
  float sum = 0.f;
  for (int s = 0; s < k; s++) sum += p[id[s]];
  for (int s = 0; s < k; s++) g[s] = p[id[s]] / sum;
}

// moe_psum: psum[e] = the sum over tokens, in order, of probs[t][e], in
// float64 (the load-balancing loss's probability mass). grid*block >= E.
extern "C" __global__ void moe_psum(double* __restrict__ psum, const float* __restrict__ probs, int T, int E) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  double s = 0.0;
  for (int t = 0; t < T; t++) s += (double)probs[(i64)t * E + e];
  psum[e] = s;
}

// router_bwd: the gradient w.r.t. each token's router logits, as
// train.RouterBackRow computes it (one thread per token, the same
// sequential float32 sums): ds = aux_grad; ds[id] += (dg - sum dg*g)/S
// (norm) or dg; then ds = p*(ds - sum p*ds). grid*block >= T.
extern "C" __global__ void router_bwd(float* __restrict__ ds, const float* __restrict__ probs,
                                      const float* __restrict__ gates, const int* __restrict__ ids,
                                      const float* __restrict__ dg, const float* __restrict__ aux_grad,
                                      int T, int E, int k, int norm) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* p = probs + (i64)t * E;
  const int* id = ids + (i64)t * k;
  const float* g = gates + (i64)t * k;
  const float* d = dg + (i64)t * k;
  float* o = ds + (i64)t * E;
  for (int e = 0; e < E; e++) o[e] = aux_grad[e];
  if (norm) {
    float sum = 0.f, gdg = 0.f;
    for (int s = 0; s < k; s++) {
      sum += p[id[s]];
      gdg += d[s] * g[s];
    }
    for (int s = 0; s < k; s++) o[id[s]] += (d[s] - gdg) / sum;
  } else {
    for (int s = 0; s < k; s++) o[id[s]] += d[s];
  }
  float pdp = 0.f;
  for (int e = 0; e < E; e++) pdp += p[e] * o[e];
  for (int e = 0; e < E; e++) o[e] = p[e] * (o[e] - pdp);
}
