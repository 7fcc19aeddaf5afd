// The optimiser's kernels: AdamW, element by element in the order of the
// CPU kernel (kernels.AdamW), with the same float32 operations, each
// correctly rounded (fused multiply-adds, IEEE sqrt and division: keel
// never compiles with fast math), so a GPU step gives the CPU's bits; and
// the sum of squares of the global gradient norm in a fixed order.

// adamw_elem updates parameter i in place:
//   g' = g*gscale; p' = p*decay; m = fma(g', omb1, m*b1);
//   v = fma(g'^2, omb2, v*b2); p = fma(-m/fma(sqrt(v), isbc2, eps), step, p')
// and returns the new p.
__device__ __forceinline__ float adamw_elem(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                            float* __restrict__ v, i64 i, float gscale, float decay, float b1,
                                            float omb1, float b2, float omb2, float step, float isbc2, float eps) {
  const float gi = g[i] * gscale;
  const float pi = p[i] * decay;
  const float mi = fmaf(gi, omb1, m[i] * b1);
  const float gg = gi * gi;
  const float vi = fmaf(gg, omb2, v[i] * b2);
  const float dn = fmaf(sqrtf(vi), isbc2, eps);
  const float q = mi / dn;
  const float pn = fmaf(-q, step, pi);
  p[i] = pn;
  m[i] = mi;
  v[i] = vi;
  return pn;
}

// adamw updates n parameters in place (adamw_elem).
extern "C" __global__ void adamw(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, i64 n, float gscale, float decay, float b1,
                                 float omb1, float b2, float omb2, float step, float isbc2, float eps) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    adamw_elem(p, g, m, v, i, gscale, decay, b1, omb1, b2, omb2, step, isbc2, eps);
}

// adamw_bf16 is adamw that also writes each new parameter rounded to bf16
// into w16: the bf16 training mode's copy of the weights, made in the
// optimiser's pass instead of one of its own.
extern "C" __global__ void adamw_bf16(float* __restrict__ p, bf16_t* __restrict__ w16, const float* __restrict__ g,
                                      float* __restrict__ m, float* __restrict__ v, i64 n, float gscale, float decay,
                                      float b1, float omb1, float b2, float omb2, float step, float isbc2, float eps) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    w16[i] = f32_to_bf16(adamw_elem(p, g, m, v, i, gscale, decay, b1, omb1, b2, omb2, step, isbc2, eps));
}

// sumsq_blocks: part[b] = sum of g[i]^2 in float64 over the block's
// NORM_BLOCK elements. grid = ceil(n/NORM_BLOCK), block = KEEL_THREADS.
#define NORM_BLOCK 8192
extern "C" __global__ void sumsq_blocks(double* __restrict__ part, const float* __restrict__ g, i64 n) {
  __shared__ double sd[32];
  const i64 lo = (i64)blockIdx.x * NORM_BLOCK;
  const i64 hi = min(n, lo + NORM_BLOCK);
  double s = 0.0;
  for (i64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const double v = g[i];
    s += v * v;
  }
  s = block_sum_f64(s, sd);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// sum_f64: out[0] = sum of the nb parts, by one block in a fixed order.
extern "C" __global__ void sum_f64(double* __restrict__ out, const double* __restrict__ parts, int nb) {
  __shared__ double sd[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) s += parts[i];
  s = block_sum_f64(s, sd);
  if (threadIdx.x == 0) out[0] = s;
}
