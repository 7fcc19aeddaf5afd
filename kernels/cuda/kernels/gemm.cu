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

// Both kernels below take 256 threads as a 16 x 16 grid; thread (tx, ty)
// computes R x R outputs (R = 4 or 8): rows ty*4 + {0..3} (and, for R = 8,
// 64 + ty*4 + {0..3}) and likewise columns from tx, so that it reads its
// operands from shared memory four at a time (float4), without bank
// conflicts. Each k tile is loaded into registers while the one before is
// multiplied (the global memory's latency hidden behind the products),
// then stored to shared memory. Every output is still one fmaf chain over
// k = 0..K-1 in order: the tiling changes no bit.

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

// gemm_tile is the product of one TM x TM output tile (TM = 64 R / 4) over
// k tiles of TK: R x R outputs per thread as described above.
template <int R, int TK>
__device__ __forceinline__ void gemm_tile(float* __restrict__ C, const float* __restrict__ A,
                                          const float* __restrict__ B, int M, int N, int K, i64 sam, i64 sak,
                                          i64 sbk, i64 sbn, i64 ldc, int acc) {
  constexpr int TM = 16 * R, PER = TM * TK / 256, H = R / 4;  // H: groups of four rows (columns) a thread takes
  __shared__ __align__(16) float As[TK][TM + 4];
  __shared__ __align__(16) float Bs[TK][TM + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TM;
  const bool ak = sak == 1, bk = sbk == 1;
  float c[R][R];
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int j = 0; j < R; j++) c[i][j] = 0.f;
  float ra[PER], rb[PER];  // the next k tile, on its way to shared memory
  auto load = [&](int k0) {
#pragma unroll
    for (int p = 0; p < PER; p++) {
      const int e = threadIdx.x + 256 * p;
      int r, kk;
      tile_index(e, TM, TK, ak, r, kk);
      const int m = m0 + r, k = k0 + kk;
      ra[p] = (m < M && k < K) ? A[m * sam + k * sak] : 0.f;
      tile_index(e, TM, TK, bk, r, kk);
      const int n = n0 + r, kb = k0 + kk;
      rb[p] = (n < N && kb < K) ? B[kb * sbk + n * sbn] : 0.f;
    }
  };
  auto store = [&]() {
#pragma unroll
    for (int p = 0; p < PER; p++) {
      const int e = threadIdx.x + 256 * p;
      int r, kk;
      tile_index(e, TM, TK, ak, r, kk);
      As[kk][r] = ra[p];
      tile_index(e, TM, TK, bk, r, kk);
      Bs[kk][r] = rb[p];
    }
  };
  auto step = [&](int kk) {
    float a[R], b[R];
#pragma unroll
    for (int h = 0; h < H; h++) {
      const float4 av = *(const float4*)&As[kk][64 * h + 4 * ty];
      const float4 bv = *(const float4*)&Bs[kk][64 * h + 4 * tx];
      a[4 * h] = av.x, a[4 * h + 1] = av.y, a[4 * h + 2] = av.z, a[4 * h + 3] = av.w;
      b[4 * h] = bv.x, b[4 * h + 1] = bv.y, b[4 * h + 2] = bv.z, b[4 * h + 3] = bv.w;
    }
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
      for (int j = 0; j < R; j++) c[i][j] = fmaf(a[i], b[j], c[i][j]);
  };
  load(0);
  store();
  __syncthreads();
  for (int k0 = 0; k0 < K; k0 += TK) {
    const bool next = k0 + TK < K;
    if (next) load(k0 + TK);
    const int kn = min(TK, K - k0);
    if (kn == TK) {
#pragma unroll
      for (int kk = 0; kk < TK; kk++) step(kk);
    } else {
      for (int kk = 0; kk < kn; kk++) step(kk);
    }
    __syncthreads();
    if (next) {
      store();
      __syncthreads();
    }
  }
#pragma unroll
  for (int i = 0; i < R; i++) {
    const int m = m0 + 64 * (i / 4) + 4 * ty + i % 4;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < R; j++) {
      const int n = n0 + 64 * (j / 4) + 4 * tx + j % 4;
      if (n >= N) continue;
      float* p = C + m * ldc + n;
      *p = acc ? *p + c[i][j] : c[i][j];
    }
  }
}

// gemm_f32: 64 x 64 output tiles, 4 x 4 a thread, k tiles of 16.
// grid = (ceil(N/64), ceil(M/64)), block = 256.
extern "C" __global__ void __launch_bounds__(256) gemm_f32(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  gemm_tile<4, 16>(C, A, B, M, N, K, sam, sak, sbk, sbn, ldc, acc);
}

// gemm_f32_128: the same product with 128 x 128 output tiles (8 x 8 a
// thread, k tiles of 8), for large M and N. Every output element is the
// same fused multiply-add chain over k = 0..K-1 as in gemm_f32, so the two
// kernels give the same bits and the choice between them (by shape) keeps
// the batch invariance. grid = (ceil(N/128), ceil(M/128)), block = 256.
extern "C" __global__ void __launch_bounds__(256, 2) gemm_f32_128(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  gemm_tile<8, 8>(C, A, B, M, N, K, sam, sak, sbk, sbn, ldc, acc);
}
