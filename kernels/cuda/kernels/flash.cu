// Causal grouped-query attention on the tensor cores, for the bf16
// training mode: q, k, v and dO are rounded to bf16 as they enter the
// products, P and dS are rounded to bf16 before theirs, and everything is
// accumulated in float32 (the FlashAttention-2 scheme: no T x T matrix in
// memory, the softmax online). Layouts as attn.cu's: q, out, dO
// [T, heads*hd], k, v [T, kv*hd], lse and dsum [T, heads]; seq_start[t]
// and seq_end[t] bound token t's packed sequence. Not batch invariant and
// not bit-equal to attn.cu (the exact mode keeps attn.cu); deterministic:
// no atomics, every sum in a fixed order.
//
// Three kernels per head size HD (32, 64, 128): the forward, and the
// backward as two passes, dQ per query tile (flash_bwd_dq, which also
// saves D = dO.O per row and head) and dK, dV per key tile (flash_bwd_dkv).
// Or the backward as three (Ops.FlashDQStored): D (flash_bwd_dsum), dK
// and dV storing the bf16 dS tiles they compute (flash_bwd_dkv_ds), and
// dQ from those (flash_bwd_dq_ds): the dQ pass's score and dP products
// not done twice, for T²·heads bytes of device memory.
// They read row-major bf16 copies of their operands [Tp, width] with rows
// T..Tp-1 zero (Ops' FlashScratch, or the training engine's own), Tp = T
// rounded up to 128, so that every tile is copied into shared memory 16
// bytes at a time and starts at a multiple of its size (the masks drop
// keys before a sequence). v's rows, and the backward's dv's, are ldv
// apart (kv·hd for a copy of its own; wider where v is a column span of
// the training engine's q, k and v). A product that needs an operand transposed
// (P·V, dS·K, Pᵀ·dO, dSᵀ·Q) takes its fragments through ldmatrix's
// transpose (ldsm4t) rather than from a transposed copy.

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
#define FA_BQ 64  // query rows of a forward or dQ block: 4 warps of 16
#define FA_BK 64  // keys of a forward tile, and of a dK/dV block
#define FB_BK 32  // keys of a dQ tile
#define FB_BQ 16  // queries of a dK/dV tile (flash_bwd_dkv_w: 32)

// DS_TILE is a stored dS tile's words: dS^T of a key block and a query
// tile, FA_BK rows (keys) of 32 bf16 (queries), 16 words a row.
#define DS_TILE (FA_BK * 16)

// FA_THREADS is every flash kernel's block: four warps.
#define FA_THREADS 128

// copy_tile copies R rows of C 16-byte chunks (row r at src + r*ld) into
// shared memory (row r at dst + r*pitch words): thread x takes chunk x % C
// of rows x / C, x / C + FA_THREADS / C, ... Row and column, the row
// step and the shared address are computed once a call, and the kernels
// are compiled with async a constant (WITH_ASYNC_CONSTANT), so each chunk
// is a cp.async and a few additions (13 instructions at sm_90, from 37:
// the copies' addressing had cost a dQ tile as many instructions as its
// products and softmax). The loops are unrolled with UNROLL (the
// backward's, a few chunks a thread: 4 instructions a chunk, not 13);
// else rolled: unrolled, the compiler keeps every chunk's offset in
// registers across the kernel's loop, and the forward spills.
template <int R, int C, bool UNROLL = false>
__device__ __forceinline__ void copy_tile(u32* dst, int pitch, const bf16_t* src, i64 ld, int async) {
  static_assert(FA_THREADS % C == 0, "a thread's chunks share a column");
  constexpr int RS = FA_THREADS / C, IT = (R + RS - 1) / RS;  // rows a step, steps
  // Offsets in 32 bits (a tile's span of its copy is far below 2^31
  // elements): those the compiler keeps across a kernel's loop take one
  // register, not two.
  const int r = threadIdx.x / C, c = threadIdx.x % C, step = RS * (int)ld;
  u32* d = dst + r * pitch + 4 * c;
  const bf16_t* s = src + (r * (int)ld + 8 * c);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (async) {
    const u32 sa = shared_address(d);
    if constexpr (UNROLL) {
#pragma unroll
      for (int i = 0; i < IT; i++)
        if (R % RS == 0 || r + i * RS < R) copy16_async(sa + 4 * i * RS * pitch, s + i * step);
    } else {
#pragma unroll 1
      for (int i = 0; i < IT; i++)
        if (R % RS == 0 || r + i * RS < R) copy16_async(sa + 4 * i * RS * pitch, s + i * step);
    }
    return;
  }
#endif
  // Plain copies (before sm_80, KEEL_FLASH_COPY=sync, the emulator) one at
  // a time: unrolled, their loads would all be hoisted, a tile's worth of
  // registers held in every kernel that has this path.
#pragma unroll 1
  for (int i = 0; i < IT; i++)
    if (R % RS == 0 || r + i * RS < R) *(u32x4*)(d + i * RS * pitch) = *(const u32x4*)(s + i * step);
}

// copy_rows copies N rows of HD bf16 (row r at src + r*ld) into dst, rows
// pitch words apart.
template <int HD, int N, bool UNROLL = false>
__device__ __forceinline__ void copy_rows(u32* dst, int pitch, const bf16_t* src, i64 ld, int async) {
  copy_tile<N, HD / 8, UNROLL>(dst, pitch, src, ld, async);
}

// load_a reads a warp's A fragments of a 16 x HD block of a row-major
// bf16 copy: rows r0 and r0 + 8 of src.
template <int HD>
__device__ __forceinline__ void load_a(u32 (&a)[HD / 16][4], const bf16_t* src, i64 ld, int r0, int t) {
  const u32* p0 = (const u32*)(src + r0 * ld);
  const u32* p1 = (const u32*)(src + (r0 + 8) * ld);
#pragma unroll
  for (int ks = 0; ks < HD / 16; ks++) {
    a[ks][0] = p0[ks * 8 + t];
    a[ks][1] = p1[ks * 8 + t];
    a[ks][2] = p0[ks * 8 + t + 4];
    a[ks][3] = p1[ks * 8 + t + 4];
  }
}

// quad_sum and quad_max reduce over the four lanes that share a row of an
// mma tile.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// c_to_a packs two 16x8 float32 tiles of mma results (k = 0..7 and
// 8..15 of the next product) into that product's A fragment, as bf16.
__device__ __forceinline__ void c_to_a(u32 (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16_rn(lo[0], lo[1]);
  a[1] = pack_bf16_rn(lo[2], lo[3]);
  a[2] = pack_bf16_rn(hi[0], hi[1]);
  a[3] = pack_bf16_rn(hi[2], hi[3]);
}

// store_tile writes a warp's 16 x HD float32 tile acc into rows r0 (times
// s0) and r0 + 8 (times s1) of dst (float32, or rounded to bf16), rows ld
// apart, skipping rows at or past T.
template <int HD, typename O>
__device__ __forceinline__ void store_tile(O* dst, i64 ld, const float (&acc)[HD / 8][4], int r0, int T, float s0,
                                           float s1, int t) {
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    const int c = n * 8 + 2 * t;
    if (r0 < T) {
      put(dst + r0 * ld + c, acc[n][0] * s0);
      put(dst + r0 * ld + c + 1, acc[n][1] * s0);
    }
    if (r0 + 8 < T) {
      put(dst + (r0 + 8) * ld + c, acc[n][2] * s1);
      put(dst + (r0 + 8) * ld + c + 1, acc[n][3] * s1);
    }
  }
}

// QRegs hands a warp's Q fragments out of registers, loaded once
// (load_a); QShared reads them from the block's Q tile in shared memory
// (rows KP words apart, from the warp's first row) each time: 64 registers
// freer at head size 128, for key tiles four times as long.
template <int HD, int MT>
struct QRegs {
  const u32 (&qa)[MT][HD / 16][4];
  __device__ __forceinline__ void get(int mt, int ks, u32 (&a)[4]) const {
    a[0] = qa[mt][ks][0], a[1] = qa[mt][ks][1], a[2] = qa[mt][ks][2], a[3] = qa[mt][ks][3];
  }
};
template <int HD>
struct QShared {
  Frags q;  // frags(the warp's first Q row, lane_a(lane, HD / 2 + 4))
  __device__ __forceinline__ void get(int mt, int ks, u32 (&a)[4]) const {
    ldsm4(a, q, 16 * mt * (HD / 2 + 4) + ks * 8);
  }
};

