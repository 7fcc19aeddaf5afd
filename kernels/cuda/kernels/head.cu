// The LM head's row kernels in float32: log-softmax at a temperature, the
// entropy, the log-prob of each row's target, and the backward of a loss
// sum_t coef_lp[t]*log p(target_t) + coef_h[t]*H_t with respect to the
// logits. One block of KEEL_THREADS per row.

// logsoftmax_row: row = row/temp (skipped at temp 1, element by element
// as the rollout engine divides), then row -= logsumexp(row), in place, by
// one block; returns the log-sum-exp. The training forward and the
// rollout's step both use it.
// With H, the last pass also sums the entropy -sum p log p of the values
// it writes into *h, as entropy_rows sums them (the same threads, order
// and block sum: the same bits), saving that kernel's pass over the row.
template <bool H>
__device__ float logsoftmax_row_h(float* row, int V, float temp, double* h) {
  __shared__ float s[32];
  __shared__ double sd[32];
  float mx = -__int_as_float(0x7f800000);
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float v = row[j];
    if (temp != 1.f) {
      v = v / temp;
      row[j] = v;
    }
    mx = fmaxf(mx, v);
  }
  mx = block_max(mx, s);
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(row[j] - mx);
  sum = block_sum_f64(sum, sd);
  const float l = (float)((double)mx + log(sum));
  double e = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float z = row[j] - l;
    row[j] = z;
    if (H) e -= (double)expf(z) * (double)z;
  }
  if (H) *h = block_sum_f64(e, sd);
  return l;
}

__device__ float logsoftmax_row(float* row, int V, float temp) { return logsoftmax_row_h<false>(row, V, temp, 0); }

// logsoftmax_rows: each row's log-softmax at temperature temp; lse[r]
// gets the log-sum-exp when lse is not null. grid = rows.
extern "C" __global__ void logsoftmax_rows(float* z, float* lse, int V, float temp) {
  const float l = logsoftmax_row(z + (i64)blockIdx.x * V, V, temp);
  if (threadIdx.x == 0 && lse) lse[blockIdx.x] = l;
}

// logsoftmax_stats_rows is logsoftmax_rows, gather_rows and (with
// entropy) entropy_rows in one launch, the same bits: each row's
// log-softmax in place, lp[r] = its target's log-prob (0 for a negative
// target) and H[r] its entropy. The training forward's head. grid = rows.
extern "C" __global__ void logsoftmax_stats_rows(float* z, float* __restrict__ lp, float* __restrict__ H,
                                                 const int* __restrict__ targets, int V, float temp, int entropy) {
  float* row = z + (i64)blockIdx.x * V;
  double h = 0.0;
  if (entropy)
    logsoftmax_row_h<true>(row, V, temp, &h);
  else
    logsoftmax_row(row, V, temp);
  __syncthreads();  // every thread's writes, before the target's is read
  if (threadIdx.x == 0) {
    const int tg = targets[blockIdx.x];
    lp[blockIdx.x] = tg < 0 ? 0.f : row[tg];
    if (entropy) H[blockIdx.x] = (float)h;
  }
}

// logsoftmax_rows_t: the same with a temperature per row (0 means 1: a
// greedy row reports the untempered distribution). grid = rows.
extern "C" __global__ void logsoftmax_rows_t(float* z, const float* __restrict__ temps, int V) {
  const float t = temps[blockIdx.x];
  logsoftmax_row(z + (i64)blockIdx.x * V, V, t == 0.f ? 1.f : t);
}

// entropy_rows: H[r] = -sum_v p_v log p_v from the log-softmax rows.
extern "C" __global__ void entropy_rows(float* __restrict__ H, const float* __restrict__ logp, int V) {
  __shared__ double sd[32];
  const float* row = logp + (i64)blockIdx.x * V;
  double h = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float z = row[j];
    h -= (double)expf(z) * (double)z;
  }
  h = block_sum_f64(h, sd);
  if (threadIdx.x == 0) H[blockIdx.x] = (float)h;
}

// gather_rows: out[r] = logp[r*V + idx[r]], 0 where idx[r] < 0 (a row
// without a next token). One thread per row.
extern "C" __global__ void gather_rows(float* __restrict__ out, const float* __restrict__ logp,
                                       const int* __restrict__ idx, int rows, int V) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  out[r] = idx[r] < 0 ? 0.f : logp[(i64)r * V + idx[r]];
}

// logit_grad is the gradient of the loss w.r.t. one logit from its
// log-prob zv (see head_bwd), divided by temp; target says it is the
// row's target.
__device__ __forceinline__ float logit_grad(float zv, float cl, float ch, float ent, bool target, float temp) {
  const float p = expf(zv);
  float v = ch == 0.f ? p * -cl : -cl * p - ch * p * (zv + ent);
  if (target) v += cl;
  if (temp != 1.f) v = v / temp;
  return v;
}

// head_bwd writes the gradient w.r.t. the logits of row r (log-softmax in
// logp): with p = exp(logp), d log p_y/d logit_v = delta_vy - p_v and
// dH/d logit_v = -p_v*(logp_v + H), each divided by temp (the logits
// entered the softmax as logit/temp). dz may alias logp. grid = rows.
extern "C" __global__ void head_bwd(float* dz, const float* logp, const float* __restrict__ coef_lp,
                                    const float* __restrict__ coef_h, const int* __restrict__ targets,
                                    int V, float temp) {
  __shared__ double sd[32];
  const i64 r = blockIdx.x;
  const float* z = logp + r * V;
  float* d = dz + r * V;
  const float cl = coef_lp[r], ch = coef_h[r];
  if (cl == 0.f && ch == 0.f) {
    for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = 0.f;
    return;
  }
  float ent = 0.f;
  if (ch != 0.f) {
    double h = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) h -= (double)expf(z[j]) * (double)z[j];
    ent = (float)block_sum_f64(h, sd);
  }
  const int tgt = cl != 0.f ? targets[r] : -1;
  for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = logit_grad(z[j], cl, ch, ent, j == tgt, temp);
}

