package cuda

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Ops launches keel's kernels with the shapes the engines use. It is the
// one place the training engine's forward and the rollout engine's
// decoding step call them from, so that the exact rollout computes what
// training computes, call for call, and its log mu is log pi_old bit for
// bit. Launches are asynchronous on the device's default stream, or
// recorded into a CUDA graph during Capture.
type Ops struct {
	Dev *Device
	// FlashPlainCopies makes flash.cu copy its tiles into shared memory
	// with plain loads and stores instead of cp.async (KEEL_FLASH_COPY=sync
	// at NewOps): the same bytes, one global-memory latency per copy; a
	// check on the async path.
	FlashPlainCopies bool
	// FlashWide runs flash.cu's wide forward (KEEL_FLASH_FWD=wide at
	// NewOps): 128 query rows a block and 32 a warp, each K and V fragment
	// read from shared memory feeding two products instead of one, the
	// next key tile's copy in flight during this one's products. The same
	// outputs within rounding (the online softmax's rescaling falls at
	// other keys).
	FlashWide bool
	// FlashWideQ runs the wide forward with Q's fragments read from shared
	// memory at every key tile instead of held in registers: 64 registers
	// freer at head size 128, so its key tiles are 64 long where the wide
	// forward's are 16 (a quarter of the barriers and copies a key, more
	// products in flight behind each copy), for one more shared-memory
	// read per four products. The narrow forward's bits (its tiles are 64
	// keys too) below head size 128. The default since an H200 timed the
	// three (2026-11-27, tools/gpu/NOTES.md): forward 5% faster than the
	// narrow one at 8 × 2048 tokens of the Qwen3-0.6B shape, 17% at
	// 2 × 16384. KEEL_FLASH_FWD=narrow (or wide) at NewOps turns it off.
	FlashWideQ bool
	// FlashBackwardSingle runs flash.cu's backward kernels with one stage
	// of shared memory (KEEL_FLASH_BWD=single at NewOps): each tile's copy
	// waited for before its products, as before the pipelined kernels
	// (the default: the next tile's copy in flight during this one's
	// products, dynamic shared memory, the same bits).
	FlashBackwardSingle bool
	// FlashDKVWide runs flash.cu's pipelined dK/dV pass with 32-query
	// tiles (flash_bwd_dkv_w) instead of 16:
	// half the barriers and per-tile work a product and twice the
	// independent score products, K's fragments read from shared memory
	// at head size 128 (their registers go to the larger tile). The same
	// bits. The default since an H200 timed it (2026-11-27,
	// tools/gpu/NOTES.md): the backward 9% faster at 8 × 2048 tokens of the
	// Qwen3-0.6B shape, 10% at 2 × 16384. KEEL_FLASH_DKV=narrow at NewOps
	// turns it off; where its shared memory (69 KiB at head size 128;
	// 109 before session 25's transposed copies went) does not fit a
	// block, the 16-query kernel runs.
	FlashDKVWide bool
	// FlashDQStored has the training engine's backward store dS, and
	// flash.cu's dQ pass read it instead of recomputing it
	// (KEEL_FLASH_DQ=stored at NewOps): the dQ pass's three products a
	// tile pair become one, for dS's bf16 tiles in device memory, about
	// T²·heads bytes a layer for sequences of T tokens (0.5 GiB at 8 ×
	// 2048 tokens of the Qwen3-0.6B shape, 8 GiB at 2 × 16384), written by
	// the dK/dV pass and read back once. The same bits
	// (TestDeviceFlashAttention). FlashAttentionBackward takes this path
	// for a scratch given its sequences (StoreScores); the flag says
	// whether the engine gives them. Untimed on a GPU: off until a card
	// says which is faster.
	FlashDQStored bool
	// FlashNoOrder has the training engine launch flash.cu's tiles without
	// FlashOrder's order (KEEL_FLASH_ORDER=0 at NewOps): each sequence's
	// tiles from its last (heaviest_first), the order before it. The same
	// bits either way. The order's gain is computed, not yet measured: a
	// simulation of the blocks' start order (two blocks a multiprocessor,
	// 132 multiprocessors, a block's time its tiles') put the dK/dV pass
	// at 8 × 2048 tokens 15% past an even share of the work, the forward
	// 14%, the dQ pass 7.5%, and FlashOrder's at 1-2%.
	FlashNoOrder bool
	// FlashOrderHeadwise takes a grid's heads one after another in
	// FlashOrder's order but for the last few, side by side
	// (KEEL_FLASH_ORDER=headwise at NewOps; flashTail), where by default
	// every head's tiles are side by side. Blocks at work together then
	// read fewer heads' and sequences' keys and values (at 8 × 2048 tokens
	// of the Qwen3-0.6B shape, the median of TestFlashOrderMakespan's
	// model, 31, 16 and 32 of the 64 (sequence, KV head) pairs in the
	// forward, dQ and dK/dV passes, 1-2 MB each, where the card's L2 cache
	// holds 50 MB; each sequence's tiles from its last: 13, 8 and 9), for
	// about the same modelled makespan. It matters if the L2 cache's
	// misses do: each tile's copy is issued a tile (some 4 µs) ahead of
	// its use, which should hide memory's latency.
	// FlashOrderTail, where positive, sets the number of heads side by
	// side (the tests').
	FlashOrderHeadwise bool
	FlashOrderTail     int
	// DecodePerHead runs the decoding step's attention a warp per query
	// head, as before the grouped kernels (a warp per KV head, which reads
	// each key and value row once for the query heads that share it): the
	// same bits. KEEL_DECODE_ATTN=head at NewOps sets it and clears
	// DecodeFast (the per-head kernels as they were); with DecodeFast set
	// too (tests), the fast kernels run a warp per query head.
	DecodePerHead bool
	// DecodeFast runs the reduced precisions' decoding attention over the
	// bf16 cache with attn.cu's decode_fast kernels where it has them
	// (fastDecode): a third of the instructions a key (each lane's
	// elements adjacent, four keys' scores summed over the warp together,
	// the hardware's approximate exponential), within float32 rounding of
	// the grouped kernels, not their bits. The default since an H200 timed
	// it (2026-11-27, tools/gpu/NOTES.md): Qwen3-0.6B-shaped decoding 24%
	// faster at 64 sequences of 1,056 tokens, where the cache is most of a
	// step's reads (at 128 tokens, 3% and 9%: within those runs' noise).
	// KEEL_DECODE_ATTN=grouped (or head) at NewOps turns it off. The exact
	// rollout's float32 cache never runs it.
	DecodeFast bool
	// DecodeDeep has the fast decoding kernels keep eight keys' rows in
	// flight a warp instead of four (attn.cu's attn_decode_deep kernels,
	// head sizes 64 and 128; KEEL_DECODE_ATTN=deep at NewOps, with
	// DecodeFast): the same bits as the fast kernels. For long contexts,
	// where the cache is most of a step's reads: at 256 sequences of 8
	// KV heads about 16 warps a multiprocessor hold 2 KiB of loads each,
	// which one four-key fold may not cover. Untimed: off until a card
	// says which is faster.
	DecodeDeep bool
	// DecodeNoSplit keeps each row's keys in one run in the reduced
	// precisions' decoding attention (KEEL_DECODE_SPLIT=0 at NewOps), as
	// before AttnDecodeBF16Split: DecodeSplits is then 1.
	DecodeNoSplit bool
	// DrawNoSplit draws DrawRowsRaw's plain rows a block a row
	// (KEEL_DRAW_SPLIT=0 at NewOps), as before the split draw, even given
	// scratch.
	DrawNoSplit bool
	// NormBlockRows runs RMSNorm and RMSNormBF16 a block a row, and the
	// backward a block a chunk (NormBackKernel) (KEEL_ROW_KERNELS=block at
	// NewOps), as before the warp kernels (rmsnorm_fwd_w*,
	// rmsnorm_bwd_c32): the same bits, for timing one against the other.
	NormBlockRows bool
	// DrawSplitAlways takes the split draw at any row count given scratch
	// (KEEL_DRAW_SPLIT=1 at NewOps; tests), not only below the device's
	// multiprocessor count (splitDraw).
	DrawSplitAlways bool

	drawChunk  int  // the split draw's chunk (0: DrawChunkTokens; tests set less)
	groupedFew int8 // the forward grouped products' warps: 0 by rows (fewRows), 1 few-row, -1 32 x 32 (tests)

	mu     sync.Mutex
	fns    map[string]*Function
	shared map[*Function]int // the dynamic shared memory each function may use (SetMaxDynamicShared)

	// stream is where launches go: 0 (the default stream), or the
	// capture stream while Capture records; graph is Capture's state.
	stream uintptr
	graph  graphState
}

