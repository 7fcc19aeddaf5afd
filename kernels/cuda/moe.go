package cuda

import (
	"errors"
	"fmt"
)

// moeTile is moe.cu's MOE_TILE: the rows of a grouped product's row tile.
const moeTile = 64

// moeChunk is moe.cu's MOE_CHUNK: the pairs a grouping block takes.
const moeChunk = 256

// MoEGroups is the device memory of an MoE layer's (token, slot) pairs
// grouped by expert on the device (Ops.MoEGroup), for up to Pairs pairs
// and Experts experts: the offsets, rows and tokens of
// model.GroupByExpert, and the tile map the grouped products
// (GemmGrouped, GemmGroupedBF16) read. With the grouping on the device an
// MoE layer needs no round trip to the host, and every launch's size
// depends on the pair count only, so a decoding step can be a CUDA graph.
type MoEGroups struct {
	Pairs, Experts int
	Off            Buffer // int32 [Experts+1]: expert e's grouped rows are Off[e]..Off[e+1]
	Row            Buffer // int32 [Pairs]: pair j's grouped row
	Tok            Buffer // int32 [Pairs]: grouped row r's token
	Tiles          Buffer // int32 [2·maxTiles]: each row tile's expert and tile within it
	count, base    Buffer // int32 [chunks·Experts]: per chunk and expert
}

// MoEGroupSpan is one of MoEGroups' buffers and its size in 4-byte words,
// for the caller to allocate (its engine's memory plan counts them).
type MoEGroupSpan struct {
	B     *Buffer
	Words int
}

// Layout sets g's capacity and lists its buffers with their sizes.
func (g *MoEGroups) Layout(pairs, experts int) []MoEGroupSpan {
	g.Pairs, g.Experts = pairs, experts
	chunks := (pairs + moeChunk - 1) / moeChunk
	return []MoEGroupSpan{{&g.Off, experts + 1}, {&g.Row, pairs}, {&g.Tok, pairs},
		{&g.Tiles, 2 * groupTiles(pairs, experts)}, {&g.count, chunks * experts}, {&g.base, chunks * experts}}
}

// groupTiles bounds the row tiles of pairs rows over experts experts:
// Σ_e ceil(n_e/moeTile) ≤ ceil(pairs/moeTile) + experts. The grouped
// products' grid has this many row tiles; those past the last return.
func groupTiles(pairs, experts int) int { return (pairs+moeTile-1)/moeTile + experts }

// MoEGroup groups pairs (token, slot) pairs by expert from ids (int32
// [pairs], k slots a token, every id in [0, Experts)) as
// model.GroupByExpert does: g.Off, g.Row, g.Tok and the tile map, on the
// device, in three launches.
func (o *Ops) MoEGroup(g *MoEGroups, ids Buffer, pairs, k int) error {
	if pairs <= 0 || pairs > g.Pairs || k <= 0 || ids.Size < int64(pairs)*4 {
		return fmt.Errorf("cuda: grouping %d pairs of %d slots (ids of %d bytes), room for %d", pairs, k, ids.Size, g.Pairs)
	}
	E, chunks := g.Experts, (pairs+moeChunk-1)/moeChunk
	if err := o.Launch("moe.cu", "moe_group_count", Dim3{X: chunks}, block256, g.count, ids, pairs, E); err != nil {
		return err
	}
	if err := o.Launch("moe.cu", "moe_group_offsets", Dim3{X: 1}, block256, g.Off, g.base, g.Tiles, g.count, chunks, E, groupTiles(pairs, E)); err != nil {
		return err
	}
	return o.Launch("moe.cu", "moe_group_place", Dim3{X: chunks}, block256, g.Row, g.Tok, ids, g.base, pairs, E, k)
}