// The bf16 training mode's head reads each row of logits once in its
// forward and once in its backward, where the float32 mode's kernels above
// read it three and four times (and write it back): at Qwen3's vocabulary
// a row is 600 KB, so these passes, not the products, were the head's
// cost. The forward keeps each row's log-sum-exp and entropy; the backward
// takes them instead of recomputing them. The sums are taken online
// (Milakov & Gimelshein's running maximum), which changes their order
// against logsoftmax_row: the same values within float32 rounding, not the
// same bits, so the float32 mode (which the exact rollout matches bit for
// bit) keeps the kernels above.

// stats_add folds v into one thread's running maximum m, sum s of
// exp(v - m) and (with T) sum t of exp(v - m)·(v - m); the sums rescale
// when the maximum grows. A NaN leaves m alone and makes s NaN, as it
// would the two-pass sums; -inf (an impossible token) adds nothing.
template <bool T = true>
__device__ __forceinline__ void stats_add(float& m, double& s, double& t, float v) {
  if (v == -__int_as_float(0x7f800000)) return;
  if (v > m) {
    if (s != 0.0) {
      const double dm = (double)m - (double)v, c = exp(dm);
      if (T) t = c * (t + dm * s);
      s *= c;
    }
    m = v;
  }
  const float d = v - m;
  const double e = (double)expf(d);
  s += e;
  if (T) t += e * (double)d;
}

// stats_merge folds another thread's (m2, s2, t2) into (m, s, t) (t only
// with T).
template <bool T = true>
__device__ __forceinline__ void stats_merge(float& m, double& s, double& t, float m2, double s2, double t2) {
  if (s2 == 0.0) return;  // nothing folded there (an empty share of the row)
  if (s == 0.0) {
    m = m2, s = s2, t = t2;
    return;
  }
  const float mm = fmaxf(m, m2);
  const double d1 = (double)m - (double)mm, d2 = (double)m2 - (double)mm;
  const double c1 = exp(d1), c2 = exp(d2);
  if (T) t = c1 * (t + d1 * s) + c2 * (t2 + d2 * s2);
  s = c1 * s + c2 * s2;
  m = mm;
}