// fa_exp2 is 2^x for the softmax's exponentials: on a GPU the special
// function unit's approximation (within 2 ulp) with subnormal results
// flushed to zero, one instruction where exp2f's care for subnormals
// costs three more per score; the C library's exp2f on keel's CPU
// emulator. The scores' exponentials are rounded to bf16 for their
// product, far coarser.
__device__ __forceinline__ float fa_exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// heaviest_first is the query tile a forward or dQ block takes: the last
// first. A query tile's work grows with its rows' positions in their
// sequence, and blocks start roughly in blockIdx order (x fastest, then
// the heads), so taking a head's tiles from the end starts a sequence's
// heaviest tiles before its lightest, and the grid ends on the first
// sequence's lightest tiles of the last head, which fill the
// multiprocessors the heavy ones leave idle (FlashAttention-2 schedules
// so too). It matters where sequences are long (2 × 16384); with many
// short ones packed together the tail is light either way. Each tile's
// arithmetic is unchanged: the same bits.
__device__ __forceinline__ int heaviest_first() { return gridDim.x - 1 - blockIdx.x; }

// scheduled gives the tile (a block of query or key rows) and head (or KV
// head) a block takes. With order (FlashScratch.UseOrder: the grid's tiles
// by their work, the heaviest first, over every packed sequence), block b
// in launch order (x fastest, then y) of the first gridDim.y - tail heads
// takes tile order[b % gridDim.x] of head b / gridDim.x, and of the last
// tail heads tile order[b' / tail] of head gridDim.y - tail + b' % tail
// (b' counted from the first of them): head after head, each starting on
// its heaviest tiles, so that blocks at work together share a head's keys
// and values in the L2 cache, then the last heads' tiles side by side, so
// that the grid ends on the lightest tiles of every sequence and of those
// heads. Ops.flashTail gives tail: every head by default (all side by
// side), the last few with KEEL_FLASH_ORDER=headwise. Taking each sequence's tiles from its end (heaviest_first), head
// after head, had left the last head's heavy tiles of the last sequences
// to start as the other blocks ended (a makespan some 15% past an even
// share at 8 x 2048 tokens, computed). Without order, tile fallback and
// head blockIdx.y. Each tile's arithmetic is unchanged: the same bits.
__device__ __forceinline__ void scheduled(const int* __restrict__ order, int tail, int fallback, int& tile, int& head) {
  if (order != nullptr) {
    const int b = blockIdx.y * gridDim.x + blockIdx.x, bulk = (gridDim.y - tail) * gridDim.x;
    if (b < bulk) {
      tile = order[b % gridDim.x];
      head = b / gridDim.x;
    } else {
      tile = order[(b - bulk) / tail];
      head = gridDim.y - tail + (b - bulk) % tail;
    }
  } else {
    tile = fallback;
    head = blockIdx.y;
  }
}

// warp_max_int is the largest of v over the warp, on every lane.
__device__ __forceinline__ int warp_max_int(int v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// flash_fwd_tile folds a tile of BK keys (K and V row-major in shared
// memory, rows HD/2 + 4 words apart, from key jt; V's fragments through
// ldmatrix's transpose) into a warp's MT
// row tiles: scores, the online softmax's update, and P·V. Each score
// sums its k slices in order, whichever source gives the Q fragments (QF:
// QRegs or QShared). The warp's rows are r0 = wr + g + 8e + 16mt; row r's
// keys are its sequence's start to r (none past T): one unsigned
// comparison a score, made only where masked (a tile not wholly inside
// every row's keys: the diagonal's, a sequence's first, the rows past T),
// the starts then read again rather than held in registers across the
// loop.
// The running maximum is taken over the raw scores and scaled after
// (sl2 > 0: the same maximum as over the scaled ones), each exponential's
// argument is one fused multiply-add, and the accumulated outputs are
// rescaled only when some row's maximum moved.
template <int HD, int MT, int BK, class QF>
__device__ __forceinline__ void flash_fwd_tile(const u32* Ks, const u32* Vs, float (&o)[MT][HD / 8][4],
                                               float (&m)[MT][2], float (&l)[MT][2], const QF& qf,
                                               const int* __restrict__ seq_start, int T, int wr, int jt, float sl2,
                                               int lane, bool masked) {
  constexpr int KS = HD / 16, ND = HD / 8, KP = HD / 2 + 4;
  static_assert(BK % 16 == 0 && ND % 2 == 0, "fragments are loaded for two 8-column blocks at a time");
  const int t = lane & 3;
  const float ninf = -__int_as_float(0x7f800000);
  const Frags kf = frags(Ks, lane_b2n(lane, KP));
  float s[MT][BK / 8][4];
#pragma unroll
  for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
    for (int mt = 0; mt < MT; mt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < KS; ks++) {
    u32 qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) qf.get(mt, ks, qa[mt]);
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt += 2) {
      u32 b[4];
      ldsm4(b, kf, nt * 8 * KP + ks * 8);
      const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma16816(s[mt][nt], qa[mt], b0);
        mma16816(s[mt][nt + 1], qa[mt], b1);
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    float mx0 = ninf, mx1 = ninf;
    if (masked) {
      int jb[2], len[2];  // the lane's first key of the tile less the row's first; the row's keys
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int r = wr + 16 * mt + (lane >> 2) + 8 * e, lo = r < T ? seq_start[r] : 0;
        jb[e] = jt + 2 * t - lo;
        len[e] = r < T ? r - lo + 1 : 0;
      }
#pragma unroll
      for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int jr = jb[e >> 1] + nt * 8 + (e & 1);  // key less the row's first
          if ((u32)jr >= (u32)len[e >> 1]) s[mt][nt][e] = ninf;
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
      mx0 = fmaxf(mx0, fmaxf(s[mt][nt][0], s[mt][nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[mt][nt][2], s[mt][nt][3]));
    }
    mx0 = fmaxf(m[mt][0], quad_max(mx0) * sl2);
    mx1 = fmaxf(m[mt][1], quad_max(mx1) * sl2);
    // A row with no key yet keeps 0 as its reference: exp2(-inf) = 0.
    const float ref0 = mx0 == ninf ? 0.f : mx0, ref1 = mx1 == ninf ? 0.f : mx1;
    const float c0 = fa_exp2(m[mt][0] - ref0), c1 = fa_exp2(m[mt][1] - ref1);
    m[mt][0] = mx0;
    m[mt][1] = mx1;
    l[mt][0] *= c0;
    l[mt][1] *= c1;
    // Multiplying by 1 changes no bit: skip it unless a maximum moved.
    if (__any_sync(0xffffffffu, c0 != 1.f || c1 != 1.f)) {
#pragma unroll
      for (int n = 0; n < ND; n++) {
        o[mt][n][0] *= c0;
        o[mt][n][1] *= c0;
        o[mt][n][2] *= c1;
        o[mt][n][3] *= c1;
      }
    }
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
      s[mt][nt][0] = fa_exp2(fmaf(s[mt][nt][0], sl2, -ref0));
      s[mt][nt][1] = fa_exp2(fmaf(s[mt][nt][1], sl2, -ref0));
      s[mt][nt][2] = fa_exp2(fmaf(s[mt][nt][2], sl2, -ref1));
      s[mt][nt][3] = fa_exp2(fmaf(s[mt][nt][3], sl2, -ref1));
      l[mt][0] += s[mt][nt][0] + s[mt][nt][1];
      l[mt][1] += s[mt][nt][2] + s[mt][nt][3];
    }
  }
  const Frags vf = frags(Vs, lane_a(lane, KP));
#pragma unroll
  for (int kk = 0; kk < BK / 16; kk++) {
    u32 pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) c_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
    for (int n = 0; n < ND; n += 2) {
      u32 b[4];
      ldsm4t(b, vf, kk * 16 * KP + n * 4);
      const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma16816(o[mt][n], pa[mt], b0);
        mma16816(o[mt][n + 1], pa[mt], b1);
      }
    }
  }
}

