// Causal grouped-query attention over packed sequences, in float32: each
// query row attends to its own sequence's prefix, one warp per (row,
// head) (the decoding step: per row and group of heads sharing a KV head),
// so a row's output depends on that prefix alone (batch invariant).
// Layouts: q and the output [T, heads*hd], k and v [T, kv*hd], lse
// [T, heads]; seq_start[t] is the packed row where token t's sequence
// begins, seq_end[t] the row after its last. hd is at most ATT_HD_MAX.
// The backward recomputes the probabilities from lse (no T x T matrix).

#define ATT_HD_MAX 256
#define ATT_PER (ATT_HD_MAX / 32)
#define ATT_WARPS 4

// ld reads element i of a key or value row, widened to float32 (the bf16
// KV cache's rows are rounded once when written).
__device__ __forceinline__ float ld(const float* p, int i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16_t* p, int i) { return bf16_to_f32(p[i]); }

// load_key reads this lane's elements (lane + 32e) of a key row and a
// value row, widened to float32 (0 past hd). P elements a lane hold rows
// of up to 32P: ATT_PER, or fewer where the head size is known to be
// smaller (the decoding kernels); an element past hd adds nothing, so a
// row's bits do not depend on P.
template <typename T, int P>
__device__ __forceinline__ void load_key(float (&k)[P], float (&v)[P], const T* kr, const T* vr, int hd, int lane) {
#pragma unroll
  for (int e = 0; e < P; e++) {
    const int d = lane + 32 * e;
    k[e] = d < hd ? ld(kr, d) : 0.f;
    v[e] = d < hd ? ld(vr, d) : 0.f;
  }
}

// load_raw is load_key without the widening: this lane's elements of a
// key and a value row as stored (0 past hd; widen gives load_key's
// values).
template <typename T, int P>
__device__ __forceinline__ void load_raw(T (&k)[P], T (&v)[P], const T* kr, const T* vr, int hd, int lane) {
#pragma unroll
  for (int e = 0; e < P; e++) {
    const int d = lane + 32 * e;
    k[e] = d < hd ? kr[d] : T(0);
    v[e] = d < hd ? vr[d] : T(0);
  }
}

// key_score is a query row's scaled score for one key (its row k as
// load_key gives it), on every lane of the warp.
template <int P>
__device__ __forceinline__ float key_score(const float (&qr)[P], const float (&k)[P], int hd, float scale, int lane) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < P; e++) {
    const int d = lane + 32 * e;
    if (d < hd) s = fmaf(qr[e], k[e], s);
  }
  return warp_sum(s) * scale;
}

// fold_scored folds one key, given its score s (key_score) and its value
// row v, into a query row's online-softmax state.
template <int P>
__device__ __forceinline__ void fold_scored(float (&acc)[P], float& mx, float& l, float s, const float (&v)[P], int hd,
                                            int lane) {
  const float mn = fmaxf(mx, s);
  const float corr = expf(mx - mn), p = expf(s - mn);
  l = l * corr + p;
#pragma unroll
  for (int e = 0; e < P; e++) {
    const int d = lane + 32 * e;
    if (d < hd) acc[e] = fmaf(p, v[e], acc[e] * corr);
  }
  mx = mn;
}

// fold_key folds one key (its row k and value row v, as load_key gives
// them) into a query row's online-softmax state: attend_key's arithmetic.
template <int P>
__device__ __forceinline__ void fold_key(float (&acc)[P], float& mx, float& l, const float (&qr)[P], const float (&k)[P],
                                         const float (&v)[P], int hd, float scale, int lane) {
  fold_scored(acc, mx, l, key_score(qr, k, hd, scale, lane), v, hd, lane);
}

// attend_key folds key j (its key row kr and value row vr) into one query
// row's online-softmax state (acc, mx, l), run by one warp. Every
// attention kernel of the forward (the training engine's tiled one, the
// per-row one, the rollout's decoding step) calls it key by key in the
// same order, so a row gets the same bits from each (on float32 rows; the
// bf16 cache's rows go through the same arithmetic once widened).
template <typename T>
__device__ __forceinline__ void attend_key(float (&acc)[ATT_PER], float& mx, float& l, const float (&qr)[ATT_PER],
                                           const T* kr, const T* vr, int hd, float scale, int lane) {
  float k[ATT_PER], v[ATT_PER];
  load_key(k, v, kr, vr, hd, lane);
  fold_key(acc, mx, l, qr, k, v, hd, scale, lane);
}

// attend_finish writes a row's output acc/l and its log-sum-exp.
template <typename O, int P>
__device__ __forceinline__ void attend_finish(O* __restrict__ out, float* __restrict__ lse, const float (&acc)[P],
                                              float mx, float l, int hd, int lane) {
#pragma unroll
  for (int e = 0; e < P; e++) {
    const int d = lane + 32 * e;
    if (d < hd) put(out + d, acc[e] / l);
  }
  if (lane == 0 && lse) *lse = mx + logf(l);
}