// block_stats merges every thread's (m, s, t) over the block (a multiple
// of 32 threads) and gives every thread the result, the same bits on
// each: a fixed butterfly in each warp, then the warps' in order.
template <bool T = true>
__device__ void block_stats(float& m, double& s, double& t) {
  __shared__ float sm[32];
  __shared__ double ss[32], st[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const double s2 = __shfl_xor_sync(0xffffffffu, s, o), t2 = T ? __shfl_xor_sync(0xffffffffu, t, o) : 0.0;
    stats_merge<T>(m, s, t, m2, s2, t2);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = m, ss[threadIdx.x >> 5] = s, st[threadIdx.x >> 5] = t;
  __syncthreads();
  m = sm[0], s = ss[0], t = st[0];
  for (int k = 1; k < (int)(blockDim.x >> 5); k++) stats_merge<T>(m, s, t, sm[k], ss[k], st[k]);
}

// ROW_STATS_LOADS is the loads in flight a thread in row_stats: at four,
// session 24's H200 profile had head_stats_bf16 read 4,096 rows of
// 151,936 float32 logits (2.5 GB) in 1.36 ms, 1.8 TB/s.
#define ROW_STATS_LOADS 16

// row_stats folds the values at(j0..j1) of a row (T: with the entropy's
// sum t), each thread its values j0 + thread + blockDim.x·i in order,
// ROW_STATS_LOADS loads in flight, and merges them over the block.
template <bool T = true, class F>
__device__ __forceinline__ void row_stats(F at, int j0, int j1, float& m, double& s, double& t) {
  constexpr int U = ROW_STATS_LOADS;
  m = -__int_as_float(0x7f800000);
  s = 0.0, t = 0.0;
  const int n = blockDim.x;
  int j = j0 + threadIdx.x;
  for (; j + (U - 1) * n < j1; j += U * n) {
    float v[U];
#pragma unroll
    for (int u = 0; u < U; u++) v[u] = at(j + u * n);
#pragma unroll
    for (int u = 0; u < U; u++) stats_add<T>(m, s, t, v[u]);
  }
  for (; j < j1; j += n) stats_add<T>(m, s, t, at(j));
  block_stats<T>(m, s, t);
}

// head_stats_bf16 is the bf16 mode's forward head: from the logits z of
// each row (read once, not changed) at temperature temp, lse[r] = the
// log-sum-exp (as logsoftmax_row's l: float of max + log sum), lp[r] = the
// target's log-prob (0 for a negative target) and H[r] = the entropy
// log s - t/s, in float64 until the end. grid = rows, block = 256.
extern "C" __global__ void head_stats_bf16(const float* __restrict__ z, float* __restrict__ lse,
                                           float* __restrict__ lp, float* __restrict__ H,
                                           const int* __restrict__ targets, int V, float temp) {
  const float* row = z + (i64)blockIdx.x * V;
  auto at = [&](int j) { return temp != 1.f ? row[j] / temp : row[j]; };
  float m;
  double s, t;
  row_stats(at, 0, V, m, s, t);
  if (threadIdx.x != 0) return;
  const double ls = log(s);
  const float l = (float)((double)m + ls);
  const int tg = targets[blockIdx.x];
  lse[blockIdx.x] = l;
  lp[blockIdx.x] = tg < 0 ? 0.f : at(tg) - l;
  H[blockIdx.x] = (float)(ls - t / s);
}

// head_grad_bf16_saved is head_bwd's gradient rounded to bf16, from the
// logits z (read once, not changed) and each row's log-sum-exp and
// entropy as head_stats_bf16 wrote them over the same logits: the bf16
// mode's head backward, whose products read dz16. grid = rows.
extern "C" __global__ void head_grad_bf16_saved(bf16_t* __restrict__ dz16, const float* __restrict__ z,
                                                const float* __restrict__ lse, const float* __restrict__ H,
                                                const float* __restrict__ coef_lp, const float* __restrict__ coef_h,
                                                const int* __restrict__ targets, int V, float temp) {
  const i64 r = blockIdx.x;
  const float* row = z + r * V;
  bf16_t* d = dz16 + r * V;
  const float cl = coef_lp[r], ch = coef_h[r];
  if (cl == 0.f && ch == 0.f) {
    for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = f32_to_bf16(0.f);
    return;
  }
  const float l = lse[r], ent = ch != 0.f ? H[r] : 0.f;
  const int tgt = cl != 0.f ? targets[r] : -1;
  auto grad = [&](float zj, int j) {
    const float v = temp != 1.f ? zj / temp : zj;
    return f32_to_bf16(logit_grad(v - l, cl, ch, ent, j == tgt, temp));
  };
  if (V % 4 == 0 && ((unsigned long long)z & 15) == 0 && ((unsigned long long)dz16 & 7) == 0) {
    // Four logits a load and four gradients a store, four loads in flight
    // a thread: each element's arithmetic is the scalar loop's, so the
    // same bits (session 24's H200 profile: 1.48 ms a call for 2.5 GB
    // read and 1.25 GB written, 2.5 TB/s, with a 4-byte load a logit).
    const u32x4* row4 = (const u32x4*)row;
    const int n4 = V / 4, step = blockDim.x;
    auto put4 = [&](int q, u32x4 v) {
      const int j = 4 * q;
      u32x2 g;
      g.x = (u32)grad(__uint_as_float(v.x), j) | ((u32)grad(__uint_as_float(v.y), j + 1) << 16);
      g.y = (u32)grad(__uint_as_float(v.z), j + 2) | ((u32)grad(__uint_as_float(v.w), j + 3) << 16);
      *(u32x2*)(d + j) = g;
    };
    int q = threadIdx.x;
    for (; q + 3 * step < n4; q += 4 * step) {
      const u32x4 a = row4[q], b = row4[q + step], c = row4[q + 2 * step], e = row4[q + 3 * step];
      put4(q, a), put4(q + step, b), put4(q + 2 * step, c), put4(q + 3 * step, e);
    }
    for (; q < n4; q += step) put4(q, row4[q]);
    return;
  }
  for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = grad(row[j], j);
}

// DRAW_BLOCK is the span of tokens whose probabilities draw_rows sums as
// one partial sum (as the host's sampler does, rollout.DrawRow), and
// DRAW_MAX_BLOCKS bounds the vocabulary a row may have (524,288 tokens).
#define DRAW_BLOCK 512
#define DRAW_MAX_BLOCKS 1024

// draw_scan is the end of a sampled row's draw, run by one warp from the
// sums of exp(lpv(j)) over each DRAW_BLOCK tokens (in shared or global
// memory): every lane finds the block where the draw lands (the same bits
// on each), the lanes take the exps of its tokens into shared memory
// together, then lane 0 adds them in token order and writes the token and
// its log-prob: the scan's sums are the one-by-one scan's, without a
// global load's latency per token.
template <class F>
__device__ void draw_scan(F lpv, int V, double ur, const double* sums, int* tok, float* lp) {
  const int l = threadIdx.x & 31, nb = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
  double total = 0.0;
  for (int b = 0; b < nb; b++) total += sums[b];
  const double target = ur * total;
  double cum = 0.0;
  int b = 0;
  for (; b < nb && cum + sums[b] <= target; b++) cum += sums[b];
  __shared__ float pexp[DRAW_BLOCK];
  const int j0 = b * DRAW_BLOCK, n = max(0, min(DRAW_BLOCK, V - j0));
  for (int k = l; k < n; k += 32) pexp[k] = expf(lpv(j0 + k));
  __syncwarp();
  if (l != 0) return;
  int pick = -1;
  for (int k = 0; k < n; k++) {
    const float p = pexp[k];
    if (p == 0.f) continue;
    cum += (double)p;
    if (cum > target) {
      pick = j0 + k;
      break;
    }
  }
  // Rounding may carry the draw past the block: on to the row's end.
  for (int j = j0 + n; pick < 0 && j < V; j++) {
    const float p = expf(lpv(j));
    if (p == 0.f) continue;
    cum += (double)p;
    if (cum > target) pick = j;
  }
  // Rounding left the target unreached: the last token of probability
  // above 0.
  for (int j = V - 1; pick < 0 && j > 0; j--) {
    if (expf(lpv(j)) != 0.f) pick = j;
  }
  if (pick < 0) pick = 0;
  *tok = pick;
  *lp = lpv(pick);
}

// span_sum is the sum of exp(lpv(j)) over tokens j0..hi-1 (at most
// DRAW_BLOCK) by a warp: each lane's tokens j0 + lane + 32k in order, in
// float64, then warp_sum_f64. Every lane's values are read before the
// first is added (16 loads in flight a lane where the loop it replaced
// kept a few): the same sums.
template <class F>
__device__ __forceinline__ double span_sum(F lpv, int j0, int hi, int lane) {
  constexpr int K = DRAW_BLOCK / 32;
  float v[K];
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int j = j0 + lane + 32 * k;
    v[k] = j < hi ? lpv(j) : 0.f;
  }
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < K; k++)
    if (j0 + lane + 32 * k < hi) s += (double)expf(v[k]);
  return warp_sum_f64(s);
}

