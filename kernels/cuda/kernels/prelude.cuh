// keel's CUDA prelude, put before every kernel source: NVRTC compiles one
// string with no include path, so what the kernels share lives here. No
// CUDA header is included, so the sources compile with any NVRTC from
// CUDA 11.8 on.
//
// Batch invariance: every reduction below adds in an order fixed by the
// block's shape and the row's length alone, never by how many rows a
// launch holds or by timing (no atomics on floats), so a row's result is
// the same bits alone or inside any batch.

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef long long i64;

// KEEL_DYNAMIC_SHARED(T, name) declares name, a T*, as the block's dynamic
// shared memory (the launch's shared bytes; above 48 KiB a kernel needs
// Function.SetMaxDynamicShared first). keel's CUDA emulator hands it a
// buffer of its own instead of an extern __shared__ array.
#ifdef KEEL_CUDA_EMU
#define KEEL_DYNAMIC_SHARED(T, name) T* name = (T*)keel_emu::dyn_shared
#else
#define KEEL_DYNAMIC_SHARED(T, name) \
  extern __shared__ T keel_dyn_##name[]; \
  T* name = keel_dyn_##name
#endif

// MOE_TILE is the rows of a grouped expert product's row tile (gemm.cu's
// gemm_*_grouped, over moe.cu's tile map): expert e's n rows take
// ceil(n/MOE_TILE) tiles.
#define MOE_TILE 64

// KEEL_THREADS is the block size of the row kernels: rows of any length
// are reduced by this many threads, so the order of additions depends on
// the row length only.
#define KEEL_THREADS 256

__device__ __forceinline__ float bf16_to_f32(bf16_t h) {
  return __uint_as_float(((u32)h) << 16);
}

// f32_to_bf16 rounds to nearest, ties to even (as the CPU kernels and
// PyTorch do); a NaN stays a (quiet) NaN.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}

// KEEL_MMA_TILES is 1 where a kernel's tiles are summed through
// mma16816 (sm_80 and later, the tensor cores) and 0 where a kernel may
// sum them another way (gemm.cu's grouped tiles from shared memory: older
// GPUs, and keel's CPU emulator, where mma16816's stand-in costs a context
// switch per shuffle). The emulator's KEEL_CUDA_EMU_MMA=1 defines
// KEEL_EMU_MMA, so its tests run the tensor-core paths' indexing through
// the stand-in too.
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(KEEL_EMU_MMA)
#define KEEL_MMA_TILES 1
#else
#define KEEL_MMA_TILES 0
#endif

// The tensor cores' bf16 product and the asynchronous tile copies, shared
// by flash.cu's attention and gemm.cu's grouped expert products.

// mma16816 adds A.B to a warp's 16x8 float32 tile d, for A 16x16 and B
// 16x8 in bf16, laid out as PTX's mma.m16n8k16 .row.col lays them: lane
// 4g + t holds a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
// a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9], b[0] =
// B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g], d[0..1] = D[g][2t..2t+1] and
// d[2..3] = D[g+8][2t..2t+1], each u32 two bf16 with the lower index in its
// low half. Below sm_80 (and on keel's CPU emulator) the same product is
// made from shuffles.
__device__ __forceinline__ float bf_lo(u32 x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf_hi(u32 x) { return __uint_as_float(x & 0xffff0000u); }
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int s = 0; s < 4; s++) {
    // Lane 4g + s holds row g's (and g+8's) k = 2s, 2s+1, 2s+8, 2s+9;
    // lane 4n + s holds column n's.
    const u32 a0 = __shfl_sync(0xffffffffu, a[0], 4 * g + s), a1 = __shfl_sync(0xffffffffu, a[1], 4 * g + s);
    const u32 a2 = __shfl_sync(0xffffffffu, a[2], 4 * g + s), a3 = __shfl_sync(0xffffffffu, a[3], 4 * g + s);
    const u32 b00 = __shfl_sync(0xffffffffu, b[0], 8 * t + s), b01 = __shfl_sync(0xffffffffu, b[1], 8 * t + s);
    const u32 b10 = __shfl_sync(0xffffffffu, b[0], 8 * t + 4 + s), b11 = __shfl_sync(0xffffffffu, b[1], 8 * t + 4 + s);
    d[0] = fmaf(bf_lo(a0), bf_lo(b00), fmaf(bf_hi(a0), bf_hi(b00), fmaf(bf_lo(a2), bf_lo(b01), fmaf(bf_hi(a2), bf_hi(b01), d[0]))));
    d[1] = fmaf(bf_lo(a0), bf_lo(b10), fmaf(bf_hi(a0), bf_hi(b10), fmaf(bf_lo(a2), bf_lo(b11), fmaf(bf_hi(a2), bf_hi(b11), d[1]))));
    d[2] = fmaf(bf_lo(a1), bf_lo(b00), fmaf(bf_hi(a1), bf_hi(b00), fmaf(bf_lo(a3), bf_lo(b01), fmaf(bf_hi(a3), bf_hi(b01), d[2]))));
    d[3] = fmaf(bf_lo(a1), bf_lo(b10), fmaf(bf_hi(a1), bf_hi(b10), fmaf(bf_lo(a3), bf_lo(b11), fmaf(bf_hi(a3), bf_hi(b11), d[3]))));
  }