// attend computes one (query row, head) output with the online softmax
// over n keys and values at kb[j*kvstride], vb[j*kvstride], j = 0..n-1
// in order, run by one warp (the per-row kernels).
template <typename T, typename O>
__device__ __forceinline__ void attend(O* __restrict__ out, float* __restrict__ lse,
                                       const float* __restrict__ qrow, const T* __restrict__ kb,
                                       const T* __restrict__ vb, i64 kvstride, int n, int hd,
                                       float scale, int lane) {
  float qr[ATT_PER], acc[ATT_PER];
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    qr[e] = d < hd ? qrow[d] : 0.f;
    acc[e] = 0.f;
  }
  float mx = -__int_as_float(0x7f800000), l = 0.f;
  // The next key's rows are read while this key is folded in: a long
  // context is otherwise one memory latency per key. (The arithmetic is
  // attend_key's, in the same order: the same bits.)
  float kn[ATT_PER], vn[ATT_PER];
  if (n > 0) load_key(kn, vn, kb, vb, hd, lane);
  for (int j = 0; j < n; j++) {
    float k[ATT_PER], v[ATT_PER];
#pragma unroll
    for (int e = 0; e < ATT_PER; e++) k[e] = kn[e], v[e] = vn[e];
    if (j + 1 < n) load_key(kn, vn, kb + (j + 1) * kvstride, vb + (j + 1) * kvstride, hd, lane);
    fold_key(acc, mx, l, qr, k, v, hd, scale, lane);
  }
  attend_finish(out, lse, acc, mx, l, hd, lane);
}

// The tiled forward: a block takes ATT_QT consecutive query rows of one
// head, ATT_TW warps each owning ATT_QT/ATT_TW of them (rows w, w+ATT_TW,
// ...), and walks their keys in tiles of ATT_KT rows staged in shared
// memory, each tile's keys in order: every row still sees its keys in
// order 0..n-1 through attend_key, so its bits are the per-row kernel's,
// with each key and value read from device memory once per block instead
// of once per row.
#define ATT_QT 32
#define ATT_TW 8
#define ATT_RW (ATT_QT / ATT_TW)
#define ATT_KT 16

// attn_fwd_tiled: as attn_fwd. grid = (ceil(T/ATT_QT), heads),
// block = 32*ATT_TW.
extern "C" __global__ void __launch_bounds__(32 * ATT_TW) attn_fwd_tiled(
    float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ q, const float* __restrict__ k,
    const float* __restrict__ v, const int* __restrict__ seq_start, int T, int heads, int kv, int hd, float scale) {
  __shared__ float Ks[ATT_KT][ATT_HD_MAX];
  __shared__ float Vs[ATT_KT][ATT_HD_MAX];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int i0 = blockIdx.x * ATT_QT, h = blockIdx.y;
  const int g = h / (heads / kv);
  const i64 qd = (i64)heads * hd, kvd = (i64)kv * hd;
  const int last = min(T, i0 + ATT_QT) - 1;
  float qr[ATT_RW][ATT_PER], acc[ATT_RW][ATT_PER], mx[ATT_RW], l[ATT_RW];
  int row[ATT_RW], start[ATT_RW];
#pragma unroll
  for (int r = 0; r < ATT_RW; r++) {
    row[r] = i0 + w + ATT_TW * r;
    start[r] = row[r] < T ? seq_start[row[r]] : 0;
    mx[r] = -__int_as_float(0x7f800000);
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < ATT_PER; e++) {
      const int d = lane + 32 * e;
      qr[r][e] = (row[r] < T && d < hd) ? q[row[r] * qd + (i64)h * hd + d] : 0.f;
      acc[r][e] = 0.f;
    }
  }
  // Packed sequences start in order, so the block's first row has the
  // earliest start.
  for (int jt = seq_start[i0]; jt <= last; jt += ATT_KT) {
    const int nk = min(ATT_KT, last + 1 - jt);
    __syncthreads();
    for (int x = threadIdx.x; x < nk * hd; x += blockDim.x) {
      const int jj = x / hd, d = x % hd;
      Ks[jj][d] = k[(i64)(jt + jj) * kvd + (i64)g * hd + d];
      Vs[jj][d] = v[(i64)(jt + jj) * kvd + (i64)g * hd + d];
    }
    __syncthreads();
    for (int jj = 0; jj < nk; jj++) {
      const int j = jt + jj;
#pragma unroll
      for (int r = 0; r < ATT_RW; r++)
        if (row[r] < T && start[r] <= j && j <= row[r]) attend_key(acc[r], mx[r], l[r], qr[r], Ks[jj], Vs[jj], hd, scale, lane);
    }
  }
#pragma unroll
  for (int r = 0; r < ATT_RW; r++)
    if (row[r] < T)
      attend_finish(out + row[r] * qd + (i64)h * hd, lse + (i64)row[r] * heads + h, acc[r], mx[r], l[r], hd, lane);
}

// attn_fwd: out = softmax(q k^T * scale) v over each row's sequence
// prefix; lse = the log-sum-exp of the scaled scores.
// grid = (T, ceil(heads/ATT_WARPS)), block = 32*ATT_WARPS.
extern "C" __global__ void attn_fwd(float* __restrict__ out, float* __restrict__ lse,
                                    const float* __restrict__ q, const float* __restrict__ k,
                                    const float* __restrict__ v, const int* __restrict__ seq_start,
                                    int heads, int kv, int hd, float scale) {
  const int i = blockIdx.x, lane = threadIdx.x & 31;
  const int h = blockIdx.y * ATT_WARPS + (threadIdx.x >> 5);
  if (h >= heads) return;
  const int g = h / (heads / kv);
  const i64 qd = (i64)heads * hd, kvd = (i64)kv * hd;
  const i64 j0 = seq_start[i];
  attend(out + i * qd + (i64)h * hd, lse + (i64)i * heads + h, q + i * qd + (i64)h * hd,
         k + j0 * kvd + (i64)g * hd, v + j0 * kvd + (i64)g * hd, kvd, (int)(i - j0 + 1), hd, scale, lane);
}