// flash_fwd: out = softmax(q k^T * scale) v over each row's sequence
// prefix, rounded to bf16 (the output projection's operand, and the
// backward's D), lse its log-sum-exp (natural log, as attn.cu's), from
// the row-major bf16 copies qb, kb and vb. A block takes
// 64·MT query rows of one head; warp w owns MT tiles of 16 rows (16·MT·w onwards) and
// walks the keys in tiles of BK in shared memory (K and V row-major, as
// bf16 pairs). Each K or V fragment read from shared
// memory feeds MT products: MT = 2 halves the shared-memory reads per
// product (the FlashAttention-2 layout) for more registers. With STAGES =
// 2 the next tile's copy is in flight while this one's products run
// (shared memory for two tiles). With QS (STAGES = 2 only) the block's Q
// rows are copied into Qs with the first tile and each tile reads its Q
// fragments there, instead of holding them in registers. A tile's keys
// are folded in SUB at a time (the scores of SUB keys in registers, not
// BK). grid = (ceil(T/(64·MT)), heads), block 128.
template <int HD, int MT, int BK, int STAGES, bool QS = false, int SUB = BK>
__device__ __forceinline__ void flash_fwd(u32* Qs, u32* Ks, u32* Vs, bf16_t* __restrict__ out, float* __restrict__ lse,
                                          const bf16_t* __restrict__ qb, const bf16_t* __restrict__ kb,
                                          const bf16_t* __restrict__ vb, const int* __restrict__ seq_start, int T,
                                          int Tp, int heads, int kv, float scale, int async, i64 ldv,
                                          const int* __restrict__ order, int tail) {
  constexpr int KS = HD / 16, ND = HD / 8, KP = HD / 2 + 4, BQ = 64 * MT;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int tile, h;
  scheduled(order, tail, heaviest_first(), tile, h);
  const int i0 = tile * BQ, grp = h / (heads / kv);
  const i64 qd = (i64)heads * HD, kvd = (i64)kv * HD;
  const int last = min(T, i0 + BQ) - 1, wr = i0 + 16 * MT * w;
  static_assert(!QS || STAGES == 2, "Q in shared memory comes with the first tile's copy");
  u32 qa[QS ? 1 : MT][QS ? 1 : KS][4];  // Q's fragments, unless QS
  float o[MT][ND][4], m[MT][2], l[MT][2];
  const float ninf = -__int_as_float(0x7f800000), sl2 = scale * FA_LOG2E;
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
      m[mt][e] = ninf;
      l[mt][e] = 0.f;
    }
    if constexpr (!QS) load_a<HD>(qa[mt], qb + (i64)i0 * qd + (i64)h * HD, qd, 16 * MT * w + 16 * mt + g, t);
#pragma unroll
    for (int n = 0; n < ND; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }
  // A key tile from key j on needs no mask where each of the warp's rows
  // is below T, at or after the tile's last key, and in a sequence that
  // starts at or before j: j >= lmax (the latest start, the last row's:
  // starts never fall along the rows) and the tile's last key <= wr.
  const int lmax = wr + 16 * MT <= T ? seq_start[wr + 16 * MT - 1] : 1 << 30;
  constexpr int KT = BK * KP;  // a stage's words of K, and of V
  const int j0 = seq_start[i0] & -BK;
  if (STAGES == 2) {
    // The copy rows stop at Tp: i0 + BQ <= Tp (a multiple of 128).
    if constexpr (QS) copy_rows<HD, BQ>(Qs, KP, qb + (i64)i0 * qd + (i64)h * HD, qd, async);
    copy_rows<HD, BK>(Ks, KP, kb + (i64)j0 * kvd + (i64)grp * HD, kvd, async);
    copy_rows<HD, BK>(Vs, KP, vb + (i64)j0 * ldv + (i64)grp * HD, ldv, async);
    copies_commit(async);
  }
  for (int jt = j0, stage = 0; jt <= last; jt += BK, stage ^= STAGES - 1) {
    u32 *K = Ks + stage * KT, *V = Vs + stage * KT;
    if (STAGES == 2) {
      // The next tile's copy into the other stage, which every warp is
      // done with (the barrier at the end of the last iteration).
      if (jt + BK <= last) {
        copy_rows<HD, BK>(Ks + (stage ^ 1) * KT, KP, kb + (i64)(jt + BK) * kvd + (i64)grp * HD, kvd, async);
        copy_rows<HD, BK>(Vs + (stage ^ 1) * KT, KP, vb + (i64)(jt + BK) * ldv + (i64)grp * HD, ldv, async);
      }
      copies_commit(async);  // perhaps empty: wait_prev then still means this tile
      copies_wait_prev(async);
      __syncthreads();
    } else {
      __syncthreads();
      copy_rows<HD, BK>(Ks, KP, kb + (i64)jt * kvd + (i64)grp * HD, kvd, async);
      copy_rows<HD, BK>(Vs, KP, vb + (i64)jt * ldv + (i64)grp * HD, ldv, async);
      copies_done(async);
      __syncthreads();
    }
    // Rolled: the sub-tiles' scores and fragments unrolled side by side
    // spill the head-size-128 kernel's registers.
#pragma unroll 1
    for (int sub = 0; sub < BK; sub += SUB) {
      if (wr + 16 * MT - 1 < jt + sub) continue;  // keys past the warp's last row
      const bool masked = !(jt + sub >= lmax && jt + sub + SUB - 1 <= wr);
      if constexpr (QS) {
        flash_fwd_tile<HD, MT, SUB>(K + sub * KP, V + sub * KP, o, m, l,
                                        QShared<HD>{frags(Qs + 16 * MT * w * KP, lane_a(lane, KP))}, seq_start, T, wr, jt + sub,
                                        sl2, lane, masked);
      } else {
        flash_fwd_tile<HD, MT, SUB>(K + sub * KP, V + sub * KP, o, m, l, QRegs<HD, MT>{qa}, seq_start, T, wr, jt + sub, sl2,
                                        lane, masked);
      }
    }
    if (STAGES == 2) __syncthreads();  // this stage is free for the copy after next
  }
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    const float l0 = quad_sum(l[mt][0]), l1 = quad_sum(l[mt][1]);
    const int r0 = wr + 16 * mt + g, r1 = r0 + 8;
    store_tile<HD>(out + (i64)h * HD, qd, o[mt], r0, T, 1.f / l0, 1.f / l1, t);
    if (t == 0 && r0 < T) lse[(i64)r0 * heads + h] = m[mt][0] * FA_LN2 + logf(l0);
    if (t == 0 && r1 < T) lse[(i64)r1 * heads + h] = m[mt][1] * FA_LN2 + logf(l1);
  }
}

// dq_tile_copy copies the dQ pass's key tile from key jt into stage S:
// K and V row-major (FB_BK rows of KP words each).
template <int HD>
__device__ __forceinline__ void dq_tile_copy(u32* Ks, u32* Vs, const bf16_t* __restrict__ kb,
                                             const bf16_t* __restrict__ vb, int jt, int grp, i64 kvd, i64 ldv, int async) {
  constexpr int KP = HD / 2 + 4;
  copy_rows<HD, FB_BK, true>(Ks, KP, kb + (i64)jt * kvd + (i64)grp * HD, kvd, async);
  copy_rows<HD, FB_BK, true>(Vs, KP, vb + (i64)jt * ldv + (i64)grp * HD, ldv, async);
}

// DQ_STAGE_WORDS is the shared memory of one stage of flash_bwd_dq, in
// words: K row-major, V row-major.
#define DQ_STAGE_WORDS(HD) (2 * FB_BK * ((HD) / 2 + 4))