#endif
}

// pack_bf16_rn is pack_bf16 in one instruction on sm_80 and later
// (cvt.rn.bf16x2.f32): the same bits for every number (round to nearest,
// ties to even), a NaN's payload aside. For the tensor-core kernels' P and
// dS tiles, where pack_bf16's NaN test and rounding cost a dozen
// instructions a pair.
__device__ __forceinline__ u32 pack_bf16_rn(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return pack_bf16(lo, hi);
#endif
}

// Frags is a warp's view of a bf16 tile in shared memory for ldsm4: the
// tile p and this lane's part of the row offset ldmatrix takes from it
// (lane_b2n, lane_b2k, lane_a), and on sm_80 and later that row's address
// in the shared window, made opaque to the compiler so that the addresses
// derived from it are added where they are used (ptxas folds each
// constant into the load) rather than hoisted out of a loop into
// registers of their own. Make one per tile per use.
struct Frags {
  const u32* p;
  int lane_off;
  u32 s;
};
__device__ __forceinline__ Frags frags(const u32* p, int lane_off) {
  Frags f{p, lane_off, 0u};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(f.s) : "l"(p + lane_off));
  asm volatile("" : "+r"(f.s));
#endif
  return f;
}

// ldsm4 loads four 8x8 tiles of bf16 from f's tile as ldmatrix.x4 does
// (sm_80 and later): lane l names row l%8 of tile l/8 by the word offset
// f.lane_off + off (off the same on every lane; each row 16 bytes,
// 16-byte aligned), and lane 4g + t receives word t of row g of tile m in
// r[m]. One instruction for four of mma16816's fragment registers, where
// four 32-bit loads took four. On older GPUs and keel's CPU emulator, the
// same words through shuffles of the lanes' offsets, so the emulator
// checks every caller's offsets.
__device__ __forceinline__ void ldsm4(u32 (&r)[4], const Frags& f, int off) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(f.s + 4u * (u32)off));
#else
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int m = 0; m < 4; m++) r[m] = f.p[__shfl_sync(0xffffffffu, f.lane_off + off, 8 * m + g) + t];
#endif
}

// ldsm4t is ldsm4 transposed (ldmatrix.x4.trans): lane 4g + t receives
// in r[m] elements g of rows 2t (low half) and 2t + 1 (high half) of tile
// m, as bf16. With lane_a's offsets over a row-major tile whose rows are
// B's k (V for P·V, K for dS·K, dO and Q for the dK/dV pass's products):
// the B fragments of the 8-column blocks w0 and w0 + 4 words on, in
// r[0..1] and r[2..3]; with lane_at's, the A fragment of a tile stored
// transposed. The emulator's path gathers the same halves through
// shuffles of the lanes' offsets.
__device__ __forceinline__ void ldsm4t(u32 (&r)[4], const Frags& f, int off) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(f.s + 4u * (u32)off));
#else
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, sh = 16 * (g & 1);
#pragma unroll
  for (int m = 0; m < 4; m++) {
    const u32 lo = f.p[__shfl_sync(0xffffffffu, f.lane_off + off, 8 * m + 2 * t) + g / 2];
    const u32 hi = f.p[__shfl_sync(0xffffffffu, f.lane_off + off, 8 * m + 2 * t + 1) + g / 2];
    r[m] = ((lo >> sh) & 0xffffu) | (((hi >> sh) & 0xffffu) << 16);
  }
#endif
}

