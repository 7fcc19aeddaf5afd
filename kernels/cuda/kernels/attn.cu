// Causal grouped-query attention over packed sequences, in float32: each
// query row attends to its own sequence's prefix, one warp per (row,
// head), so a row's output depends on that prefix alone (batch invariant).
// Layouts: q and the output [T, heads*hd], k and v [T, kv*hd], lse
// [T, heads]; seq_start[t] is the packed row where token t's sequence
// begins, seq_end[t] the row after its last. hd is at most ATT_HD_MAX.
// The backward recomputes the probabilities from lse (no T x T matrix).

#define ATT_HD_MAX 256
#define ATT_PER (ATT_HD_MAX / 32)
#define ATT_WARPS 4

// attn_fwd: out = softmax(q k^T * scale) v with an online softmax over the
// keys in order; lse = the log-sum-exp of the scaled scores.
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
  float qr[ATT_PER], acc[ATT_PER];
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    qr[e] = d < hd ? q[i * qd + (i64)h * hd + d] : 0.f;
    acc[e] = 0.f;
  }
  float mx = -__int_as_float(0x7f800000), l = 0.f;
  for (int j = seq_start[i]; j <= i; j++) {
    const float* kr = k + j * kvd + (i64)g * hd;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < ATT_PER; e++) {
      const int d = lane + 32 * e;
      if (d < hd) s = fmaf(qr[e], kr[d], s);
    }
    s = warp_sum(s) * scale;
    const float mn = fmaxf(mx, s);
    const float corr = expf(mx - mn), p = expf(s - mn);
    l = l * corr + p;
    const float* vr = v + j * kvd + (i64)g * hd;
#pragma unroll
    for (int e = 0; e < ATT_PER; e++) {
      const int d = lane + 32 * e;
      if (d < hd) acc[e] = fmaf(p, vr[d], acc[e] * corr);
    }
    mx = mn;
  }
#pragma unroll
  for (int e = 0; e < ATT_PER; e++) {
    const int d = lane + 32 * e;
    if (d < hd) out[i * qd + (i64)h * hd + d] = acc[e] / l;
  }
  if (lane == 0) lse[(i64)i * heads + h] = mx + logf(l);
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
    float s = 0.f, dp = 0.f;
#pragma unroll
    for (int e = 0; e < ATT_PER; e++) {
      const int d = lane + 32 * e;
      if (d < hd) {
        s = fmaf(qr[e], kr[d], s);
        dp = fmaf(dor[e], vr[d], dp);
      }
    }
    s = warp_sum(s) * scale;
    dp = warp_sum(dp);
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
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int e = 0; e < ATT_PER; e++) {
        const int d = lane + 32 * e;
        if (d < hd) {
          s = fmaf(qr[d], kr[e], s);
          dp = fmaf(dor[d], vr[e], dp);
        }
      }
      s = warp_sum(s) * scale;
      dp = warp_sum(dp);
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
