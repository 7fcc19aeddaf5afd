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

// The kernels below take 256 threads as a 16 x 16 grid; thread (tx, ty)
// computes R x R outputs (R = 4 or 8): rows ty*4 + {0..3} (and, for R = 8,
// 64 + ty*4 + {0..3}) and likewise columns from tx, so that it reads its
// operands from shared memory four at a time (float4), without bank
// conflicts; for R = 2, rows ty*2 + {0, 1}, read two at a time. Each k tile is loaded into registers while the one before is
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

// gemm_tile is the product of one TM x TM output tile (TM = 16 R) over
// k tiles of TK: R x R outputs per thread as described above.
// The tile is (mt, nt): rows mt*TM.., columns nt*TM... With FWD the
// layout is the forward's, both operands k-contiguous (sak = sbk = 1,
// whatever is passed), known to the compiler, and each element's address
// taken once (gemm_f32_fwd's loop 547 instructions a k tile where
// gemm_f32's is 964, sm_90), the products and their order the same.
template <int R, int TK, bool FWD = false>
__device__ __forceinline__ void gemm_tile(float* __restrict__ C, const float* __restrict__ A,
                                          const float* __restrict__ B, int M, int N, int K, i64 sam, i64 sak,
                                          i64 sbk, i64 sbn, i64 ldc, int acc, int mt, int nt) {
  if constexpr (FWD) sak = 1, sbk = 1;
  constexpr int TM = 16 * R, PER = TM * TK / 256, H = R / 4;  // H: groups of four rows (columns) a thread takes
  constexpr int PAD = R == 2 ? 2 : 4;  // keeps float2 (float4) reads aligned; 2 halves R = 2's store conflicts
  __shared__ __align__(16) float As[TK][TM + PAD];
  __shared__ __align__(16) float Bs[TK][TM + PAD];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = mt * TM, n0 = nt * TM;
  const bool ak = FWD || sak == 1, bk = FWD || sbk == 1;
  float c[R][R];
#pragma unroll
  for (int i = 0; i < R; i++)
#pragma unroll
    for (int j = 0; j < R; j++) c[i][j] = 0.f;
  float ra[PER], rb[PER];  // the next k tile, on its way to shared memory
  // With FWD each element's row start (null past M or N) and k offset are
  // fixed over the k tiles, taken once: a load is then a bounds test and
  // an add (each element's index arithmetic had been most of the loop).
  // Both operands k-contiguous over tiles of TM rows, so A's and B's
  // elements share their (row, k) place.
  const float* pa[FWD ? PER : 1];
  const float* pb[FWD ? PER : 1];
  int kof[FWD ? PER : 1];
  if constexpr (FWD) {
#pragma unroll
    for (int p = 0; p < PER; p++) {
      int r, kk;
      tile_index(threadIdx.x + 256 * p, TM, TK, true, r, kk);
      kof[p] = kk;
      pa[p] = m0 + r < M ? A + (m0 + r) * sam + kk : nullptr;
      pb[p] = n0 + r < N ? B + (n0 + r) * sbn + kk : nullptr;
    }
  }
  auto load = [&](int k0) {
#pragma unroll
    for (int p = 0; p < PER; p++) {
      if constexpr (FWD) {
        const bool in = k0 + kof[p] < K;
        ra[p] = pa[p] && in ? pa[p][k0] : 0.f;
        rb[p] = pb[p] && in ? pb[p][k0] : 0.f;
      } else {
        const int e = threadIdx.x + 256 * p;
        int r, kk;
        tile_index(e, TM, TK, ak, r, kk);
        const int m = m0 + r, k = k0 + kk;
        ra[p] = (m < M && k < K) ? A[m * sam + k * sak] : 0.f;
        tile_index(e, TM, TK, bk, r, kk);
        const int n = n0 + r, kb = k0 + kk;
        rb[p] = (n < N && kb < K) ? B[kb * sbk + n * sbn] : 0.f;
      }
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
    if constexpr (R == 2) {
      const float2 av = *(const float2*)&As[kk][2 * ty];
      const float2 bv = *(const float2*)&Bs[kk][2 * tx];
      a[0] = av.x, a[1] = av.y, b[0] = bv.x, b[1] = bv.y;
    } else {
#pragma unroll
      for (int h = 0; h < H; h++) {
        const float4 av = *(const float4*)&As[kk][64 * h + 4 * ty];
        const float4 bv = *(const float4*)&Bs[kk][64 * h + 4 * tx];
        a[4 * h] = av.x, a[4 * h + 1] = av.y, a[4 * h + 2] = av.z, a[4 * h + 3] = av.w;
        b[4 * h] = bv.x, b[4 * h + 1] = bv.y, b[4 * h + 2] = bv.z, b[4 * h + 3] = bv.w;
      }
    }
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
      for (int j = 0; j < R; j++) c[i][j] = fmaf(a[i], b[j], c[i][j]);
  };
  // In the forward kernels a thread whose rows all lie past M (an
  // expert's 16 rows in a 64-row tile: 3 of its 4 row groups) stages its
  // share of the tiles but skips the products, whose outputs nobody
  // stores: the valid rows' bits are the same. (Not in the generic
  // kernels: gemm_f32 spills at sm_80 with the test.)
  const bool live = !FWD || m0 + (R == 2 ? 2 : 4) * ty < M;
  load(0);
  store();
  __syncthreads();
  for (int k0 = 0; k0 < K; k0 += TK) {
    const bool next = k0 + TK < K;
    if (next) load(k0 + TK);
    const int kn = min(TK, K - k0);
    if (!live) {
    } else if (kn == TK) {
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
    const int m = m0 + (R == 2 ? 2 * ty + i : 64 * (i / 4) + 4 * ty + i % 4);
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < R; j++) {
      const int n = n0 + (R == 2 ? 2 * tx + j : 64 * (j / 4) + 4 * tx + j % 4);
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
  gemm_tile<4, 16>(C, A, B, M, N, K, sam, sak, sbk, sbn, ldc, acc, blockIdx.y, blockIdx.x);
}

// gemm_f32_128: the same product with 128 x 128 output tiles (8 x 8 a
// thread, k tiles of 8), for large M and N. Every output element is the
// same fused multiply-add chain over k = 0..K-1 as in gemm_f32, so the two
// kernels give the same bits and the choice between them (by shape) keeps
// the batch invariance. grid = (ceil(N/128), ceil(M/128)), block = 256.
extern "C" __global__ void __launch_bounds__(256, 2) gemm_f32_128(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  gemm_tile<8, 8>(C, A, B, M, N, K, sam, sak, sbk, sbn, ldc, acc, blockIdx.y, blockIdx.x);
}

// gemm_f32_32: the same product with 32 x 32 output tiles (2 x 2 a
// thread, k tiles of 32), for products too small to fill the GPU with 64
// x 64 tiles: a decoding step's at a few hundred rows (at 256 rows, a
// 1024-wide output is 64 blocks of 64 x 64 for 132 multiprocessors; 256
// of 32 x 32). The same fused multiply-add chain per output, so the same
// bits. grid = (ceil(N/32), ceil(M/32)), block = 256.
extern "C" __global__ void __launch_bounds__(256) gemm_f32_32(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  gemm_tile<2, 32>(C, A, B, M, N, K, sam, sak, sbk, sbn, ldc, acc, blockIdx.y, blockIdx.x);
}

// gemm_f32_fwd and gemm_f32_32_fwd are gemm_f32 and gemm_f32_32 for the
// forward's layout (sak = sbk = 1, A[m*sam + k], B[n*sbn + k]; the strides
// sak and sbk passed are not read): the same bits, with fewer
// instructions a k tile (964 -> 547, 856 -> 543 at sm_90). (gemm_f32_128
// so specialised spills at its 128 registers.)
extern "C" __global__ void __launch_bounds__(256) gemm_f32_fwd(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  gemm_tile<4, 16, true>(C, A, B, M, N, K, sam, sak, sbk, sbn, ldc, acc, blockIdx.y, blockIdx.x);
}
extern "C" __global__ void __launch_bounds__(256) gemm_f32_32_fwd(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
    i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, int acc) {
  gemm_tile<2, 32, true>(C, A, B, M, N, K, sam, sak, sbk, sbn, ldc, acc, blockIdx.y, blockIdx.x);
}

// The grouped expert products of an MoE layer: the rows grouped by expert
// (moe.cu's moe_group_*: expert e's rows off[e]..off[e+1]), each expert's
// rows times its own weights, all experts in one launch whose size depends
// only on the row count (a CUDA graph can hold it). Expert e's weights are
// at B + e*wstride, [N, K] row-major (an expert's gate and up projections
// side by side are one [2I, H] matrix in the arena). Row tile y of the
// grid is tiles[2y]'s tile tiles[2y+1] (moe_group_offsets' map; -1 past
// the last: the block returns): grid = (column tiles, ceil(R/64) + E).
// The weights' gradients run a block per expert and output tile instead.

// gemm_f32_grouped: C[r, n] (+)= sum_k A[r*sam + k*sak] * B_e[k*sbk + n*sbn]
// for every grouped row r of expert e, B_e = B + e*wstride: the forward
// (sam = lda, sak = 1, sbk = 1, sbn = K: B_e is W_e [N, K]) and the
// input's gradient (A the output's gradient, sbk = N, sbn = 1: W_e
// [K, N] read transposed). gemm_f32's tile, so every output is the same
// fmaf chain as the product over the expert's rows alone (Ops.Gemm): the
// same bits in one launch.
template <bool FWD>
__device__ __forceinline__ void grouped_f32(float* __restrict__ C, const float* __restrict__ A,
                                            const float* __restrict__ B, const int* __restrict__ off,
                                            const int* __restrict__ tiles, int N, int K, i64 sam, i64 sak, i64 sbk,
                                            i64 sbn, i64 ldc, i64 wstride, int acc) {
  const int e = tiles[2 * blockIdx.y];
  if (e < 0) return;
  const int r0 = off[e];
  gemm_tile<4, 16, FWD>(C + r0 * ldc, A + r0 * sam, B + e * wstride, off[e + 1] - r0, N, K, sam, sak, sbk, sbn, ldc,
                        acc, tiles[2 * blockIdx.y + 1], blockIdx.x);
}
extern "C" __global__ void __launch_bounds__(256, 2) gemm_f32_grouped(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, const int* __restrict__ off,
    const int* __restrict__ tiles, int N, int K, i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, i64 wstride, int acc) {
  grouped_f32<false>(C, A, B, off, tiles, N, K, sam, sak, sbk, sbn, ldc, wstride, acc);
}

// gemm_f32_grouped_fwd is gemm_f32_grouped for the forward (sak = sbk = 1,
// not read): gemm_f32_fwd's tile, the same bits.
extern "C" __global__ void __launch_bounds__(256, 2) gemm_f32_grouped_fwd(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B, const int* __restrict__ off,
    const int* __restrict__ tiles, int N, int K, i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc, i64 wstride, int acc) {
  grouped_f32<true>(C, A, B, off, tiles, N, K, sam, sak, sbk, sbn, ldc, wstride, acc);
}

// gemm_f32_grouped_dw: the weights' gradient, dW_e[n*K + j] += sum over
// expert e's grouped rows r, in order, of A[r*lda + n] * X[r*ldx + j] (A
// the output's gradient [R, N], X the input [R, K]), dW_e at C +
// e*wstride: Ops.Gemm's weight gradient over the expert's rows, bit for
// bit. grid = (ceil(K/64), ceil(N/64), E); an expert without rows adds
// nothing.
extern "C" __global__ void __launch_bounds__(256, 2) gemm_f32_grouped_dw(
    float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ X, const int* __restrict__ off,
    int N, int K, i64 lda, i64 ldx, i64 wstride) {
  const int e = blockIdx.z, r0 = off[e], rows = off[e + 1] - r0;
  if (rows <= 0) return;
  gemm_tile<4, 16>(C + e * wstride, A + r0 * lda, X + r0 * ldx, N, K, rows, 1, lda, ldx, 1, K, 1, blockIdx.y, blockIdx.x);
}

// gemm_bf16_grouped and its two backward products: C[m, n] (+)= sum_k
// A(m, k) B(n, k) on the tensor cores from bf16 operands, float32
// accumulation and output. A block's 64 x 64 output tile is four warps of
// 32 x 32 (2 x 4 mma.m16n8k16 tiles), over k tiles of 32 in two stages of
// shared memory (the next tile's copy in flight during this one's
// products: a k-contiguous operand's by cp.async, a transposed operand's
// loaded into registers before the products and stored after them). Each
// output is a sum over k in a fixed order that does not depend on the
// other rows: batch invariant, like gemm_f32. An operand is
// read from memory k-contiguous (A(m, k) at A[m*lda + k]: copied 16 bytes
// at a time) or transposed (A(m, k) at A[k*lda + m], T: two k rows of 8
// elements each, interleaved in registers into the k pairs the tensor
// cores take). vec says every row of both starts 16-byte aligned and the
// lengths are multiples of 8 (16-byte copies, cp.async where async); else
// the tiles are staged element by element. block = 128.
#define GB_BK 32
#define GB_P 20  // words of a shared tile row: 32 bf16 and 8 of padding (no bank conflicts)

// gb_copy copies the stage of rows 0..rows-1 (at most 64; row r valid
// below n) and k k0..k0+31 (valid below K) of a k-contiguous operand,
// zeros outside, into dst: row r's k pairs at words r*GB_P... (cp.async
// where async and vec).
__device__ __forceinline__ void gb_copy(u32* dst, const bf16_t* __restrict__ src, i64 ld, int n, int k0, int K, int vec,
                                        int async, int rows = 64) {
  for (int x = threadIdx.x; x < rows * (GB_BK / 8); x += blockDim.x) {
    const int r = x / (GB_BK / 8), c = x % (GB_BK / 8), k = k0 + 8 * c;
    u32* d = dst + r * GB_P + 4 * c;
    if (vec && r < n && k + 8 <= K) {
      copy16(d, src + r * ld + k, async);
      continue;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const int k2 = k + 2 * q;
      const u32 lo = (r < n && k2 < K) ? src[r * ld + k2] : 0u;
      const u32 hi = (r < n && k2 + 1 < K) ? src[r * ld + k2 + 1] : 0u;
      d[q] = lo | (hi << 16);
    }
  }
}

// gb_regs is a thread's share of a transposed operand's stage on its way
// from global to shared memory: rows 8c..8c+7 of k and of k+1 (two bf16 a
// word), thread (c, p) taking k pairs 2p, 2p+1 (16 pairs make the tile's
// 32 k; 8 row groups its 64 rows; 128 threads the whole stage).
struct gb_regs {
  u32 lo[4], hi[4];
};

// gb_load reads a thread's share of the stage of rows 0..63 (valid below
// n) and k 0..31 (valid below K) of a transposed operand (element (r, k)
// at src[k*ld + r]) into registers, zeros outside: issued before this
// tile's products, stored after them (gb_store), so that the loads'
// latency passes during the products.
__device__ __forceinline__ void gb_load(gb_regs& g, const bf16_t* __restrict__ src, i64 ld, int n, int K, int vec) {
  const int x = threadIdx.x, c = x / (GB_BK / 2), p = x % (GB_BK / 2), r = 8 * c, k = 2 * p;
  if (vec && r + 8 <= n && k + 2 <= K) {
    const u32x4 a = *(const u32x4*)(src + k * ld + r), b = *(const u32x4*)(src + (k + 1) * ld + r);
    g.lo[0] = a.x, g.lo[1] = a.y, g.lo[2] = a.z, g.lo[3] = a.w;
    g.hi[0] = b.x, g.hi[1] = b.y, g.hi[2] = b.z, g.hi[3] = b.w;
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; q++) {
    u32 v[4];
#pragma unroll
    for (int h = 0; h < 4; h++) {  // (k or k+1) x (row 2q or 2q+1)
      const int kk = k + (h >> 1), rr = r + 2 * q + (h & 1);
      v[h] = (rr < n && kk < K) ? src[kk * ld + rr] : 0u;
    }
    g.lo[q] = v[0] | (v[1] << 16);
    g.hi[q] = v[2] | (v[3] << 16);
  }
}

// gb_store interleaves a thread's gb_load into the k pairs the tensor
// cores take, row r's at words r*GB_P....
__device__ __forceinline__ void gb_store(u32* dst, const gb_regs& g) {
  const int x = threadIdx.x, r = 8 * (x / (GB_BK / 2)), p = x % (GB_BK / 2);
#pragma unroll
  for (int q = 0; q < 4; q++) {
    dst[(r + 2 * q) * GB_P + p] = (g.lo[q] & 0xffffu) | (g.hi[q] << 16);
    dst[(r + 2 * q + 1) * GB_P + p] = (g.lo[q] >> 16) | (g.hi[q] & 0xffff0000u);
  }
}

// gb_row and gb_col are the tile row and column of accumulator q of the
// warp's m16n8 tile (i, j), for lane 4g + t: mma.m16n8k16's layout.
__device__ __forceinline__ int gb_row(int wm, int i, int g, int q) { return wm + 16 * i + g + 8 * (q >> 1); }
__device__ __forceinline__ int gb_col(int wn, int j, int t, int q) { return wn + 8 * j + 2 * t + (q & 1); }

// gb_tile is one block's 64 x 64 tile of C (M x N valid) over k = 0..K-1:
// A(m, k) and B(n, k) from the tile's origin, each k-contiguous or
// transposed (AT, BT); C float32, or bf16 (each float32 sum rounded once;
// acc 0). The four warps take 32 x 32 each, or with FEW (a k-contiguous
// A only) 64 x 16 each, in 16-row slabs of which only those holding a
// valid row are staged and multiplied: a decoding step's experts get
// about 16 rows each (256 rows x 8 of 128 experts), for which the 32 x 32
// warps did four times the tensor work, half of the warps on rows that
// do not exist. Each output is the same mma.m16n8k16 over the same k
// steps either way: the same bits.
template <bool AT, bool BT, typename O = float, bool FEW = false>
__device__ __forceinline__ void gb_tile(O* __restrict__ C, i64 ldc, const bf16_t* __restrict__ A, i64 lda,
                                        const bf16_t* __restrict__ B, i64 ldb, int M, int N, int K, int acc, int vec,
                                        int async) {
  static_assert(!(FEW && AT), "the few-row tiles stage A k-contiguous");
  constexpr int MI = FEW ? 4 : 2, NJ = FEW ? 2 : 4;  // the warp's m16 and n8 tiles
  __shared__ __align__(16) u32 As[2][64 * GB_P];
  __shared__ __align__(16) u32 Bs[2][64 * GB_P];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = FEW ? 0 : (warp >> 1) * 32, wn = FEW ? warp * 16 : (warp & 1) * 32;
  const int slabs = FEW ? (M + 15) / 16 : MI;  // the warp's m16 tiles holding a valid row (M >= 1)
  float d[MI][NJ][4];
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) d[i][j][q] = 0.f;
  const int nk = (K + GB_BK - 1) / GB_BK;
  gb_regs ra, rb;  // a transposed operand's next stage, in registers
  // issue starts stage s's copies: cp.async (or plain copies) for a
  // k-contiguous operand, loads into registers for a transposed one;
  // land stores the registers into stage s.
  auto issue = [&](int s, int k0) {
    if constexpr (AT) {
      gb_load(ra, A + (i64)k0 * lda, lda, M, K - k0, vec);
    } else {
      gb_copy(As[s], A, lda, M, k0, K, vec, async, FEW ? 16 * slabs : 64);
    }
    if constexpr (BT) {
      gb_load(rb, B + (i64)k0 * ldb, ldb, N, K - k0, vec);
    } else {
      gb_copy(Bs[s], B, ldb, N, k0, K, vec, async);
    }
    copies_commit(async);
  };
  auto land = [&](int s) {
    if constexpr (AT) gb_store(As[s], ra);
    if constexpr (BT) gb_store(Bs[s], rb);
  };
  issue(0, 0);
  land(0);
  for (int kt = 0; kt < nk; kt++) {
    const int st = kt & 1;
    if (kt + 1 < nk) {
      issue(st ^ 1, (kt + 1) * GB_BK);
      copies_wait_prev(async);
    } else {
      copies_done(async);
    }
    __syncthreads();
    const u32* as = As[st];
    const u32* bs = Bs[st];
#if !KEEL_MMA_TILES
    // Without the tensor cores (and on keel's CPU emulator unless
    // KEEL_CUDA_EMU_MMA=1): each lane's outputs summed from shared memory,
    // k in order.
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
      for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
          if (i >= slabs) continue;
          const u32* ar = as + gb_row(wm, i, g, q) * GB_P;
          const u32* br = bs + gb_col(wn, j, t, q) * GB_P;
          float acc_k = d[i][j][q];
          for (int w = 0; w < GB_BK / 2; w++) {
            acc_k = fmaf(bf_lo(ar[w]), bf_lo(br[w]), acc_k);
            acc_k = fmaf(bf_hi(ar[w]), bf_hi(br[w]), acc_k);
          }
          d[i][j][q] = acc_k;
        }
#else
    // The fragments by ldmatrix (ldsm4): 4 loads a k-step where 32-bit
    // loads took 16 (ncu on an H200: the shared-memory pipe, not the
    // tensor cores, was these kernels' limit). The same words.
    const Frags fa = frags(as + wm * GB_P, lane_a(lane, GB_P)), fb = frags(bs + wn * GB_P, lane_b2n(lane, GB_P));
#pragma unroll
    for (int ks = 0; ks < GB_BK / 16; ks++) {
      u32 af[MI][4], bq[NJ / 2][4];
#pragma unroll
      for (int i = 0; i < MI; i++)
        if (i < slabs) ldsm4(af[i], fa, 16 * i * GB_P + ks * 8);  // slabs: uniform over the block
#pragma unroll
      for (int jj = 0; jj < NJ / 2; jj++) ldsm4(bq[jj], fb, 16 * jj * GB_P + ks * 8);
#pragma unroll
      for (int i = 0; i < MI; i++) {
        if (i >= slabs) continue;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
          const u32 b[2] = {bq[j >> 1][2 * (j & 1)], bq[j >> 1][2 * (j & 1) + 1]};
          mma16816(d[i][j], af[i], b);
        }
      }
    }
#endif
    // The next stage was last read before the previous iteration's final
    // barrier: its registers can land now, their loads' latency spent.
    if (kt + 1 < nk) land(st ^ 1);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const int m = gb_row(wm, i, g, q), n = gb_col(wn, j, t, q);
        if (m >= M || n >= N) continue;
        O* p = C + m * ldc + n;
        if constexpr (sizeof(O) == sizeof(float)) {
          *p = acc ? *p + d[i][j][q] : d[i][j][q];
        } else {
          put(p, d[i][j][q]);
        }
      }
}

