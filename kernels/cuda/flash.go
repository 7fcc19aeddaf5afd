package cuda

// Attention on the tensor cores (flash.cu) for the bf16 training mode: the
// scratch of bf16 copies its kernels read, the order of their tiles, the
// stored dS of the backward, and the launches.

import (
	"cmp"
	"fmt"
	"slices"
)

// flashThreads is every flash.cu attention kernel's block (FA_THREADS
// there): their tile copies are unrolled for it, and another block
// would skip or repeat chunks.
const flashThreads = 128

// flashAsync is flash.cu's copy flag: 1 for cp.async.
func (o *Ops) flashAsync() int {
	if o.FlashPlainCopies {
		return 0
	}
	return 1
}

// FlashHeadDim says whether flash.cu has kernels for head size hd.
func FlashHeadDim(hd int) bool { return hd == 32 || hd == 64 || hd == 128 }

func checkFlash(heads, kv, hd int) error {
	if !FlashHeadDim(hd) || kv < 1 || heads < 1 || heads%kv != 0 {
		return fmt.Errorf("cuda: flash attention with %d heads, %d KV heads, head_dim %d: want KV heads dividing heads and head_dim 32, 64 or 128", heads, kv, hd)
	}
	return nil
}

// FlashScratch holds the bf16 copies of attention's operands that
// flash.cu's kernels read, for rows tokens: row-major [Tp, width] copies
// whose rows past rows stay zero, Tp = rows rounded up to 128 (the wide
// forward's query block). A forward needs q, k and v; a backward q, k, v
// and dO. One scratch serves every layer of a pass.
type FlashScratch struct {
	mem                      Memory
	rows, pad, heads, kv, hd int
	backward                 bool
	q, k, v, dout            Buffer
	vld                      int // the row stride of v, and of a backward's dv16: kv·hd, or UseQKVRows
	bufs                     []Buffer
	// givenQK: the caller makes q's and k's row-major copies
	// (NormRopeBF16) and points the scratch at them (UseQK); givenV: v's
	// too (UseQKV); givenDO: a backward's dO too (UseDO).
	givenQK, givenV, givenDO bool
	// ds and dsOff: the backward's stored dS tiles and each key block's
	// first (StoreScores); none without.
	ds, dsOff Buffer
	// order: the tiles' launch order (UseOrder, FlashOrder's); none
	// without.
	order Buffer
}

// NewFlashScratch allocates from mem the copies a forward (backward false)
// or a backward over rows tokens needs.
func NewFlashScratch(mem Memory, rows, heads, kv, hd int, backward bool) (*FlashScratch, error) {
	return newFlashScratch(mem, rows, heads, kv, hd, backward, false, false, false)
}

// NewFlashScratchGivenQK is NewFlashScratch for a caller that makes q's and
// k's row-major bf16 copies itself ([Pad(rows), width], the pad rows zero:
// NormRopeBF16 writes them so, and the training engine keeps them for the
// backward) and hands them to each call with UseQK: no rounding pass of
// its own for them.
func NewFlashScratchGivenQK(mem Memory, rows, heads, kv, hd int, backward bool) (*FlashScratch, error) {
	return newFlashScratch(mem, rows, heads, kv, hd, backward, true, false, false)
}

// NewFlashScratchGivenQKV is NewFlashScratchGivenQK for a caller that has
// v in bf16 as well ([Pad(rows), kv·hd], or a column span of wider rows,
// the pad rows zero: the bf16 training mode's q, k and v product writes
// it so) and hands it to each call with UseQKV or UseQKVRows: the forward and the backward read it as their row-major copy
// (none of their own, no rounding pass).
func NewFlashScratchGivenQKV(mem Memory, rows, heads, kv, hd int, backward bool) (*FlashScratch, error) {
	return newFlashScratch(mem, rows, heads, kv, hd, backward, true, true, false)
}