// draw_row draws one row's token by draw_rows's rule from its
// log-probabilities lpv(j), writing the token to *tok and its log-prob to
// *lp (thread 0); greedy takes the most probable.
template <class F>
__device__ void draw_row(F lpv, int V, double ur, bool greedy, int* tok, float* lp) {
  __shared__ double sums[DRAW_MAX_BLOCKS];
  __shared__ float sv[32];
  __shared__ int si[32];
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, warps = blockDim.x >> 5;
  if (greedy) {
    // Argmax: each thread's first maximum over its tokens (ascending),
    // then the warps' and the block's, the lower id winning ties.
    float bv = -__int_as_float(0x7f800000);
    int bi = V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = lpv(j);
      if (v > bv || bi == V) {
        bv = v;
        bi = j;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (l == 0) {
      sv[w] = bv;
      si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < warps; k++) {
        if (sv[k] > bv || (sv[k] == bv && si[k] < bi)) {
          bv = sv[k];
          bi = si[k];
        }
      }
      if (bi >= V) bi = 0;  // a row of NaN: token 0, as the host's scan
      *tok = bi;
      *lp = lpv(bi);
    }
    return;
  }
  const int nb = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
  for (int b = w; b < nb; b += warps) {
    const int hi = min((b + 1) * DRAW_BLOCK, V);
    const double s = span_sum(lpv, b * DRAW_BLOCK, hi, l);
    if (l == 0) sums[b] = s;
  }
  __syncthreads();
  if (w == 0) draw_scan(lpv, V, ur, sums, tok, lp);
}

// The truncated draws (top-k, top-p: rollout.DrawTruncated's rule) walk a
// row's tokens in descending probability, the lower id first among
// equals, without sorting it: each cut and the draw is the first token in
// that order at which a running count or sum reaches a limit, found by a
// radix descent over the tokens' keys (draw_find). The sums are of
// fixed-point probabilities, DRAW_FIX = 2^43 units to 1 (floor(p 2^43)):
// a row of up to 2^19 tokens sums below 2^62, exactly and the same in any
// order, so no atomics or fixed reduction order are needed for the bits
// to be a row's alone. A token's probability is off by less than 2^-43,
// so the cuts and the draw differ from the host's float64 sums only within
// rounding of a boundary (rollout.NearTruncBoundary).
#define DRAW_FIX 8796093022208.0  // 2^43
typedef unsigned long long u64;

// draw_key orders tokens as the truncated draws walk them: ascending key
// is descending z (-0 counted as +0, as the host compares values; NaN
// last).
__device__ __forceinline__ u32 draw_key(float v) {
  if (v != v) return 0xffffffffu;
  const u32 b = v == 0.f ? 0u : __float_as_uint(v);
  return (b & 0x80000000u) ? b : (~b & 0x7fffffffu);
}

// draw_fix is the fixed-point probability of log-probability v (p 2^43 is
// exact in float: a power of two's scaling; no float64 work).
__device__ __forceinline__ u64 draw_fix(float v) {
  const float p = expf(v);
  return p > 0.f ? (u64)(p * 8796093022208.0f) : 0ull;
}

// DrawFind is where draw_find stopped: the key and id of the token found
// and the count and fixed-point mass of the tokens up to it, in the
// draw's order, inclusive. found is false when the limit is never
// reached; count and mass are then the whole row's.
struct DrawFind {
  u32 key;
  int id;
  u64 count, mass;
  bool found;
};

// draw_reached says whether a running count c and mass m have reached
// lim: mode 0 c >= lim, mode 1 m >= lim, mode 2 m > lim.
__device__ __forceinline__ bool draw_reached(int mode, u64 c, u64 m, u64 lim) {
  return mode == 0 ? c >= lim : mode == 1 ? m >= lim : m > lim;
}

// warp_bins_step is a step of warp_bins16 over H bins: each lane keeps
// the lower or upper H of its 2H bins (lane bit 2H says which) and adds its
// partner's copy of them. H is a template constant so that every index is
// one and the bins stay in registers.
template <int H, class T>
__device__ __forceinline__ void warp_bins_step(T (&v)[16], int l) {
  const bool up = (l & (2 * H)) != 0;
#pragma unroll
  for (int i = 0; i < H; i++) {
    const T lo = v[i], hi = v[i + H];
    v[i] = (up ? hi : lo) + __shfl_xor_sync(0xffffffffu, up ? lo : hi, 2 * H);
  }
}

// warp_bins16 sums each lane's 16 bins v over the warp, returning bin
// (lane >> 1)'s total: a halving butterfly (each step a lane keeps half
// its bins and adds its partner's copy of them), 16 shuffles where a sum
// per bin takes 80. v is spent.
template <class T>
__device__ __forceinline__ T warp_bins16(T (&v)[16]) {
  const int l = threadIdx.x & 31;
  warp_bins_step<8>(v, l);
  warp_bins_step<4>(v, l);
  warp_bins_step<2>(v, l);
  warp_bins_step<1>(v, l);
  return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
}