// rows_dsum sets D0 and D1 to D = dO.O of rows r0 and r0 + 8 for head h,
// each lane of a quad summing its own columns of the rows, then the quad;
// and stores them into dsum (lane 0). dO comes from the warp's A
// fragments of its bf16 copy (load_a's: each lane's columns of the rows),
// as dP's product takes it (so that sum_j P_ij dP_ij and D_i cancel as
// they should), O as the forward rounded it.
template <int HD>
__device__ __forceinline__ void rows_dsum(float& D0, float& D1, float* __restrict__ dsum, const u32 (&da)[HD / 16][4],
                                          const bf16_t* __restrict__ out, int r0, int h, int T, int heads, int t) {
  const int r1 = r0 + 8;
  const i64 qd = (i64)heads * HD;
  D0 = 0.f, D1 = 0.f;
#pragma unroll
  for (int ks = 0; ks < HD / 16; ks++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      // Column ks·16 + 2t + (e & 1) + (e & 2)·4: fragment word e & 2 (row
      // r0) or (e & 2) + 1 (row r1), its low or high half.
      const int c = ks * 16 + 2 * t + (e & 1) + (e & 2) * 4, sh = (e & 1) ? 16 : 0;
      const float d0 = bf16_to_f32((bf16_t)(da[ks][e & 2] >> sh)), d1 = bf16_to_f32((bf16_t)(da[ks][(e & 2) + 1] >> sh));
      if (r0 < T) D0 = fmaf(d0, bf16_to_f32(out[(i64)r0 * qd + (i64)h * HD + c]), D0);
      if (r1 < T) D1 = fmaf(d1, bf16_to_f32(out[(i64)r1 * qd + (i64)h * HD + c]), D1);
    }
  }
  D0 = quad_sum(D0);
  D1 = quad_sum(D1);
  if (t == 0 && r0 < T) dsum[(i64)r0 * heads + h] = D0;
  if (t == 0 && r1 < T) dsum[(i64)r1 * heads + h] = D1;
}

// ds_times_k adds A · K to a warp's dQ tile acc (16 rows × HD): A the
// fragment of 16 keys' dS (16kk onwards in the tile), K's fragments from
// its row-major tile (kf: lane_a's offsets, KP words a row) through
// ldmatrix's transpose. The dQ passes' one product a key step.
template <int HD>
__device__ __forceinline__ void ds_times_k(float (&acc)[HD / 8][4], const u32 (&a)[4], const Frags& kf, int kk) {
  constexpr int KP = HD / 2 + 4;
#pragma unroll
  for (int n = 0; n < HD / 8; n += 2) {
    u32 b[4];
    ldsm4t(b, kf, kk * 16 * KP + n * 4);
    const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    mma16816(acc[n], a, b0);
    mma16816(acc[n + 1], a, b1);
  }
}