// kv_store writes each step row's keys and values into the cache of its
// slot at its position: cache [slots, max_len, kvd]. grid = rows. A row
// whose slot is negative is padding (a graph's rows beyond the step's,
// rollout/cuda) and writes nothing.
extern "C" __global__ void kv_store(float* __restrict__ kc, float* __restrict__ vc,
                                    const float* __restrict__ k, const float* __restrict__ v,
                                    const int* __restrict__ slot, const int* __restrict__ pos,
                                    int max_len, int kvd) {
  const i64 r = blockIdx.x;
  if (slot[r] < 0) return;
  const i64 o = ((i64)slot[r] * max_len + pos[r]) * kvd;
  for (int j = threadIdx.x; j < kvd; j += blockDim.x) {
    kc[o + j] = k[r * kvd + j];
    vc[o + j] = v[r * kvd + j];
  }
}

// score_pair returns, summed over the warp, s = scale * a.x and dp = b.y for
// register rows a, b (element lane+32e) and memory rows x, y: the two dot
// products both attention backward kernels take per (query, key) pair.
__device__ __forceinline__ void score_pair(float& s, float& dp, const float (&a)[ATT_PER],
                                           const float* __restrict__ x, const float (&b)[ATT_PER],
                                           const float* __restrict__ y, int hd, float scale, int lane) {
  s = 0.f;
  dp = 0.f;
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    if (d < hd) {
      s = fmaf(a[e], x[d], s);
      dp = fmaf(b[e], y[d], dp);
    }
  }
  s = warp_sum(s) * scale;
  dp = warp_sum(dp);
}