// NewOps returns the launcher of d's kernels.
func NewOps(d *Device) *Ops {
	return &Ops{Dev: d, fns: map[string]*Function{}, shared: map[*Function]int{},
		FlashPlainCopies: os.Getenv("KEEL_FLASH_COPY") == "sync", FlashWide: os.Getenv("KEEL_FLASH_FWD") == "wide",
		FlashWideQ:          os.Getenv("KEEL_FLASH_FWD") != "wide" && os.Getenv("KEEL_FLASH_FWD") != "narrow",
		FlashBackwardSingle: os.Getenv("KEEL_FLASH_BWD") == "single", FlashDKVWide: os.Getenv("KEEL_FLASH_DKV") != "narrow",
		FlashDQStored: os.Getenv("KEEL_FLASH_DQ") == "stored", FlashNoOrder: os.Getenv("KEEL_FLASH_ORDER") == "0",
		FlashOrderHeadwise: os.Getenv("KEEL_FLASH_ORDER") == "headwise",
		DecodePerHead:      os.Getenv("KEEL_DECODE_ATTN") == "head",
		DecodeFast:         os.Getenv("KEEL_DECODE_ATTN") != "head" && os.Getenv("KEEL_DECODE_ATTN") != "grouped",
		DecodeDeep:         os.Getenv("KEEL_DECODE_ATTN") == "deep",
		DecodeNoSplit:      os.Getenv("KEEL_DECODE_SPLIT") == "0", DrawNoSplit: os.Getenv("KEEL_DRAW_SPLIT") == "0",
		DrawSplitAlways: os.Getenv("KEEL_DRAW_SPLIT") == "1", NormBlockRows: os.Getenv("KEEL_ROW_KERNELS") == "block"}
}

// Floats is the span of n float32 (or int32) at element offset off of b.
func (b Buffer) Floats(off, n int) Buffer {
	return Buffer{Ptr: b.Ptr + uint64(off)*4, Size: int64(n) * 4}
}

// Launch runs kernel name of the embedded source mod over grid × block.
func (o *Ops) Launch(mod, name string, grid, block Dim3, args ...any) error {
	return o.LaunchShared(mod, name, grid, block, 0, args...)
}

// LaunchShared is Launch with shared bytes of dynamic shared memory
// (raising the kernel's limit first where it is above the default 48 KiB).
func (o *Ops) LaunchShared(mod, name string, grid, block Dim3, shared int, args ...any) error {
	key := mod + "/" + name
	o.mu.Lock()
	f, ok := o.fns[key]
	o.mu.Unlock()
	if !ok {
		m, err := o.Dev.Module(mod)
		if err != nil {
			return err
		}
		if f, err = m.Function(name); err != nil {
			return err
		}
		o.mu.Lock()
		o.fns[key] = f
		o.mu.Unlock()
	}
	if shared > 48<<10 {
		o.mu.Lock()
		allowed := o.shared[f]
		o.mu.Unlock()
		if shared > allowed {
			if err := f.SetMaxDynamicShared(shared); err != nil {
				return err
			}
			o.mu.Lock()
			o.shared[f] = shared
			o.mu.Unlock()
		}
	}
	return f.launchOn(o.stream, grid, block, shared, args...)
}

var block256 = Dim3{X: 256}

