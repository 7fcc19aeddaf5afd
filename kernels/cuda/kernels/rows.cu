// Row kernels of the training engine, in float32: RMSNorm and its
// backward, SwiGLU and its backward, the per-head RMSNorm + RoPE of q and
// k, RoPE's transpose, and the residual add. One block of KEEL_THREADS
// threads owns a row (or a chunk of rows), so a row's bits do not depend
// on the batch around it.

// rmsnorm_row normalises one row at offset o: y = x * inv * w with inv =
// 1/sqrt(mean(x^2) + eps), returned; y float32 or bf16 (put).
template <typename O>
__device__ __forceinline__ float rmsnorm_row(O* __restrict__ y, const float* __restrict__ x,
                                             const float* __restrict__ w, i64 o, int n, float eps, float* s) {
  float ss = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = x[o + j];
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, s);
  const float iv = (float)(1.0 / sqrt((double)(ss / (float)n + eps)));
  for (int j = threadIdx.x; j < n; j += blockDim.x) put(y + o + j, x[o + j] * iv * w[j]);
  return iv;
}

// rmsnorm_fwd: y = x * inv * w with inv = 1/sqrt(mean(x^2) + eps), saved
// per row for the backward. grid = rows, block = KEEL_THREADS.
extern "C" __global__ void rmsnorm_fwd(float* __restrict__ y, float* __restrict__ inv,
                                       const float* __restrict__ x, const float* __restrict__ w,
                                       int n, int per, i64 stride, float eps) {
  __shared__ float s[32];
  const i64 r = blockIdx.x;
  const float iv = rmsnorm_row(y, x, w, row_offset(r, n, per, stride), n, eps, s);
  if (threadIdx.x == 0 && inv) inv[r] = iv;
}

// rmsnorm_fwd_bf16 is rmsnorm_fwd (the same arithmetic; inv saved where
// not null) with y rounded to bf16, contiguous [rows, n]: the operand of
// the products that read it, made in the same pass (the bf16 rollout's
// fused step, and the bf16 training mode, which keeps it for the weight
// gradients). grid = rows, block = KEEL_THREADS.
extern "C" __global__ void rmsnorm_fwd_bf16(bf16_t* __restrict__ y, float* __restrict__ inv,
                                            const float* __restrict__ x, const float* __restrict__ w, int n,
                                            float eps) {
  __shared__ float s[32];
  const float iv = rmsnorm_row(y, x, w, (i64)blockIdx.x * n, n, eps, s);
  if (threadIdx.x == 0 && inv) inv[blockIdx.x] = iv;
}

// rmsnorm_warp_row is rmsnorm_row for a row of n <= 32·PER elements by
// one warp, bit for bit: lane l plays rmsnorm_row's threads l, 32 + l,
// ..., 224 + l of its block of KEEL_THREADS (virtual warp v is threads
// 32v..32v+31), each virtual thread's fmaf chain over its elements j =
// thread + KEEL_THREADS·i in order, each virtual warp's warp_sum, then
// block_sum's second warp_sum over the virtual warps' sums. Every load is
// issued before the first sum (PER floats a lane in flight, the row held
// in registers for the output), where rmsnorm_row's block issues four a
// thread and waits out two barriers a row: session 24's H200 profile had
// rmsnorm_fwd_bf16 at 1.5 TB/s over 16,384 rows of 1,024.
template <typename O, int PER>
__device__ __forceinline__ float rmsnorm_warp_row(O* __restrict__ y, const float* __restrict__ x,
                                                  const float* __restrict__ w, i64 o, int n, float eps) {
  constexpr int V = KEEL_THREADS / 32, I = PER / V;
  static_assert(PER % V == 0, "PER: whole elements a virtual thread");
  const int l = threadIdx.x & 31;
  float xv[V][I];
#pragma unroll
  for (int v = 0; v < V; v++)
#pragma unroll
    for (int i = 0; i < I; i++) {
      const int j = 32 * v + l + KEEL_THREADS * i;
      xv[v][i] = j < n ? x[o + j] : 0.f;
    }
  float own = 0.f;  // block_sum's s[l]: virtual warp l's sum, lanes 0..V-1
#pragma unroll
  for (int v = 0; v < V; v++) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < I; i++)
      if (32 * v + l + KEEL_THREADS * i < n) ss = fmaf(xv[v][i], xv[v][i], ss);
    ss = warp_sum(ss);
    if (l == v) own = ss;
  }
  const float ss = warp_sum(own);
  const float iv = (float)(1.0 / sqrt((double)(ss / (float)n + eps)));
#pragma unroll
  for (int v = 0; v < V; v++)
#pragma unroll
    for (int i = 0; i < I; i++) {
      const int j = 32 * v + l + KEEL_THREADS * i;
      if (j < n) put(y + o + j, xv[v][i] * iv * w[j]);
    }
  return iv;
}