// draw_find returns the first token of the row (log-probabilities lpv(j),
// V tokens) in the draw's order at which the running count or mass
// reaches lim (draw_reached's mode). A radix descent over the keys, four
// bits a pass from the top: each pass counts and weighs the tokens whose
// key starts with the digits chosen so far by their next digit (per
// thread in registers, then over the warp, warp_bins16, and the warps in
// order), and the first digit at which the running totals reach lim is
// chosen. A digit held by one token ends the descent: that token, found
// by a pass of its own. Tokens of one key (equal z, equal probability)
// are taken in id order: the n-th, n the fewest that reach lim, found by a
// block scan. Every thread calls it and gets the result.
template <class F>
__device__ DrawFind draw_find(F lpv, int V, int mode, u64 lim) {
  __shared__ u64 wc[32][16], wm[32][16];
  __shared__ u64 s_c, s_m, s_n, s_bm;
  __shared__ int s_digit, s_id, s_done;
  __shared__ u32 s_key;
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, warps = blockDim.x >> 5;
  u32 prefix = 0, mask = 0;
  u64 accC = 0, accM = 0, binC = 0, binM = 0;
  __syncthreads();  // the last call's results are read
  for (int shift = 28; shift >= 0; shift -= 4) {
    u64 c[16], m[16];
#pragma unroll
    for (int d = 0; d < 16; d++) c[d] = 0, m[d] = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = lpv(j);
      const u32 key = draw_key(v);
      if ((key & mask) != prefix) continue;
      const u32 dig = (key >> shift) & 15u;
      const u64 p = draw_fix(v);
#pragma unroll
      for (int d = 0; d < 16; d++) {
        const bool hit = dig == (u32)d;
        c[d] += hit ? 1ull : 0ull;
        m[d] += hit ? p : 0ull;
      }
    }
    const u64 cw = warp_bins16(c), mw = warp_bins16(m);
    if ((l & 1) == 0) wc[w][l >> 1] = cw, wm[w][l >> 1] = mw;
    __syncthreads();
    if (threadIdx.x == 0) {
      int digit = -1;
      for (int d = 0; d < 16 && digit < 0; d++) {
        u64 cd = 0, md = 0;
        for (int k = 0; k < warps; k++) cd += wc[k][d], md += wm[k][d];
        if (cd != 0 && draw_reached(mode, accC + cd, accM + md, lim)) {
          digit = d;
          binC = cd;
          binM = md;
        } else {
          accC += cd;
          accM += md;
        }
      }
      s_digit = digit;
      s_c = accC, s_m = accM, s_n = binC, s_bm = binM;
    }
    __syncthreads();
    const int digit = s_digit;
    accC = s_c, accM = s_m, binC = s_n, binM = s_bm;
    __syncthreads();
    if (digit < 0) return DrawFind{0u, -1, accC, accM, false};
    prefix |= (u32)digit << shift;
    mask |= 15u << shift;
    if (binC == 1) break;
  }
  if (binC == 1) {  // the one token with the prefix, wherever it is
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float v = lpv(j);
      if ((draw_key(v) & mask) == prefix) s_id = j, s_key = draw_key(v);
    }
    __syncthreads();
    return DrawFind{s_key, s_id, accC + 1, accM + binM, true};
  }
  // binC tokens of the whole key chosen, each of mass binM / binC: the
  // n-th of them in id order.
  const u64 pt = binM / binC;
  u64 n = 1;
  if (mode == 0) n = lim - accC;
  else if (pt != 0) n = (lim - accM) / pt + (mode == 2 ? 1 : ((lim - accM) % pt != 0));
  n = min(max(n, (u64)1), binC);
  if (threadIdx.x == 0) s_done = 0, s_id = -1;
  u64 base = 0;  // matches in the chunks before
  for (int j0 = 0; j0 < V; j0 += blockDim.x) {
    const int j = j0 + threadIdx.x;
    const int f = j < V && draw_key(lpv(j)) == prefix;
    int incl = f;
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, incl, o);
      if (l >= o) incl += t;
    }
    if (l == 31) wc[w][0] = (u64)incl;
    __syncthreads();
    u64 before = base, total = base;
    for (int k = 0; k < warps; k++) {
      if (k < w) before += wc[k][0];
      total += wc[k][0];
    }
    if (f && before + (u64)incl == n) s_id = j, s_done = 1;
    __syncthreads();
    base = total;
    if (s_done) break;
  }
  return DrawFind{prefix, s_id, accC + n, accM + n * pt, true};
}

// draw_row_trunc draws one row's token by rollout.DrawTruncated's rule
// from its log-probabilities lpv(j) with uniform ur, top-k k (off unless
// 0 < k < V) and top-p tp (off unless 0 < tp < 1): the cuts and the draw
// are draw_find's, the kept total their fixed-point mass. Thread 0 writes
// the token, its log-probability and its truncated log-probability.
template <class F>
__device__ void draw_row_trunc(F lpv, int V, double ur, int k, double tp, int* tok, float* lp, float* tlp) {
  DrawFind end{0u, -1, 0ull, 0ull, false};
  if (k > 0 && k < V) end = draw_find(lpv, V, 0, (u64)k);
  if (tp > 0.0 && tp < 1.0) {
    const DrawFind f = draw_find(lpv, V, 1, (u64)ceil(tp * DRAW_FIX));
    if (f.found && (!end.found || f.key < end.key || (f.key == end.key && f.id <= end.id))) end = f;
  }
  // Uncut (top-k at least V, top-p never reached): the whole row's mass.
  const u64 kept = end.found ? end.mass : draw_find(lpv, V, 0, (u64)V + 1).mass;
  DrawFind pick;
  if (kept == 0) {  // nothing of weight: the last kept token, as the host's scan ends
    pick = draw_find(lpv, V, 0, end.found ? end.count : (u64)V);
  } else {
    u64 target = (u64)(ur * (double)kept);
    if (target >= kept) target = kept - 1;
    pick = draw_find(lpv, V, 2, target);
  }
  if (threadIdx.x == 0) {
    if (pick.id < 0) pick.id = 0;  // not reached: the sums are exact, so never
    const float z = lpv(pick.id);
    *tok = pick.id;
    *lp = z;
    *tlp = (float)((double)z - log((double)kept / DRAW_FIX));
  }
}

// TOP_MAX bounds the most probable tokens a row reports (top_row;
// rollout.MaxTopLogProbs).
#define TOP_MAX 20