// grouped_fwd is the forward grouped products' block: columns
// 64·blockIdx.x.. of the rows of tile map entry blockIdx.y (an expert and
// its tile of MOE_TILE rows; -1: none).
template <typename O, bool FEW>
__device__ __forceinline__ void grouped_fwd(O* __restrict__ C, const bf16_t* __restrict__ A,
                                            const bf16_t* __restrict__ B, const int* __restrict__ off,
                                            const int* __restrict__ tiles, int N, int K, i64 lda, i64 ldc, i64 wstride,
                                            int acc, int vec, int async) {
  const int e = tiles[2 * blockIdx.y];
  if (e < 0) return;
  const int r0 = off[e] + tiles[2 * blockIdx.y + 1] * MOE_TILE, n0 = blockIdx.x * 64;
  gb_tile<false, false, O, FEW>(C + r0 * ldc + n0, ldc, A + r0 * lda, lda, B + e * wstride + (i64)n0 * K, K,
                                min(MOE_TILE, off[e + 1] - r0), min(64, N - n0), K, acc, vec, async);
}

// gemm_bf16_grouped: the forward, C[r, n] (+)= sum_k A[r*lda + k] W_e[n*K + k]
// for every grouped row r of expert e (the bf16 rollout's and the bf16
// mode's expert products). grid = (ceil(N/64), ceil(R/64) + E).
extern "C" __global__ void __launch_bounds__(128) gemm_bf16_grouped(
    float* __restrict__ C, const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, const int* __restrict__ off,
    const int* __restrict__ tiles, int N, int K, i64 lda, i64 ldc, i64 wstride, int acc, int vec, int async) {
  grouped_fwd<float, false>(C, A, B, off, tiles, N, K, lda, ldc, wstride, acc, vec, async);
}