// groupedProduct checks a grouped product's shapes: the weights of every
// expert, w + e·wstride words of [N, K], inside w.
func groupedProduct(g *MoEGroups, pairs int, w Buffer, N, K, wstride, elem int) error {
	need := int64((g.Experts-1)*wstride+N*K) * int64(elem)
	switch {
	case pairs <= 0 || pairs > g.Pairs:
		return fmt.Errorf("cuda: a grouped product of %d rows, grouping for %d", pairs, g.Pairs)
	case N <= 0 || K <= 0 || wstride < N*K:
		return fmt.Errorf("cuda: a grouped product's weights [%d, %d] %d apart", N, K, wstride)
	case w.Size < need:
		return fmt.Errorf("cuda: a grouped product's %d experts' weights need %d bytes, have %d", g.Experts, need, w.Size)
	case groupTiles(pairs, g.Experts) > 65535:
		return fmt.Errorf("cuda: a grouped product of %d rows over %d experts: more row tiles than a grid holds", pairs, g.Experts)
	}
	return nil
}

// rowsFit checks that b holds rows rows of cols elements of elem bytes,
// ld apart: a grouped product's operand or output.
func rowsFit(what string, b Buffer, rows, cols, ld, elem int) error {
	if ld < cols || b.Size < (int64(rows-1)*int64(ld)+int64(cols))*int64(elem) {
		return fmt.Errorf("cuda: a grouped product's %s: %d rows of %d, %d apart, in %d bytes", what, rows, cols, ld, b.Size)
	}
	return nil
}

// GemmGrouped is the float32 product of every expert over its grouped
// rows (pairs of them, grouped by MoEGroup): c[r, 0:N] (+)= a[r, 0:K] ·
// W_eᵀ, rows lda and ldc apart, W_e = [N, K] at word e·wstride of w.
// Every output is the fmaf chain of Gemm over the expert's rows alone:
// the same bits, in one launch.
func (o *Ops) GemmGrouped(g *MoEGroups, pairs int, c, a, w Buffer, N, K, lda, ldc, wstride int, acc bool) error {
	if err := errors.Join(groupedProduct(g, pairs, w, N, K, wstride, 4), rowsFit("input", a, pairs, K, lda, 4), rowsFit("output", c, pairs, N, ldc, 4)); err != nil {
		return err
	}
	return o.Launch("gemm.cu", "gemm_f32_grouped_fwd", Dim3{X: (N + 63) / 64, Y: groupTiles(pairs, g.Experts)}, block256,
		c, a, w, g.Off, g.Tiles, N, K, int64(lda), int64(1), int64(1), int64(K), int64(ldc), int64(wstride), flag(acc))
}

// GemmGroupedBackX is GemmGrouped's input gradient: dx[r, 0:K] (+)=
// dy[r, 0:N] · W_e for every grouped row, the bits of LinearBackX over
// the expert's rows alone.
func (o *Ops) GemmGroupedBackX(g *MoEGroups, pairs int, dx, dy, w Buffer, N, K, lddy, lddx, wstride int, acc bool) error {
	if err := errors.Join(groupedProduct(g, pairs, w, N, K, wstride, 4), rowsFit("output's gradient", dy, pairs, N, lddy, 4), rowsFit("input's gradient", dx, pairs, K, lddx, 4)); err != nil {
		return err
	}
	return o.Launch("gemm.cu", "gemm_f32_grouped", Dim3{X: (K + 63) / 64, Y: groupTiles(pairs, g.Experts)}, block256,
		dx, dy, w, g.Off, g.Tiles, K, N, int64(lddy), int64(1), int64(K), int64(1), int64(lddx), int64(wstride), flag(acc))
}