// top_row writes the row's n (at most TOP_MAX) most probable tokens and
// their log-probabilities lpv(j) to ttok and tlpv, the most probable
// first, the lower id first among equals (rollout's topTokens): draw_find
// gives the n-th, a pass counts each thread's tokens that rank at or
// before it, a block scan gives each thread its place, a second pass
// stages them in shared memory, and thread 0 sorts the n.
template <class F>
__device__ void top_row(F lpv, int V, int n, int* ttok, float* tlpv) {
  __shared__ int sid[TOP_MAX], wsum[32];
  __shared__ float sval[TOP_MAX];
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  n = min(min(n, V), TOP_MAX);
  const DrawFind f = draw_find(lpv, V, 0, (u64)n);
  auto ranks = [&](int j, float v) {
    const u32 k = draw_key(v);
    return k < f.key || (k == f.key && j <= f.id);
  };
  int cnt = 0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) cnt += ranks(j, lpv(j));
  int incl = cnt;
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(0xffffffffu, incl, o);
    if (l >= o) incl += t;
  }
  if (l == 31) wsum[w] = incl;
  __syncthreads();
  int at = incl - cnt;
  for (int k = 0; k < w; k++) at += wsum[k];
  for (int j = threadIdx.x; j < V && at < n; j += blockDim.x) {
    const float v = lpv(j);
    if (ranks(j, v)) sid[at] = j, sval[at] = v, at++;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int i = 1; i < n; i++) {  // insertion sort by the draw's order
    const int id = sid[i];
    const float v = sval[i];
    const u32 k = draw_key(v);
    int j = i;
    for (; j > 0 && (draw_key(sval[j - 1]) > k || (draw_key(sval[j - 1]) == k && sid[j - 1] > id)); j--) {
      sid[j] = sid[j - 1];
      sval[j] = sval[j - 1];
    }
    sid[j] = id;
    sval[j] = v;
  }
  for (int i = 0; i < n; i++) ttok[i] = sid[i], tlpv[i] = sval[i];
}

// draw_special says whether a row is drawn by draw_rows_trunc (or its raw
// twin) rather than draw_rows: it reports top log-probabilities, or
// truncates at a temperature other than 0. The two kernels split the rows
// so that draw_rows, every RL recipe's, keeps the few registers a full
// draw needs (the truncated draws' bins take about a hundred).
__device__ __forceinline__ bool draw_special(float temp, int k, double p, int n) {
  return n > 0 || (temp != 0.f && (k > 0 || (p > 0.0 && p < 1.0)));
}

// draw_one draws row r from its log-probabilities lpv(j) (see draw_rows):
// a special row's top log-probabilities, then its truncated draw or its
// full one; a plain row's full draw.
template <bool Special, class F>
__device__ void draw_one(F lpv, int V, i64 r, double ur, float temp, int k, double p, int n, int* tok, float* lp,
                         float* tlp, int* ttok, float* tlpv) {
  if (Special) {
    if (n > 0) top_row(lpv, V, n, ttok + r * TOP_MAX, tlpv + r * TOP_MAX);
    if (temp != 0.f && (k > 0 || (p > 0.0 && p < 1.0))) {
      draw_row_trunc(lpv, V, ur, k, p, tok + r, lp + r, tlp + r);
      return;
    }
  }
  draw_row(lpv, V, ur, temp == 0.f, tok + r, lp + r);
  if (threadIdx.x == 0) tlp[r] = lp[r];
}

// draw_rows_t is draw_rows (Special false, Raw false), draw_rows_trunc
// (true, false) and their twins from the logits, draw_rows_raw and
// draw_rows_trunc_raw (Raw true): a row's log-probabilities z[r] as they
// are, or the logits' log-softmax at the row's temperature (0 meaning 1)
// taken on the fly from a log-sum-exp summed online.
template <bool Special, bool Raw>
__device__ void draw_rows_t(int* tok, float* lp, float* tlp, int* ttok, float* tlpv, const float* z, const double* u,
                            const float* temps, const int* topk, const double* topp, const int* topn, int V) {
  const i64 r = blockIdx.x;
  const double ur = u[r];
  if (ur < 0.0 || draw_special(temps[r], topk[r], topp[r], topn[r]) != Special) return;
  const float* row = z + r * V;
  const float tr = temps[r];
  if (!Raw) {
    draw_one<Special>([&](int j) { return row[j]; }, V, r, ur, tr, topk[r], topp[r], topn[r], tok, lp, tlp, ttok,
                      tlpv);
    return;
  }
  const float tp = tr == 0.f ? 1.f : tr;
  auto at = [&](int j) { return tp != 1.f ? row[j] / tp : row[j]; };
  float m;
  double s, t;
  row_stats(at, 0, V, m, s, t);
  const float l = (float)((double)m + log(s));
  draw_one<Special>([&](int j) { return at(j) - l; }, V, r, ur, tr, topk[r], topp[r], topn[r], tok, lp, tlp, ttok,
                    tlpv);
}

// draw_rows draws the token of every output row r with u[r] >= 0 from its
// log-probabilities z[r] (tempered and normalised, logsoftmax_rows_t) by
// rollout.DrawRow's rule, writing it to tok[r] and z at it to lp[r] and
// tlp[r]: at temperature 0 the most probable token, the lowest id among
// equals; otherwise inverse CDF in token order, the first token at which
// the running float64 sum of exp(z) exceeds u[r] times the row's total, a
// token of probability 0 never drawn. The sums of exp over each
// DRAW_BLOCK tokens are taken by one warp each, then warp 0 finds the
// block where the draw lands and its lane 0 scans that block's tokens one
// by one (their exps staged in shared memory by the warp): the same
// draws as the host's sampler except where u falls within a few ulps of a
// boundary between two tokens. Rows with u[r] < 0 are left alone (the host
// samples them), and so are the special rows (draw_special), which
// draw_rows_trunc draws. grid = rows, block = KEEL_THREADS.
extern "C" __global__ void draw_rows(int* __restrict__ tok, float* __restrict__ lp, float* __restrict__ tlp,
                                     int* __restrict__ ttok, float* __restrict__ tlpv, const float* __restrict__ z,
                                     const double* __restrict__ u, const float* __restrict__ temps,
                                     const int* __restrict__ topk, const double* __restrict__ topp,
                                     const int* __restrict__ topn, int V) {
  draw_rows_t<false, false>(tok, lp, tlp, ttok, tlpv, z, u, temps, topk, topp, topn, V);
}