// NormChunk is the rows of a chunk of rows.cu's RMSNorm backward over
// rows longer than a warp takes (rmsnorm_bwd, rmsnorm_bwd_dx16: NORM_CHUNK):
// a block a chunk, each writing its rows' weight-gradient partial sums,
// which sum_chunks adds.
const NormChunk = 8

// SumChunksGrid is rows.cu's sum_chunks grid for n columns (32 a block of
// KEEL_THREADS).
func SumChunksGrid(n int) Dim3 { return Dim3{X: (n + 31) / 32} }

// elemGrid is a grid-stride launch for n elements.
func elemGrid(n int) Dim3 { return Dim3{X: max(1, min((n+255)/256, 8192))} }

// Gemm computes C[m*ldc+n] = (acc ? C : 0) + Σ_k A[m*sam+k*sak]·B[k*sbk+n*sbn]
// with keel's batch-invariant float32 product (gemm.cu): 128 × 128 tiles
// when they are enough blocks to fill the GPU (two a multiprocessor),
// 32 × 32 when 64 × 64 would leave multiprocessors without a block (a
// decoding step's products at a few hundred rows), else 64 × 64, the same
// bits whichever; the 64 and 32 tiles in the forward's layout (sak = sbk
// = 1) by their kernels for it (gemm_f32_fwd, gemm_f32_32_fwd).
func (o *Ops) Gemm(c, a, b Buffer, M, N, K, sam, sak, sbk, sbn, ldc int, acc bool) error {
	flag := 0
	if acc {
		flag = 1
	}
	name, tile := "gemm_f32", 64
	switch {
	case bigTiles(M, N, o.Dev.SMs): // the same bits from bigger tiles
		name, tile = "gemm_f32_128", 128
	case smallTiles(M, N, o.Dev.SMs):
		name, tile = "gemm_f32_32", 32
	}
	if tile < 128 && sak == 1 && sbk == 1 {
		name += "_fwd"
	}
	return o.Launch("gemm.cu", name, Dim3{X: (N + tile - 1) / tile, Y: (M + tile - 1) / tile}, block256,
		c, a, b, M, N, K, int64(sam), int64(sak), int64(sbk), int64(sbn), int64(ldc), flag)
}

// LinearMany is Linear for several weights that read the same input x:
// the float32 products one by one (BF16Linear's and QuantLinear's round or
// quantise x once for all of them).
func (o *Ops) LinearMany(x Buffer, rows, in, ldx int, ps ...Product) error {
	if err := noAddend(ps); err != nil {
		return err
	}
	for _, p := range ps {
		if err := o.Linear(p.Y, x, p.W, rows, in, p.Out, p.LdY, ldx); err != nil {
			return err
		}
	}
	return nil
}

// noAddend refuses products with an addend, or a bf16 output, where the
// epilogue has neither.
func noAddend(ps []Product) error {
	for _, p := range ps {
		if p.Add.Ptr != 0 || p.Y16 {
			return fmt.Errorf("cuda: a product with an addend or a bf16 output outside the bf16 products")
		}
	}
	return nil
}

// bigTiles says whether gemm_f32_128 fills a GPU of sms multiprocessors
// with at least two blocks each for an M × N product.
func bigTiles(M, N, sms int) bool {
	return M >= 128 && N >= 128 && ((M+127)/128)*((N+127)/128) >= 2*max(sms, 1)
}

// smallTiles says whether gemm_f32's 64 × 64 tiles of an M × N product
// leave some of a GPU's sms multiprocessors without a block, so that
// gemm_f32_32 (four times the blocks) runs it.
func smallTiles(M, N, sms int) bool {
	return ((M+63)/64)*((N+63)/64) < sms
}

// Linear: y[r, 0:out] (row stride ldy) = x[r, 0:in] (row stride ldx) · Wᵀ,
// W [out, in].
func (o *Ops) Linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error {
	return o.Gemm(y, x, w, rows, out, in, ldx, 1, 1, in, ldy, false)
}

// LinearBackX: dx[r, 0:in] (+)= dy[r, 0:out] · W.
func (o *Ops) LinearBackX(dx, dy, w Buffer, rows, in, out, lddx, lddy int, acc bool) error {
	return o.Gemm(dx, dy, w, rows, in, out, lddy, 1, in, 1, lddx, acc)
}

// LinearBackW: dW[out, in] += Σ_r dy[r, o]·x[r, i].
func (o *Ops) LinearBackW(dw, dy, x Buffer, rows, in, out, lddy, ldx int) error {
	return o.Gemm(dw, dy, x, out, in, rows, 1, lddy, ldx, 1, in, true)
}

// RMSNorm: y = x·inv·w over rows of n, saving inv per row (inv may be an
// empty Buffer).
func (o *Ops) RMSNorm(y, inv, x, w Buffer, rows, n int, eps float32) error {
	if per := o.normWarpPer(n); per > 0 {
		return o.Launch("rows.cu", fmt.Sprintf("rmsnorm_fwd_w%d", per), Dim3{X: (rows + 7) / 8}, block256, y, inv, x, w, n, 1, int64(n), eps, rows)
	}
	return o.Launch("rows.cu", "rmsnorm_fwd", Dim3{X: rows}, block256, y, inv, x, w, n, 1, int64(n), eps)
}

// NormBackKernel names rows.cu's RMSNorm backward over chunks chunks of
// NormChunk rows of n elements (rows longer than the per-head norms'
// rmsnorm_bwd_warp takes), with dx's bf16 rounding where dx16, and its
// grid and block: rmsnorm_bwd[_dx16]_c32 (a warp a chunk, 4 a block) for
// rows of at most 1,024, else (or with NormBlockRows) rmsnorm_bwd[_dx16]
// (a block a chunk). The same arguments, bits and partial sums either
// way.
func (o *Ops) NormBackKernel(n, chunks int, dx16 bool) (string, Dim3, Dim3) {
	name := "rmsnorm_bwd"
	if dx16 {
		name += "_dx16"
	}
	if o.NormBlockRows || n > 1024 {
		return name, Dim3{X: chunks}, block256
	}
	return name + "_c32", Dim3{X: (chunks + 3) / 4}, Dim3{X: 128}
}