// flash_bwd_dq: for query rows i and head h, D_i = dO_i.O_i (into dsum;
// dO rounded to bf16 as dob holds it, O as the forward wrote it)
// and dq_i = scale * sum_j P_ij (dO_i.v_j - D_i) k_j, P recomputed from
// lse. Blocks as flash_fwd's; key tiles of FB_BK, K and V in shared
// memory row-major (kb, vb; K's fragments for dS·K through ldmatrix's
// transpose); Q and dO from qb and dob. With STAGES = 2 the next key
// tile's copy is in flight while this one's products run (Ks0 and Vs0 are the first stage's tiles,
// the second's DQ_STAGE_WORDS on; the same bits as one stage).
// grid = (ceil(T/FA_BQ), heads), block 128.
template <int HD, int STAGES>
__device__ __forceinline__ void flash_bwd_dq(u32* Ks0, u32* Vs0, float* __restrict__ dq, float* __restrict__ dsum,
                                             const bf16_t* __restrict__ out,
                                             const float* __restrict__ lse, const bf16_t* __restrict__ qb,
                                             const bf16_t* __restrict__ dob, const bf16_t* __restrict__ kb,
                                             const bf16_t* __restrict__ vb, const int* __restrict__ seq_start, int T,
                                             int Tp, int heads, int kv, float scale, int async, i64 ldv,
                                             const int* __restrict__ order, int tail) {
  constexpr int KS = HD / 16, ND = HD / 8, KP = HD / 2 + 4;
  constexpr int SW = DQ_STAGE_WORDS(HD);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int tile, h;
  scheduled(order, tail, heaviest_first(), tile, h);
  const int i0 = tile * FA_BQ, grp = h / (heads / kv);
  const i64 qd = (i64)heads * HD, kvd = (i64)kv * HD;
  const int last = min(T, i0 + FA_BQ) - 1;
  const int r0 = i0 + 16 * w + g, r1 = r0 + 8;
  const int st0 = r0 < T ? seq_start[r0] : T, st1 = r1 < T ? seq_start[r1] : T;
  const int smax = warp_max_int(max(st0, st1));  // the latest sequence start of the warp's rows
  const i64 base = (i64)i0 * qd + (i64)h * HD;
  u32 qa[KS][4], da[KS][4];
  load_a<HD>(qa, qb + base, qd, 16 * w + g, t);
  load_a<HD>(da, dob + base, qd, 16 * w + g, t);
  float D0, D1;
  rows_dsum<HD>(D0, D1, dsum, da, out, r0, h, T, heads, t);
  const float sl2 = scale * FA_LOG2E;
  const float L0 = r0 < T ? lse[(i64)r0 * heads + h] * FA_LOG2E : 0.f, L1 = r1 < T ? lse[(i64)r1 * heads + h] * FA_LOG2E : 0.f;
  float acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  const int j0 = seq_start[i0] & -FB_BK;
  if (STAGES == 2) {  // the first tile's copy
    dq_tile_copy<HD>(Ks0, Vs0, kb, vb, j0, grp, kvd, ldv, async);
    copies_commit(async);
  }
  for (int jt = j0, stage = 0; jt <= last; jt += FB_BK, stage ^= STAGES - 1) {
    u32 *Ks = Ks0 + stage * SW, *Vs = Vs0 + stage * SW;
    if (STAGES == 2) {
      // The next tile's copy into the other stage, which every warp is
      // done with (the barrier at the end of the last iteration).
      const int o = (stage ^ 1) * SW;
      if (jt + FB_BK <= last) dq_tile_copy<HD>(Ks0 + o, Vs0 + o, kb, vb, jt + FB_BK, grp, kvd, ldv, async);
      copies_commit(async);  // perhaps empty: wait_prev then still means this tile
      copies_wait_prev(async);
      __syncthreads();
    } else {
      __syncthreads();
      dq_tile_copy<HD>(Ks, Vs, kb, vb, jt, grp, kvd, ldv, async);
      copies_done(async);
      __syncthreads();
    }
    if (i0 + 16 * w + 15 >= jt) {  // else every key of the tile is after the warp's rows
      // No key of the tile past a row of the warp's or before its sequence
      // (rows past T have start T): no score to mask.
      const bool masked = !(jt + FB_BK - 1 <= i0 + 16 * w && jt >= smax);
      const Frags kf = frags(Ks, lane_b2k(lane, KP)), vf = frags(Vs, lane_b2k(lane, KP)), tf = frags(Ks, lane_a(lane, KP));
      float s[FB_BK / 8][4], dp[FB_BK / 8][4];
#pragma unroll
      for (int nt = 0; nt < FB_BK / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
      }
      // k-steps outside, key blocks inside: consecutive products go to
      // different accumulators (2·FB_BK/8 chains, not 2), so each waits
      // less on the last one's latency; each score still sums its k-steps
      // in order.
#pragma unroll
      for (int ks = 0; ks < KS; ks += 2) {
#pragma unroll
        for (int nt = 0; nt < FB_BK / 8; nt++) {
          u32 bk[4], bv[4];
          ldsm4(bk, kf, nt * 8 * KP + ks * 8);
          ldsm4(bv, vf, nt * 8 * KP + ks * 8);
          const u32 bk0[2] = {bk[0], bk[1]}, bk1[2] = {bk[2], bk[3]}, bv0[2] = {bv[0], bv[1]}, bv1[2] = {bv[2], bv[3]};
          mma16816(s[nt], qa[ks], bk0);
          mma16816(dp[nt], da[ks], bv0);
          mma16816(s[nt], qa[ks + 1], bk1);
          mma16816(dp[nt], da[ks + 1], bv1);
        }
      }
      // dS before the scale, from P masked: one branch a tile, not one a
      // score.
      if (masked) {
#pragma unroll
        for (int nt = 0; nt < FB_BK / 8; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int j = jt + nt * 8 + 2 * t + (e & 1), r = e < 2 ? r0 : r1, st = e < 2 ? st0 : st1;
            float p = fa_exp2(fmaf(s[nt][e], sl2, -(e < 2 ? L0 : L1)));
            if (!(j <= r && j >= st && r < T)) p = 0.f;
            s[nt][e] = p * (dp[nt][e] - (e < 2 ? D0 : D1));
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < FB_BK / 8; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            s[nt][e] = fa_exp2(fmaf(s[nt][e], sl2, -(e < 2 ? L0 : L1))) * (dp[nt][e] - (e < 2 ? D0 : D1));
      }
#pragma unroll
      for (int kk = 0; kk < FB_BK / 16; kk++) {
        u32 a[4];
        c_to_a(a, s[2 * kk], s[2 * kk + 1]);
        ds_times_k<HD>(acc, a, tf, kk);
      }
    }
    if (STAGES == 2) __syncthreads();  // this stage is free for the copy after next
  }
  store_tile<HD>(dq + (i64)h * HD, qd, acc, r0, T, scale, scale, t);
}

// DQS_STAGE_WORDS is the shared memory of one stage of flash_bwd_dq_ds, in
// words: K row-major (FB_BK rows of HD), then the key tile's dS^T for the
// block's FA_BQ queries (FB_BK rows of FA_BQ bf16).
#define DQS_SP (FA_BQ / 2 + 4)
#define DQS_STAGE_WORDS(HD) (FB_BK * ((HD) / 2 + 4) + FB_BK * DQS_SP)

// flash_bwd_dq_ds is flash_bwd_dq from the dS tiles that flash_bwd_dkv
// stored (DS; flash_bwd_dsum wrote D before it): dq_i = scale * sum_j
// dS_ij k_j, one product a key tile where flash_bwd_dq recomputes S and
// dP (two more) to get dS. The same tiles, rows, fragments and order as
// flash_bwd_dq, so the same bits wherever the two passes' dS are (the
// same scores' products, the same exponentials). dS^T comes from the
// tiles of the key block b the tile lies in (ds_off, as ds_store lays
// them out: the block's tiles for head h from ds_off[b] + h*n_b, n_b
// (ds_off[b+1] - ds_off[b]) / heads, a 32-query tile each, from query
// 64b), through ldmatrix's transpose, as K's fragments (K row-major).
// Two stages, the next tile's copy in flight. grid = (ceil(T/FA_BQ),
// heads), block 128.
template <int HD>
__device__ __forceinline__ void flash_bwd_dq_ds(u32* sm, float* __restrict__ dq, const u32* __restrict__ ds,
                                                const i64* __restrict__ ds_off, const bf16_t* __restrict__ kb,
                                                const int* __restrict__ seq_start, int T, int heads, int kv,
                                                float scale, int async, const int* __restrict__ order, int tail) {
  constexpr int ND = HD / 8, KP = HD / 2 + 4, SP = DQS_SP, SW = DQS_STAGE_WORDS(HD);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int tile, h;
  scheduled(order, tail, heaviest_first(), tile, h);
  const int i0 = tile * FA_BQ, grp = h / (heads / kv);
  const int last = min(T, i0 + FA_BQ) - 1, r0 = i0 + 16 * w + g;
  const int j0 = seq_start[i0] & -FB_BK;
  // copy stages key tile jt: K's FB_BK rows, then dS^T's, the block's
  // two query tiles side by side (16 words each).
  auto copy = [&](u32* S, int jt) {
    copy_rows<HD, FB_BK, true>(S, KP, kb + (i64)jt * kv * HD + (i64)grp * HD, (i64)kv * HD, async);
    const int b = jt / FA_BK;
    const i64 o = ds_off[b], n = (ds_off[b + 1] - o) / heads;
    const u32* src = ds + (o + (i64)h * n + (i0 - FA_BK * b) / 32) * DS_TILE + (jt - FA_BK * b) * 16;
    copy_tile<FB_BK, 4, true>(S + FB_BK * KP, SP, (const bf16_t*)src, 32, async);
    copy_tile<FB_BK, 4, true>(S + FB_BK * KP + 16, SP, (const bf16_t*)(src + DS_TILE), 32, async);
  };
  float acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  copy(sm, j0);
  copies_commit(async);
  for (int jt = j0, stage = 0; jt <= last; jt += FB_BK, stage ^= 1) {
    const u32* S = sm + stage * SW;
    if (jt + FB_BK <= last) copy(sm + (stage ^ 1) * SW, jt + FB_BK);
    copies_commit(async);  // perhaps empty: wait_prev then still means this tile
    copies_wait_prev(async);
    __syncthreads();
    if (i0 + 16 * w + 15 >= jt) {  // else every key of the tile is after the warp's rows: dS zero
      const Frags kf = frags(S, lane_a(lane, KP)), sf = frags(S + FB_BK * KP, lane_at(lane, SP));
#pragma unroll
      for (int kk = 0; kk < FB_BK / 16; kk++) {
        u32 a[4];
        ldsm4t(a, sf, kk * 16 * SP + 8 * w);
        ds_times_k<HD>(acc, a, kf, kk);
      }
    }
    __syncthreads();  // this stage is free for the copy after next
  }
  store_tile<HD>(dq + (i64)h * HD, (i64)heads * HD, acc, r0, T, scale, scale, t);
}

// flash_bwd_dsum writes D = dO.O (dsum) for the rows and heads of
// flash_bwd_dq's blocks, as flash_bwd_dq computes it, for the passes that
// need it first (flash_bwd_dkv with DS). grid = (ceil(T/FA_BQ), heads),
// block 128.
template <int HD>
__device__ __forceinline__ void flash_bwd_dsum(float* __restrict__ dsum, const bf16_t* __restrict__ dob,
                                               const bf16_t* __restrict__ out, int T, int heads) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, i0 = blockIdx.x * FA_BQ, h = blockIdx.y;
  u32 da[HD / 16][4];
  load_a<HD>(da, dob + (i64)i0 * heads * HD + (i64)h * HD, (i64)heads * HD, 16 * w + (lane >> 2), lane & 3);
  float D0, D1;
  rows_dsum<HD>(D0, D1, dsum, da, out, i0 + 16 * w + (lane >> 2), h, T, heads, lane & 3);
}

// dkv_tile_copy copies the dK/dV pass's query tile (BQ rows it.., head
// h) into stage S: Q and dO row-major (BQ rows of KP words each).
template <int HD, int BQ>
__device__ __forceinline__ void dkv_tile_copy(u32* S, const bf16_t* __restrict__ qb, const bf16_t* __restrict__ dob,
                                              int it, int h, i64 qd, int async) {
  constexpr int KP = HD / 2 + 4, RW = BQ * KP;
  const i64 rb = (i64)it * qd + (i64)h * HD;
  copy_rows<HD, BQ, true>(S, KP, qb + rb, qd, async);
  copy_rows<HD, BQ, true>(S + RW, KP, dob + rb, qd, async);
}

// DKV_STAGE_WORDS is the shared memory of one stage of flash_bwd_dkv with
// query tiles of BQ, in words: dkv_tile_copy's tiles, then the tile's
// log2-scaled lse, D and sequence starts (BQ each); DKV_V_WORDS the
// block's V (or K) before them.
#define DKV_STAGE_WORDS(HD, BQ) (2 * (BQ) * ((HD) / 2 + 4) + 3 * (BQ))
#define DKV_V_WORDS(HD) (FA_BK * ((HD) / 2 + 4))

// dkv_row_stats reads query row i's log2-scaled lse, D and sequence start
// for head h (zeros and T past the last row).
__device__ __forceinline__ void dkv_row_stats(float& L, float& D, int& st, const float* __restrict__ lse,
                                              const float* __restrict__ dsum, const int* __restrict__ seq_start,
                                              int i, int h, int T, int heads) {
  L = i < T ? lse[(i64)i * heads + h] * FA_LOG2E : 0.f;
  D = i < T ? dsum[(i64)i * heads + h] : 0.f;
  st = i < T ? seq_start[i] : T;
}

// dkv_stats_store puts query row c's statistics (dkv_row_stats) into the
// tail of stage S.
template <int HD, int BQ>
__device__ __forceinline__ void dkv_stats_store(u32* S, int c, float L, float D, int st) {
  constexpr int RW = BQ * (HD / 2 + 4);
  float* f = (float*)(S + 2 * RW);
  f[c] = L;
  f[BQ + c] = D;
  ((int*)f)[2 * BQ + c] = st;
}