// draw_rows_trunc draws draw_rows's special rows (draw_special): a row
// with top-k topk[r] > 0 or top-p 0 < topp[r] < 1 at a temperature other
// than 0 by rollout.DrawTruncated's rule (draw_row_trunc), its truncated
// log-probability in tlp[r]; a row with topn[r] > 0 also gets its topn[r]
// most probable tokens and their log-probabilities in ttok and tlpv, at
// r * TOP_MAX (top_row). grid = rows, block = KEEL_THREADS.
extern "C" __global__ void draw_rows_trunc(int* __restrict__ tok, float* __restrict__ lp, float* __restrict__ tlp,
                                           int* __restrict__ ttok, float* __restrict__ tlpv,
                                           const float* __restrict__ z, const double* __restrict__ u,
                                           const float* __restrict__ temps, const int* __restrict__ topk,
                                           const double* __restrict__ topp, const int* __restrict__ topn, int V) {
  draw_rows_t<true, false>(tok, lp, tlp, ttok, tlpv, z, u, temps, topk, topp, topn, V);
}

// draw_rows_raw is draw_rows over the log-softmax of the logits z at each
// row's temperature (0 meaning 1) without writing it: a first pass takes
// the row's log-sum-exp l online (head_stats_bf16's sums), the draw's
// pass reads each log-prob as z/temp - l. Two reads of the row where
// logsoftmax_rows_t then draw_rows make four and a write. l is not
// logsoftmax_row's bits, so the exact rollout, whose log-probs must be
// the training engine's, keeps those two. grid = rows.
extern "C" __global__ void draw_rows_raw(int* __restrict__ tok, float* __restrict__ lp, float* __restrict__ tlp,
                                         int* __restrict__ ttok, float* __restrict__ tlpv,
                                         const float* __restrict__ z, const double* __restrict__ u,
                                         const float* __restrict__ temps, const int* __restrict__ topk,
                                         const double* __restrict__ topp, const int* __restrict__ topn, int V) {
  draw_rows_t<false, true>(tok, lp, tlp, ttok, tlpv, z, u, temps, topk, topp, topn, V);
}

// draw_rows_trunc_raw is draw_rows_trunc from the logits, as draw_rows_raw
// is draw_rows. grid = rows.
extern "C" __global__ void draw_rows_trunc_raw(int* __restrict__ tok, float* __restrict__ lp, float* __restrict__ tlp,
                                               int* __restrict__ ttok, float* __restrict__ tlpv,
                                               const float* __restrict__ z, const double* __restrict__ u,
                                               const float* __restrict__ temps, const int* __restrict__ topk,
                                               const double* __restrict__ topp, const int* __restrict__ topn,
                                               int V) {
  draw_rows_t<true, true>(tok, lp, tlp, ttok, tlpv, z, u, temps, topk, topp, topn, V);
}

// The split raw draw (Ops.DrawRowsRaw given scratch) is draw_rows_raw's
// for the plain rows (draw_special's are draw_rows_trunc_raw's), each row
// spread over a block per `chunk` tokens (a multiple of DRAW_BLOCK).
// draw_rows_raw gives a row one block, whose threads read its logits
// twice with a few loads in flight each: at 64 or 256 rows a fraction of
// the card's multiprocessors, each waiting on memory (284 µs at 256 rows
// of 151,936 on an H200, about four times what two reads of the logits
// take at the card's bandwidth). draw_chunk_stats takes each chunk's maximum and
// sum of exponentials; draw_chunk_sums merges a row's chunks in order
// into its log-sum-exp l (its bits the row's alone, whatever rows are
// beside it: not row_stats's, so the drawn log-probs may differ from
// draw_rows_raw's by an ulp) and, with the same l, sums each DRAW_BLOCK
// tokens of its chunk as draw_row does, or takes a greedy row's maximum;
// draw_chunk_pick then draws as draw_row does from those sums. Scratch,
// for R rows of nc chunks and nb blocks (Ops.DrawScratchFloats): cs
// [R, nc] and sums [R, nb] float64, then cm and cv [R, nc] float, ci
// [R, nc] int and l [R] float.

// draw_plain reports whether draw_rows_raw would draw row r: its uniform
// is not negative and it neither truncates nor reports top log-probs.
__device__ __forceinline__ bool draw_plain(i64 r, const double* u, const float* temps, const int* topk,
                                           const double* topp, const int* topn) {
  return u[r] >= 0.0 && !draw_special(temps[r], topk[r], topp[r], topn[r]);
}

// draw_chunk_stats: the maximum cm and sum of exp(v - cm) cs over chunk
// blockIdx.x of each plain row's tempered logits v = z/temp (temperature
// 0 meaning 1), as row_stats folds them. grid = (nc, rows), block =
// KEEL_THREADS.
extern "C" __global__ void draw_chunk_stats(double* __restrict__ cs, float* __restrict__ cm,
                                            const float* __restrict__ z, const double* __restrict__ u,
                                            const float* __restrict__ temps, const int* __restrict__ topk,
                                            const double* __restrict__ topp, const int* __restrict__ topn, int V,
                                            int chunk) {
  const i64 r = blockIdx.y;
  if (!draw_plain(r, u, temps, topk, topp, topn)) return;
  const float tp = temps[r] == 0.f ? 1.f : temps[r];
  const float* row = z + r * V;
  auto at = [&](int j) { return tp != 1.f ? row[j] / tp : row[j]; };
  const int j0 = blockIdx.x * chunk;
  float m;
  double sum, t;
  row_stats<false>(at, j0, min(V, j0 + chunk), m, sum, t);
  if (threadIdx.x == 0) {
    cs[r * gridDim.x + blockIdx.x] = sum;
    cm[r * gridDim.x + blockIdx.x] = m;
  }
}