// normWarpPer is the elements a lane of rows.cu's warp-a-row RMSNorm
// kernels (rmsnorm_fwd_w<PER>, 8 rows a block) holds for rows of n: the
// least of 8, 32 and 64 with n <= 32·PER, or 0 (rows longer than 2,048,
// or NormBlockRows) for the block-a-row kernels. The same bits either
// way.
func (o *Ops) normWarpPer(n int) int {
	if o.NormBlockRows {
		return 0
	}
	for _, per := range []int{8, 32, 64} {
		if n <= 32*per {
			return per
		}
	}
	return 0
}

// RMSNormBF16 is RMSNorm (rows of n, contiguous; inv may be an empty
// Buffer) with y rounded to bf16 in the same pass: y16 [rows, n] is then
// the operand of the products that read it (BF16Linear.LinearManyBF16),
// bit for bit what rounding RMSNorm's output gives.
func (o *Ops) RMSNormBF16(y16, inv, x, w Buffer, rows, n int, eps float32) error {
	if per := o.normWarpPer(n); per > 0 {
		return o.Launch("rows.cu", fmt.Sprintf("rmsnorm_fwd_bf16_w%d", per), Dim3{X: (rows + 7) / 8}, block256, y16, inv, x, w, n, eps, rows)
	}
	return o.Launch("rows.cu", "rmsnorm_fwd_bf16", Dim3{X: rows}, block256, y16, inv, x, w, n, eps)
}

// NormRope: per token and head, RoPE(RMSNorm(head row)) at the token's
// position (pos, int32 per row), from raw (token rows of rawStride) into
// out [rows, heads·hd], saving each head row's inverse RMS.
func (o *Ops) NormRope(out, inv, raw, w, cos, sin, pos Buffer, rows, heads, hd, rawStride int, eps float32) error {
	return o.Launch("rows.cu", "norm_rope_fwd", Dim3{X: rows}, block256, out, inv, raw, w, cos, sin, pos, heads, hd, int64(rawStride), eps)
}

// NormRopeBF16 is NormRope with out16 in bf16, [FlashPad(rows), heads·hd]
// with the pad rows zero: flash.cu's row-major copy of q or k
// (FlashScratch.UseQK), bit for bit NormRope's output rounded.
func (o *Ops) NormRopeBF16(out16, inv, raw, w, cos, sin, pos Buffer, rows, heads, hd, rawStride int, eps float32) error {
	return o.Launch("rows.cu", "norm_rope_fwd_bf16", Dim3{X: FlashPad(rows)}, block256, out16, inv, raw, w, cos, sin, pos, heads, hd,
		int64(rawStride), eps, rows)
}

// NormRopeBF16From16 is NormRopeBF16 from raw16, q or k in bf16 as its
// product wrote it: bit for bit NormRopeBF16 over the widened values.
func (o *Ops) NormRopeBF16From16(out16, inv, raw16, w, cos, sin, pos Buffer, rows, heads, hd, rawStride int, eps float32) error {
	return o.Launch("rows.cu", "norm_rope_fwd_bf16_raw16", Dim3{X: FlashPad(rows)}, block256, out16, inv, raw16, w, cos, sin, pos, heads, hd,
		int64(rawStride), eps, rows)
}

// Attention: causal grouped-query attention over packed sequences
// (seqStart, int32 per row, is where each row's sequence starts; the
// sequences lie in order), by the tiled kernel: each row's bits are the
// per-row kernel's and the decoding step's.
func (o *Ops) Attention(out, lse, q, k, v, seqStart Buffer, rows, heads, kv, hd int, scale float32) error {
	if err := checkHeads(heads, kv, hd); err != nil {
		return err
	}
	return o.Launch("attn.cu", "attn_fwd_tiled", Dim3{X: (rows + 31) / 32, Y: heads}, Dim3{X: 256}, out, lse, q, k, v, seqStart, rows, heads, kv, hd, scale)
}

// Add: y += x over n elements.
func (o *Ops) Add(y, x Buffer, n int) error {
	return o.Launch("rows.cu", "add", elemGrid(n), block256, y, x, int64(n))
}

// SwiGLU: a = silu(g)·u from rows of gu = [g | u] (2n wide).
func (o *Ops) SwiGLU(a, gu Buffer, rows, n int) error {
	return o.Launch("rows.cu", "swiglu_fwd", elemGrid(rows*n), block256, a, gu, int64(rows), n)
}

// NormRopeKVBF16 is the bf16 rollout's q/k step in one launch: q =
// NormRope(qraw) (rows of heads·hd), and NormRope(kraw) and v rounded to
// bf16 into the caches at each row's (slot, pos), as NormRope then
// KVStoreBF16 would store them, bit for bit; a padding row (negative
// slot) writes q only. Rows of qraw, kraw and v are ld floats apart: they
// are column spans of one [rows, ld] matrix, q, k and v's one product
// (BF16Linear merges them).
func (o *Ops) NormRopeKVBF16(q, kcache, vcache, qraw, kraw, v, qw, kw, cos, sin, slot, pos Buffer, rows, ld, heads, kv, hd, maxLen int, eps float32) error {
	return o.Launch("rows.cu", "norm_rope_kv_bf16", Dim3{X: rows}, block256, q, kcache, vcache, qraw, kraw, v, qw, kw, cos, sin, slot, pos,
		int64(ld), heads, kv, hd, maxLen, eps)
}

// SwiGLUBF16 is SwiGLU with a rounded to bf16 in the same pass.
func (o *Ops) SwiGLUBF16(a16, gu Buffer, rows, n int) error {
	return o.Launch("rows.cu", "swiglu_fwd_bf16", elemGrid(rows*n), block256, a16, gu, int64(rows), n)
}

// SwiGLUBF16From16 is SwiGLUBF16 from gu16 [rows, 2n] in bf16 (a product's
// bf16 output, Product.Y16).
func (o *Ops) SwiGLUBF16From16(a16, gu16 Buffer, rows, n int) error {
	return o.Launch("rows.cu", "swiglu_fwd_bf16_gu16", elemGrid(rows*n), block256, a16, gu16, int64(rows), n)
}