// NewFlashBackwardGiven is NewFlashScratchGivenQKV's backward for a caller
// that has dO in bf16 as well ([Pad(rows), heads·hd], the pad rows zero:
// the bf16 training mode's o product writes it so, rounding its float32
// sums once) and hands it to each call with UseDO: the scratch holds no
// copy, and the backward rounds nothing.
func NewFlashBackwardGiven(mem Memory, rows, heads, kv, hd int) (*FlashScratch, error) {
	return newFlashScratch(mem, rows, heads, kv, hd, true, true, true, true)
}

// FlashPad is the rows of flash.cu's copies for rows tokens: rows rounded
// up to 128.
func FlashPad(rows int) int { return (rows + 127) / 128 * 128 }

// UseQK points a NewFlashScratchGivenQK scratch at q16 and k16, the bf16
// row-major copies of the next call's q and k.
func (s *FlashScratch) UseQK(q16, k16 Buffer) error {
	if !s.givenQK {
		return fmt.Errorf("cuda: UseQK on a flash scratch that makes its own copies of q and k")
	}
	if q16.Size < int64(s.pad*s.heads*s.hd)*2 || k16.Size < int64(s.pad*s.kv*s.hd)*2 {
		return fmt.Errorf("cuda: UseQK: copies of %d and %d bytes for %d padded rows of %d and %d", q16.Size, k16.Size, s.pad, s.heads*s.hd, s.kv*s.hd)
	}
	s.q, s.k = q16, k16
	return nil
}

// UseQKV is UseQK for a NewFlashScratchGivenQKV scratch, with v16 the
// bf16 row-major copy of the next call's v.
func (s *FlashScratch) UseQKV(q16, k16, v16 Buffer) error {
	return s.UseQKVRows(q16, k16, v16, s.kv*s.hd)
}

// UseQKVRows is UseQKV with v16's rows ld bf16 apart (v a column span of a
// wider matrix: the training engine's q, k and v products in one), and a
// backward's dv16 laid out so too.
func (s *FlashScratch) UseQKVRows(q16, k16, v16 Buffer, ld int) error {
	if !s.givenV {
		return fmt.Errorf("cuda: UseQKV on a flash scratch that makes its own copies of v")
	}
	kvd := s.kv * s.hd
	if ld < kvd || ld%8 != 0 || v16.Ptr%16 != 0 { // flash.cu copies 16 bytes at a time
		return fmt.Errorf("cuda: UseQKVRows: rows %d apart from %#x: want at least v's %d, a multiple of 8, 16-byte aligned", ld, v16.Ptr, kvd)
	}
	if v16.Size < (int64(s.pad-1)*int64(ld)+int64(kvd))*2 {
		return fmt.Errorf("cuda: UseQKVRows: a copy of v of %d bytes for %d padded rows of %d, %d apart", v16.Size, s.pad, kvd, ld)
	}
	if err := s.UseQK(q16, k16); err != nil {
		return err
	}
	s.v, s.vld = v16, ld
	return nil
}

// UseDO points a NewFlashBackwardGiven scratch at do16, the bf16
// row-major copy of the next backward's dO.
func (s *FlashScratch) UseDO(do16 Buffer) error {
	if !s.givenDO {
		return fmt.Errorf("cuda: UseDO on a flash scratch that makes its own copy of dO")
	}
	if do16.Size < int64(s.pad*s.heads*s.hd)*2 {
		return fmt.Errorf("cuda: UseDO: a copy of dO of %d bytes for %d padded rows of %d", do16.Size, s.pad, s.heads*s.hd)
	}
	s.dout = do16
	return nil
}

// UseOrder has the scratch's kernels take their tiles in the order
// FlashOrder gives for the packed sequences of its calls (order holds
// FlashOrder's int32s on the device), the heaviest first over every
// sequence and head; without it, each sequence's tiles from its last. The
// same bits either way: only which block computes a tile, and when,
// changes.
func (s *FlashScratch) UseOrder(order Buffer) error {
	if n := int64(FlashOrderLen(s.rows)) * 4; order.Size < n {
		return fmt.Errorf("cuda: UseOrder: %d bytes for %d rows' orders of %d", order.Size, s.rows, n)
	}
	s.order = order
	return nil
}

