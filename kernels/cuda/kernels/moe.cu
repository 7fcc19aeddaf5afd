// The sparse MoE block's kernels, in float32: the router's softmax, the
// choice of experts and gates (moe_route, the same scans as model.TopK and
// model.GateWeights, so every engine routes alike), the probability mass
// of the load-balancing loss, the combination of the experts' outputs in
// slot order (no atomics) and the backward of all of it, the router's
// gradient as train.RouterBackRow computes it, and the grouping of the
// (token, slot) pairs by expert (moe_group_*, model.GroupByExpert's
// order), so that a step needs no round trip to the host.

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
// the slots added in order; yg float32, or (moe_combine_y16) bf16 as the
// bf16 training mode's down products write it, widened. grid = T.
template <typename Y>
__device__ __forceinline__ void moe_combine_token(float* __restrict__ out, const float* __restrict__ resid,
                                                  const Y* __restrict__ yg, const float* __restrict__ gates,
                                                  const int* __restrict__ row, int k, int H) {
  const i64 t = blockIdx.x;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < k; s++) {
      const float y = widen(yg[(i64)row[t * k + s] * H + j]);
      acc = s == 0 ? gates[t * k] * y : fmaf(gates[t * k + s], y, acc);
    }
    out[t * H + j] = resid[t * H + j] + acc;
  }
}
extern "C" __global__ void moe_combine(float* __restrict__ out, const float* __restrict__ resid,
                                       const float* __restrict__ yg, const float* __restrict__ gates,
                                       const int* __restrict__ row, int k, int H) {
  moe_combine_token(out, resid, yg, gates, row, k, H);
}
extern "C" __global__ void moe_combine_y16(float* __restrict__ out, const float* __restrict__ resid,
                                           const bf16_t* __restrict__ yg, const float* __restrict__ gates,
                                           const int* __restrict__ row, int k, int H) {
  moe_combine_token(out, resid, yg, gates, row, k, H);
}

// moe_combine_bwd: for token t and slot s, the gate's gradient
// dgt[t*k+s] = dout[t].yg[r] and the expert output's gradient
// dy[r] = gate * dout[t], r = row[t*k+s]. moe_combine_bwd_y16, the bf16
// training mode's, reads yg in bf16 and writes dy rounded to bf16 (the
// experts' down products' gradient operand). grid = T.
template <typename Y, typename D>
__device__ void moe_combine_bwd_token(D* __restrict__ dy, float* __restrict__ dgt, const float* __restrict__ dout,
                                      const Y* __restrict__ yg, const float* __restrict__ gates,
                                      const int* __restrict__ row, int k, int H) {
  __shared__ double sd[32];
  const i64 t = blockIdx.x;
  for (int s = 0; s < k; s++) {
    const i64 r = row[t * k + s];
    const float g = gates[t * k + s];
    double dot = 0.0;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
      const float d = dout[t * H + j];
      dot += (double)d * (double)widen(yg[r * H + j]);
      put(dy + r * H + j, g * d);
    }
    dot = block_sum_f64(dot, sd);
    if (threadIdx.x == 0) dgt[t * k + s] = (float)dot;
  }
}
extern "C" __global__ void moe_combine_bwd(float* __restrict__ dy, float* __restrict__ dgt,
                                           const float* __restrict__ dout, const float* __restrict__ yg,
                                           const float* __restrict__ gates, const int* __restrict__ row,
                                           int k, int H) {
  moe_combine_bwd_token(dy, dgt, dout, yg, gates, row, k, H);
}
extern "C" __global__ void moe_combine_bwd_y16(bf16_t* __restrict__ dy, float* __restrict__ dgt,
                                               const float* __restrict__ dout, const bf16_t* __restrict__ yg,
                                               const float* __restrict__ gates, const int* __restrict__ row,
                                               int k, int H) {
  moe_combine_bwd_token(dy, dgt, dout, yg, gates, row, k, H);
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

// route_better says whether expert a (probability va) comes before
// expert b (vb) in model.TopK's order: a number before a NaN, the larger
// number first, the lower expert first among equals (and among NaNs); an
// expert < 0 (none) after every expert.
__device__ __forceinline__ bool route_better(float va, int a, float vb, int b) {
  if (a < 0 || b < 0) return b < 0 && a >= 0;
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return a < b;
}

// moe_route chooses each token's experts and their gate weights on the
// device, as model.TopK and model.GateWeights do on the host (the same
// experts and the same bits): the k largest router probabilities in
// descending order, ties to the lower expert, a NaN below every number;
// or, when replay is not null and holds experts for the token (its first
// slot >= 0; -1 for a token routed live), the replayed ones. Gates: p_id /
// (sum of the chosen p in slot order) when norm, else p_id. A warp per
// token: each slot's expert is the warp's best by route_better (a total
// order, so the butterfly's order does not matter) among those not yet
// taken, lane l holding experts l, l+32, ... (E <= 1024); where a thread
// per token had scanned every expert for every slot, at 6% occupancy (an
// H200's Nsight Compute: 340 µs a layer for 4,096 tokens). grid =
// ceil(T/(block/32)), block a multiple of 32.
extern "C" __global__ void moe_route(int* __restrict__ ids, float* __restrict__ gates,
                                     const float* __restrict__ probs, const int* __restrict__ replay,
                                     int T, int E, int k, int norm) {
  const int lane = threadIdx.x & 31;
  const i64 t = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= T) return;  // the whole warp
  const float* p = probs + t * E;
  int* id = ids + t * k;
  if (replay && replay[t * k] >= 0) {
    for (int s = lane; s < k; s += 32) id[s] = replay[t * k + s];
  } else {
    u32 taken = 0;  // bit i: expert lane + 32i chosen
    for (int s = 0; s < k; s++) {
      float bv = 0.f;
      int best = -1;
      for (int i = 0, e = lane; e < E; i++, e += 32) {
        const float v = p[e];
        if (!((taken >> i) & 1u) && route_better(v, e, bv, best)) bv = v, best = e;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int ob = __shfl_xor_sync(0xffffffffu, best, o);
        if (route_better(ov, ob, bv, best)) bv = ov, best = ob;
      }
      if (best >= 0 && (best & 31) == lane) taken |= 1u << (best >> 5);
      if (lane == 0) id[s] = best;
    }
  }
  __syncwarp();  // id, as the lanes wrote it, for lane 0's gates below
  if (lane != 0) return;
  float* g = gates + t * k;
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

// The grouping of the (token, slot) pairs by expert, as model.GroupByExpert
// orders them: expert e's pairs are the grouped rows off[e]..off[e+1],
// pairs in order within an expert (pair j is token j/k's slot j%k). Three
// launches over chunks of MOE_CHUNK pairs, with no atomics: the counts per
// chunk and expert, the offsets (and the tile map of the grouped
// products), the rows. Every array has a size fixed by the pair count, so
// a decoding step that groups on the device can be a CUDA graph.
#define MOE_CHUNK 256

// moe_group_count: cnt[c*E + e] = the pairs of chunk c (pairs
// c*MOE_CHUNK...) routed to expert e. grid = chunks, block = MOE_CHUNK.
extern "C" __global__ void __launch_bounds__(256) moe_group_count(int* __restrict__ cnt, const int* __restrict__ ids, int R, int E) {
  __shared__ int s[MOE_CHUNK];
  const int j0 = blockIdx.x * MOE_CHUNK, n = min(MOE_CHUNK, R - j0);
  if ((int)threadIdx.x < n) s[threadIdx.x] = ids[j0 + threadIdx.x];
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int m = 0;
    for (int j = 0; j < n; j++) m += s[j] == e;
    cnt[(i64)blockIdx.x * E + e] = m;
  }
}