// SwiGLUBackBF16From16 is SwiGLUBackBF16 from gu16 in bf16.
func (o *Ops) SwiGLUBackBF16From16(dgu16, da, gu16 Buffer, rows, n int) error {
	return o.Launch("rows.cu", "swiglu_bwd_bf16_gu16", elemGrid(rows*n), block256, dgu16, da, gu16, int64(rows), n)
}

// SwiGLUBackBF16 is SwiGLU's backward with dgu rounded to bf16: from da
// [rows, n] and gu [rows, 2n], dgu16 [rows, 2n] = bf16(da·u·silu'(g),
// da·silu(g)), bit for bit what rounding the float32 backward gives.
func (o *Ops) SwiGLUBackBF16(dgu16, da, gu Buffer, rows, n int) error {
	return o.Launch("rows.cu", "swiglu_bwd_bf16", elemGrid(rows*n), block256, dgu16, da, gu, int64(rows), n)
}

// Gather: dst[r] = src[idx[r]], rows of n floats (idx int32).
func (o *Ops) Gather(dst, src, idx Buffer, rows, n int) error {
	return o.Launch("convert.cu", "embed_fwd", Dim3{X: rows}, block256, dst, src, idx, n)
}

// GatherBF16: dst[r] = src[idx[r]], rows of n bf16 (idx int32).
func (o *Ops) GatherBF16(dst, src, idx Buffer, rows, n int) error {
	return o.Launch("convert.cu", "gather_bf16", Dim3{X: rows}, block256, dst, src, idx, n)
}

// LogSoftmax: z = log-softmax(z/temp) in place over rows of V (the
// division skipped at temp 1), lse per row when lse is not empty.
func (o *Ops) LogSoftmax(z, lse Buffer, rows, V int, temp float32) error {
	return o.Launch("head.cu", "logsoftmax_rows", Dim3{X: rows}, block256, z, lse, V, temp)
}

// Softmax: z = softmax(z) in place over rows of n (the MoE router).
func (o *Ops) Softmax(z Buffer, rows, n int) error {
	return o.Launch("moe.cu", "softmax_rows", Dim3{X: rows}, block256, z, n)
}

// MoECombine: out[t] = resid[t] + Σ_s gates[t·k+s]·yg[row[t·k+s]].
func (o *Ops) MoECombine(out, resid, yg, gates, row Buffer, rows, k, H int) error {
	return o.Launch("moe.cu", "moe_combine", Dim3{X: rows}, block256, out, resid, yg, gates, row, k, H)
}

// MoECombine16 is MoECombine from yg16, the experts' outputs in bf16 (as
// the bf16 training mode's down products write them): MoECombine's bits
// over the widened values.
func (o *Ops) MoECombine16(out, resid, yg16, gates, row Buffer, rows, k, H int) error {
	return o.Launch("moe.cu", "moe_combine_y16", Dim3{X: rows}, block256, out, resid, yg16, gates, row, k, H)
}

// KVStore writes step rows' keys and values into the cache of their slot
// at their position (slot, pos: int32 per row; caches [slots, maxLen, kvd]).
// A row whose slot is negative is padding and writes nothing.
func (o *Ops) KVStore(kcache, vcache, k, v, slot, pos Buffer, rows, maxLen, kvd int) error {
	return o.Launch("attn.cu", "kv_store", Dim3{X: rows}, block256, kcache, vcache, k, v, slot, pos, maxLen, kvd)
}

// AttnDecode: each step row attends over positions [0, pos] of its slot's
// cache, with the training forward's attention arithmetic; a padding row
// (negative slot) gets zeros.
func (o *Ops) AttnDecode(out, q, kcache, vcache, slot, pos Buffer, rows, maxLen, heads, kv, hd int, scale float32) error {
	if err := checkHeads(heads, kv, hd); err != nil {
		return err
	}
	return o.decode("attn_decode", out, q, kcache, vcache, slot, pos, rows, maxLen, heads, kv, hd, scale)
}

// decodeGroups are the groups (query heads per KV head) attn.cu has
// grouped decoding kernels for.
var decodeGroups = map[int]bool{1: true, 2: true, 4: true, 8: true}

// decode launches attn.cu's decoding kernel name (attn_decode,
// attn_decode_bf16 or attn_decode_bf16_out16): grouped (a warp per KV head
// for the heads/kv query heads that read it, each key and value row read
// once for them) where the group has a kernel, else (and with
// DecodePerHead) a warp per query head. The same bits either way.
func (o *Ops) decode(name string, out, q, kcache, vcache, slot, pos Buffer, rows, maxLen, heads, kv, hd int, scale float32) error {
	if err := checkHeads(heads, kv, hd); err != nil {
		return err
	}
	name, warps := o.decodeKernel(name, heads, kv, hd)
	if err := fastAligned(name, kcache, vcache); err != nil {
		return err
	}
	return o.Launch("attn.cu", name, Dim3{X: rows, Y: (warps + 3) / 4}, Dim3{X: 128}, out, q, kcache, vcache, slot, pos, maxLen, heads, kv, hd, scale)
}

// decodeKernel names the decoding kernel of family name for the heads and
// head size, with the warps a step row takes.
func (o *Ops) decodeKernel(name string, heads, kv, hd int) (string, int) {
	g, warps := heads/kv, kv
	if !decodeGroups[g] || o.DecodePerHead {
		g, warps = 1, heads
	}
	if o.DecodeFast && fastDecode(hd, g) && strings.HasPrefix(name, "attn_decode_bf16") {
		family := "attn_decode_fast"
		if o.DecodeDeep && hd >= 64 {
			family = "attn_decode_deep"
		}
		return fmt.Sprintf("%s%s_g%d_%d", family, strings.TrimPrefix(name, "attn_decode_bf16"), g, hd), warps
	}
	name = fmt.Sprintf("%s_g%d", name, g)
	if hd <= 128 { // the kernels for head sizes up to 128: half the registers
		name += "_s"
	}
	return name, warps
}