// draw_chunk_sums: every block of a plain row merges the row's chunk
// statistics in chunk order into its log-sum-exp l (block 0 writes it to
// lrow); a sampled row's block then sums exp(z/temp - l) over each
// DRAW_BLOCK tokens of its chunk into sums (draw_row's sums, the same
// bits for the same l), a greedy row's takes the first largest z - l of
// its chunk into cv and ci (its index; V where none is above -inf).
// grid = (nc, rows), block = KEEL_THREADS.
extern "C" __global__ void draw_chunk_sums(double* __restrict__ sums, float* __restrict__ cv, int* __restrict__ ci,
                                           float* __restrict__ lrow, const double* __restrict__ cs,
                                           const float* __restrict__ cm, const float* __restrict__ z,
                                           const double* __restrict__ u, const float* __restrict__ temps,
                                           const int* __restrict__ topk, const double* __restrict__ topp,
                                           const int* __restrict__ topn, int V, int chunk) {
  const i64 r = blockIdx.y;
  if (!draw_plain(r, u, temps, topk, topp, topn)) return;
  const int nc = gridDim.x, c = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __shared__ float ls, sv[32];
  __shared__ int si[32];
  if (threadIdx.x == 0) {
    float m = -__int_as_float(0x7f800000);
    double sum = 0.0, t = 0.0;
    for (int k = 0; k < nc; k++) stats_merge<false>(m, sum, t, cm[r * nc + k], cs[r * nc + k], 0.0);
    ls = (float)((double)m + log(sum));
    if (c == 0) lrow[r] = ls;
  }
  __syncthreads();
  const float l = ls, tp = temps[r] == 0.f ? 1.f : temps[r];
  const float* row = z + r * V;
  auto lpv = [&](int j) { return (tp != 1.f ? row[j] / tp : row[j]) - l; };
  const int j0 = c * chunk, j1 = min(V, j0 + chunk);
  if (temps[r] == 0.f) {
    // The chunk's first largest log-prob: each thread's, then the warps'
    // and the block's, the lower index winning ties; NaN never wins.
    float bv = -__int_as_float(0x7f800000);
    int bi = V;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
      const float v = lpv(j);
      if (v > bv) bv = v, bi = j;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < warps; k++)
        if (sv[k] > bv || (sv[k] == bv && si[k] < bi)) bv = sv[k], bi = si[k];
      cv[r * nc + c] = bv;
      ci[r * nc + c] = bi;
    }
    return;
  }
  const int nb = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
  for (int b = j0 / DRAW_BLOCK + w; b * DRAW_BLOCK < j1; b += warps) {
    const int hi = min((b + 1) * DRAW_BLOCK, V);
    const double sb = span_sum(lpv, b * DRAW_BLOCK, hi, lane);
    if (lane == 0) sums[r * nb + b] = sb;
  }
}

// draw_chunk_pick draws each plain row from draw_chunk_sums's sums as
// draw_row does (draw_scan), or for a greedy row takes the first chunk's
// largest (token 0 where z[0] is NaN or no token is above -inf, as the
// host's scan), writing the token, its log-prob z/temp - l and the same
// as its truncated log-prob. grid = rows, block = 32.
extern "C" __global__ void draw_chunk_pick(int* __restrict__ tok, float* __restrict__ lp, float* __restrict__ tlp,
                                           const double* __restrict__ sums, const float* __restrict__ cv,
                                           const int* __restrict__ ci, const float* __restrict__ lrow,
                                           const float* __restrict__ z, const double* __restrict__ u,
                                           const float* __restrict__ temps, const int* __restrict__ topk,
                                           const double* __restrict__ topp, const int* __restrict__ topn, int V,
                                           int nc) {
  const i64 r = blockIdx.x;
  if (!draw_plain(r, u, temps, topk, topp, topn)) return;
  const float l = lrow[r], tp = temps[r] == 0.f ? 1.f : temps[r];
  const float* row = z + r * V;
  auto lpv = [&](int j) { return (tp != 1.f ? row[j] / tp : row[j]) - l; };
  if (temps[r] != 0.f) {
    const int nb = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
    draw_scan(lpv, V, u[r], sums + r * nb, tok + r, lp + r);
    if (threadIdx.x == 0) tlp[r] = lp[r];
    return;
  }
  if (threadIdx.x != 0) return;
  float bv = -__int_as_float(0x7f800000);
  int bi = V;
  for (int k = 0; k < nc; k++)
    if (cv[r * nc + k] > bv) bv = cv[r * nc + k], bi = ci[r * nc + k];
  if (bi >= V || row[0] != row[0]) bi = 0;
  tok[r] = bi;
  lp[r] = tlp[r] = lpv(bi);
}

// logsoftmax_rows_host is logsoftmax_rows_t over the rows with u[r] < 0
// only (the rows the host samples, beside draw_rows_raw's). grid = rows.
extern "C" __global__ void logsoftmax_rows_host(float* z, const float* __restrict__ temps,
                                                const double* __restrict__ u, int V) {
  if (u[blockIdx.x] >= 0.0) return;
  const float t = temps[blockIdx.x];
  logsoftmax_row(z + (i64)blockIdx.x * V, V, t == 0.f ? 1.f : t);
}
