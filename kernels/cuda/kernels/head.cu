// The LM head's row kernels in float32: log-softmax at a temperature, the
// entropy, the log-prob of each row's target, and the backward of a loss
// sum_t coef_lp[t]*log p(target_t) + coef_h[t]*H_t with respect to the
// logits. One block of KEEL_THREADS per row.

// logsoftmax_row: row = row/temp (skipped at temp 1, element by element
// as the rollout engine divides), then row -= logsumexp(row), in place, by
// one block; returns the log-sum-exp. The training forward and the
// rollout's step both use it.
__device__ float logsoftmax_row(float* row, int V, float temp) {
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
  for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] -= l;
  return l;
}

// logsoftmax_rows: each row's log-softmax at temperature temp; lse[r]
// gets the log-sum-exp when lse is not null. grid = rows.
extern "C" __global__ void logsoftmax_rows(float* z, float* lse, int V, float temp) {
  const float l = logsoftmax_row(z + (i64)blockIdx.x * V, V, temp);
  if (threadIdx.x == 0 && lse) lse[blockIdx.x] = l;
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
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float zv = z[j], p = expf(zv);
    float v = ch == 0.f ? p * -cl : -cl * p - ch * p * (zv + ent);
    if (j == tgt) v += cl;
    if (temp != 1.f) v = v / temp;
    d[j] = v;
  }
}