// orderOf is the part of s's order for tiles of rows query rows (64 or
// 128: FlashOrder's first two) or, with keys, the key blocks' (its third);
// Buffer{} (no order) without UseOrder.
func (s *FlashScratch) orderOf(rows int, keys bool) Buffer {
	if s.order.Ptr == 0 {
		return Buffer{}
	}
	n64, n128 := (s.rows+63)/64, (s.rows+127)/128
	switch {
	case keys:
		return s.order.Floats(n64+n128, n64)
	case rows == 128:
		return s.order.Floats(n64, n128)
	default:
		return s.order.Floats(0, n64)
	}
}

// flashTail is how many of a grid's heads flash.cu's blocks take side by
// side (the rest head after head; see scheduled in flash.cu) for tiles
// tiles a head and heads heads: all of them, but with
// Ops.FlashOrderHeadwise the fewest whose blocks fill the card's block
// slots (two a multiprocessor, the head size 128 kernels' occupancy) three
// times, so that the last three waves start on the heaviest tiles of every
// sequence (in TestFlashOrderMakespan's model two waves left the dQ pass
// over one sequence of 4,096 tokens 7.7% past an even share, three 3.1%);
// Ops.FlashOrderTail where it is set.
func (o *Ops) flashTail(tiles, heads int) int {
	switch {
	case o.FlashOrderTail > 0:
		return min(o.FlashOrderTail, heads)
	case !o.FlashOrderHeadwise:
		return heads
	}
	slots := 2 * max(1, o.Dev.SMs)
	return min(heads, max(1, (3*slots+tiles-1)/tiles))
}

// FlashOrderLen is the int32s FlashOrder gives for rows tokens.
func FlashOrderLen(rows int) int { return 2*((rows+63)/64) + (rows+127)/128 }

// FlashOrder is the order in which flash.cu's blocks take their tiles over
// the packed sequences that ends describes (ends[t]: one past the last
// token of token t's sequence, as seqEnd holds it), for UseOrder: the query
// tiles of 64 rows (the narrow forward, the dQ passes), then of 128 (the
// wide forwards), then the key blocks of 64 (the dK/dV passes), each a
// permutation of its tiles, the most work first and ties in index order.
// A query tile's work is the keys its rows see (from its first row's
// sequence start to its last row), a key block's the queries that see its
// keys (from its first key to its last key's sequence end). Launched
// blocks start in about that order, so the grid ends on light tiles
// wherever the heavy ones lie.
func FlashOrder(ends []int32) ([]int32, error) {
	T := len(ends)
	start := make([]int32, T)
	for i, e := range ends {
		// A token's sequence ends where the one before's does, or that
		// one's ended at this token.
		if int(e) <= i || int(e) > T || (i > 0 && e != ends[i-1] && int(ends[i-1]) != i) {
			return nil, fmt.Errorf("cuda: flash order: token %d's sequence ends at %d of %d tokens", i, e, T)
		}
		if i > 0 && ends[i-1] == e {
			start[i] = start[i-1]
		} else {
			start[i] = int32(i)
		}
	}
	order := make([]int32, 0, FlashOrderLen(T))
	sorted := func(n int, work func(tile int) int) {
		w := make([]int, n)
		tiles := make([]int32, n)
		for i := range tiles {
			tiles[i], w[i] = int32(i), work(i)
		}
		slices.SortStableFunc(tiles, func(a, b int32) int { return cmp.Compare(w[b], w[a]) })
		order = append(order, tiles...)
	}
	for _, rows := range []int{64, 128} {
		sorted((T+rows-1)/rows, func(x int) int {
			last := min(T, (x+1)*rows) - 1
			return last + 1 - int(start[x*rows])
		})
	}
	sorted((T+63)/64, func(x int) int {
		last := min(T, (x+1)*64) - 1
		return int(ends[last]) - x*64
	})
	return order, nil
}