// fastAligned refuses caches the decode_fast kernel name cannot read: its
// rows are read 8 bytes a lane at head size 128, so a cache must start on
// 8 bytes (a device allocation's start does).
func fastAligned(name string, kcache, vcache Buffer) error {
	if (strings.HasPrefix(name, "attn_decode_fast") || strings.HasPrefix(name, "attn_decode_deep")) && (kcache.Ptr|vcache.Ptr)&7 != 0 {
		return fmt.Errorf("cuda: %s: KV caches at %#x and %#x, not 8-byte aligned", name, kcache.Ptr, vcache.Ptr)
	}
	return nil
}

// fastDecode says whether attn.cu has decode_fast kernels for head size hd
// and group g: 64 and 128, and 32 below groups of 8.
func fastDecode(hd, g int) bool {
	return hd == 64 || hd == 128 || hd == 32 && g < 8
}

// decodeSplitWarps is how many warps a decoding step's attention is split
// to reach: about 16 a multiprocessor on a 132-SM H100, what 256
// sequences of a model with 8 KV heads give unsplit (KEEL_DECODE_SPLIT_WARPS
// sets another, read once: check.sh times 8192, 62 a multiprocessor,
// against it, since at 256 short sequences the unsplit attention read
// its 2.3 GB of cache at about 1.5 TB/s on an H200). decodeMaxSplits
// bounds the runs of one row's keys.
var decodeSplitWarps = min(envPositive("KEEL_DECODE_SPLIT_WARPS", 2048), 1<<20)

const decodeMaxSplits = 16