// ds_store writes warp w's part of the bf16 dS^T of query tile (head h,
// queries qo.. past the key block's first) as the dK product takes it
// (sa, from c_to_a: queries 16kq.. of keys 16w + g and 16w + g + 8)
// into the block's tiles from ds0, dsn tiles a head: tile ds0 + h*dsn +
// qo/32, keys as rows. The dQ pass (flash_bwd_dq_ds) reads them back.
__device__ __forceinline__ void ds_store(u32* __restrict__ ds, i64 ds0, i64 dsn, int h, int qo, int w, int g, int t,
                                         int kq, const u32 (&sa)[4]) {
  u32* p = ds + (ds0 + (i64)h * dsn + (qo >> 5)) * DS_TILE + (16 * w + g) * 16 + 8 * kq + t;
  p[0] = sa[0];
  p[8 * 16] = sa[1];
  p[4] = sa[2];
  p[8 * 16 + 4] = sa[3];
}

// flash_bwd_dkv: for key rows j and KV head grp, over the query heads of
// the group and the rows i >= j of the sequence: dv_j = sum P_ij dO_i
// (rounded to bf16: the v product's gradient operand, all that reads it)
// and dk_j = scale * sum P_ij (dO_i.v_j - D_i) q_i (float32). A block takes FA_BK keys,
// warp w keys 16w..16w+15 (K as A fragments in registers, V in shared
// memory), and walks the queries of each head in turn in tiles of BQ (Q
// and dO in shared memory row-major, from qb and dob; their fragments for
// dK's and dV's products through ldmatrix's transpose). With STAGES = 2 the next tile's copy is in flight while
// this one's products run, and its rows' lse, D and starts are read into
// registers then (the same bits as one stage). smem: DKV_V_WORDS (with
// KSM, K's DKV_V_WORDS first), then STAGES of DKV_STAGE_WORDS(HD, BQ).
// grid = (ceil(T/FA_BK), kv), block 128.
//
// BQ = 32 (flash_bwd_dkv_w) halves the barriers and per-tile work
// (copies' issue, row statistics, the mask's test) a product, and gives
// the score products eight independent accumulators where 16 gives four
// (session 20's Nsight Compute: this kernel's warps mostly wait on
// fixed-latency dependencies and barriers, two warps a scheduler). Its
// larger tiles leave no registers for K at head size 128, so there K's
// fragments are read from shared memory (KSM) each tile. The same
// products in the same order as BQ = 16, so the same bits: a 32-query
// tile's two halves accumulate into dK and dV in turn, as two 16-query
// tiles do, and the half before a warp's keys, which BQ = 16 skips,
// adds exact zeros (its P masked).
template <int HD, int STAGES, int BQ = FB_BQ, bool KSM = false, bool DS = false>
__device__ __forceinline__ void flash_bwd_dkv(u32* smem, float* __restrict__ dk, bf16_t* __restrict__ dv,
                                              const float* __restrict__ lse, const float* __restrict__ dsum,
                                              const bf16_t* __restrict__ qb, const bf16_t* __restrict__ dob,
                                              const bf16_t* __restrict__ kb, const bf16_t* __restrict__ vb,
                                              const int* __restrict__ seq_start, const int* __restrict__ seq_end, int T,
                                              int Tp, int heads, int kv, float scale, int async, i64 ldv,
                                              const int* __restrict__ order, int tail, u32* __restrict__ ds = nullptr,
                                              const i64* __restrict__ ds_off = nullptr) {
  constexpr int KS = HD / 16, ND = HD / 8, KP = HD / 2 + 4, RW = BQ * KP;
  constexpr int SW = DKV_STAGE_WORDS(HD, BQ);
  static_assert(!DS || BQ == 32, "dS tiles are 32 queries wide");
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  int kb0, grp;  // the key block, and the KV head
  scheduled(order, tail, blockIdx.x, kb0, grp);
  const int j0 = kb0 * FA_BK, group = heads / kv;
  const i64 qd = (i64)heads * HD, kvd = (i64)kv * HD;
  const int last = min(T, j0 + FA_BK) - 1;
  // With DS the query tiles run on to a multiple of FA_BQ, the dQ pass's
  // blocks, which read every tile of theirs (past the sequence: zeros).
  const int qend = DS ? min(Tp, (seq_end[last] + FA_BQ - 1) & -FA_BQ) : seq_end[last];
  // dS tiles: this block's first, and how many a head.
  const i64 ds0 = DS ? ds_off[kb0] : 0, dsn = DS ? (ds_off[kb0 + 1] - ds0) / heads : 0;
  const int kr0 = j0 + 16 * w + g, kr1 = kr0 + 8;
  const int h0 = grp * group, h1 = h0 + group;
  u32* Ks = smem;  // with KSM
  u32* Vs = KSM ? smem + DKV_V_WORDS(HD) : smem;
  u32* stages = Vs + DKV_V_WORDS(HD);
  // V's (and K's) copy completes with the first query tile's.
  copy_rows<HD, FA_BK>(Vs, KP, vb + (i64)j0 * ldv + (i64)grp * HD, ldv, async);
  if constexpr (KSM) copy_rows<HD, FA_BK>(Ks, KP, kb + (i64)j0 * kvd + (i64)grp * HD, kvd, async);
  if (STAGES == 2) {
    dkv_tile_copy<HD, BQ>(stages, qb, dob, j0, h0, qd, async);
    copies_commit(async);
    if (threadIdx.x < BQ) {
      float L, D;
      int st;
      dkv_row_stats(L, D, st, lse, dsum, seq_start, j0 + threadIdx.x, h0, T, heads);
      dkv_stats_store<HD, BQ>(stages, threadIdx.x, L, D, st);
    }
  }
  u32 ka[KSM ? 1 : KS][4];  // K's A fragments, in registers without KSM
  if constexpr (!KSM) load_a<HD>(ka, kb + (i64)j0 * kvd + (i64)grp * HD, kvd, 16 * w + g, t);
  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) {
    dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
    dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
  }
  const float sl2 = scale * FA_LOG2E;
  // The query tiles (h, it), head by head; stage alternates with STAGES = 2.
  for (int h = h0, it = j0, stage = 0; h < h1; stage ^= STAGES - 1) {
    int nh = h, nit = it + BQ;  // the next tile
    if (nit >= qend) nh = h + 1, nit = j0;
    u32* S = stages + stage * SW;
    float nL = 0.f, nD = 0.f;
    int nst = 0;
    if (STAGES == 2) {
      if (nh < h1) {
        dkv_tile_copy<HD, BQ>(stages + (stage ^ 1) * SW, qb, dob, nit, nh, qd, async);
        if (threadIdx.x < BQ) dkv_row_stats(nL, nD, nst, lse, dsum, seq_start, nit + threadIdx.x, nh, T, heads);
      }
      copies_commit(async);
      copies_wait_prev(async);
      __syncthreads();
    } else {
      __syncthreads();
      dkv_tile_copy<HD, BQ>(S, qb, dob, it, h, qd, async);
      if (threadIdx.x < BQ) {
        float L, D;
        int st;
        dkv_row_stats(L, D, st, lse, dsum, seq_start, it + threadIdx.x, h, T, heads);
        dkv_stats_store<HD, BQ>(S, threadIdx.x, L, D, st);
      }
      copies_done(async);
      __syncthreads();
    }
    const u32 *Qs = S, *Ds = S + RW;
    const float* Ls = (const float*)(S + 2 * RW);
    const float* Dd = Ls + BQ;
    const int* Ss = (const int*)(Ls + 2 * BQ);
    if (it + BQ - 1 >= j0 + 16 * w) {  // else every query of the tile is before the warp's keys
      // Every query of the tile at or after each of the warp's keys, below
      // T, and in a sequence that holds them: no score to mask. The
      // tile's latest sequence start is its last row's (starts never fall
      // along the rows; T past the last).
      const int kw = j0 + 16 * w;
      const bool masked = !(it >= kw + 15 && it + BQ <= T && kw + 15 < T && kw >= Ss[BQ - 1]);
      const Frags qf = frags(Qs, lane_b2k(lane, KP)), df = frags(Ds, lane_b2k(lane, KP)), vf = frags(Vs + 16 * w * KP, lane_a(lane, KP));
      float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
      for (int nt = 0; nt < BQ / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
      }
      // k-steps outside (V's fragments read once for both query blocks),
      // query blocks inside: four accumulators in turn, each score
      // summing its k-steps in order.
#pragma unroll
      for (int ks = 0; ks < KS; ks += 2) {
        u32 va0[4], va1[4], ka0[4], ka1[4];
        ldsm4(va0, vf, ks * 8);
        ldsm4(va1, vf, ks * 8 + 8);
        if constexpr (KSM) {
          const Frags kf = frags(Ks + 16 * w * KP, lane_a(lane, KP));
          ldsm4(ka0, kf, ks * 8);
          ldsm4(ka1, kf, ks * 8 + 8);
        } else {
#pragma unroll
          for (int m = 0; m < 4; m++) ka0[m] = ka[ks][m], ka1[m] = ka[ks + 1][m];
        }
#pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++) {
          u32 bq[4], bd[4];
          ldsm4(bq, qf, nt * 8 * KP + ks * 8);
          ldsm4(bd, df, nt * 8 * KP + ks * 8);
          const u32 bq0[2] = {bq[0], bq[1]}, bq1[2] = {bq[2], bq[3]}, bd0[2] = {bd[0], bd[1]}, bd1[2] = {bd[2], bd[3]};
          mma16816(s[nt], ka0, bq0);   // S^T = K Q^T
          mma16816(dp[nt], va0, bd0);  // dP^T = V dO^T
          mma16816(s[nt], ka1, bq1);
          mma16816(dp[nt], va1, bd1);
        }
      }
      // P, masked (one branch a tile, not one a score), then dS^T before
      // the scale.
#pragma unroll
      for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = fa_exp2(fmaf(s[nt][e], sl2, -Ls[nt * 8 + 2 * t + (e & 1)]));
      if (masked) {
#pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int c = nt * 8 + 2 * t + (e & 1), i = it + c, j = e < 2 ? kr0 : kr1;
            if (!(i < T && j <= i && j >= Ss[c] && j < T)) s[nt][e] = 0.f;
          }
      }