// vGiven reports whether the scratch reads the caller's v (UseQKV), and
// fails if the caller has given none.
func (s *FlashScratch) vGiven() (bool, error) {
	if s.givenV && s.v.Ptr == 0 {
		return true, fmt.Errorf("cuda: a flash scratch without its copy of v (UseQKV)")
	}
	return s.givenV, nil
}

func newFlashScratch(mem Memory, rows, heads, kv, hd int, backward, givenQK, givenV, givenDO bool) (*FlashScratch, error) {
	d := mem.Device()
	if err := checkFlash(heads, kv, hd); err != nil {
		return nil, err
	}
	if rows < 1 {
		return nil, fmt.Errorf("cuda: flash attention's copies for %d rows", rows)
	}
	s := &FlashScratch{mem: mem, rows: rows, pad: FlashPad(rows), heads: heads, kv: kv, hd: hd, backward: backward, givenQK: givenQK, givenV: givenV, givenDO: givenDO, vld: kv * hd}
	qd, kvd := int64(s.pad*heads*hd)*2, int64(s.pad*kv*hd)*2
	// Each copy's pad rows must read as zeros; the caller's (given) come
	// with each call (UseQK, UseQKV).
	type copyBuf struct {
		b     *Buffer
		bytes int64
		given bool
	}
	want := []copyBuf{{&s.q, qd, givenQK}, {&s.k, kvd, givenQK}, {&s.v, kvd, givenV}}
	if backward {
		want = append(want, copyBuf{&s.dout, qd, givenDO})
	}
	for _, w := range want {
		if w.given {
			continue
		}
		b, err := mem.Alloc(w.bytes)
		if err != nil {
			s.Free()
			return nil, outOfMemory(d, "flash attention's bf16 copies", w.bytes, err)
		}
		s.bufs = append(s.bufs, b)
		*w.b = b
		if err := d.Zero(b); err != nil {
			s.Free()
			return nil, err
		}
	}
	return s, nil
}

// Free releases the copies.
func (s *FlashScratch) Free() {
	for _, b := range s.bufs {
		s.mem.Free(b)
	}
	s.bufs = nil
	s.freeScores()
}

func (s *FlashScratch) freeScores() {
	for _, b := range []*Buffer{&s.ds, &s.dsOff} {
		if b.Ptr != 0 {
			s.mem.Free(*b)
		}
		*b = Buffer{}
	}
}

// flashBlock is flash.cu's key block (FA_BK) and dQ block (FA_BQ), the
// units of the stored dS's layout; flashScoreTile the bytes of one of
// its tiles (DS_TILE words: a key block by 32 queries, bf16).
const (
	flashBlock     = 64
	flashScoreTile = flashBlock * 32 * 2
)

// ScoreLayout is where a backward over the packed sequences that ends
// describes (ends[t]: one past the last token of token t's sequence, as
// seqEnd holds it) stores dS for heads heads (FlashDQStored): key block b
// (tokens 64b..64b+63) has a tile of 32 queries for each query tile from
// 64b to its sequence's end rounded up to 64 (the dQ pass's blocks; at
// most FlashPad(len(ends))), for each head; its tiles start at off[b] and
// number off[b+1] - off[b]. off has a key block's entry more than there
// are blocks; off[last] is every tile.
func ScoreLayout(ends []int32, heads int) ([]int64, error) {
	T := len(ends)
	pad := FlashPad(T)
	nb := (T + flashBlock - 1) / flashBlock
	for i, e := range ends {
		if int(e) <= i || int(e) > T || (i > 0 && e < ends[i-1]) {
			return nil, fmt.Errorf("cuda: stored dS: token %d's sequence ends at %d of %d tokens", i, e, T)
		}
	}
	off := make([]int64, nb+1)
	for b := 0; b < nb; b++ {
		j0, last := b*flashBlock, min(T, (b+1)*flashBlock)-1
		qend := min(pad, (int(ends[last])+flashBlock-1)/flashBlock*flashBlock)
		off[b+1] = off[b] + int64(heads*(qend-j0)/32)
	}
	return off, nil
}