// The lanes' parts of ldsm4's offsets over a tile of rows pitch words
// apart; the call's off adds r0 * pitch + w0 for the block of rows r0 at
// word w0. lane_b2n: mma16816's B fragments (b[0], b[1]) of the 8-row
// blocks r0 and r0 + 8, in r[0..1] and r[2..3] (the rows are B's
// columns: K row-major for Q·Kᵀ); lane_b2k: those
// of row block r0 at words w0 and w0 + 8 (two k-steps); lane_a: the A
// fragment (a[0..3]) of the 16 rows from r0.
__device__ __forceinline__ int lane_b2n(int lane, int pitch) {
  return ((lane >> 4) * 8 + (lane & 7)) * pitch + ((lane >> 3) & 1) * 4;
}
__device__ __forceinline__ int lane_b2k(int lane, int pitch) {
  return (lane & 7) * pitch + (lane >> 4) * 8 + ((lane >> 3) & 1) * 4;
}
__device__ __forceinline__ int lane_a(int lane, int pitch) {
  return (((lane >> 3) & 1) * 8 + (lane & 7)) * pitch + (lane >> 4) * 4;
}
// lane_at: for ldsm4t, the A fragment of the 16 x 16 tile whose element
// (row i, column k) is stored at row k, bf16 column i (rows pitch words
// apart from the call's offset): the tile's transpose is stored. The
// rows are lane_b2n's (tiles 0 and 1 rows 0-7, 2 and 3 rows 8-15; tiles 1
// and 3 four words on); ldmatrix's transpose makes them A's columns.
__device__ __forceinline__ int lane_at(int lane, int pitch) { return lane_b2n(lane, pitch); }

// u32x4 is 16 bytes moved at once; shared tiles are declared as arrays of
// it so that they are 16-byte aligned.
struct alignas(16) u32x4 {
  u32 x, y, z, w;
};

// u32x2 is 8 bytes moved at once.
struct alignas(8) u32x2 {
  u32 x, y;
};

// copy16 moves 16 bytes from global to shared memory. With async (sm_80
// and later) through cp.async: every copy a thread issues is in flight at
// once until copies_done, instead of one global-memory latency per copy;
// else (and on keel's CPU emulator) a plain copy. The two give the same
// bytes: the device tests compare them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// shared_address is p's address in the shared window, as cp.async and
// ldmatrix take it.
__device__ __forceinline__ u32 shared_address(const void* p) {
  u32 s;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(p));
  return s;
}
// copy16_async starts a copy of 16 bytes from global src to shared
// address dst (cp.async, sm_80 and later).
__device__ __forceinline__ void copy16_async(u32 dst, const bf16_t* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
#endif
__device__ __forceinline__ void copy16(u32* dst, const bf16_t* src, int async) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (async) {
    copy16_async(shared_address(dst), src);
    return;
  }
#endif
  *(u32x4*)dst = *(const u32x4*)src;
}

// copies_done waits for this thread's copies; a barrier must follow before
// other threads read them.
__device__ __forceinline__ void copies_done(int async) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (async) asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
#endif
}

// copies_commit closes the group of copies issued since the last;
// copies_wait_prev waits for every group but the last one (the tile
// before the one in flight). Plain copies are done when issued.
__device__ __forceinline__ void copies_commit(int async) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (async) asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void copies_wait_prev(int async) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (async) asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

// widen reads an input element as float32: a float32 as it is, a bf16
// exactly.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(bf16_t h) { return bf16_to_f32(h); }

// put stores an output element: float32, or rounded to bf16 where the
// element is a bf16 product's operand (the fused kernels' outputs).
__device__ __forceinline__ void put(float* p, float v) { *p = v; }
__device__ __forceinline__ void put(bf16_t* p, float v) { *p = f32_to_bf16(v); }

// warp_sum returns the sum of v over the warp to every lane, by a fixed
// butterfly: each step adds the same two values on both lanes of a pair,
// so all lanes hold the same bits.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// block_sum returns the sum of v over the block (a multiple of 32 threads,
// at most 1024) to every thread: warp sums, then the warp sums summed by
// each warp in the same order. s is shared scratch of 32 floats; the
// barriers make back-to-back calls safe.
__device__ float block_sum(float v, float* s) {
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) s[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x >> 5) ? s[l] : 0.f;
  return warp_sum(v);
}

__device__ float block_max(float v, float* s) {
  v = warp_max(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) s[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x >> 5) ? s[l] : -__int_as_float(0x7f800000);
  return warp_max(v);
}

__device__ double block_sum_f64(double v, double* s) {
  v = warp_sum_f64(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) s[w] = v;
  __syncthreads();
  v = l < (int)(blockDim.x >> 5) ? s[l] : 0.0;
  return warp_sum_f64(v);
}

// row_offset is where row r starts in a matrix whose rows come per to a
// group of stride elements (per = 1, stride = n for plain rows; per =
// heads, stride = a token's row for per-head rows inside a wider matrix).
__device__ __forceinline__ i64 row_offset(i64 r, int n, int per, i64 stride) {
  return (r / per) * stride + (r % per) * (i64)n;
}