// gemm_bf16_grouped_few is gemm_bf16_grouped with gb_tile's few-row
// warps (64 x 16 each, empty 16-row slabs skipped): the same bits, for
// products whose experts get few rows each (a decoding step's).
extern "C" __global__ void __launch_bounds__(128) gemm_bf16_grouped_few(
    float* __restrict__ C, const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, const int* __restrict__ off,
    const int* __restrict__ tiles, int N, int K, i64 lda, i64 ldc, i64 wstride, int acc, int vec, int async) {
  grouped_fwd<float, true>(C, A, B, off, tiles, N, K, lda, ldc, wstride, acc, vec, async);
}

// gemm_bf16_grouped_c16 is gemm_bf16_grouped with C in bf16 (acc 0): the
// bf16 training mode's expert outputs (gate and up, down), each the
// float32 sum rounded once (gemm_bf16_grouped's output rounded, bit for
// bit).
extern "C" __global__ void __launch_bounds__(128) gemm_bf16_grouped_c16(
    bf16_t* __restrict__ C, const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, const int* __restrict__ off,
    const int* __restrict__ tiles, int N, int K, i64 lda, i64 ldc, i64 wstride, int vec, int async) {
  grouped_fwd<bf16_t, false>(C, A, B, off, tiles, N, K, lda, ldc, wstride, 0, vec, async);
}