// ScoreBytes is the device memory StoreScores takes for ends and heads:
// the tiles and their offsets.
func ScoreBytes(ends []int32, heads int) (int64, error) {
	off, err := ScoreLayout(ends, heads)
	if err != nil {
		return 0, err
	}
	return off[len(off)-1]*flashScoreTile + int64(len(off))*8, nil
}

// StoreScores gives a backward's scratch the device memory for dS
// (ScoreLayout) over the packed sequences ends describes, one entry a
// token (the seqEnd of FlashAttentionBackward's calls): its backward then
// stores dS in the dK/dV pass and its dQ pass reads it back
// (FlashDQStored), where the pipelined 32-query dK/dV pass runs.
func (s *FlashScratch) StoreScores(ends []int32) error {
	if !s.backward {
		return fmt.Errorf("cuda: StoreScores on a forward's flash scratch")
	}
	if len(ends) != s.rows {
		return fmt.Errorf("cuda: StoreScores: %d sequence ends for a scratch of %d rows", len(ends), s.rows)
	}
	off, err := ScoreLayout(ends, s.heads)
	if err != nil {
		return err
	}
	s.freeScores()
	d := s.mem.Device()
	bytes := off[len(off)-1] * flashScoreTile
	if s.ds, err = s.mem.Alloc(bytes); err != nil {
		s.ds = Buffer{}
		return outOfMemory(d, "flash attention's stored dS (KEEL_FLASH_DQ=stored)", bytes, err)
	}
	if s.dsOff, err = s.mem.Alloc(int64(len(off)) * 8); err != nil {
		s.dsOff = Buffer{}
		s.freeScores()
		return outOfMemory(d, "flash attention's stored dS offsets", int64(len(off))*8, err)
	}
	return Upload(d, s.dsOff, off)
}

// rowsBF16 rounds src [rows, width] into the row-major copy dst.
func (o *Ops) rowsBF16(dst, src Buffer, rows, width int) error { return o.ToBF16(dst, src, rows*width) }

// qkCopies makes s's row-major copies of q and k, unless the caller gave
// them (UseQK).
func (o *Ops) qkCopies(s *FlashScratch, q, k Buffer) error {
	if s.givenQK {
		if s.q.Ptr == 0 || s.k.Ptr == 0 {
			return fmt.Errorf("cuda: a flash scratch without its copies of q and k (UseQK)")
		}
		return nil
	}
	T := s.rows
	if err := o.rowsBF16(s.q, q, T, s.heads*s.hd); err != nil {
		return err
	}
	return o.rowsBF16(s.k, k, T, s.kv*s.hd)
}