// rmsnorm_fwd_w<PER> and rmsnorm_fwd_bf16_w<PER> are rmsnorm_fwd and
// rmsnorm_fwd_bf16 (the same arguments, plus rows) a warp per row
// (rmsnorm_warp_row: the same bits), for rows of at most 32·PER: 8 rows a
// block, grid = ceil(rows/8), block = KEEL_THREADS (Ops.RMSNorm,
// Ops.RMSNormBF16; KEEL_ROW_KERNELS=block keeps the block a row). The
// names written out for the emulator.
template <typename O, int PER>
__device__ __forceinline__ void rmsnorm_warp_rows(O* __restrict__ y, float* __restrict__ inv,
                                                  const float* __restrict__ x, const float* __restrict__ w, int n,
                                                  int per, i64 stride, float eps, int rows) {
  const i64 r = (i64)blockIdx.x * (KEEL_THREADS / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const float iv = rmsnorm_warp_row<O, PER>(y, x, w, row_offset(r, n, per, stride), n, eps);
  if ((threadIdx.x & 31) == 0 && inv) inv[r] = iv;
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_fwd_w8(float* __restrict__ y, float* __restrict__ inv,
                                                                       const float* __restrict__ x,
                                                                       const float* __restrict__ w, int n, int per,
                                                                       i64 stride, float eps, int rows) {
  rmsnorm_warp_rows<float, 8>(y, inv, x, w, n, per, stride, eps, rows);
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_fwd_bf16_w8(bf16_t* __restrict__ y, float* __restrict__ inv,
                                                                            const float* __restrict__ x,
                                                                            const float* __restrict__ w, int n, float eps,
                                                                            int rows) {
  rmsnorm_warp_rows<bf16_t, 8>(y, inv, x, w, n, 1, n, eps, rows);
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_fwd_w32(float* __restrict__ y, float* __restrict__ inv,
                                                                       const float* __restrict__ x,
                                                                       const float* __restrict__ w, int n, int per,
                                                                       i64 stride, float eps, int rows) {
  rmsnorm_warp_rows<float, 32>(y, inv, x, w, n, per, stride, eps, rows);
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_fwd_bf16_w32(bf16_t* __restrict__ y, float* __restrict__ inv,
                                                                            const float* __restrict__ x,
                                                                            const float* __restrict__ w, int n, float eps,
                                                                            int rows) {
  rmsnorm_warp_rows<bf16_t, 32>(y, inv, x, w, n, 1, n, eps, rows);
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_fwd_w64(float* __restrict__ y, float* __restrict__ inv,
                                                                       const float* __restrict__ x,
                                                                       const float* __restrict__ w, int n, int per,
                                                                       i64 stride, float eps, int rows) {
  rmsnorm_warp_rows<float, 64>(y, inv, x, w, n, per, stride, eps, rows);
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_fwd_bf16_w64(bf16_t* __restrict__ y, float* __restrict__ inv,
                                                                            const float* __restrict__ x,
                                                                            const float* __restrict__ w, int n, float eps,
                                                                            int rows) {
  rmsnorm_warp_rows<bf16_t, 64>(y, inv, x, w, n, 1, n, eps, rows);
}

// rmsnorm_bwd: for each row, dx = inv*(dy*w) - x*inv^3*mean(dy*w*x)
// (written, or added when acc), and the weight gradient dy*x*inv summed
// over the rows of each chunk of NORM_CHUNK into dw_part[chunk*n ...] in
// row order (sum_chunks adds the chunks). dx may alias dy when acc is 0.
// rmsnorm_bwd_dx16 also writes dx rounded to bf16 into dx16 (laid out as
// dx): the bf16 mode's gradient operand of the product that reads it
// next, made in this pass. grid = ceil(rows/NORM_CHUNK), block =
// KEEL_THREADS. Chunks of 8 rows (kernels/cuda.NormChunk): at 32 an
// H200 ran 256 blocks for 8,192 rows, a quarter of the card's threads,
// at 1 TB/s.
#define NORM_CHUNK 8
__device__ void rmsnorm_bwd_rows(float* dx, bf16_t* __restrict__ dx16, float* __restrict__ dw_part, const float* dy,
                                 const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ inv, int rows, int n, int per, i64 stride, int acc) {
  __shared__ double s[32];
  const int c = blockIdx.x;
  float* part = dw_part + (i64)c * n;
  const int r1 = min(rows, (c + 1) * NORM_CHUNK);
  for (int r = c * NORM_CHUNK; r < r1; r++) {
    const i64 o = row_offset(r, n, per, stride);
    double d = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
      d += (double)dy[o + j] * (double)w[j] * (double)x[o + j];
    d = block_sum_f64(d, s);
    const double iv = inv[r];
    const float k = (float)(iv * iv * iv * d / (double)n);
    const float ivf = inv[r];
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float g = dy[o + j], xv = x[o + j];
      const float v = ivf * (g * w[j]) - xv * k;
      const float pw = g * (xv * ivf);
      part[j] = r == c * NORM_CHUNK ? pw : part[j] + pw;
      const float out = acc ? dx[o + j] + v : v;
      dx[o + j] = out;
      if (dx16) dx16[o + j] = f32_to_bf16(out);
    }
  }
}
extern "C" __global__ void rmsnorm_bwd(float* dx, float* __restrict__ dw_part, const float* dy,
                                       const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ inv, int rows, int n, int per,
                                       i64 stride, int acc) {
  rmsnorm_bwd_rows(dx, nullptr, dw_part, dy, x, w, inv, rows, n, per, stride, acc);
}
extern "C" __global__ void rmsnorm_bwd_dx16(float* dx, bf16_t* __restrict__ dx16, float* __restrict__ dw_part,
                                            const float* dy, const float* __restrict__ x,
                                            const float* __restrict__ w, const float* __restrict__ inv, int rows,
                                            int n, int per, i64 stride, int acc) {
  rmsnorm_bwd_rows(dx, dx16, dw_part, dy, x, w, inv, rows, n, per, stride, acc);
}

// rmsnorm_bwd_chunk is rmsnorm_bwd_rows for rows of n <= 32·PER by one
// warp a chunk of NORM_CHUNK rows, bit for bit: lane l plays the block's
// threads l, 32 + l, ..., 224 + l (rmsnorm_warp_row's virtual warps), so
// each row's double sum is block_sum_f64's, every element's arithmetic
// is the block's, and each column's weight-gradient partial adds the
// chunk's rows in order, in shared memory (each lane its own columns;
// written out once, where the block kernel reads and writes global memory
// back every row). A row's dy and x are all loaded before its sum:
// session 24's H200 profile had rmsnorm_bwd_dx16 at about 1.9 TB/s over
// 16,384 rows of 1,024. (At PER = 64 ptxas spills.)
#define NORM_CWARPS 4  // the warps (chunks) of a block of rmsnorm_bwd_chunk
// NORM_CMIN is its blocks a multiprocessor for ptxas: 4 (119 registers at
// sm_90) spills at sm_80, where 3 does not.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define NORM_CMIN 3
#else
#define NORM_CMIN 4
#endif
template <int PER>
__device__ __forceinline__ void rmsnorm_bwd_chunk(float* dx, bf16_t* __restrict__ dx16, float* __restrict__ dw_part,
                                                  const float* dy, const float* __restrict__ x,
                                                  const float* __restrict__ w, const float* __restrict__ inv, int rows,
                                                  int n, int per, i64 stride, int acc) {
  constexpr int V = KEEL_THREADS / 32, I = PER / V;
  static_assert(PER % V == 0, "PER: whole elements a virtual thread");
  const int c = blockIdx.x * NORM_CWARPS + (threadIdx.x >> 5), l = threadIdx.x & 31;
  const int r0 = c * NORM_CHUNK, r1 = min(rows, r0 + NORM_CHUNK);
  if (r0 >= rows) return;
  __shared__ float pws[NORM_CWARPS][32 * PER];  // each warp's partials: lane l's columns only
  float* pw = pws[threadIdx.x >> 5];
  for (int r = r0; r < r1; r++) {
    const i64 o = row_offset(r, n, per, stride);
    float g[V][I], xv[V][I];
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
      for (int i = 0; i < I; i++) {
        const int j = 32 * v + l + KEEL_THREADS * i;
        const bool in = j < n;
        g[v][i] = in ? dy[o + j] : 0.f;
        xv[v][i] = in ? x[o + j] : 0.f;
      }
    double own = 0.0;  // block_sum_f64's s[l]: virtual warp l's sum
#pragma unroll
    for (int v = 0; v < V; v++) {
      double d = 0.0;
#pragma unroll
      for (int i = 0; i < I; i++)
        if (32 * v + l + KEEL_THREADS * i < n) d += (double)g[v][i] * (double)w[32 * v + l + KEEL_THREADS * i] * (double)xv[v][i];
      d = warp_sum_f64(d);
      if (l == v) own = d;
    }
    const double d = warp_sum_f64(own);
    const double iv = inv[r];
    const float k = (float)(iv * iv * iv * d / (double)n);
    const float ivf = inv[r];
#pragma unroll
    for (int v = 0; v < V; v++)
#pragma unroll
      for (int i = 0; i < I; i++) {
        const int j = 32 * v + l + KEEL_THREADS * i;
        if (j >= n) continue;
        const float gj = g[v][i], xj = xv[v][i];
        const float val = ivf * (gj * w[j]) - xj * k;
        const float p = gj * (xj * ivf);
        pw[j] = r == r0 ? p : pw[j] + p;
        const float out = acc ? dx[o + j] + val : val;
        dx[o + j] = out;
        if (dx16) dx16[o + j] = f32_to_bf16(out);
      }
  }
  float* part = dw_part + (i64)c * n;
#pragma unroll
  for (int v = 0; v < V; v++)
#pragma unroll
    for (int i = 0; i < I; i++) {
      const int j = 32 * v + l + KEEL_THREADS * i;
      if (j < n) part[j] = pw[j];
    }
}

// rmsnorm_bwd_c32 and rmsnorm_bwd_dx16_c32 are rmsnorm_bwd and
// rmsnorm_bwd_dx16 (the same arguments, the same chunks of partial sums)
// a warp a chunk (rmsnorm_bwd_chunk: the same bits), for rows of at most
// 1,024: grid = ceil(ceil(rows/NORM_CHUNK)/4), block = 128
// (kernels/cuda.Ops.NormBackKernel; KEEL_ROW_KERNELS=block keeps the
// block kernels). The names written out for the emulator.
extern "C" __global__ void __launch_bounds__(32 * NORM_CWARPS, NORM_CMIN) rmsnorm_bwd_c32(float* dx, float* __restrict__ dw_part, const float* dy,
                                                                        const float* __restrict__ x, const float* __restrict__ w,
                                                                        const float* __restrict__ inv, int rows, int n, int per,
                                                                        i64 stride, int acc) {
  rmsnorm_bwd_chunk<32>(dx, nullptr, dw_part, dy, x, w, inv, rows, n, per, stride, acc);
}
extern "C" __global__ void __launch_bounds__(32 * NORM_CWARPS, NORM_CMIN) rmsnorm_bwd_dx16_c32(float* dx, bf16_t* __restrict__ dx16,
                                                                             float* __restrict__ dw_part, const float* dy,
                                                                             const float* __restrict__ x, const float* __restrict__ w,
                                                                             const float* __restrict__ inv, int rows, int n,
                                                                             int per, i64 stride, int acc) {
  rmsnorm_bwd_chunk<32>(dx, dx16, dw_part, dy, x, w, inv, rows, n, per, stride, acc);
}

// rmsnorm_bwd_warp is rmsnorm_bwd for rows of at most NORM_WMAX elements
// (q_norm's and k_norm's head rows): a warp per row, each warp 32
// consecutive rows in order and a block 8 warps, so a row's sum is a
// warp's shuffles instead of the block's barriers, and a block's 256
// threads all work where rmsnorm_bwd's left most idle and waited out two
// barriers a row. dx is rmsnorm_bwd's arithmetic per element (mean(dy*w*x)
// summed in double, in a warp's order); the weight gradient's partial sum
// per chunk of NORM_WCHUNK rows adds each warp's rows in order, then the
// warps in order (sum_chunks adds the chunks). dx may alias dy when acc is
// 0. grid = ceil(rows/NORM_WCHUNK), block = KEEL_THREADS.
#define NORM_WMAX 256
#define NORM_WCHUNK 256
// norm_row_back is one row's RMSNorm backward by a warp, rmsnorm_bwd's
// arithmetic: from g (the lane's elements lane + 32i of the gradient at
// the norm's output), the row's input x (float32, or bf16 as a product
// wrote it: widened), the weight w and the row's inverse RMS, it writes
// dx (float32, or rounded to bf16; plus addend's element where addend is
// given, which may be dx), and where dx16 is given its bf16 rounding too,
// and adds the lane's g·x·inv into pw. n <= NORM_WMAX. norm_row_back_at
// takes the lane's elements of x through xat(i) (element lane + 32i,
// widened), norm_row_back from the row itself.
template <typename O, class XF>
__device__ __forceinline__ void norm_row_back_at(O* dx, const float* addend, const float (&g)[NORM_WMAX / 32], XF xat,
                                                 const float* __restrict__ w, float invr, int n,
                                                 float (&pw)[NORM_WMAX / 32], bf16_t* dx16) {
  const int lane = threadIdx.x & 31;
  double d = 0.0;
#pragma unroll
  for (int i = 0; i < NORM_WMAX / 32; i++) {
    const int j = lane + 32 * i;
    if (j < n) d += (double)g[i] * (double)w[j] * (double)xat(i);
  }
  d = warp_sum_f64(d);
  const double iv = invr;
  const float k = (float)(iv * iv * iv * d / (double)n);
  const float ivf = invr;
#pragma unroll
  for (int i = 0; i < NORM_WMAX / 32; i++) {
    const int j = lane + 32 * i;
    if (j < n) {
      const float xv = xat(i);
      const float v = ivf * (g[i] * w[j]) - xv * k;
      pw[i] += g[i] * (xv * ivf);
      const float out = addend ? addend[j] + v : v;
      put(dx + j, out);
      if (dx16) dx16[j] = f32_to_bf16(out);
    }
  }
}
template <typename O, typename X>
__device__ __forceinline__ void norm_row_back(O* dx, const float* addend, const float (&g)[NORM_WMAX / 32],
                                              const X* __restrict__ x, const float* __restrict__ w, float invr,
                                              int n, float (&pw)[NORM_WMAX / 32], bf16_t* dx16 = nullptr) {
  const int lane = threadIdx.x & 31;
  norm_row_back_at(dx, addend, g, [&](int i) { return widen(x[lane + 32 * i]); }, w, invr, n, pw, dx16);
}

// norm_warp_partials writes the block's partial sums of the weight
// gradient for chunk c: each warp's pw (its rows' sums, lane + 32i) in
// shared memory, then the warps' added in order.
__device__ void norm_warp_partials(float* __restrict__ dw_part, const float (&pw)[NORM_WMAX / 32], int n, int c) {
  __shared__ float ps[KEEL_THREADS / 32][NORM_WMAX];
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < NORM_WMAX / 32; i++)
    if (lane + 32 * i < n) ps[wp][lane + 32 * i] = pw[i];
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float v = ps[0][j];
    for (int q = 1; q < KEEL_THREADS / 32; q++) v += ps[q][j];
    dw_part[(i64)c * n + j] = v;
  }
}

__device__ void rmsnorm_bwd_warp_rows(float* dx, bf16_t* __restrict__ dx16, float* __restrict__ dw_part, const float* dy,
                                      const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ inv, int rows, int n, int per, i64 stride, int acc) {
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, c = blockIdx.x;
  float pw[NORM_WMAX / 32];
#pragma unroll
  for (int i = 0; i < NORM_WMAX / 32; i++) pw[i] = 0.f;
  const int r0 = c * NORM_WCHUNK + wp * 32, r1 = min(rows, r0 + 32);
  for (int r = r0; r < r1; r++) {  // warp-uniform
    const i64 o = row_offset(r, n, per, stride);
    float g[NORM_WMAX / 32];
#pragma unroll
    for (int i = 0; i < NORM_WMAX / 32; i++) g[i] = lane + 32 * i < n ? dy[o + lane + 32 * i] : 0.f;
    norm_row_back(dx + o, acc ? dx + o : nullptr, g, x + o, w, inv[r], n, pw, dx16 ? dx16 + o : nullptr);
  }
  norm_warp_partials(dw_part, pw, n, c);
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_bwd_warp(float* dx, float* __restrict__ dw_part, const float* dy,
                                                                       const float* __restrict__ x,
                                                                       const float* __restrict__ w,
                                                                       const float* __restrict__ inv, int rows, int n,
                                                                       int per, i64 stride, int acc) {
  rmsnorm_bwd_warp_rows(dx, nullptr, dw_part, dy, x, w, inv, rows, n, per, stride, acc);
}
// rmsnorm_bwd_warp_dx16 is rmsnorm_bwd_warp writing dx's bf16 rounding into
// dx16 too (rmsnorm_bwd_dx16).
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) rmsnorm_bwd_warp_dx16(float* dx, bf16_t* __restrict__ dx16,
                                                                            float* __restrict__ dw_part, const float* dy,
                                                                            const float* __restrict__ x,
                                                                            const float* __restrict__ w,
                                                                            const float* __restrict__ inv, int rows,
                                                                            int n, int per, i64 stride, int acc) {
  rmsnorm_bwd_warp_rows(dx, dx16, dw_part, dy, x, w, inv, rows, n, per, stride, acc);
}

// norm_rope_bwd_bf16 is the bf16 mode's backward of q's (or k's) norm
// and RoPE, into the products' bf16 operand: per head row r (token r/per),
// the gradient dy at RoPE's output taken back through RoPE (rope_rows with
// the negated sines sinv, the same expressions), then through the head's
// RMSNorm as rmsnorm_bwd_warp takes it (the same sums in the same order),
// rounded to bf16 into dx16 (laid out as x: row_offset with ldx; dy's
// rows are stride apart), with the weight
// gradient's partial sums per NORM_WCHUNK rows as rmsnorm_bwd_warp writes
// them. So the bits of rope_rows, rmsnorm_bwd_warp (acc 0) and the
// rounding, in one pass that reads dy and x once and writes bf16, where
// the three read and wrote float32 five times. x, the norm's input, is
// float32 or (norm_rope_bwd_bf16_x16) the bf16 q or k its product wrote,
// widened. n <= NORM_WMAX, even. grid = ceil(rows/NORM_WCHUNK), block =
// KEEL_THREADS.
template <typename X>
__device__ void norm_rope_bwd_rows(bf16_t* __restrict__ dx16, float* __restrict__ dw_part, const float* __restrict__ dy,
                                   const X* __restrict__ x, const float* __restrict__ w, const float* __restrict__ inv,
                                   const float* __restrict__ cosv, const float* __restrict__ sinv,
                                   const int* __restrict__ pos, int rows, int n, int per, i64 stride, i64 ldx) {
  __shared__ float row[KEEL_THREADS / 32][NORM_WMAX];
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, c = blockIdx.x, half = n / 2;
  float pw[NORM_WMAX / 32];
#pragma unroll
  for (int i = 0; i < NORM_WMAX / 32; i++) pw[i] = 0.f;
  const int r0 = c * NORM_WCHUNK + wp * 32, r1 = min(rows, r0 + 32);
  // The next row's dy, x and position, loaded while this row is taken back
  // (session 24's H200 profile: norm_rope_bwd_bf16_x16 at about 1.5 TB/s,
  // each row's loads waiting on the last's sums).
  float dn[NORM_WMAX / 32], xn[NORM_WMAX / 32];
  int pn = 0;
  auto fetch = [&](int r) {
    const i64 o = row_offset(r, n, per, stride), ox = row_offset(r, n, per, ldx);
#pragma unroll
    for (int i = 0; i < NORM_WMAX / 32; i++) {
      const bool in = lane + 32 * i < n;
      dn[i] = in ? dy[o + lane + 32 * i] : 0.f;
      xn[i] = in ? widen(x[ox + lane + 32 * i]) : 0.f;
    }
    pn = pos[r / per];
  };
  if (r0 < r1) fetch(r0);
  for (int r = r0; r < r1; r++) {  // warp-uniform
    const i64 ox = row_offset(r, n, per, ldx);
    const float* cs = cosv + (i64)pn * half;
    const float* sn = sinv + (i64)pn * half;
    float xc[NORM_WMAX / 32];
#pragma unroll
    for (int i = 0; i < NORM_WMAX / 32; i++) xc[i] = xn[i];
    __syncwarp();  // the last row's reads of row[wp] are done
#pragma unroll
    for (int i = 0; i < NORM_WMAX / 32; i++)
      if (lane + 32 * i < n) row[wp][lane + 32 * i] = dn[i];
    __syncwarp();
    if (r + 1 < r1) fetch(r + 1);
    float g[NORM_WMAX / 32];
#pragma unroll
    for (int i = 0; i < NORM_WMAX / 32; i++) {
      const int j = lane + 32 * i;
      g[i] = 0.f;
      if (j < n) {
        // rope_rows: x[i] = a·cos - b·sin, x[i+half] = b·cos + a·sin.
        if (j < half) {
          const float a = row[wp][j], b = row[wp][j + half];
          g[i] = a * cs[j] - b * sn[j];
        } else {
          const int k = j - half;
          const float a = row[wp][k], b = row[wp][j];
          g[i] = b * cs[k] + a * sn[k];
        }
      }
    }
    norm_row_back_at(dx16 + ox, nullptr, g, [&](int i) { return xc[i]; }, w, inv[r], n, pw, nullptr);
  }
  norm_warp_partials(dw_part, pw, n, c);
}

extern "C" __global__ void __launch_bounds__(KEEL_THREADS) norm_rope_bwd_bf16(bf16_t* __restrict__ dx16, float* __restrict__ dw_part,
                                                                         const float* __restrict__ dy,
                                                                         const float* __restrict__ x,
                                                                         const float* __restrict__ w,
                                                                         const float* __restrict__ inv,
                                                                         const float* __restrict__ cosv,
                                                                         const float* __restrict__ sinv,
                                                                         const int* __restrict__ pos, int rows, int n,
                                                                         int per, i64 stride, i64 ldx) {
  norm_rope_bwd_rows(dx16, dw_part, dy, x, w, inv, cosv, sinv, pos, rows, n, per, stride, ldx);
}
extern "C" __global__ void __launch_bounds__(KEEL_THREADS) norm_rope_bwd_bf16_x16(bf16_t* __restrict__ dx16, float* __restrict__ dw_part,
                                                                             const float* __restrict__ dy,
                                                                             const bf16_t* __restrict__ x,
                                                                             const float* __restrict__ w,
                                                                             const float* __restrict__ inv,
                                                                             const float* __restrict__ cosv,
                                                                             const float* __restrict__ sinv,
                                                                             const int* __restrict__ pos, int rows, int n,
                                                                             int per, i64 stride, i64 ldx) {
  norm_rope_bwd_rows(dx16, dw_part, dy, x, w, inv, cosv, sinv, pos, rows, n, per, stride, ldx);
}

// sum_chunks: out[j] (+)= sum over c of parts[c*n + j]. A block takes 32
// columns; each of its 8 warps sums an eighth of the chunks in order, and
// the eighths are added in order (a fixed order for a given number of
// chunks): one thread adding every chunk in turn had made the norms'
// weight gradients wait on thousands of dependent loads at long batches.
// A warp loads 16 chunks' values before adding them in order (the same
// sums): with 32 columns a block, a 1024-wide norm runs 32 blocks, two
// warps a multiprocessor, and the compiler's 4 loads in flight a warp held
// session 24's H200 to about 250 GB/s (32 µs a call, 113 calls a step of
// the Qwen3-0.6B shape at 8 × 2048). grid = ceil(n/32)
// (kernels/cuda.SumChunksGrid), block = KEEL_THREADS.
#define SUM_CHUNKS_LOADS 16
extern "C" __global__ void sum_chunks(float* __restrict__ out, const float* __restrict__ parts,
                                      int chunks, int n, int acc) {
  __shared__ float s[KEEL_THREADS / 32][32];
  constexpr int W = KEEL_THREADS / 32;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, j = blockIdx.x * 32 + lane;
  const int per = (chunks + W - 1) / W, c0 = w * per, c1 = min(chunks, c0 + per);
  float v = 0.f;
  if (j < n) {
    int c = c0;
    for (; c + SUM_CHUNKS_LOADS <= c1; c += SUM_CHUNKS_LOADS) {
      float x[SUM_CHUNKS_LOADS];
#pragma unroll
      for (int u = 0; u < SUM_CHUNKS_LOADS; u++) x[u] = parts[(i64)(c + u) * n + j];
#pragma unroll
      for (int u = 0; u < SUM_CHUNKS_LOADS; u++) v += x[u];
    }
    for (; c < c1; c++) v += parts[(i64)c * n + j];
  }
  s[w][lane] = v;
  __syncthreads();
  if (w == 0 && j < n) {
    float t = acc ? out[j] : 0.f;
    for (int k = 0; k < W; k++) t += s[k][lane];
    out[j] = t;
  }
}

// widen2 reads elements p[0] and p[1] (4- or 8-byte aligned) in one
// load; put2 stores two, as put would.
struct alignas(8) f32x2 {
  float x, y;
};
__device__ __forceinline__ void widen2(const float* p, float& a, float& b) {
  const f32x2 v = *(const f32x2*)p;
  a = v.x, b = v.y;
}
__device__ __forceinline__ void widen2(const bf16_t* p, float& a, float& b) {
  const u32 v = *(const u32*)p;
  a = bf_lo(v), b = bf_hi(v);
}
__device__ __forceinline__ void put2(float* p, float a, float b) { *(f32x2*)p = f32x2{a, b}; }
__device__ __forceinline__ void put2(bf16_t* p, float a, float b) { *(u32*)p = pack_bf16(a, b); }

// RowChunks walks a grid-stride loop over chunks of blockDim.x column
// units (pairs, or the octets of swiglu_octets) of each row (cpr a row),
// row by row: the row and chunk of each
// step follow from the last by adds, where the flat index's division by
// the row length cost dozens of instructions an element.
struct RowChunks {
  i64 r;
  int c, cpr, dc;
  i64 dr;
  __device__ __forceinline__ RowChunks(int pairs) {
    cpr = max(1, (pairs + (int)blockDim.x - 1) / (int)blockDim.x);
    r = blockIdx.x / cpr, c = blockIdx.x % cpr;
    dr = gridDim.x / cpr, dc = gridDim.x % cpr;
  }
  __device__ __forceinline__ void next() {
    r += dr, c += dc;
    if (c >= cpr) c -= cpr, r++;
  }
};

// swiglu_octets says whether SwiGLU's kernels over a bf16 gu of rows of
// 2n take eight elements a thread (one 16-byte load of gate and one of
// up, from gu 16-byte aligned with n a multiple of 8) where they take two:
// each element's arithmetic is the same, so the same bits, with four
// times the bytes in flight a thread (session 24's H200 profile had
// swiglu_fwd_bf16_gu16 at 2.5 TB/s, its backward at 2.9).
template <typename I>
__device__ __forceinline__ bool swiglu_octets(const I* gu, int n) {
  return n % 8 == 0 && ((unsigned long long)gu & 15) == 0;
}

// words4 is a 16-byte load's four words.
__device__ __forceinline__ void words4(u32 (&w)[4], const void* p) {
  const u32x4 v = *(const u32x4*)p;
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}

// swiglu_octet_rows is swiglu_rows eight elements a thread
// (swiglu_octets).
template <typename O>
__device__ __forceinline__ void swiglu_octet_rows(O* __restrict__ a, const bf16_t* __restrict__ gu, i64 rows, int n) {
  for (RowChunks w(n / 8); w.r < rows; w.next()) {
    const int j = 8 * (w.c * blockDim.x + threadIdx.x);
    if (j >= n) continue;
    const bf16_t* g = gu + w.r * 2 * n;
    O* y = a + w.r * n;
    u32 gw[4], uw[4];
    words4(gw, g + j);
    words4(uw, g + n + j);
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const float g0 = bf_lo(gw[q]), g1 = bf_hi(gw[q]), u0 = bf_lo(uw[q]), u1 = bf_hi(uw[q]);
      put2(y + j + 2 * q, g0 / (1.f + expf(-g0)) * u0, g1 / (1.f + expf(-g1)) * u1);
    }
  }
}

// swiglu_bwd_octet_rows is swiglu_bwd_rows eight elements a thread
// (swiglu_octets, da 16-byte aligned).
template <typename O>
__device__ __forceinline__ void swiglu_bwd_octet_rows(O* __restrict__ dgu, const float* __restrict__ da,
                                                      const bf16_t* __restrict__ gu, i64 rows, int n) {
  for (RowChunks w(n / 8); w.r < rows; w.next()) {
    const int j = 8 * (w.c * blockDim.x + threadIdx.x);
    if (j >= n) continue;
    const bf16_t* g = gu + w.r * 2 * n;
    const float* d = da + w.r * n;
    O* out = dgu + w.r * 2 * n;
    u32 gw[4], uw[4];
    words4(gw, g + j);
    words4(uw, g + n + j);
    const u32x4 d0 = *(const u32x4*)(d + j), d1 = *(const u32x4*)(d + j + 4);
    const u32 dw[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
      float dg[2], du[2];
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float gv = e ? bf_hi(gw[q]) : bf_lo(gw[q]), u = e ? bf_hi(uw[q]) : bf_lo(uw[q]);
        const float dv = __uint_as_float(dw[2 * q + e]);
        const float sg = 1.f / (1.f + expf(-gv));
        const float silu = gv * sg;
        dg[e] = dv * u * (sg * (1.f + gv * (1.f - sg)));
        du[e] = dv * silu;
      }
      put2(out + j + 2 * q, dg[0], dg[1]);
      put2(out + n + j + 2 * q, du[0], du[1]);
    }
  }
}

// swiglu_rows: a = silu(g) * u, where each row of gu (float32, or bf16 as
// a product wrote it) holds the gate and up projections side by side
// ([rows, 2n]) and a is [rows, n], float32 or bf16 (put). Elements in
// pairs (one load of two) where n is even, so that every pair is aligned;
// from a bf16 gu eight at a time where swiglu_octets says.
template <typename O, typename I>
__device__ __forceinline__ void swiglu_rows(O* __restrict__ a, const I* __restrict__ gu, i64 rows, int n) {
  if constexpr (sizeof(I) == 2) {
    if (swiglu_octets(gu, n)) return swiglu_octet_rows(a, gu, rows, n);
  }
  const bool pairs = (n & 1) == 0;
  for (RowChunks w(pairs ? n / 2 : n); w.r < rows; w.next()) {
    const I* g = gu + w.r * 2 * n;
    O* y = a + w.r * n;
    const int j = w.c * blockDim.x + threadIdx.x;
    if (pairs) {
      if (2 * j >= n) continue;
      float g0, g1, u0, u1;
      widen2(g + 2 * j, g0, g1);
      widen2(g + n + 2 * j, u0, u1);
      put2(y + 2 * j, g0 / (1.f + expf(-g0)) * u0, g1 / (1.f + expf(-g1)) * u1);
    } else if (j < n) {
      const float gv = widen(g[j]), u = widen(g[n + j]);
      put(y + j, gv / (1.f + expf(-gv)) * u);
    }
  }
}

// swiglu_fwd: swiglu_rows in float32.
extern "C" __global__ void swiglu_fwd(float* __restrict__ a, const float* __restrict__ gu, i64 rows, int n) {
  swiglu_rows(a, gu, rows, n);
}

// swiglu_fwd_bf16 is swiglu_fwd with a rounded to bf16 (the down
// projection's operand).
extern "C" __global__ void swiglu_fwd_bf16(bf16_t* __restrict__ a, const float* __restrict__ gu, i64 rows, int n) {
  swiglu_rows(a, gu, rows, n);
}

// swiglu_fwd_bf16_gu16 is swiglu_fwd_bf16 from gu in bf16 (the gate and up
// product's bf16 output in the bf16 training mode).
extern "C" __global__ void swiglu_fwd_bf16_gu16(bf16_t* __restrict__ a, const bf16_t* __restrict__ gu, i64 rows, int n) {
  swiglu_rows(a, gu, rows, n);
}

// swiglu_bwd_rows: from da [rows, n], dgu [rows, 2n] = (da*u*silu'(g),
// da*silu(g)), float32 or bf16 (put); in pairs as swiglu_rows.
template <typename O, typename I>
__device__ __forceinline__ void swiglu_bwd_rows(O* __restrict__ dgu, const float* __restrict__ da,
                                                const I* __restrict__ gu, i64 rows, int n) {
  if constexpr (sizeof(I) == 2) {
    if (swiglu_octets(gu, n) && ((unsigned long long)da & 15) == 0) return swiglu_bwd_octet_rows(dgu, da, gu, rows, n);
  }
  const bool pairs = (n & 1) == 0;
  for (RowChunks w(pairs ? n / 2 : n); w.r < rows; w.next()) {
    const I* g = gu + w.r * 2 * n;
    const float* d = da + w.r * n;
    O* out = dgu + w.r * 2 * n;
    const int j = w.c * blockDim.x + threadIdx.x;
    float gv[2], u[2], dv[2], dg[2], du[2];
    int k = 1;
    if (pairs) {
      if (2 * j >= n) continue;
      widen2(g + 2 * j, gv[0], gv[1]);
      widen2(g + n + 2 * j, u[0], u[1]);
      widen2(d + 2 * j, dv[0], dv[1]);
      k = 2;
    } else {
      if (j >= n) continue;
      gv[0] = widen(g[j]), u[0] = widen(g[n + j]), dv[0] = d[j];
    }
#pragma unroll
    for (int e = 0; e < 2; e++) {
      if (e >= k) break;
      const float sg = 1.f / (1.f + expf(-gv[e]));
      const float silu = gv[e] * sg;
      dg[e] = dv[e] * u[e] * (sg * (1.f + gv[e] * (1.f - sg)));
      du[e] = dv[e] * silu;
    }
    if (pairs) {
      put2(out + 2 * j, dg[0], dg[1]);
      put2(out + n + 2 * j, du[0], du[1]);
    } else {
      put(out + j, dg[0]);
      put(out + n + j, du[0]);
    }
  }
}

// swiglu_bwd: swiglu_bwd_rows in float32.
extern "C" __global__ void swiglu_bwd(float* __restrict__ dgu, const float* __restrict__ da,
                                      const float* __restrict__ gu, i64 rows, int n) {
  swiglu_bwd_rows(dgu, da, gu, rows, n);
}

// swiglu_bwd_bf16 is swiglu_bwd with dgu rounded to bf16: the bf16 training
// mode's operand of the gate and up projections' backward products, which
// is all dgu is used for.
extern "C" __global__ void swiglu_bwd_bf16(bf16_t* __restrict__ dgu, const float* __restrict__ da,
                                           const float* __restrict__ gu, i64 rows, int n) {
  swiglu_bwd_rows(dgu, da, gu, rows, n);
}

// swiglu_bwd_bf16_gu16 is swiglu_bwd_bf16 from gu in bf16.
extern "C" __global__ void swiglu_bwd_bf16_gu16(bf16_t* __restrict__ dgu, const float* __restrict__ da,
                                                const bf16_t* __restrict__ gu, i64 rows, int n) {
  swiglu_bwd_rows(dgu, da, gu, rows, n);
}

// norm_rope_pairs is norm_rope_token's loop for head size 32·E (64 or
// 128) two heads at a time, every element of both loaded (once) before
// the first sum: the same arithmetic, where a warp's heads went one after
// another, each read twice (session 24's H200 profile:
// norm_rope_fwd_bf16_raw16 at about 1.3 TB/s). cs and sn are the
// token's cosines and sines.
template <int E, typename O, typename R>
__device__ __forceinline__ void norm_rope_pairs(O* __restrict__ out, float* __restrict__ inv,
                                                const R* __restrict__ raw, const float* __restrict__ w,
                                                const float* __restrict__ cs, const float* __restrict__ sn, int heads,
                                                i64 raw_stride, float eps, i64 t) {
  constexpr int hd = 32 * E, half = hd / 2;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int h0 = threadIdx.x >> 5; h0 < heads; h0 += 2 * warps) {
    float xv[2][E];
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const int h = h0 + p * warps;
      const R* x = raw + t * raw_stride + (i64)h * hd;
#pragma unroll
      for (int k = 0; k < E; k++) xv[p][k] = h < heads ? widen(x[lane + 32 * k]) : 0.f;
    }
#pragma unroll
    for (int p = 0; p < 2; p++) {
      const int h = h0 + p * warps;
      if (h >= heads) break;  // uniform over the warp
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < E; k++) ss = fmaf(xv[p][k], xv[p][k], ss);
      ss = warp_sum(ss);
      const float iv = (float)(1.0 / sqrt((double)(ss / (float)hd + eps)));
      if (lane == 0 && inv) inv[t * heads + h] = iv;
      O* y = out + (t * heads + h) * (i64)hd;
#pragma unroll
      for (int k = 0; k < E / 2; k++) {
        const int i = lane + 32 * k;
        const float a = xv[p][k] * iv * w[i], b = xv[p][k + E / 2] * iv * w[i + half];
        put(y + i, a * cs[i] - b * sn[i]);
        put(y + i + half, b * cs[i] + a * sn[i]);
      }
    }
  }
}