// attn_bwd_q: for query row i and head h, D = dO.O (saved in dsum for
// attn_bwd_kv) and dq = scale * sum_j P_ij (dO.v_j - D) k_j.
// grid = (T, ceil(heads/ATT_WARPS)), block = 32*ATT_WARPS.
extern "C" __global__ void attn_bwd_q(float* __restrict__ dq, float* __restrict__ dsum,
                                      const float* __restrict__ dout, const float* __restrict__ out,
                                      const float* __restrict__ lse, const float* __restrict__ q,
                                      const float* __restrict__ k, const float* __restrict__ v,
                                      const int* __restrict__ seq_start, int heads, int kv, int hd,
                                      float scale) {
  const int i = blockIdx.x, lane = threadIdx.x & 31;
  const int h = blockIdx.y * ATT_WARPS + (threadIdx.x >> 5);
  if (h >= heads) return;
  const int g = h / (heads / kv);
  const i64 qd = (i64)heads * hd, kvd = (i64)kv * hd, o = i * qd + (i64)h * hd;
  float qr[ATT_PER], dor[ATT_PER], acc[ATT_PER];
  float D = 0.f;
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    qr[e] = d < hd ? q[o + d] : 0.f;
    dor[e] = d < hd ? dout[o + d] : 0.f;
    acc[e] = 0.f;
    if (d < hd) D = fmaf(dor[e], out[o + d], D);
  }
  D = warp_sum(D);
  if (lane == 0) dsum[(i64)i * heads + h] = D;
  const float L = lse[(i64)i * heads + h];
  for (int j = seq_start[i]; j <= i; j++) {
    const float* kr = k + j * kvd + (i64)g * hd;
    const float* vr = v + j * kvd + (i64)g * hd;
    float s, dp;
    score_pair(s, dp, qr, kr, dor, vr, hd, scale, lane);
    const float ds = expf(s - L) * (dp - D) * scale;
#pragma unroll
    for (int e = 0; e < ATT_PER; e++) {
      const int d = lane + 32 * e;
      if (d < hd) acc[e] = fmaf(ds, kr[d], acc[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    if (d < hd) dq[o + d] = acc[e];
  }
}

// attn_bwd_kv: for key row j and kv head g, over the query heads of the
// group and the rows i >= j of the sequence, in order:
// dv_j = sum P_ij dO_i and dk_j = scale * sum P_ij (dO_i.v_j - D_i) q_i.
// grid = (T, ceil(kv/ATT_WARPS)), block = 32*ATT_WARPS.
extern "C" __global__ void attn_bwd_kv(float* __restrict__ dk, float* __restrict__ dv,
                                       const float* __restrict__ dout, const float* __restrict__ lse,
                                       const float* __restrict__ dsum, const float* __restrict__ q,
                                       const float* __restrict__ k, const float* __restrict__ v,
                                       const int* __restrict__ seq_end, int heads, int kv, int hd,
                                       float scale) {
  const int j = blockIdx.x, lane = threadIdx.x & 31;
  const int g = blockIdx.y * ATT_WARPS + (threadIdx.x >> 5);
  if (g >= kv) return;
  const int group = heads / kv;
  const i64 qd = (i64)heads * hd, kvd = (i64)kv * hd, o = j * kvd + (i64)g * hd;
  float kr[ATT_PER], vr[ATT_PER], dka[ATT_PER], dva[ATT_PER];
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    kr[e] = d < hd ? k[o + d] : 0.f;
    vr[e] = d < hd ? v[o + d] : 0.f;
    dka[e] = 0.f;
    dva[e] = 0.f;
  }
  for (int h = g * group; h < (g + 1) * group; h++) {
    for (int i = j; i < seq_end[j]; i++) {
      const float* qr = q + i * qd + (i64)h * hd;
      const float* dor = dout + i * qd + (i64)h * hd;
      float s, dp;  // fmaf is commutative: the same bits as q.k and dO.v
      score_pair(s, dp, kr, qr, vr, dor, hd, scale, lane);
      const float p = expf(s - lse[(i64)i * heads + h]);
      const float ds = p * (dp - dsum[(i64)i * heads + h]) * scale;
#pragma unroll
      for (int e = 0; e < ATT_PER; e++) {
        const int d = lane + 32 * e;
        if (d < hd) {
          dva[e] = fmaf(p, dor[d], dva[e]);
          dka[e] = fmaf(ds, qr[d], dka[e]);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    if (d < hd) {
      dk[o + d] = dka[e];
      dv[o + d] = dva[e];
    }
  }
}

// kv_store_bf16 is kv_store into a bfloat16 cache (the bf16 rollout's):
// keys and values rounded once, to nearest even; v's rows ldv apart (a
// column span of q, k and v's one product). grid = rows.
extern "C" __global__ void kv_store_bf16(bf16_t* __restrict__ kc, bf16_t* __restrict__ vc,
                                         const float* __restrict__ k, const float* __restrict__ v,
                                         const int* __restrict__ slot, const int* __restrict__ pos,
                                         int max_len, int kvd, i64 ldv) {
  const i64 r = blockIdx.x;
  if (slot[r] < 0) return;
  const i64 o = ((i64)slot[r] * max_len + pos[r]) * kvd;
  for (int j = threadIdx.x; j < kvd; j += blockDim.x) {
    kc[o + j] = f32_to_bf16(k[r * kvd + j]);
    vc[o + j] = f32_to_bf16(v[r * ldv + j]);
  }
}

// decode_keys folds keys j0..n-1 of one KV head's cache rows (kb, vb,
// kvd apart) into the online softmaxes of G query heads, in key order.
template <typename T, int G, int P>
__device__ __forceinline__ void decode_keys(float (&acc)[G][P], float (&mx)[G], float (&l)[G], const float (&qr)[G][P],
                                            const T* __restrict__ kb, const T* __restrict__ vb, int j0, int n, i64 kvd,
                                            int hd, float scale, int lane) {
  // The rows of the next D keys are in flight while this key is folded in
  // (a ring of D register sets, key j in set (j - j0) % D), held as loaded
  // (a bf16 cache's unwidened) so that no instruction waits on a load
  // before its key's turn: one key ahead left a warp waiting out most of a
  // memory latency per key, and the cache is most of a step's bytes. The
  // folds are in key order: the same bits as one key at a time.
  constexpr int D = P <= 4 ? 4 : 2;
  T kn[D][P], vn[D][P];
#pragma unroll
  for (int u = 0; u < D; u++)
    if (j0 + u < n) load_raw(kn[u], vn[u], kb + (j0 + u) * kvd, vb + (j0 + u) * kvd, hd, lane);
  for (int j = j0; j < n; j += D) {
    if (j + D <= n) {
      // A whole ring: the D·G scores first, their warp sums independent
      // of each other and of the running state (so their shuffles
      // overlap, where key by key each waited out the last one's), then
      // the folds in key order: the same bits as fold_key key by key.
      float s[D][G], v[D][P];
#pragma unroll
      for (int u = 0; u < D; u++) {
        float k[P];
#pragma unroll
        for (int e = 0; e < P; e++) k[e] = widen(kn[u][e]), v[u][e] = widen(vn[u][e]);
        if (j + u + D < n) load_raw(kn[u], vn[u], kb + (j + u + D) * kvd, vb + (j + u + D) * kvd, hd, lane);
#pragma unroll
        for (int x = 0; x < G; x++) s[u][x] = key_score(qr[x], k, hd, scale, lane);
      }
#pragma unroll
      for (int u = 0; u < D; u++)
#pragma unroll
        for (int x = 0; x < G; x++) fold_scored(acc[x], mx[x], l[x], s[u][x], v[u], hd, lane);
      continue;
    }
#pragma unroll
    for (int u = 0; u < D; u++) {
      if (j + u < n) {
        float k[P], v[P];
#pragma unroll
        for (int e = 0; e < P; e++) k[e] = widen(kn[u][e]), v[e] = widen(vn[u][e]);
        if (j + u + D < n) load_raw(kn[u], vn[u], kb + (j + u + D) * kvd, vb + (j + u + D) * kvd, hd, lane);
#pragma unroll
        for (int x = 0; x < G; x++) fold_key(acc[x], mx[x], l[x], qr[x], k, v, hd, scale, lane);
      }
    }
  }
}

// decode_group is the rollout's attention: step row r attends over
// positions [0, pos[r]] of its slot's cache. Warp w takes the G query
// heads w·G .. w·G+G-1, which share one KV head when G = heads/kv (the
// grouped kernels: each key and value row is read once for the G heads,
// not once per head, and the G online softmaxes are G independent chains
// of work per key), or one head with G = 1. Each head folds its keys in
// order with fold_key, so its bits are attend's (the training forward's)
// whatever G. A padding row (negative slot) gets zeros.
//
// With part, the keys are split into gridDim.z contiguous runs (split
// blockIdx.z takes the z-th of ceil(n/splits) keys) and each head's
// unnormalised sums and its max and sum of exps go to part for
// decode_combine (flash-decoding: a few long rows still fill the GPU); a
// padding row writes nothing there. Not attend's bits: the reduced
// precisions' decoding only.
template <typename T, typename O, int G, int P>
__device__ __forceinline__ void decode_group(O* __restrict__ out, float* __restrict__ part, const float* __restrict__ q,
                                             const T* __restrict__ kc, const T* __restrict__ vc,
                                             const int* __restrict__ slot, const int* __restrict__ pos, int max_len,
                                             int heads, int kv, int hd, float scale) {
  const int r = blockIdx.x, lane = threadIdx.x & 31;
  const int h0 = (blockIdx.y * ATT_WARPS + (threadIdx.x >> 5)) * G;
  if (h0 >= heads) return;
  const int g = G == 1 ? h0 / (heads / kv) : h0 / G;  // G > 1 is heads/kv
  const i64 qd = (i64)heads * hd, kvd = (i64)kv * hd;
  O* o = part ? nullptr : out + r * qd + (i64)h0 * hd;  // no arithmetic on the null out of a split
  if (slot[r] < 0) {
    if (!part)
      for (int d = lane; d < G * hd; d += 32) put(o + d, 0.f);
    return;
  }
  const T* kb = kc + (i64)slot[r] * max_len * kvd + (i64)g * hd;
  const T* vb = vc + (i64)slot[r] * max_len * kvd + (i64)g * hd;
  const float* qrow = q + r * qd + (i64)h0 * hd;
  float qr[G][P], acc[G][P], mx[G], l[G];
#pragma unroll
  for (int x = 0; x < G; x++) {
#pragma unroll
    for (int e = 0; e < P; e++) {
      const int d = lane + 32 * e;
      qr[x][e] = d < hd ? qrow[x * hd + d] : 0.f;
      acc[x][e] = 0.f;
    }
    mx[x] = -__int_as_float(0x7f800000);
    l[x] = 0.f;
  }
  const int n = pos[r] + 1;
  if (!part) {
    decode_keys<T, G, P>(acc, mx, l, qr, kb, vb, 0, n, kvd, hd, scale, lane);
#pragma unroll
    for (int x = 0; x < G; x++) attend_finish(o + x * hd, (float*)0, acc[x], mx[x], l[x], hd, lane);
    return;
  }
  const int S = gridDim.z, len = (n + S - 1) / S, j0 = min(n, (int)blockIdx.z * len);
  decode_keys<T, G, P>(acc, mx, l, qr, kb, vb, j0, min(n, j0 + len), kvd, hd, scale, lane);
#pragma unroll
  for (int x = 0; x < G; x++) {
    float* pp = part + (((i64)r * heads + h0 + x) * S + blockIdx.z) * (hd + 2);
#pragma unroll
    for (int e = 0; e < P; e++) {
      const int d = lane + 32 * e;
      if (d < hd) pp[d] = acc[x][e];
    }
    if (lane == 0) pp[hd] = mx[x], pp[hd + 1] = l[x];
  }
}

// decode_combine merges the splits of attn_decode_bf16_split_*: for step
// row r and head h, out = sum_s e^(mx_s - m)·acc_s / sum_s e^(mx_s - m)·l_s
// over the splits that had keys (l_s > 0), m their largest max; a padding
// row gets zeros. A warp per head. grid = (rows, ceil(heads/ATT_WARPS)),
// block = 32*ATT_WARPS.
template <typename O>
__device__ __forceinline__ void decode_combine_body(O* __restrict__ out, const float* __restrict__ part,
                                                    const int* __restrict__ slot, int heads, int hd, int S) {
  const int r = blockIdx.x, lane = threadIdx.x & 31, h = blockIdx.y * ATT_WARPS + (threadIdx.x >> 5);
  if (h >= heads) return;
  O* o = out + ((i64)r * heads + h) * hd;
  if (slot[r] < 0) {
    for (int d = lane; d < hd; d += 32) put(o + d, 0.f);
    return;
  }
  const float* p = part + ((i64)r * heads + h) * S * (hd + 2);
  float m = -__int_as_float(0x7f800000);
  for (int s = 0; s < S; s++)
    if (p[s * (hd + 2) + hd + 1] > 0.f) m = fmaxf(m, p[s * (hd + 2) + hd]);
  float L = 0.f;
  for (int s = 0; s < S; s++) {
    const float ls = p[s * (hd + 2) + hd + 1];
    if (ls > 0.f) L += ls * expf(p[s * (hd + 2) + hd] - m);
  }
  for (int d = lane; d < hd; d += 32) {
    float a = 0.f;
    for (int s = 0; s < S; s++) {
      const float* ps = p + s * (hd + 2);
      if (ps[hd + 1] > 0.f) a += ps[d] * expf(ps[hd] - m);
    }
    put(o + d, a / L);
  }
}
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) decode_combine(float* __restrict__ out, const float* __restrict__ part,
                                                                        const int* __restrict__ slot, int heads, int hd, int S) {
  decode_combine_body(out, part, slot, heads, hd, S);
}
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) decode_combine_out16(bf16_t* __restrict__ out, const float* __restrict__ part,
                                                                              const int* __restrict__ slot, int heads, int hd, int S) {
  decode_combine_body(out, part, slot, heads, hd, S);
}

// The decoding kernels, for G of 1 (a warp per query head, any group) and
// of the groups 2, 4 and 8 (heads/kv), each for head sizes up to 128 (_s,
// 4 elements a lane) and up to ATT_HD_MAX: attn_decode_g<G>[_s] over a
// float32 cache (the exact rollout's), attn_decode_bf16_g<G>[_s] over a
// bf16 cache, attn_decode_bf16_out16_g<G>[_s] with its output rounded to
// bf16 (the output projection's operand). grid = (rows,
// ceil(heads/G/ATT_WARPS)), block = 32*ATT_WARPS. (The names are written
// out: keel's CUDA emulator finds kernels by name.)
#define DECODE_PARAMS(O, T)                                                                                  \
  O *__restrict__ out, const float *__restrict__ q, const T *__restrict__ kc, const T *__restrict__ vc,      \
      const int *__restrict__ slot, const int *__restrict__ pos, int max_len, int heads, int kv, int hd,     \
      float scale
#define DECODE_BODY(T, O, G, P) decode_group<T, O, G, P>(out, (float*)0, q, kc, vc, slot, pos, max_len, heads, kv, hd, scale);
// attn_decode_bf16_split_g<G>[_s]: the bf16 cache's decoding, keys split
// over gridDim.z (grid = (rows, ceil(heads/G/ATT_WARPS), splits)), into
// part [rows, heads, splits, hd+2] for decode_combine.
#define SPLIT_PARAMS                                                                                          \
  float *__restrict__ part, const float *__restrict__ q, const bf16_t *__restrict__ kc,                      \
      const bf16_t *__restrict__ vc, const int *__restrict__ slot, const int *__restrict__ pos, int max_len, \
      int heads, int kv, int hd, float scale
#define SPLIT_BODY(G, P) decode_group<bf16_t, float, G, P>((float*)0, part, q, kc, vc, slot, pos, max_len, heads, kv, hd, scale);
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g1(SPLIT_PARAMS) { SPLIT_BODY(1, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g2(SPLIT_PARAMS) { SPLIT_BODY(2, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g4(SPLIT_PARAMS) { SPLIT_BODY(4, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g8(SPLIT_PARAMS) { SPLIT_BODY(8, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g1_s(SPLIT_PARAMS) { SPLIT_BODY(1, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g2_s(SPLIT_PARAMS) { SPLIT_BODY(2, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g4_s(SPLIT_PARAMS) { SPLIT_BODY(4, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_split_g8_s(SPLIT_PARAMS) { SPLIT_BODY(8, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g1(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 1, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g2(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 2, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g4(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 4, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g8(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 8, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g1(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 1, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g2(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 2, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g4(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 4, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g8(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 8, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g1(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 1, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g2(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 2, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g4(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 4, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g8(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 8, ATT_PER) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g1_s(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 1, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g2_s(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 2, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g4_s(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 4, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_g8_s(DECODE_PARAMS(float, float)) { DECODE_BODY(float, float, 8, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g1_s(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 1, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g2_s(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 2, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g4_s(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 4, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_g8_s(DECODE_PARAMS(float, bf16_t)) { DECODE_BODY(bf16_t, float, 8, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g1_s(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 1, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g2_s(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 2, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g4_s(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 4, 4) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_bf16_out16_g8_s(DECODE_PARAMS(bf16_t, bf16_t)) { DECODE_BODY(bf16_t, bf16_t, 8, 4) }

// The reduced precisions' fast decoding attention over the bf16 cache
// (Ops.DecodeFast, the default): decode_group's warp per step
// row and KV head for its G query heads, for head sizes 32, 64 and 128
// known at compile time, with a third of its instructions a key.
// decode_group (attend_key's arithmetic, bit for bit the training
// forward's over a float32 cache) reads each lane's elements 32 apart, two
// bytes a load, and sums each key's score over the warp on its own, five
// shuffles and five additions a head; about 245 instructions a key at G = 2 (sm_90,
// `tools/sass -loops`), which at two warps a scheduler cap its reads near
// 2 TB/s (session 20's H200 profile: 1.5). Here a lane holds HD/32
// adjacent elements (one 8-byte load a row at 128), keys go four at a
// time, and their four partial scores are summed over the warp together
// (each step of the butterfly halves the values a lane holds until each
// lane has one key's score: 6 shuffles for 4 keys, not 20), the online
// softmax's maximum moves once per four keys, and the exponentials are
// the hardware's approximate ones (__expf). Within float32 rounding of
// decode_group, not its bits: the reduced precisions' decoding owes the
// training engine no bits. The next four keys' rows are in flight while
// these are folded. With part, as decode_group's splits.
#define FAST_KEYS 4

// fast_exp is e^x, the hardware's approximation on a GPU.
__device__ __forceinline__ float fast_exp(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  return expf(x);
#endif
}

// FAST_WORDS is the 32-bit words holding a lane's HD/32 adjacent bf16
// elements of a row (at HD = 32, one element in the low half of one).
#define FAST_WORDS(HD) ((HD) >= 64 ? (HD) / 64 : 1)

// fast_row reads this lane's HD/32 adjacent bf16 elements of a cache row.
template <int HD>
__device__ __forceinline__ void fast_row(u32 (&w)[FAST_WORDS(HD)], const bf16_t* row, int lane) {
  if constexpr (HD == 128) {
    const u32x2 v = *(const u32x2*)(row + 4 * lane);
    w[0] = v.x, w[1] = v.y;
  } else if constexpr (HD == 64) {
    w[0] = *(const u32*)(row + 2 * lane);
  } else {
    w[0] = row[lane];
  }
}

// fast_widen widens fast_row's words into the lane's HD/32 floats (each
// word's low half first).
template <int HD>
__device__ __forceinline__ void fast_widen(float (&f)[HD / 32], const u32 (&w)[FAST_WORDS(HD)]) {
#pragma unroll
  for (int i = 0; i < FAST_WORDS(HD); i++) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    if constexpr (HD >= 64) f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <typename O, int G, int HD, int DEPTH>
__device__ __forceinline__ void decode_fast(O* __restrict__ out, float* __restrict__ part, const float* __restrict__ q,
                                            const bf16_t* __restrict__ kc, const bf16_t* __restrict__ vc,
                                            const int* __restrict__ slot, const int* __restrict__ pos, int max_len,
                                            int heads, int kv, float scale) {
  constexpr int E = HD / 32, W = FAST_WORDS(HD), U = FAST_KEYS;
  const int r = blockIdx.x, lane = threadIdx.x & 31;
  const int h0 = (blockIdx.y * ATT_WARPS + (threadIdx.x >> 5)) * G;
  if (h0 >= heads) return;
  const int g = G == 1 ? h0 / (heads / kv) : h0 / G;  // G > 1 is heads/kv
  const i64 qd = (i64)heads * HD, kvd = (i64)kv * HD;
  O* o = part ? nullptr : out + r * qd + (i64)h0 * HD + E * lane;
  if (slot[r] < 0) {
    if (!part)
#pragma unroll
      for (int x = 0; x < G; x++)
#pragma unroll
        for (int e = 0; e < E; e++) put(o + x * HD + e, 0.f);
    return;
  }
  const bf16_t* kb = kc + (i64)slot[r] * max_len * kvd + (i64)g * HD;
  const bf16_t* vb = vc + (i64)slot[r] * max_len * kvd + (i64)g * HD;
  float qr[G][E], acc[G][E], mx[G], l[G];
#pragma unroll
  for (int x = 0; x < G; x++) {
#pragma unroll
    for (int e = 0; e < E; e++) {
      qr[x][e] = q[r * qd + (i64)(h0 + x) * HD + E * lane + e] * scale;
      acc[x][e] = 0.f;
    }
    mx[x] = -__int_as_float(0x7f800000);
    l[x] = 0.f;
  }
  const int n = pos[r] + 1;
  int j0 = 0, j1 = n;
  if (part) {
    const int S = gridDim.z, len = (n + S - 1) / S;
    j0 = min(n, (int)blockIdx.z * len), j1 = min(n, j0 + len);
  }
  // This lane's score of its group's key after the butterfly: lanes
  // 8u..8u+7 hold key u's.
  const int own = (lane >> 3) & 3;
  const bool hi16 = lane & 16, hi8 = lane & 8;
  // The next DEPTH·U keys' rows, as loaded (zeros past j1): buffer d
  // holds keys j + d·U.. of the fold at j, and is loaded again, DEPTH·U
  // keys on, as soon as it is widened.
  u32 kw[DEPTH][U][W], vw[DEPTH][U][W];
  auto load = [&](int d, int j) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (j + u < j1) {
        fast_row<HD>(kw[d][u], kb + (i64)(j + u) * kvd, lane);
        fast_row<HD>(vw[d][u], vb + (i64)(j + u) * kvd, lane);
      } else {
#pragma unroll
        for (int i = 0; i < W; i++) kw[d][u][i] = vw[d][u][i] = 0u;
      }
    }
  };
#pragma unroll
  for (int d = 0; d < DEPTH; d++)
    if (j0 + d * U < j1) load(d, j0 + d * U);
  for (int jd = j0; jd < j1; jd += DEPTH * U) {
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
      const int j = jd + d * U;
      if (j >= j1) break;
      float kf[U][E], vf[U][E];
#pragma unroll
      for (int u = 0; u < U; u++) fast_widen<HD>(kf[u], kw[d][u]), fast_widen<HD>(vf[u], vw[d][u]);
      if (j + DEPTH * U < j1) load(d, j + DEPTH * U);
#pragma unroll
      for (int x = 0; x < G; x++) {
        float s[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
          s[u] = 0.f;
#pragma unroll
          for (int e = 0; e < E; e++) s[u] = fmaf(qr[x][e], kf[u][e], s[u]);
        }
        // The four sums over the warp at once: lanes exchange the half of
        // their values the partner keeps (keys 0, 1 below lane 16, 2, 3
        // from it), then the quarter, then sum one value over 8 lanes.
        float a0 = hi16 ? s[2] : s[0], a1 = hi16 ? s[3] : s[1];
        a0 += __shfl_xor_sync(0xffffffffu, hi16 ? s[0] : s[2], 16);
        a1 += __shfl_xor_sync(0xffffffffu, hi16 ? s[1] : s[3], 16);
        float sc = hi8 ? a1 : a0;
        sc += __shfl_xor_sync(0xffffffffu, hi8 ? a0 : a1, 8);
        sc += __shfl_xor_sync(0xffffffffu, sc, 4);
        sc += __shfl_xor_sync(0xffffffffu, sc, 2);
        sc += __shfl_xor_sync(0xffffffffu, sc, 1);
        if (j + own >= j1) sc = -__int_as_float(0x7f800000);  // past the run: no weight
        float cm = fmaxf(sc, __shfl_xor_sync(0xffffffffu, sc, 8));
        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
        const float mn = fmaxf(mx[x], cm);  // finite: the run's first key is in the first four
        const float corr = fast_exp(mx[x] - mn), p = fast_exp(sc - mn);
        float ps = p + __shfl_xor_sync(0xffffffffu, p, 8);
        ps += __shfl_xor_sync(0xffffffffu, ps, 16);
        l[x] = l[x] * corr + ps;
        mx[x] = mn;
        float pu[U];
#pragma unroll
        for (int u = 0; u < U; u++) pu[u] = __shfl_sync(0xffffffffu, p, 8 * u);
#pragma unroll
        for (int e = 0; e < E; e++) {
          float a = acc[x][e] * corr;
#pragma unroll
          for (int u = 0; u < U; u++) a = fmaf(pu[u], vf[u][e], a);
          acc[x][e] = a;
        }
      }
    }
  }
  if (!part) {
#pragma unroll
    for (int x = 0; x < G; x++)
#pragma unroll
      for (int e = 0; e < E; e++) put(o + x * HD + e, acc[x][e] / l[x]);
    return;
  }
#pragma unroll
  for (int x = 0; x < G; x++) {
    float* pp = part + (((i64)r * heads + h0 + x) * gridDim.z + blockIdx.z) * (HD + 2);
#pragma unroll
    for (int e = 0; e < E; e++) pp[E * lane + e] = acc[x][e];
    if (lane == 0) pp[HD] = mx[x], pp[HD + 1] = l[x];
  }
}

// attn_decode_fast[_out16|_split]_g<G>_<HD> (HD 32, 64, 128; no G = 8 at
// 32, where ptxas spills): decode_fast's kernels, as
// attn_decode_bf16[_out16|_split]_g<G>'s (the same grids and arguments,
// hd = HD; the names written out for the emulator).
#define FAST_BODY(O, G, HD) \
  decode_fast<O, G, HD, 1>(out, (float*)0, q, kc, vc, slot, pos, max_len, heads, kv, scale);
#define FAST_SPLIT_BODY(G, HD) \
  decode_fast<float, G, HD, 1>((float*)0, part, q, kc, vc, slot, pos, max_len, heads, kv, scale);
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g1_64(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 1, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g1_64(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 1, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g1_64(SPLIT_PARAMS) { FAST_SPLIT_BODY(1, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g2_64(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 2, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g2_64(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 2, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g2_64(SPLIT_PARAMS) { FAST_SPLIT_BODY(2, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g4_64(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 4, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g4_64(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 4, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g4_64(SPLIT_PARAMS) { FAST_SPLIT_BODY(4, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g8_64(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 8, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g8_64(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 8, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g8_64(SPLIT_PARAMS) { FAST_SPLIT_BODY(8, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g1_128(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 1, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g1_128(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 1, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g1_128(SPLIT_PARAMS) { FAST_SPLIT_BODY(1, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g2_128(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 2, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g2_128(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 2, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g2_128(SPLIT_PARAMS) { FAST_SPLIT_BODY(2, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g4_128(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 4, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g4_128(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 4, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g4_128(SPLIT_PARAMS) { FAST_SPLIT_BODY(4, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g8_128(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 8, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g8_128(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 8, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g8_128(SPLIT_PARAMS) { FAST_SPLIT_BODY(8, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g1_32(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 1, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g1_32(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 1, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g1_32(SPLIT_PARAMS) { FAST_SPLIT_BODY(1, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g2_32(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 2, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g2_32(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 2, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g2_32(SPLIT_PARAMS) { FAST_SPLIT_BODY(2, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_g4_32(DECODE_PARAMS(float, bf16_t)) { FAST_BODY(float, 4, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_out16_g4_32(DECODE_PARAMS(bf16_t, bf16_t)) { FAST_BODY(bf16_t, 4, 32) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_fast_split_g4_32(SPLIT_PARAMS) { FAST_SPLIT_BODY(4, 32) }

// attn_decode_deep[_out16|_split]_g<G>_<HD> (HD 64 and 128;
// Ops.DecodeDeep, KEEL_DECODE_ATTN=deep): decode_fast with eight keys'
// rows in flight a warp where the fast kernels have four (two buffers of
// four, each loaded again as soon as it is widened), for the long
// contexts where the cache is most of a step's reads and one fold's
// instructions may not cover a load's latency (about 16 warps a
// multiprocessor at 256 sequences of 8 KV heads, 2 KiB in flight
// each). The same arithmetic in the same order: the fast kernels'
// bits. Untimed: off until a card says which is faster.
#define DEEP_BODY(O, G, HD) \
  decode_fast<O, G, HD, 2>(out, (float*)0, q, kc, vc, slot, pos, max_len, heads, kv, scale);
#define DEEP_SPLIT_BODY(G, HD) \
  decode_fast<float, G, HD, 2>((float*)0, part, q, kc, vc, slot, pos, max_len, heads, kv, scale);
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g1_64(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 1, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g1_64(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 1, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g1_64(SPLIT_PARAMS) { DEEP_SPLIT_BODY(1, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g2_64(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 2, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g2_64(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 2, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g2_64(SPLIT_PARAMS) { DEEP_SPLIT_BODY(2, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g4_64(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 4, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g4_64(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 4, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g4_64(SPLIT_PARAMS) { DEEP_SPLIT_BODY(4, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g8_64(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 8, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g8_64(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 8, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g8_64(SPLIT_PARAMS) { DEEP_SPLIT_BODY(8, 64) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g1_128(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 1, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g1_128(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 1, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g1_128(SPLIT_PARAMS) { DEEP_SPLIT_BODY(1, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g2_128(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 2, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g2_128(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 2, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g2_128(SPLIT_PARAMS) { DEEP_SPLIT_BODY(2, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g4_128(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 4, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g4_128(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 4, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g4_128(SPLIT_PARAMS) { DEEP_SPLIT_BODY(4, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_g8_128(DECODE_PARAMS(float, bf16_t)) { DEEP_BODY(float, 8, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_out16_g8_128(DECODE_PARAMS(bf16_t, bf16_t)) { DEEP_BODY(bf16_t, 8, 128) }
extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS) attn_decode_deep_split_g8_128(SPLIT_PARAMS) { DEEP_SPLIT_BODY(8, 128) }