// FlashAttention is Attention on the tensor cores (flash.cu): bf16
// operands, float32 accumulation, the softmax online, for the bf16
// training mode; out16 [rows, heads*hd] gets the output rounded to bf16
// (the output projection's operand, as the backward reads it too).
// Deterministic, but neither batch invariant nor equal to Attention's
// bits: the exact mode keeps Attention. s is a scratch for s.rows rows
// with the same heads and head size.
func (o *Ops) FlashAttention(s *FlashScratch, out16, lse, q, k, v, seqStart Buffer, scale float32) error {
	if s.backward {
		return fmt.Errorf("cuda: FlashAttention given a backward's scratch")
	}
	if !(scale > 0) {
		// The forward takes each row's running maximum over the raw
		// scores and scales it after, which holds for a positive scale.
		return fmt.Errorf("cuda: FlashAttention's scale %v: want a positive number", scale)
	}
	T := s.rows
	for _, f := range []func() error{
		func() error { return o.qkCopies(s, q, k) },
		func() error { return o.vCopy(s, v) },
		func() error {
			name, rows, shared := "flash_fwd_%d", 64, 0
			switch {
			case o.FlashWideQ && o.fitsShared(flashForwardShared(s.hd)):
				name, rows, shared = "flash_fwd_wq_%d", 128, flashForwardShared(s.hd)
			case o.FlashWide:
				name, rows = "flash_fwd_wide_%d", 128
			}
			return o.LaunchShared("flash.cu", fmt.Sprintf(name, s.hd), Dim3{X: (T + rows - 1) / rows, Y: s.heads}, Dim3{X: flashThreads}, shared,
				out16, lse, s.q, s.k, s.v, seqStart, T, s.pad, s.heads, s.kv, scale, o.flashAsync(), int64(s.vld), s.orderOf(rows, false), o.flashTail((T+rows-1)/rows, s.heads))
		},
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// vCopy makes s's row-major copy of v, unless the caller gave it
// (UseQKV).
func (o *Ops) vCopy(s *FlashScratch, v Buffer) error {
	if given, err := s.vGiven(); given || err != nil {
		return err
	}
	return o.rowsBF16(s.v, v, s.rows, s.kv*s.hd)
}

// fitsShared says whether a block may have bytes of shared memory on o's
// device: the forward with Q in shared memory needs 102 KiB at head size
// 128, more than sm_86 and sm_89 cards give a block (99 KiB), and takes
// the narrow forward there; the backward takes the 16-query dK/dV pass
// where the 32-query one's 69 KiB do not fit, and one stage where the
// pipelined passes' (34 KiB) do not.
func (o *Ops) fitsShared(bytes int) bool { return bytes <= o.Dev.SharedPerBlock }

// flashForwardShared is the dynamic shared memory, in bytes, of flash.cu's
// wide forward with Q in shared memory (flash_fwd_wq) for head size hd:
// Q's 128 rows, two stages of 64 keys' K rows and of V's (FLASH_FWDQ_BODY).
// 102 KiB at head size 128: two blocks a multiprocessor.
func flashForwardShared(hd int) int {
	kp := hd/2 + 4
	return 4 * (128*kp + 4*64*kp)
}

// flashBackwardShared is the dynamic shared memory, in bytes, of flash.cu's
// pipelined backward kernels for head size hd: two stages of
// DQ_STAGE_WORDS (flash_bwd_dq_2), or DKV_V_WORDS and two stages of
// DKV_STAGE_WORDS (flash_bwd_dkv_2); with wide, flash_bwd_dkv_w's (32
// queries a stage, K's DKV_V_WORDS too at head size 128). The emulator
// faults on a kernel that reads past what it is given.
func flashBackwardShared(hd int, dkv, wide bool) int {
	const bk, faBK = 32, 64 // flash.cu's FB_BK, FA_BK
	bq := 16                // FB_BQ
	kp := hd/2 + 4
	if dkv {
		kv := 1 // V, and K where it is not in registers
		if wide {
			bq = 32
			if hd == 128 {
				kv = 2
			}
		}
		return 4 * (kv*faBK*kp + 2*(2*bq*kp+3*bq))
	}
	return 4 * 2 * 2 * bk * kp
}

// FlashAttentionBackward computes FlashAttention's gradients dq and dk
// (float32) and dv16 (bf16: each float32 sum rounded once, as the v
// product's backward reads it; its rows laid out as v's, UseQKVRows) for the upstream gradient dout (float32;
// none for a NewFlashBackwardGiven scratch, which has it in bf16),
// from its out16 (bf16) and lse; dsum [rows, heads] is scratch (D = dO·O
// per row and head). Two passes, no atomics; with stored dS (StoreScores)
// three: D, dK and dV storing dS, dQ from it (the same bits). s is a
// backward's scratch.
func (o *Ops) FlashAttentionBackward(s *FlashScratch, dq, dk, dv16, dsum, dout, out16, lse, q, k, v, seqStart, seqEnd Buffer, scale float32) error {
	if !s.backward {
		return fmt.Errorf("cuda: FlashAttentionBackward given a forward's scratch")
	}
	T, qd := s.rows, s.heads*s.hd
	if need := (int64(T-1)*int64(s.vld) + int64(s.kv*s.hd)) * 2; dv16.Size < need {
		return fmt.Errorf("cuda: FlashAttentionBackward: dv16 of %d bytes for %d rows of %d, %d apart", dv16.Size, T, s.kv*s.hd, s.vld)
	}
	// With stored dS (StoreScores), where the 32-query dK/dV pass runs:
	// D's pass, then the dK/dV pass that stores dS, then the dQ pass that
	// reads it.
	stored := s.ds.Ptr != 0 && !o.FlashBackwardSingle && o.fitsShared(flashBackwardShared(s.hd, true, true))
	for _, f := range []func() error{
		func() error { return o.qkCopies(s, q, k) },
		func() error { return o.vCopy(s, v) },
		func() error {
			if s.givenDO { // the caller's copy
				if s.dout.Ptr == 0 {
					return fmt.Errorf("cuda: a flash scratch without its copy of dO (UseDO)")
				}
				return nil
			}
			return o.rowsBF16(s.dout, dout, T, qd)
		},
		func() error {
			if stored {
				return o.Launch("flash.cu", fmt.Sprintf("flash_bwd_dsum_%d", s.hd), Dim3{X: (T + 63) / 64, Y: s.heads}, Dim3{X: flashThreads},
					dsum, s.dout, out16, T, s.heads)
			}
			name, shared := "flash_bwd_dq_%d", 0
			if !o.FlashBackwardSingle && o.fitsShared(flashBackwardShared(s.hd, false, false)) {
				name, shared = "flash_bwd_dq_2_%d", flashBackwardShared(s.hd, false, false)
			}
			return o.LaunchShared("flash.cu", fmt.Sprintf(name, s.hd), Dim3{X: (T + 63) / 64, Y: s.heads}, Dim3{X: flashThreads}, shared,
				dq, dsum, out16, lse, s.q, s.dout, s.k, s.v, seqStart, T, s.pad, s.heads, s.kv, scale, o.flashAsync(), int64(s.vld), s.orderOf(64, false), o.flashTail((T+63)/64, s.heads))
		},
		func() error {
			name, shared := "flash_bwd_dkv_%d", 0
			switch {
			case o.FlashBackwardSingle:
			case o.FlashDKVWide && o.fitsShared(flashBackwardShared(s.hd, true, true)):
				name, shared = "flash_bwd_dkv_w_%d", flashBackwardShared(s.hd, true, true)
			case o.fitsShared(flashBackwardShared(s.hd, true, false)):
				name, shared = "flash_bwd_dkv_2_%d", flashBackwardShared(s.hd, true, false)
			}
			args := []any{dk, dv16, lse, dsum, s.q, s.dout, s.k, s.v, seqStart, seqEnd, T, s.pad, s.heads, s.kv, scale, o.flashAsync(), int64(s.vld), s.orderOf(64, true), o.flashTail((T+63)/64, s.kv)}
			if stored {
				name, shared = "flash_bwd_dkv_ds_%d", flashBackwardShared(s.hd, true, true)
				args = append(args, s.ds, s.dsOff)
			}
			return o.LaunchShared("flash.cu", fmt.Sprintf(name, s.hd), Dim3{X: (T + 63) / 64, Y: s.kv}, Dim3{X: flashThreads}, shared, args...)
		},
		func() error {
			if !stored {
				return nil
			}
			return o.Launch("flash.cu", fmt.Sprintf("flash_bwd_dq_ds_%d", s.hd), Dim3{X: (T + 63) / 64, Y: s.heads}, Dim3{X: flashThreads},
				dq, s.ds, s.dsOff, s.k, seqStart, T, s.heads, s.kv, scale, o.flashAsync(), s.orderOf(64, false), o.flashTail((T+63)/64, s.heads))
		},
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}