// norm_rope_token: for token t and head h, out = RoPE(RMSNorm(raw head
// row)) (Qwen3's q_norm/k_norm then rotate-half RoPE at position pos[t]),
// float32 or rounded to bf16 (put), saving each head row's inverse RMS in
// inv[t*heads + h]. raw is float32, or bf16 as a product wrote it
// (widened). Token t's heads start at raw[t*raw_stride]; out is [T,
// heads*hd]; cos and sin are [positions, hd/2]. Warp k of the block does
// heads k, k+8, ...
template <typename O, typename R>
__device__ __forceinline__ void norm_rope_token(O* __restrict__ out, float* __restrict__ inv,
                                                const R* __restrict__ raw, const float* __restrict__ w,
                                                const float* __restrict__ cosv, const float* __restrict__ sinv,
                                                const int* __restrict__ pos, int heads, int hd, i64 raw_stride,
                                                float eps, i64 t) {
  const int half = hd / 2, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float* cs = cosv + (i64)pos[t] * half;
  const float* sn = sinv + (i64)pos[t] * half;
  if (hd == 128) return norm_rope_pairs<4>(out, inv, raw, w, cs, sn, heads, raw_stride, eps, t);
  if (hd == 64) return norm_rope_pairs<2>(out, inv, raw, w, cs, sn, heads, raw_stride, eps, t);
  for (int h = threadIdx.x >> 5; h < heads; h += warps) {
    const R* x = raw + t * raw_stride + (i64)h * hd;
    O* y = out + (t * heads + h) * (i64)hd;
    float ss = 0.f;
    for (int i = lane; i < hd; i += 32) ss = fmaf(widen(x[i]), widen(x[i]), ss);
    ss = warp_sum(ss);
    const float iv = (float)(1.0 / sqrt((double)(ss / (float)hd + eps)));
    if (lane == 0 && inv) inv[t * heads + h] = iv;
    for (int i = lane; i < half; i += 32) {
      const float a = widen(x[i]) * iv * w[i], b = widen(x[i + half]) * iv * w[i + half];
      put(y + i, a * cs[i] - b * sn[i]);
      put(y + i + half, b * cs[i] + a * sn[i]);
    }
  }
}

