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
// exp(v - m) and sum t of exp(v - m)·(v - m); both sums rescale when the
// maximum grows. A NaN leaves m alone and makes s NaN, as it would the
// two-pass sums; -inf (an impossible token) adds nothing.
__device__ __forceinline__ void stats_add(float& m, double& s, double& t, float v) {
  if (v == -__int_as_float(0x7f800000)) return;
  if (v > m) {
    if (s != 0.0) {
      const double dm = (double)m - (double)v, c = exp(dm);
      t = c * (t + dm * s);
      s *= c;
    }
    m = v;
  }
  const float d = v - m;
  const double e = (double)expf(d);
  s += e;
  t += e * (double)d;
}

// stats_merge folds another thread's (m2, s2, t2) into (m, s, t).
__device__ __forceinline__ void stats_merge(float& m, double& s, double& t, float m2, double s2, double t2) {
  if (s2 == 0.0) return;  // nothing folded there (an empty share of the row)
  if (s == 0.0) {
    m = m2, s = s2, t = t2;
    return;
  }
  const float mm = fmaxf(m, m2);
  const double d1 = (double)m - (double)mm, d2 = (double)m2 - (double)mm;
  const double c1 = exp(d1), c2 = exp(d2);
  t = c1 * (t + d1 * s) + c2 * (t2 + d2 * s2);
  s = c1 * s + c2 * s2;
  m = mm;
}

// block_stats merges every thread's (m, s, t) over the block (a multiple
// of 32 threads) and gives every thread the result, the same bits on
// each: a fixed butterfly in each warp, then the warps' in order.
__device__ void block_stats(float& m, double& s, double& t) {
  __shared__ float sm[32];
  __shared__ double ss[32], st[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const double s2 = __shfl_xor_sync(0xffffffffu, s, o), t2 = __shfl_xor_sync(0xffffffffu, t, o);
    stats_merge(m, s, t, m2, s2, t2);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = m, ss[threadIdx.x >> 5] = s, st[threadIdx.x >> 5] = t;
  __syncthreads();
  m = sm[0], s = ss[0], t = st[0];
  for (int k = 1; k < (int)(blockDim.x >> 5); k++) stats_merge(m, s, t, sm[k], ss[k], st[k]);
}

// row_stats folds the values at(0..V) of a row, four loads in flight a
// thread, and merges them over the block.
template <class F>
__device__ __forceinline__ void row_stats(F at, int V, float& m, double& s, double& t) {
  m = -__int_as_float(0x7f800000);
  s = 0.0, t = 0.0;
  const int n = blockDim.x;
  int j = threadIdx.x;
  for (; j + 3 * n < V; j += 4 * n) {
    const float v0 = at(j), v1 = at(j + n), v2 = at(j + 2 * n), v3 = at(j + 3 * n);
    stats_add(m, s, t, v0);
    stats_add(m, s, t, v1);
    stats_add(m, s, t, v2);
    stats_add(m, s, t, v3);
  }
  for (; j < V; j += n) stats_add(m, s, t, at(j));
  block_stats(m, s, t);
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
  row_stats(at, V, m, s, t);
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
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float v = temp != 1.f ? row[j] / temp : row[j];
    d[j] = f32_to_bf16(logit_grad(v - l, cl, ch, ent, j == tgt, temp));
  }
}

// DRAW_BLOCK is the span of tokens whose probabilities draw_rows sums as
// one partial sum (as the host's sampler does, rollout.DrawRow), and
// DRAW_MAX_BLOCKS bounds the vocabulary a row may have (524,288 tokens).
#define DRAW_BLOCK 512
#define DRAW_MAX_BLOCKS 1024

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
    double s = 0.0;
    for (int j = b * DRAW_BLOCK + l; j < hi; j += 32) s += (double)expf(lpv(j));
    s = warp_sum_f64(s);
    if (l == 0) sums[b] = s;
  }
  __syncthreads();
  if (w != 0) return;
  // Warp 0: every lane finds the block where the draw lands (the same
  // bits on each), the lanes take the exps of its tokens into shared
  // memory together, then lane 0 adds them in token order: the scan's
  // sums are the one-by-one scan's, without a global load's latency per
  // token.
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

// draw_rows draws the token of every output row r with u[r] >= 0 from its
// log-probabilities z[r] (tempered and normalised, logsoftmax_rows_t) by
// rollout.DrawRow's rule, writing it to tok[r] and z at it to lp[r]:
// at temperature 0 the most probable token, the lowest id among equals;
// otherwise inverse CDF in token order, the first token at which the
// running float64 sum of exp(z) exceeds u[r] times the row's total, a
// token of probability 0 never drawn. The sums of exp over each
// DRAW_BLOCK tokens are taken by one warp each, then warp 0 finds the
// block where the draw lands and its lane 0 scans that block's tokens one
// by one (their exps staged in shared memory by the warp): the same
// draws as the host's sampler except where u falls within a few ulps of a
// boundary between two tokens. Rows with u[r] < 0 are left alone (the host
// samples them). grid = rows, block = KEEL_THREADS.
extern "C" __global__ void draw_rows(int* __restrict__ tok, float* __restrict__ lp, const float* __restrict__ z,
                                     const double* __restrict__ u, const float* __restrict__ temps, int V) {
  const i64 r = blockIdx.x;
  const double ur = u[r];
  if (ur < 0.0) return;
  const float* row = z + r * V;
  draw_row([&](int j) { return row[j]; }, V, ur, temps[r] == 0.f, tok + r, lp + r);
}

// draw_rows_raw is draw_rows over the log-softmax of the logits z at each
// row's temperature (0 meaning 1) without writing it: a first pass takes
// the row's log-sum-exp l online (head_stats_bf16's sums), the draw's
// pass reads each log-prob as z/temp - l. Two reads of the row where
// logsoftmax_rows_t then draw_rows make four and a write. l is not
// logsoftmax_row's bits, so the exact rollout, whose log-probs must be
// the training engine's, keeps those two. grid = rows.
extern "C" __global__ void draw_rows_raw(int* __restrict__ tok, float* __restrict__ lp, const float* __restrict__ z,
                                         const double* __restrict__ u, const float* __restrict__ temps, int V) {
  const i64 r = blockIdx.x;
  const double ur = u[r];
  if (ur < 0.0) return;
  const float* row = z + r * V;
  const float tr = temps[r], tp = tr == 0.f ? 1.f : tr;
  auto at = [&](int j) { return tp != 1.f ? row[j] / tp : row[j]; };
  float m;
  double s, t;
  row_stats(at, V, m, s, t);
  const float l = (float)((double)m + log(s));
  draw_row([&](int j) { return at(j) - l; }, V, ur, tr == 0.f, tok + r, lp + r);
}

// logsoftmax_rows_host is logsoftmax_rows_t over the rows with u[r] < 0
// only (the rows the host samples, beside draw_rows_raw's). grid = rows.
extern "C" __global__ void logsoftmax_rows_host(float* z, const float* __restrict__ temps,
                                                const double* __restrict__ u, int V) {
  if (u[blockIdx.x] >= 0.0) return;
  const float t = temps[blockIdx.x];
  logsoftmax_row(z + (i64)blockIdx.x * V, V, t == 0.f ? 1.f : t);
}