#pragma unroll
      for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dp[nt][e] = s[nt][e] * (dp[nt][e] - Dd[nt * 8 + 2 * t + (e & 1)]);
      // A k-step per 16 queries, in order: dV += P^T dO, dK += dS^T Q.
      const Frags dtf = frags(Ds, lane_a(lane, KP)), qtf = frags(Qs, lane_a(lane, KP));
#pragma unroll
      for (int kq = 0; kq < BQ / 16; kq++) {
        u32 pa[4], sa[4];
        c_to_a(pa, s[2 * kq], s[2 * kq + 1]);
        c_to_a(sa, dp[2 * kq], dp[2 * kq + 1]);
        if constexpr (DS) ds_store(ds, ds0, dsn, h, it - j0, w, g, t, kq, sa);
#pragma unroll
        for (int n = 0; n < ND; n += 2) {
          u32 bd[4], bq[4];
          ldsm4t(bd, dtf, kq * 16 * KP + n * 4);
          ldsm4t(bq, qtf, kq * 16 * KP + n * 4);
          const u32 bd0[2] = {bd[0], bd[1]}, bd1[2] = {bd[2], bd[3]}, bq0[2] = {bq[0], bq[1]}, bq1[2] = {bq[2], bq[3]};
          mma16816(dva[n], pa, bd0);
          mma16816(dka[n], sa, bq0);
          mma16816(dva[n + 1], pa, bd1);
          mma16816(dka[n + 1], sa, bq1);
        }
      }
    }  // with DS, the tile's dS rows of a warp that skips it stay unwritten: the dQ pass's warps skip them too
    if (STAGES == 2) {
      // The next tile's row statistics, read during this tile's products,
      // into the other stage; then every warp is done with this stage.
      if (nh < h1 && threadIdx.x < BQ) dkv_stats_store<HD, BQ>(stages + (stage ^ 1) * SW, threadIdx.x, nL, nD, nst);
      __syncthreads();
    }
    h = nh, it = nit;
  }
  store_tile<HD>(dk + (i64)grp * HD, kvd, dka, kr0, T, scale, scale, t);
  store_tile<HD>(dv + (i64)grp * HD, ldv, dva, kr0, T, 1.f, 1.f, t);
}

// The kernels, one set per head size, each with its shared memory (the
// names written out: keel's CUDA emulator finds kernels by name). Shared
// tiles are u32x4 arrays, 16-byte aligned, used as words.
//
// WITH_ASYNC_CONSTANT compiles stmt twice, with the copy flag async a
// constant 1 or 0 (shadowing the kernel's argument), and runs the one the
// argument names: each copy then compiles to cp.async or to plain copies
// alone, not to both under a predicate that every chunk issues.
#define WITH_ASYNC_CONSTANT(stmt) \
  if (async) {                     \
    constexpr int async = 1;       \
    stmt;                          \
  } else {                         \
    constexpr int async = 0;       \
    stmt;                          \
  }
#define FLASH_FWD_PARAMS                                                                                        \
  bf16_t *__restrict__ out, float *__restrict__ lse, const bf16_t *__restrict__ qb, const bf16_t *__restrict__ kb, \
      const bf16_t *__restrict__ vb, const int *__restrict__ seq_start, int T, int Tp, int heads, int kv, float scale, \
      int async, i64 ldv, const int *__restrict__ order, int tail
#define FLASH_FWD_BODY(HD, MT, BK, STAGES)                                                                   \
  __shared__ u32x4 Ks[STAGES * BK * (HD / 2 + 4) / 4];                                                       \
  __shared__ u32x4 Vs[STAGES * BK * (HD / 2 + 4) / 4];                                                       \
  WITH_ASYNC_CONSTANT((flash_fwd<HD, MT, BK, STAGES>(nullptr, (u32*)Ks, (u32*)Vs, out, lse, qb, kb, vb, seq_start, T, Tp, \
                                                     heads, kv, scale, async, ldv, order, tail)))