// norm_rope_fwd: norm_rope_token in float32. grid = T, block =
// KEEL_THREADS.
extern "C" __global__ void norm_rope_fwd(float* __restrict__ out, float* __restrict__ inv,
                                         const float* __restrict__ raw, const float* __restrict__ w,
                                         const float* __restrict__ cosv, const float* __restrict__ sinv,
                                         const int* __restrict__ pos, int heads, int hd, i64 raw_stride,
                                         float eps) {
  norm_rope_token(out, inv, raw, w, cosv, sinv, pos, heads, hd, raw_stride, eps, blockIdx.x);
}

// norm_rope_padded is norm_rope_token for block t of Tp, writing zeros
// for the pad rows t >= T.
template <typename R>
__device__ __forceinline__ void norm_rope_padded(bf16_t* __restrict__ out, float* __restrict__ inv,
                                                 const R* __restrict__ raw, const float* __restrict__ w,
                                                 const float* __restrict__ cosv, const float* __restrict__ sinv,
                                                 const int* __restrict__ pos, int heads, int hd, i64 raw_stride,
                                                 float eps, int T) {
  const i64 t = blockIdx.x;
  if (t >= T) {  // a pad row
    for (int i = threadIdx.x; i < heads * hd; i += blockDim.x) out[t * heads * hd + i] = 0;
    return;
  }
  norm_rope_token(out, inv, raw, w, cosv, sinv, pos, heads, hd, raw_stride, eps, t);
}