// gemm_bf16_grouped_c16_few is gemm_bf16_grouped_c16 with the few-row
// warps (gemm_bf16_grouped_few): the same bits.
extern "C" __global__ void __launch_bounds__(128) gemm_bf16_grouped_c16_few(
    bf16_t* __restrict__ C, const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, const int* __restrict__ off,
    const int* __restrict__ tiles, int N, int K, i64 lda, i64 ldc, i64 wstride, int vec, int async) {
  grouped_fwd<bf16_t, true>(C, A, B, off, tiles, N, K, lda, ldc, wstride, 0, vec, async);
}

// gemm_bf16_grouped_dx: the input's gradient, C[r, j] (+)= sum_n
// A[r*lda + n] W_e[n*K + j] for every grouped row r of expert e (A the
// output's gradient [R, N], the weights [N, K] read transposed); C is
// [R, K]. grid = (ceil(K/64), ceil(R/64) + E).
extern "C" __global__ void __launch_bounds__(128) gemm_bf16_grouped_dx(
    float* __restrict__ C, const bf16_t* __restrict__ A, const bf16_t* __restrict__ B, const int* __restrict__ off,
    const int* __restrict__ tiles, int N, int K, i64 lda, i64 ldc, i64 wstride, int acc, int vec, int async) {
  const int e = tiles[2 * blockIdx.y];
  if (e < 0) return;
  const int r0 = off[e] + tiles[2 * blockIdx.y + 1] * MOE_TILE, j0 = blockIdx.x * 64;
  gb_tile<false, true>(C + r0 * ldc + j0, ldc, A + r0 * lda, lda, B + e * wstride + j0, K,
                       min(MOE_TILE, off[e + 1] - r0), min(64, K - j0), N, acc, vec, async);
}

// gemm_bf16_grouped_dw: the weights' gradient, dW_e[n*K + j] += sum over
// expert e's grouped rows r of A[r*lda + n] X[r*ldx + j] (A the output's
// gradient [R, N], X the input [R, K], both read transposed: the sum runs
// over rows), into dW_e at C + e*wstride. grid = (ceil(K/64),
// ceil(N/64), E); an expert without rows adds nothing.
extern "C" __global__ void __launch_bounds__(128) gemm_bf16_grouped_dw(
    float* __restrict__ C, const bf16_t* __restrict__ A, const bf16_t* __restrict__ X, const int* __restrict__ off,
    int N, int K, i64 lda, i64 ldx, i64 wstride, int vec, int async) {
  const int e = blockIdx.z, r0 = off[e], rows = off[e + 1] - r0;
  if (rows <= 0) return;
  const int n0 = blockIdx.y * 64, j0 = blockIdx.x * 64;
  gb_tile<true, true>(C + e * wstride + (i64)n0 * K + j0, K, A + r0 * lda + n0, lda, X + r0 * ldx + j0, ldx,
                      min(64, N - n0), min(64, K - j0), rows, 1, vec, async);
}
