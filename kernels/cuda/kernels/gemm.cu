// keel's own float32 matrix product, for the float32 mode (checking the
// GPU engine against the CPU engine) and for the exact rollout, which
// needs what cuBLAS does not promise: every output element is the same
// sequence of fused multiply-adds over k = 0, 1, ..., K-1 whatever M, N,
// the tiling or the launch, so a row's result does not depend on the
// batch around it. Strides give the three products of a linear layer:
//   forward    Y[M,N]  = X[M,K] W[N,K]^T   (sam = K, sak = 1, sbk = 1, sbn = K)
//   input grad dX[M,K] = dY[M,N] W[N,K]    (sam = N, sak = 1, sbk = K, sbn = 1)
//   weight grad dW[N,K] += dY[M,N]^T X[M,K] (C is [N,K], A(n,m) = dY[m*N+n]).
//
// C[m*ldc + n] = (acc ? C : 0) + sum_k A[m*sam + k*sak] * B[k*sbk + n*sbn].
// grid = (ceil(N/64), ceil(M/64)), block = 256 (16 x 16 threads, each 4 x 4
// outputs).

#define GT 64 // output tile
#define GK 16 // k tile

// tile_index maps a thread's e-th element of a rows x kt tile to its row r
// and k index kk: k fastest when k is the contiguous index in memory (kfast),
// else the row, so that consecutive threads read consecutive addresses. The
// same (r, kk) pairs are covered either way: what reaches shared memory,
// and so every bit of the product, does not depend on the order.
__device__ __forceinline__ void tile_index(int e, int rows, int kt, bool kfast, int& r, int& kk) {
  if (kfast) {
    r = e / kt;
    kk = e % kt;
  } else {
    r = e % rows;
    kk = e / rows;
  }
}

extern "C" __global__ void __launch_bounds__(256) gemm_f32(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  __shared__ float As[GK][GT + 1];
  __shared__ float Bs[GK][GT + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * GT, n0 = blockIdx.x * GT;
  float c[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) c[i][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += GK) {
    // 64 x 16 elements of A and of B, 4 per thread, each walked along
    // its contiguous index (tile_index) so that a warp's loads coalesce.
    for (int e = threadIdx.x; e < GT * GK; e += 256) {
      int r, kk;
      tile_index(e, GT, GK, sak == 1, r, kk);
      const int m = m0 + r, k = k0 + kk;
      As[kk][r] = (m < M && k < K) ? A[m * sam + k * sak] : 0.f;
      tile_index(e, GT, GK, sbk == 1, r, kk);
      const int n = n0 + r, kb = k0 + kk;
      Bs[kk][r] = (n < N && kb < K) ? B[kb * sbk + n * sbn] : 0.f;
    }
    __syncthreads();
    const int kn = min(GK, K - k0);
    for (int kk = 0; kk < kn; kk++) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) c[i][j] = fmaf(a[i], b[j], c[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int m = m0 + ty + 16 * i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int n = n0 + tx + 16 * j;
      if (n >= N) continue;
      float* p = C + m * ldc + n;
      *p = acc ? *p + c[i][j] : c[i][j];
    }
  }
}

// gemm_f32_128: the same product with 128 x 128 output tiles (each thread
// 8 x 8 outputs), for large M and N. Every output element is the same
// fused multiply-add chain over k = 0..K-1 as in gemm_f32, so the two
// kernels give the same bits and the choice between them (by shape) keeps
// the batch invariance. grid = (ceil(N/128), ceil(M/128)), block = 256.
#define G2T 128
#define G2K 8
extern "C" __global__ void __launch_bounds__(256) gemm_f32_128(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  __shared__ float As[G2K][G2T + 4];
  __shared__ float Bs[G2K][G2T + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * G2T, n0 = blockIdx.x * G2T;
  float c[8][8];
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) c[i][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += G2K) {
    for (int e = threadIdx.x; e < G2T * G2K; e += 256) {
      int r, kk;
      tile_index(e, G2T, G2K, sak == 1, r, kk);
      const int m = m0 + r, k = k0 + kk;
      As[kk][r] = (m < M && k < K) ? A[m * sam + k * sak] : 0.f;
      tile_index(e, G2T, G2K, sbk == 1, r, kk);
      const int n = n0 + r, kb = k0 + kk;
      Bs[kk][r] = (n < N && kb < K) ? B[kb * sbk + n * sbn] : 0.f;
    }
    __syncthreads();
    const int kn = min(G2K, K - k0);
    for (int kk = 0; kk < kn; kk++) {
      float a[8], b[8];
#pragma unroll
      for (int i = 0; i < 8; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 8; j++) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) c[i][j] = fmaf(a[i], b[j], c[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int m = m0 + ty + 16 * i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int n = n0 + tx + 16 * j;
      if (n >= N) continue;
      float* p = C + m * ldc + n;
      *p = acc ? *p + c[i][j] : c[i][j];
    }
  }
}