// norm_rope_fwd_bf16 is norm_rope_fwd with out rounded to bf16, [Tp,
// heads*hd] with the rows T..Tp-1 zero: flash.cu's row-major copy of q or k
// (FlashScratch.UseQK), made in the pass that computes it, bit for bit
// the float32 kernel's output rounded. grid = Tp, block = KEEL_THREADS.
extern "C" __global__ void norm_rope_fwd_bf16(bf16_t* __restrict__ out, float* __restrict__ inv,
                                              const float* __restrict__ raw, const float* __restrict__ w,
                                              const float* __restrict__ cosv, const float* __restrict__ sinv,
                                              const int* __restrict__ pos, int heads, int hd, i64 raw_stride,
                                              float eps, int T) {
  norm_rope_padded(out, inv, raw, w, cosv, sinv, pos, heads, hd, raw_stride, eps, T);
}

// norm_rope_fwd_bf16_raw16 is norm_rope_fwd_bf16 from raw in bf16 (the
// bf16 mode's q and k as their products wrote them): bit for bit
// norm_rope_fwd_bf16 over the widened values. grid = Tp, block =
// KEEL_THREADS.
extern "C" __global__ void norm_rope_fwd_bf16_raw16(bf16_t* __restrict__ out, float* __restrict__ inv,
                                                    const bf16_t* __restrict__ raw, const float* __restrict__ w,
                                                    const float* __restrict__ cosv, const float* __restrict__ sinv,
                                                    const int* __restrict__ pos, int heads, int hd, i64 raw_stride,
                                                    float eps, int T) {
  norm_rope_padded(out, inv, raw, w, cosv, sinv, pos, heads, hd, raw_stride, eps, T);
}