// moe_group_offsets: off[e] = the pairs routed to experts below e (off[E]
// = R); base[c*E + e] = the grouped row of chunk c's first pair of expert
// e (off[e] + those of the chunks before c); and the tile map of the
// grouped products: tiles[2i], tiles[2i+1] = the expert and its row tile
// of tile i, experts in order, entries past the last tile -1. One block.
extern "C" __global__ void __launch_bounds__(256) moe_group_offsets(int* __restrict__ off, int* __restrict__ base,
                                                                    int* __restrict__ tiles, const int* __restrict__ cnt,
                                                                    int chunks, int E, int ntiles) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int s = 0;
    for (int c = 0; c < chunks; c++) {
      const int m = cnt[(i64)c * E + e];
      base[(i64)c * E + e] = s;
      s += m;
    }
    off[e + 1] = s;
  }
  for (int i = threadIdx.x; i < ntiles; i += blockDim.x) tiles[2 * i] = tiles[2 * i + 1] = -1;
  __syncthreads();
  if (threadIdx.x == 0) {
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int o = off[e];
    for (int c = 0; c < chunks; c++) base[(i64)c * E + e] += o;
    // Expert e's tiles follow those of the experts before it.
    int t0 = 0;
    for (int q = 0; q < e; q++) t0 += (off[q + 1] - off[q] + MOE_TILE - 1) / MOE_TILE;
    const int nt = (off[e + 1] - o + MOE_TILE - 1) / MOE_TILE;
    for (int t = 0; t < nt && t0 + t < ntiles; t++) {
      tiles[2 * (t0 + t)] = e;
      tiles[2 * (t0 + t) + 1] = t;
    }
  }
}

// moe_group_place: for pair j, its grouped row row[j] = base[c*E + e] +
// the pairs of chunk c before j routed to e, and tok[row[j]] = j/k.
// grid = chunks, block = MOE_CHUNK.
extern "C" __global__ void __launch_bounds__(256) moe_group_place(int* __restrict__ row, int* __restrict__ tok,
                                                                  const int* __restrict__ ids, const int* __restrict__ base,
                                                                  int R, int E, int k) {
  __shared__ int s[MOE_CHUNK];
  const int i = threadIdx.x, j0 = blockIdx.x * MOE_CHUNK, n = min(MOE_CHUNK, R - j0);
  if (i < n) s[i] = ids[j0 + i];
  __syncthreads();
  if (i >= n) return;
  const int e = s[i];
  if (e < 0 || e >= E) return;  // not an expert: moe_route never writes one
  int rank = 0;
  for (int j = 0; j < i; j++) rank += s[j] == e;
  const int r = base[(i64)blockIdx.x * E + e] + rank;
  row[j0 + i] = r;
  tok[r] = (j0 + i) / k;
}