// The wide forward with Q in shared memory and 64-key tiles folded in SUB
// at a time, in dynamic shared memory (Ops.FlashAttention launches it with
// flashForwardShared's bytes): Q's 128 rows, then two stages of K, then
// two of V.
#define FLASH_FWDQ_BODY(HD, SUB)                                                                       \
  KEEL_DYNAMIC_SHARED(u32x4, fq##HD);                                                                   \
  u32* sm = (u32*)fq##HD;                                                                               \
  u32* ks = sm + 128 * (HD / 2 + 4);                                                                    \
  WITH_ASYNC_CONSTANT((flash_fwd<HD, 2, 64, 2, true, SUB>(sm, ks, ks + 2 * 64 * (HD / 2 + 4), out, lse, qb, kb, vb,    \
                                                          seq_start, T, Tp, heads, kv, scale, async, ldv, order, tail)))
#define FLASH_DQ_PARAMS                                                                                         \
  float *__restrict__ dq, float *__restrict__ dsum, const bf16_t *__restrict__ out,                                  \
      const float *__restrict__ lse, const bf16_t *__restrict__ qb, const bf16_t *__restrict__ dob,               \
      const bf16_t *__restrict__ kb, const bf16_t *__restrict__ vb,                                                \
      const int *__restrict__ seq_start, int T, int Tp, int heads, int kv, float scale, int async, i64 ldv,          \
      const int *__restrict__ order, int tail
#define FLASH_DQ_ARGS dq, dsum, out, lse, qb, dob, kb, vb, seq_start, T, Tp, heads, kv, scale, async, ldv, order, tail
#define FLASH_DKV_PARAMS                                                                                           \
  float *__restrict__ dk, bf16_t *__restrict__ dv, const float *__restrict__ lse, const float *__restrict__ dsum,    \
      const bf16_t *__restrict__ qb, const bf16_t *__restrict__ dob, const bf16_t *__restrict__ kb,                 \
      const bf16_t *__restrict__ vb,                                                                                \
      const int *__restrict__ seq_start, const int *__restrict__ seq_end, int T, int Tp, int heads, int kv,          \
      float scale, int async, i64 ldv, const int *__restrict__ order, int tail
#define FLASH_DKV_ARGS dk, dv, lse, dsum, qb, dob, kb, vb, seq_start, seq_end, T, Tp, heads, kv, scale, async, ldv, order, tail
// One stage in static shared memory; two (the pipelined kernels, _2) in
// dynamic shared memory: Ops.FlashAttentionBackward launches them with
// flashBackwardShared's bytes (kernels/cuda/ops.go).
#define FLASH_DQ_BODY(HD)                                                      \
  __shared__ u32x4 Ks[FB_BK * (HD / 2 + 4) / 4];                                 \
  __shared__ u32x4 Vs[FB_BK * (HD / 2 + 4) / 4];                                 \
  WITH_ASYNC_CONSTANT((flash_bwd_dq<HD, 1>((u32*)Ks, (u32*)Vs, FLASH_DQ_ARGS)))
#define FLASH_DQ2_BODY(HD)                                                     \
  KEEL_DYNAMIC_SHARED(u32x4, dq##HD);                                          \
  u32* sm = (u32*)dq##HD;                                                      \
  WITH_ASYNC_CONSTANT((flash_bwd_dq<HD, 2>(sm, sm + FB_BK * (HD / 2 + 4), FLASH_DQ_ARGS)))
#define FLASH_DKV_BODY(HD)                                             \
  __shared__ u32x4 sm[(DKV_V_WORDS(HD) + DKV_STAGE_WORDS(HD, FB_BQ)) / 4];    \
  WITH_ASYNC_CONSTANT((flash_bwd_dkv<HD, 1>((u32*)sm, FLASH_DKV_ARGS)))
#define FLASH_DKV2_BODY(HD)                             \
  KEEL_DYNAMIC_SHARED(u32x4, dkv##HD);                  \
  WITH_ASYNC_CONSTANT((flash_bwd_dkv<HD, 2>((u32*)dkv##HD, FLASH_DKV_ARGS)))
// The pipelined dK/dV pass with 32-query tiles, K in shared memory at
// head size 128 (Ops.FlashDKVWide).
#define FLASH_DKVW_BODY(HD)                             \
  KEEL_DYNAMIC_SHARED(u32x4, dkvw##HD);                 \
  WITH_ASYNC_CONSTANT((flash_bwd_dkv<HD, 2, 32, HD == 128>((u32*)dkvw##HD, FLASH_DKV_ARGS)))

// The dK/dV pass that also stores dS (flash_bwd_dkv's DS), the dQ pass
// from it and D's pass (Ops.FlashDQStored).
#define FLASH_DKVS_BODY(HD)                            \
  KEEL_DYNAMIC_SHARED(u32x4, dkvs##HD);                \
  WITH_ASYNC_CONSTANT((flash_bwd_dkv<HD, 2, 32, HD == 128, true>((u32*)dkvs##HD, FLASH_DKV_ARGS, ds, ds_off)))
#define FLASH_DQS_PARAMS                                                                                         \
  float *__restrict__ dq, const u32 *__restrict__ ds, const i64 *__restrict__ ds_off, const bf16_t *__restrict__ kb, \
      const int *__restrict__ seq_start, int T, int heads, int kv, float scale, int async, const int *__restrict__ order, \
      int tail
#define FLASH_DQS_BODY(HD)                                           \
  __shared__ u32x4 dqs##HD[2 * DQS_STAGE_WORDS(HD) / 4];              \
  WITH_ASYNC_CONSTANT((flash_bwd_dq_ds<HD>((u32*)dqs##HD, dq, ds, ds_off, kb, seq_start, T, heads, kv, scale, async, order, tail)))
#define FLASH_DSUM_PARAMS float *__restrict__ dsum, const bf16_t *__restrict__ dob, const bf16_t *__restrict__ out, int T, int heads

extern "C" __global__ void __launch_bounds__(128) flash_fwd_32(FLASH_FWD_PARAMS) { FLASH_FWD_BODY(32, 1, FA_BK, 1) }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_64(FLASH_FWD_PARAMS) { FLASH_FWD_BODY(64, 1, FA_BK, 1) }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_128(FLASH_FWD_PARAMS) { FLASH_FWD_BODY(128, 1, FA_BK, 1) }
// The wide forward: 128 query rows a block, 32 a warp (Ops.FlashWide).
extern "C" __global__ void __launch_bounds__(128) flash_fwd_wide_32(FLASH_FWD_PARAMS) { FLASH_FWD_BODY(32, 2, 64, 2) }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_wide_64(FLASH_FWD_PARAMS) { FLASH_FWD_BODY(64, 2, 32, 2) }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_wide_128(FLASH_FWD_PARAMS) { FLASH_FWD_BODY(128, 2, 16, 2) }
// The wide forward with Q in shared memory (Ops.FlashWideQ). At head
// size 128 the keys are folded 16 at a time (was 32): with the unmasked
// tiles' own path the 32-key fold spills at sm_80 and sm_90.
extern "C" __global__ void __launch_bounds__(128) flash_fwd_wq_32(FLASH_FWD_PARAMS) { FLASH_FWDQ_BODY(32, 64) }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_wq_64(FLASH_FWD_PARAMS) { FLASH_FWDQ_BODY(64, 64) }
extern "C" __global__ void __launch_bounds__(128) flash_fwd_wq_128(FLASH_FWD_PARAMS) { FLASH_FWDQ_BODY(128, 16) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_32(FLASH_DQ_PARAMS) { FLASH_DQ_BODY(32) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_64(FLASH_DQ_PARAMS) { FLASH_DQ_BODY(64) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_128(FLASH_DQ_PARAMS) { FLASH_DQ_BODY(128) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_32(FLASH_DKV_PARAMS) { FLASH_DKV_BODY(32) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_64(FLASH_DKV_PARAMS) { FLASH_DKV_BODY(64) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_128(FLASH_DKV_PARAMS) { FLASH_DKV_BODY(128) }
// The pipelined backward (dynamic shared memory: two stages).
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_2_32(FLASH_DQ_PARAMS) { FLASH_DQ2_BODY(32) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_2_64(FLASH_DQ_PARAMS) { FLASH_DQ2_BODY(64) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_2_128(FLASH_DQ_PARAMS) { FLASH_DQ2_BODY(128) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_2_32(FLASH_DKV_PARAMS) { FLASH_DKV2_BODY(32) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_2_64(FLASH_DKV_PARAMS) { FLASH_DKV2_BODY(64) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_2_128(FLASH_DKV_PARAMS) { FLASH_DKV2_BODY(128) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_w_32(FLASH_DKV_PARAMS) { FLASH_DKVW_BODY(32) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_w_64(FLASH_DKV_PARAMS) { FLASH_DKVW_BODY(64) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_w_128(FLASH_DKV_PARAMS) { FLASH_DKVW_BODY(128) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_ds_32(FLASH_DKV_PARAMS, u32* __restrict__ ds, const i64* __restrict__ ds_off) { FLASH_DKVS_BODY(32) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_ds_64(FLASH_DKV_PARAMS, u32* __restrict__ ds, const i64* __restrict__ ds_off) { FLASH_DKVS_BODY(64) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dkv_ds_128(FLASH_DKV_PARAMS, u32* __restrict__ ds, const i64* __restrict__ ds_off) { FLASH_DKVS_BODY(128) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_ds_32(FLASH_DQS_PARAMS) { FLASH_DQS_BODY(32) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_ds_64(FLASH_DQS_PARAMS) { FLASH_DQS_BODY(64) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dq_ds_128(FLASH_DQS_PARAMS) { FLASH_DQS_BODY(128) }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dsum_32(FLASH_DSUM_PARAMS) { flash_bwd_dsum<32>(dsum, dob, out, T, heads); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dsum_64(FLASH_DSUM_PARAMS) { flash_bwd_dsum<64>(dsum, dob, out, T, heads); }
extern "C" __global__ void __launch_bounds__(128) flash_bwd_dsum_128(FLASH_DSUM_PARAMS) { flash_bwd_dsum<128>(dsum, dob, out, T, heads); }