// norm_rope_kv_heads is norm_rope_kv_bf16's q and k heads at head size
// 32·E (64 or 128), a warp's heads four at a time with every element of
// the four loaded before the first sum (a decoding step's 24 heads of the
// Qwen3-0.6B shape are three a warp, each a round trip to memory after
// the last): the same arithmetic as its loop. cs and sn are the token's
// cosines and sines, cache the cache row's offset (negative: padding,
// no keys written).
template <int E>
__device__ __forceinline__ void norm_rope_kv_heads(float* __restrict__ q, bf16_t* __restrict__ kc,
                                                   const float* __restrict__ qraw, const float* __restrict__ kraw,
                                                   const float* __restrict__ qw, const float* __restrict__ kw,
                                                   const float* __restrict__ cs, const float* __restrict__ sn, i64 ld,
                                                   int heads, int kv, float eps, i64 t, i64 cache) {
  constexpr int hd = 32 * E, half = hd / 2, P = 4;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int h0 = threadIdx.x >> 5; h0 < heads + kv; h0 += P * warps) {
    float xv[P][E];
#pragma unroll
    for (int p = 0; p < P; p++) {
      const int h = h0 + p * warps;
      const bool isq = h < heads, live = h < heads + kv && (isq || cache >= 0);
      const float* x = (isq ? qraw + (i64)h * hd : kraw + (i64)(h - heads) * hd) + t * ld;
#pragma unroll
      for (int k = 0; k < E; k++) xv[p][k] = live ? x[lane + 32 * k] : 0.f;
    }
#pragma unroll
    for (int p = 0; p < P; p++) {
      const int h = h0 + p * warps;
      if (h >= heads + kv) break;  // uniform over the warp
      const bool isq = h < heads;
      if (!isq && cache < 0) continue;
      const float* w = isq ? qw : kw;
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < E; k++) ss = fmaf(xv[p][k], xv[p][k], ss);
      ss = warp_sum(ss);
      const float iv = (float)(1.0 / sqrt((double)(ss / (float)hd + eps)));
#pragma unroll
      for (int k = 0; k < E / 2; k++) {
        const int i = lane + 32 * k;
        const float a = xv[p][k] * iv * w[i], b = xv[p][k + E / 2] * iv * w[i + half];
        const float y0 = a * cs[i] - b * sn[i], y1 = b * cs[i] + a * sn[i];
        if (isq) {
          float* y = q + (t * heads + h) * (i64)hd;
          y[i] = y0;
          y[i + half] = y1;
        } else {
          bf16_t* y = kc + cache + (i64)(h - heads) * hd;
          y[i] = f32_to_bf16(y0);
          y[i + half] = f32_to_bf16(y1);
        }
      }
    }
  }
}