// envPositive is the environment variable name as a positive integer,
// def where it is unset or not one.
func envPositive(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// decodeSplits is the runs each row's keys are split into for a step of
// rows rows of warps warps each: enough to reach decodeSplitWarps, at
// most decodeMaxSplits; 1 from decodeSplitWarps/warps rows up.
func decodeSplits(rows, warps int) int {
	if rows*warps <= 0 {
		return 1
	}
	return min(decodeMaxSplits, (decodeSplitWarps+rows*warps-1)/(rows*warps))
}

// DecodeSplits is the runs AttnDecodeBF16Split splits each row's keys
// into for a step of rows rows: a few long sequences (a rollout's tail)
// otherwise leave most of the GPU idle, each warp folding thousands of
// keys one after another.
func (o *Ops) DecodeSplits(rows, heads, kv int) int {
	if o.DecodeNoSplit {
		return 1
	}
	_, warps := o.decodeKernel("", heads, kv, 0)
	return decodeSplits(rows, warps)
}

// DecodeSplitFloats is the scratch AttnDecodeBF16Split needs for steps of
// up to rows rows (whichever kernels DecodePerHead picks): rows ×
// splits × heads × (hd+2) floats at its largest.
func DecodeSplitFloats(rows, heads, kv, hd int) int {
	warps := kv
	if kv <= 0 || !decodeGroups[heads/kv] {
		warps = heads
	}
	most := 0
	for r := 1; r <= rows; r++ {
		s := decodeSplits(r, warps)
		if s == 1 {
			break
		}
		most = max(most, r*s)
	}
	return most * heads * (hd + 2)
}

// AttnDecodeBF16Split is AttnDecodeBF16 (or, with out16, AttnDecodeBF16To16)
// with each row's keys split into splits contiguous runs (flash-decoding):
// a warp per run and head group writes its unnormalised sums to part
// (DecodeSplitFloats), then decode_combine merges the runs. Within float32
// rounding of the unsplit kernels, not their bits: for the reduced
// precisions, whose decoding owes the training engine no bits. splits of
// 1 is the unsplit kernel.
func (o *Ops) AttnDecodeBF16Split(out16 bool, out, part, q, kcache, vcache, slot, pos Buffer, rows, maxLen, heads, kv, hd int, scale float32, splits int) error {
	if splits <= 1 {
		if out16 {
			return o.AttnDecodeBF16To16(out, q, kcache, vcache, slot, pos, rows, maxLen, heads, kv, hd, scale)
		}
		return o.AttnDecodeBF16(out, q, kcache, vcache, slot, pos, rows, maxLen, heads, kv, hd, scale)
	}
	if err := checkHeads(heads, kv, hd); err != nil {
		return err
	}
	if need := int64(rows*splits*heads*(hd+2)) * 4; part.Size < need {
		return fmt.Errorf("cuda: AttnDecodeBF16Split: %d bytes of scratch for %d rows in %d splits, want %d", part.Size, rows, splits, need)
	}
	name, warps := o.decodeKernel("attn_decode_bf16_split", heads, kv, hd)
	if err := fastAligned(name, kcache, vcache); err != nil {
		return err
	}
	if err := o.Launch("attn.cu", name, Dim3{X: rows, Y: (warps + 3) / 4, Z: splits}, Dim3{X: 128},
		part, q, kcache, vcache, slot, pos, maxLen, heads, kv, hd, scale); err != nil {
		return err
	}
	comb := "decode_combine"
	if out16 {
		comb = "decode_combine_out16"
	}
	return o.Launch("attn.cu", comb, Dim3{X: rows, Y: (heads + 3) / 4}, Dim3{X: 128}, out, part, slot, heads, hd, splits)
}

// LogSoftmaxTemps: LogSoftmax with a temperature per row (0 meaning 1).
func (o *Ops) LogSoftmaxTemps(z, temps Buffer, rows, V int) error {
	return o.Launch("head.cu", "logsoftmax_rows_t", Dim3{X: rows}, block256, z, temps, V)
}

// DrawMaxVocab is the largest vocabulary DrawRows draws from (its
// kernel's shared table of partial sums).
const DrawMaxVocab = 512 * 1024

// Draws is what DrawRows reads and writes, one entry a row (TopTok and
// TopLP: TopMax entries a row).
type Draws struct {
	Tok, LP, TLP  Buffer // written: the token (int32), its log-prob, its truncated log-prob
	TopTok, TopLP Buffer // written: the TopN most probable tokens (int32) and their log-probs
	U, Temps      Buffer // the uniform (float64; < 0: the row is left alone), the temperature
	TopK, TopP    Buffer // top-k (int32; 0: off), top-p (float64; 0 or 1: off)
	TopN          Buffer // the most probable tokens to report (int32, at most TopMax; 0: none)
	// Scratch, where it holds DrawScratchFloats(rows, V) floats from an
	// 8-byte aligned address, lets DrawRowsRaw spread each row over many
	// blocks (the split draw).
	Scratch Buffer
}

// DrawChunkTokens is the tokens of a row each block of DrawRowsRaw's split
// draw takes: 19 blocks a row of Qwen3's 151,936, so that 64 rows make
// 1,216 blocks (a row a block made 64, on a card of 132
// multiprocessors). A multiple of head.cu's DRAW_BLOCK.
const DrawChunkTokens = 8192

// drawBlock is head.cu's DRAW_BLOCK: the tokens whose probabilities a
// draw sums at a time.
const drawBlock = 512

// DrawScratchFloats is the scratch (in float32 words) DrawRowsRaw's split
// draw needs for rows of V tokens.
func DrawScratchFloats(rows, V int) int { return drawScratchFloats(rows, V, DrawChunkTokens) }

// drawScratchFloats is DrawScratchFloats for chunks of chunk tokens: per
// row, each chunk's sum (float64), each DRAW_BLOCK's sum (float64), each
// chunk's maximum, greedy maximum and its index, and the log-sum-exp.
func drawScratchFloats(rows, V, chunk int) int {
	nc, nb := (V+chunk-1)/chunk, (V+drawBlock-1)/drawBlock
	return rows * (2*nc + 2*nb + 3*nc + 1)
}

// TopMax is the most probable tokens DrawRows reports a row (head.cu's
// TOP_MAX; rollout.MaxTopLogProbs).
const TopMax = 20

// DrawRows draws, for every one of rows log-softmax rows of z [rows, V]
// whose uniform d.U[r] is >= 0, a token by rollout.DrawRow's rule
// (d.Temps[r] == 0: the argmax), or by rollout.DrawTruncated's where the
// row's top-k or top-p truncates, into d.Tok[r], with z at it in d.LP[r]
// and its log-prob under the truncated distribution in d.TLP[r] (d.LP[r]
// where none is), and where d.TopN[r] > 0 the row's d.TopN[r] most
// probable tokens and their log-probs, the most probable first (the lower
// id first among equals), at d.TopTok[r*TopMax:] and d.TopLP[r*TopMax:];
// rows with d.U[r] < 0 are left alone. V <= DrawMaxVocab.
func (o *Ops) DrawRows(d Draws, z Buffer, rows, V int) error {
	if V > DrawMaxVocab {
		return fmt.Errorf("cuda: DrawRows over a vocabulary of %d, at most %d", V, DrawMaxVocab)
	}
	return o.drawRows("draw_rows", "draw_rows_trunc", d, z, rows, V)
}

// drawRows launches the kernel of the plain rows, then that of the rows
// that truncate or report top log-probabilities (each kernel leaves the
// other's rows alone, so that the plain one keeps its few registers).
func (o *Ops) drawRows(plain, special string, d Draws, z Buffer, rows, V int) error {
	for _, k := range []string{plain, special} {
		if err := o.Launch("head.cu", k, Dim3{X: rows}, block256, d.Tok, d.LP, d.TLP, d.TopTok, d.TopLP, z, d.U, d.Temps, d.TopK, d.TopP, d.TopN, V); err != nil {
			return err
		}
	}
	return nil
}

// DrawRowsRaw is DrawRows from the logits z themselves (not changed):
// each drawn row's log-softmax at its temperature is taken on the fly from
// a log-sum-exp summed online, so the kernel reads a row twice where
// LogSoftmaxTemps then DrawRows read it four times and write it once (a
// truncated row more: each cut and the draw reads it up to nine times).
// The log-sum-exp is not LogSoftmaxTemps's bits: the reduced-precision
// rollouts draw so, the exact one (whose log-probs are the training
// engine's) through LogSoftmaxTemps and DrawRows. Given d.Scratch, the
// plain rows are drawn by the split draw (head.cu's draw_chunk_*: a
// block per DrawChunkTokens of a row, the same rule; its log-sum-exp is
// summed in another order, so a log-prob may differ by an ulp and a draw
// within rounding of a boundary) where the rows are fewer than the
// device's multiprocessors (splitDraw). V <= DrawMaxVocab.
func (o *Ops) DrawRowsRaw(d Draws, z Buffer, rows, V int) error {
	if V > DrawMaxVocab {
		return fmt.Errorf("cuda: DrawRowsRaw over a vocabulary of %d, at most %d", V, DrawMaxVocab)
	}
	chunk := o.drawChunk
	if chunk == 0 {
		chunk = DrawChunkTokens
	}
	// The scratch's float64 sums need it 8-byte aligned.
	if !o.splitDraw(rows) || d.Scratch.Size < int64(drawScratchFloats(rows, V, chunk))*4 || d.Scratch.Ptr%8 != 0 {
		return o.drawRows("draw_rows_raw", "draw_rows_trunc_raw", d, z, rows, V)
	}
	// The split draw: head.cu's draw_chunk_* kernels, then the special
	// rows' kernel.
	nc, nb := (V+chunk-1)/chunk, (V+drawBlock-1)/drawBlock
	at := 0
	span := func(floats int) Buffer {
		b := d.Scratch.Floats(at, floats)
		at += floats
		return b
	}
	cs, sums, cm, cv, ci, lrow := span(2*rows*nc), span(2*rows*nb), span(rows*nc), span(rows*nc), span(rows*nc), span(rows)
	grid := Dim3{X: nc, Y: rows}
	if err := o.Launch("head.cu", "draw_chunk_stats", grid, block256, cs, cm, z, d.U, d.Temps, d.TopK, d.TopP, d.TopN, V, chunk); err != nil {
		return err
	}
	if err := o.Launch("head.cu", "draw_chunk_sums", grid, block256, sums, cv, ci, lrow, cs, cm, z, d.U, d.Temps, d.TopK, d.TopP, d.TopN, V, chunk); err != nil {
		return err
	}
	if err := o.Launch("head.cu", "draw_chunk_pick", Dim3{X: rows}, Dim3{X: 32}, d.Tok, d.LP, d.TLP, sums, cv, ci, lrow, z, d.U, d.Temps, d.TopK, d.TopP, d.TopN, V, nc); err != nil {
		return err
	}
	return o.Launch("head.cu", "draw_rows_trunc_raw", Dim3{X: rows}, block256, d.Tok, d.LP, d.TLP, d.TopTok, d.TopLP, z, d.U, d.Temps, d.TopK, d.TopP, d.TopN, V)
}

// splitDraw says whether DrawRowsRaw splits rows rows' plain draws into
// chunks: where a block a row leaves multiprocessors idle. On an H200
// (2026-11-27, BenchmarkDeviceDraw, 151,936 tokens a row) the split draw
// took 141 µs for 64 rows against 193 a block a row, and 335 µs for 256
// rows against 292.
func (o *Ops) splitDraw(rows int) bool {
	switch {
	case o.DrawNoSplit:
		return false
	case o.DrawSplitAlways:
		return true
	}
	return rows < o.Dev.SMs
}

// LogSoftmaxHostRows is LogSoftmaxTemps over the rows whose uniform u[r]
// (float64) is negative: the rows the host samples beside DrawRowsRaw's.
func (o *Ops) LogSoftmaxHostRows(z, temps, u Buffer, rows, V int) error {
	return o.Launch("head.cu", "logsoftmax_rows_host", Dim3{X: rows}, block256, z, temps, u, V)
}

// ToBF16 rounds n floats of src into dst (bf16, half the bytes).
func (o *Ops) ToBF16(dst, src Buffer, n int) error {
	return o.Launch("convert.cu", "f32_to_bf16", elemGrid(n), block256, dst, src, int64(n))
}

// ToBF16Rows rounds rows of cols floats, ld apart in src, into dst as
// contiguous bf16 rows.
func (o *Ops) ToBF16Rows(dst, src Buffer, rows, cols, ld int) error {
	return o.Launch("convert.cu", "f32_to_bf16_2d", Dim3{X: rows}, block256, dst, src, cols, int64(ld))
}

// ToBF16RowsOut rounds src [rows, cols] (contiguous float32) into rows of
// dst ld bf16 apart: a column span of a wider bf16 matrix.
func (o *Ops) ToBF16RowsOut(dst, src Buffer, rows, cols, ld int) error {
	return o.Launch("convert.cu", "f32_to_bf16_2d_out", Dim3{X: rows}, block256, dst, src, cols, int64(ld))
}

// FromBF16Rows widens rows of cols bf16, ld apart in src, into dst as
// contiguous float32 rows (exactly).
func (o *Ops) FromBF16Rows(dst, src Buffer, rows, cols, ld int) error {
	return o.Launch("convert.cu", "bf16_to_f32_2d", Dim3{X: rows}, block256, dst, src, cols, int64(ld))
}

// DeviceWeights is implemented by a GPU training engine: its weights (the
// model's arena layout, float32) in device memory, which a rollout backend
// on the same GPU copies device to device instead of through the host.
type DeviceWeights interface {
	DeviceWeights() (*Device, Buffer)
}

// MoERoute chooses each of rows tokens' k experts (ids, int32) and gate
// weights from the router softmax probs [rows, E], as model.TopK and
// model.GateWeights do, or takes the experts from replay (int32 [rows, k])
// when it is not empty, for the tokens whose first slot there is >= 0.
func (o *Ops) MoERoute(ids, gates, probs, replay Buffer, rows, E, k int, norm bool) error {
	n := 0
	if norm {
		n = 1
	}
	if E > 1024 {
		return fmt.Errorf("cuda: MoERoute over %d experts: moe.cu's moe_route takes at most 1024", E)
	}
	return o.Launch("moe.cu", "moe_route", Dim3{X: (rows + 3) / 4}, Dim3{X: 128}, ids, gates, probs, replay, rows, E, k, n)
}

// attnHeadDimMax is attn.cu's ATT_HD_MAX: the largest head_dim its
// registers and shared memory hold.
const attnHeadDimMax = 256

func checkHeads(heads, kv, hd int) error {
	if hd < 1 || hd > attnHeadDimMax || kv < 1 || heads < 1 || heads%kv != 0 {
		return fmt.Errorf("cuda: attention with %d heads, %d KV heads, head_dim %d: want KV heads dividing heads and head_dim 1 to %d", heads, kv, hd, attnHeadDimMax)
	}
	return nil
}

// KVStoreBF16 is KVStore into bfloat16 caches (keys and values rounded
// once, to nearest even), v's rows ldv floats apart (a column span of q,
// k and v's one product; kvd where v is a matrix of its own).
func (o *Ops) KVStoreBF16(kcache, vcache, k, v, slot, pos Buffer, rows, maxLen, kvd, ldv int) error {
	return o.Launch("attn.cu", "kv_store_bf16", Dim3{X: rows}, block256, kcache, vcache, k, v, slot, pos, maxLen, kvd, int64(ldv))
}

// AttnDecodeBF16To16 is AttnDecodeBF16 with its output rounded to bf16
// (out16 [rows, heads·hd]), the output projection's operand.
func (o *Ops) AttnDecodeBF16To16(out16, q, kcache, vcache, slot, pos Buffer, rows, maxLen, heads, kv, hd int, scale float32) error {
	return o.decode("attn_decode_bf16_out16", out16, q, kcache, vcache, slot, pos, rows, maxLen, heads, kv, hd, scale)
}

// AttnDecodeBF16 is AttnDecode over bfloat16 caches: the same arithmetic
// on the widened keys and values.
func (o *Ops) AttnDecodeBF16(out, q, kcache, vcache, slot, pos Buffer, rows, maxLen, heads, kv, hd int, scale float32) error {
	return o.decode("attn_decode_bf16", out, q, kcache, vcache, slot, pos, rows, maxLen, heads, kv, hd, scale)
}