// GemmGroupedBackW is GemmGrouped's weight gradient: dW_e += dy_eᵀ · x_e
// over each expert's grouped rows (dW_e [N, K] at word e·wstride of dw),
// the bits of LinearBackW over the expert's rows alone.
func (o *Ops) GemmGroupedBackW(g *MoEGroups, dw, dy, x Buffer, N, K, lddy, ldx, wstride int) error {
	if err := groupedProduct(g, g.Pairs, dw, N, K, wstride, 4); err != nil {
		return err
	}
	return o.Launch("gemm.cu", "gemm_f32_grouped_dw", Dim3{X: (K + 63) / 64, Y: (N + 63) / 64, Z: g.Experts}, block256,
		dw, dy, x, g.Off, N, K, int64(lddy), int64(ldx), int64(wstride))
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// vec16 says whether bf16 operands may be copied 16 bytes at a time: every
// buffer 16-byte aligned and every length (leading dimensions, strides,
// the products' sizes) a multiple of 8 elements.
func vec16(bufs []Buffer, lens ...int) int {
	for _, b := range bufs {
		if b.Ptr%16 != 0 {
			return 0
		}
	}
	for _, n := range lens {
		if n%8 != 0 {
			return 0
		}
	}
	return 1
}

// GemmGroupedBF16 is GemmGrouped from bf16 operands (a16 [pairs, lda] and
// the weights w16, wstride bf16 apart) on the tensor cores, float32
// accumulation and output (gemm_bf16_grouped: a row's outputs do not
// depend on the other rows).
func (o *Ops) GemmGroupedBF16(g *MoEGroups, pairs int, c, a16, w16 Buffer, N, K, lda, ldc, wstride int, acc bool) error {
	if err := errors.Join(groupedProduct(g, pairs, w16, N, K, wstride, 2), rowsFit("input", a16, pairs, K, lda, 2), rowsFit("output", c, pairs, N, ldc, 4)); err != nil {
		return err
	}
	return o.Launch("gemm.cu", "gemm_bf16_grouped"+o.fewRows(pairs, g.Experts), Dim3{X: (N + 63) / 64, Y: groupTiles(pairs, g.Experts)}, Dim3{X: 128},
		c, a16, w16, g.Off, g.Tiles, N, K, int64(lda), int64(ldc), int64(wstride), flag(acc),
		vec16([]Buffer{a16, w16}, lda, K, wstride), o.flashAsync())
}

// fewRows is the suffix of the forward grouped products' kernels with
// few-row warps ("_few": 64 x 16 a warp, 16-row slabs without a valid
// row skipped) where the experts get fewer than 32 rows each on average,
// as in a decoding step (256 rows x 8 of 128 experts: 16), and "" (32 x 32
// a warp) otherwise: the same bits either way, so the choice is speed
// only (o.groupedFew forces one in tests).
func (o *Ops) fewRows(pairs, experts int) string {
	if o.groupedFew > 0 || o.groupedFew == 0 && pairs < 32*experts {
		return "_few"
	}
	return ""
}

// GemmGroupedBF16To16 is GemmGroupedBF16 with c16 in bf16 (written, not
// accumulated): each output the float32 sum rounded once, bit for bit
// GemmGroupedBF16's output rounded.
func (o *Ops) GemmGroupedBF16To16(g *MoEGroups, pairs int, c16, a16, w16 Buffer, N, K, lda, ldc, wstride int) error {
	if err := errors.Join(groupedProduct(g, pairs, w16, N, K, wstride, 2), rowsFit("input", a16, pairs, K, lda, 2), rowsFit("output", c16, pairs, N, ldc, 2)); err != nil {
		return err
	}
	return o.Launch("gemm.cu", "gemm_bf16_grouped_c16"+o.fewRows(pairs, g.Experts), Dim3{X: (N + 63) / 64, Y: groupTiles(pairs, g.Experts)}, Dim3{X: 128},
		c16, a16, w16, g.Off, g.Tiles, N, K, int64(lda), int64(ldc), int64(wstride),
		vec16([]Buffer{a16, w16}, lda, K, wstride), o.flashAsync())
}

// GemmGroupedBF16BackX is GemmGroupedBF16's input gradient: dx[r, 0:K]
// (+)= dy16[r, 0:N] · W_e (the weights read transposed).
func (o *Ops) GemmGroupedBF16BackX(g *MoEGroups, pairs int, dx, dy16, w16 Buffer, N, K, lddy, lddx, wstride int, acc bool) error {
	if err := errors.Join(groupedProduct(g, pairs, w16, N, K, wstride, 2), rowsFit("output's gradient", dy16, pairs, N, lddy, 2), rowsFit("input's gradient", dx, pairs, K, lddx, 4)); err != nil {
		return err
	}
	return o.Launch("gemm.cu", "gemm_bf16_grouped_dx", Dim3{X: (K + 63) / 64, Y: groupTiles(pairs, g.Experts)}, Dim3{X: 128},
		dx, dy16, w16, g.Off, g.Tiles, N, K, int64(lddy), int64(lddx), int64(wstride), flag(acc),
		vec16([]Buffer{dy16, w16}, lddy, N, K, wstride), o.flashAsync())
}

// GemmGroupedBF16BackW is GemmGroupedBF16's weight gradient: dW_e (float32,
// word e·wstride of dw) += dy16_eᵀ · x16_e over each expert's grouped rows
// (both read transposed: the sum runs over rows).
func (o *Ops) GemmGroupedBF16BackW(g *MoEGroups, dw, dy16, x16 Buffer, N, K, lddy, ldx, wstride int) error {
	if err := groupedProduct(g, g.Pairs, dw, N, K, wstride, 4); err != nil {
		return err
	}
	return o.Launch("gemm.cu", "gemm_bf16_grouped_dw", Dim3{X: (K + 63) / 64, Y: (N + 63) / 64, Z: g.Experts}, Dim3{X: 128},
		dw, dy16, x16, g.Off, N, K, int64(lddy), int64(ldx), int64(wstride),
		vec16([]Buffer{dy16, x16}, lddy, ldx, N, K), o.flashAsync())
}

// current16 is the bf16 copy of w, a span of the float32 arena, rounded
// again first if the weights changed (Stale).
func (l *BF16Linear) current16(w Buffer) (Buffer, error) {
	if err := l.weights(); err != nil {
		return Buffer{}, err
	}
	return l.w16span(w)
}

// Grouped is GemmGroupedBF16 with the weights' bf16 copy: w is the span
// of the float32 arena holding every expert's [N, K] (expert e at word
// e·wstride), x16 the grouped rows in bf16.
func (l *BF16Linear) Grouped(g *MoEGroups, pairs int, y, x16, w Buffer, N, K, ldx, ldy, wstride int) error {
	w16, err := l.current16(w)
	if err != nil {
		return err
	}
	return l.ops.GemmGroupedBF16(g, pairs, y, x16, w16, N, K, ldx, ldy, wstride, false)
}

// Grouped16 is Grouped with y16 in bf16 (GemmGroupedBF16To16).
func (l *BF16Linear) Grouped16(g *MoEGroups, pairs int, y16, x16, w Buffer, N, K, ldx, ldy, wstride int) error {
	w16, err := l.current16(w)
	if err != nil {
		return err
	}
	return l.ops.GemmGroupedBF16To16(g, pairs, y16, x16, w16, N, K, ldx, ldy, wstride)
}

// GroupedBack is Grouped's backward from bf16 operands: dx[r, 0:K] (+)=
// dy16[r, 0:N] · W_e and dW_e (the float32 gradient span dw, laid out as
// w) += dy16_eᵀ · x16_e, for every expert over its grouped rows.
func (l *BF16Linear) GroupedBack(g *MoEGroups, pairs int, dx, dw, dy16, x16, w Buffer, N, K, lddy, ldx, lddx, wstride int, acc bool) error {
	w16, err := l.current16(w)
	if err != nil {
		return err
	}
	if err := l.ops.GemmGroupedBF16BackX(g, pairs, dx, dy16, w16, N, K, lddy, lddx, wstride, acc); err != nil {
		return err
	}
	return l.ops.GemmGroupedBF16BackW(g, dw, dy16, x16, N, K, lddy, ldx, wstride)
}