// norm_rope_kv_bf16 is the bf16 rollout's fused q/k step: for step row t,
// its q heads as norm_rope_fwd makes them (into q, float32), its k heads
// likewise but rounded to bf16 straight into the cache at (slot[t],
// pos[t]), and its v row rounded into the value cache: norm_rope_fwd twice
// and kv_store_bf16, bit for bit, in one launch. A padding row (negative
// slot) writes q only. Caches [slots, max_len, kv*hd]. Row t of qraw, kraw
// and v starts at t*ld: they are column spans of one [T, ld] matrix, the
// output of q, k and v's one product. grid = T, block = KEEL_THREADS:
// warp k does heads k, k+8, ... of the q and k heads.
extern "C" __global__ void norm_rope_kv_bf16(float* __restrict__ q, bf16_t* __restrict__ kc, bf16_t* __restrict__ vc,
                                             const float* __restrict__ qraw, const float* __restrict__ kraw,
                                             const float* __restrict__ v, const float* __restrict__ qw,
                                             const float* __restrict__ kw, const float* __restrict__ cosv,
                                             const float* __restrict__ sinv, const int* __restrict__ slot,
                                             const int* __restrict__ pos, i64 ld, int heads, int kv, int hd,
                                             int max_len, float eps) {
  const i64 t = blockIdx.x;
  const int half = hd / 2, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float* cs = cosv + (i64)pos[t] * half;
  const float* sn = sinv + (i64)pos[t] * half;
  const i64 kvd = (i64)kv * hd, cache = slot[t] < 0 ? -1 : ((i64)slot[t] * max_len + pos[t]) * kvd;
  if (hd == 128 || hd == 64) {
    if (hd == 128)
      norm_rope_kv_heads<4>(q, kc, qraw, kraw, qw, kw, cs, sn, ld, heads, kv, eps, t, cache);
    else
      norm_rope_kv_heads<2>(q, kc, qraw, kraw, qw, kw, cs, sn, ld, heads, kv, eps, t, cache);
    if (cache >= 0)
      for (int j = threadIdx.x; j < kvd; j += blockDim.x) vc[cache + j] = f32_to_bf16(v[t * ld + j]);
    return;
  }
  for (int h = threadIdx.x >> 5; h < heads + kv; h += warps) {
    const bool isq = h < heads;
    if (!isq && cache < 0) continue;
    const float* x = (isq ? qraw + (i64)h * hd : kraw + (i64)(h - heads) * hd) + t * ld;
    const float* w = isq ? qw : kw;
    float ss = 0.f;
    for (int i = lane; i < hd; i += 32) ss = fmaf(x[i], x[i], ss);
    ss = warp_sum(ss);
    const float iv = (float)(1.0 / sqrt((double)(ss / (float)hd + eps)));
    for (int i = lane; i < half; i += 32) {
      const float a = x[i] * iv * w[i], b = x[i + half] * iv * w[i + half];
      const float y0 = a * cs[i] - b * sn[i], y1 = b * cs[i] + a * sn[i];
      if (isq) {
        float* y = q + (t * heads + h) * (i64)hd;
        y[i] = y0;
        y[i + half] = y1;
      } else {
        bf16_t* y = kc + cache + (i64)(h - heads) * hd;
        y[i] = f32_to_bf16(y0);
        y[i + half] = f32_to_bf16(y1);
      }
    }
  }
  if (cache >= 0)
    for (int j = threadIdx.x; j < kvd; j += blockDim.x) vc[cache + j] = f32_to_bf16(v[t * ld + j]);
}

// rope_rows rotates the heads of every token in place by rotate-half RoPE
// with the tables given: with the negated sines it is RoPE's transpose,
// the backward. Token t's heads start at d[t*stride]. grid = T.
extern "C" __global__ void rope_rows(float* d, const float* __restrict__ cosv,
                                     const float* __restrict__ sinv, const int* __restrict__ pos,
                                     int heads, int hd, i64 stride) {
  const i64 t = blockIdx.x;
  const int half = hd / 2;
  const float* cs = cosv + (i64)pos[t] * half;
  const float* sn = sinv + (i64)pos[t] * half;
  for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int h = k / half, i = k % half;
    float* x = d + t * stride + (i64)h * hd;
    const float a = x[i], b = x[i + half];
    x[i] = a * cs[i] - b * sn[i];
    x[i + half] = b * cs[i] + a * sn[i];
  }
}

// add: y += x over n elements (the residual stream).
extern "C" __global__ void add(float* __restrict__ y, const float* __restrict__ x, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) y[i] += x[i];
}
