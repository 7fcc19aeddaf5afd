//go:build amd64 && !purego

#include "textflag.h"

// Attention kernels over the bfloat16 KV cache (see attn_bf16.go). A
// bfloat16 is widened to float32 by a 16-bit left shift of its zero-extended
// bits (VPMOVZXWD then VPSLLD $16).

// func dotRowsBF16AVX512(s, q *float32, k *kernels.BF16, n, d, ld int, scale float32)
//
// s[j] = scale · dot(q, k[j·ld : j·ld+d]) for j < n, d a multiple of 16:
// per key, sixteen lanes accumulate q·k over the 16-wide chunks in
// increasing order (one FMA chain per lane), then the lanes are added
// pairwise: l + l+8, then l + l+4, then l + l+2, then l + l+1. Four keys
// go together (q loaded once, the four trees reduced side by side); the
// last n mod 4 one at a time, with the same sums.
TEXT ·dotRowsBF16AVX512(SB), NOSPLIT, $0-52
	MOVQ s+0(FP), R8
	MOVQ k+16(FP), R10
	MOVQ n+24(FP), R11
	MOVQ d+32(FP), R12
	MOVQ ld+40(FP), R13
	SHLQ $1, R13                  // row stride in bytes
	LEAQ (R13)(R13*2), R14        // three rows
	VBROADCASTSS scale+48(FP), X9

quad:
	CMPQ R11, $4
	JLT single
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ q+8(FP), SI
	MOVQ R10, DI
	MOVQ R12, BX

quadchunk:
	VMOVUPS (SI), Z4
	VPMOVZXWD (DI), Z5
	VPMOVZXWD (DI)(R13*1), Z6
	VPMOVZXWD (DI)(R13*2), Z7
	VPMOVZXWD (DI)(R14*1), Z8
	VPSLLD $16, Z5, Z5
	VPSLLD $16, Z6, Z6
	VPSLLD $16, Z7, Z7
	VPSLLD $16, Z8, Z8
	VFMADD231PS Z4, Z5, Z0
	VFMADD231PS Z4, Z6, Z1
	VFMADD231PS Z4, Z7, Z2
	VFMADD231PS Z4, Z8, Z3
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, BX
	JNZ quadchunk

	// Lanes l + l+8, then l + l+4, per key.
	VEXTRACTF64X4 $1, Z0, Y5
	VEXTRACTF64X4 $1, Z1, Y6
	VEXTRACTF64X4 $1, Z2, Y7
	VEXTRACTF64X4 $1, Z3, Y8
	VADDPS Y5, Y0, Y0
	VADDPS Y6, Y1, Y1
	VADDPS Y7, Y2, Y2
	VADDPS Y8, Y3, Y3
	VEXTRACTF128 $1, Y0, X5
	VEXTRACTF128 $1, Y1, X6
	VEXTRACTF128 $1, Y2, X7
	VEXTRACTF128 $1, Y3, X8
	VADDPS X5, X0, X0
	VADDPS X6, X1, X1
	VADDPS X7, X2, X2
	VADDPS X8, X3, X3
	// l + l+2: keys 0 and 1 side by side, then 2 and 3.
	VUNPCKLPD X1, X0, X4
	VUNPCKHPD X1, X0, X5
	VADDPS X5, X4, X4
	VUNPCKLPD X3, X2, X6
	VUNPCKHPD X3, X2, X7
	VADDPS X7, X6, X6
	// l + l+1: the four scores.
	VHADDPS X6, X4, X4
	VMULPS X9, X4, X4
	VMOVUPS X4, (R8)
	ADDQ $16, R8
	LEAQ (R10)(R13*4), R10
	SUBQ $4, R11
	JMP quad

single:
	TESTQ R11, R11
	JZ done
	VPXORD Z0, Z0, Z0
	MOVQ q+8(FP), SI
	MOVQ R10, DI
	MOVQ R12, BX

singlechunk:
	VPMOVZXWD (DI), Z5
	VPSLLD $16, Z5, Z5
	VFMADD231PS (SI), Z5, Z0
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, BX
	JNZ singlechunk

	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VADDPS X1, X0, X0
	VMOVSHDUP X0, X1
	VADDSS X1, X0, X0
	VMULSS X9, X0, X0
	VMOVSS X0, (R8)
	ADDQ $4, R8
	ADDQ R13, R10
	DECQ R11
	JMP single

done:
	VZEROUPPER
	RET

// func axpyRowsBF16AVX512(out, p *float32, v *kernels.BF16, n, d, ld int)
//
// out[i] += (a0 + a1) + (a2 + a3) with a_r = Σ_{j ≡ r mod 4} p[j]·v[j·ld + i]
// (each a FMA chain in increasing j), for i < d, d a multiple of 16.
TEXT ·axpyRowsBF16AVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), R8
	MOVQ v+16(FP), R10
	MOVQ d+32(FP), R12
	MOVQ ld+40(FP), R13
	SHLQ $1, R13                  // row stride in bytes
	LEAQ (R13)(R13*2), R14        // three rows

chunk:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ p+8(FP), SI
	MOVQ R10, DI
	MOVQ n+24(FP), BX

quad:
	CMPQ BX, $4
	JLT rest
	VPMOVZXWD (DI), Z5
	VPMOVZXWD (DI)(R13*1), Z6
	VPMOVZXWD (DI)(R13*2), Z7
	VPMOVZXWD (DI)(R14*1), Z8
	VPSLLD $16, Z5, Z5
	VPSLLD $16, Z6, Z6
	VPSLLD $16, Z7, Z7
	VPSLLD $16, Z8, Z8
	VBROADCASTSS (SI), Z4
	VFMADD231PS Z4, Z5, Z0
	VBROADCASTSS 4(SI), Z4
	VFMADD231PS Z4, Z6, Z1
	VBROADCASTSS 8(SI), Z4
	VFMADD231PS Z4, Z7, Z2
	VBROADCASTSS 12(SI), Z4
	VFMADD231PS Z4, Z8, Z3
	ADDQ $16, SI
	LEAQ (DI)(R13*4), DI
	SUBQ $4, BX
	JMP quad

rest:
	TESTQ BX, BX
	JZ sum
	VPMOVZXWD (DI), Z5
	VPSLLD $16, Z5, Z5
	VBROADCASTSS (SI), Z4
	VFMADD231PS Z4, Z5, Z0
	CMPQ BX, $1
	JEQ sum
	VPMOVZXWD (DI)(R13*1), Z6
	VPSLLD $16, Z6, Z6
	VBROADCASTSS 4(SI), Z4
	VFMADD231PS Z4, Z6, Z1
	CMPQ BX, $2
	JEQ sum
	VPMOVZXWD (DI)(R13*2), Z7
	VPSLLD $16, Z7, Z7
	VBROADCASTSS 8(SI), Z4
	VFMADD231PS Z4, Z7, Z2

sum:
	VADDPS Z1, Z0, Z0
	VADDPS Z3, Z2, Z2
	VADDPS Z2, Z0, Z0
	VADDPS (R8), Z0, Z0
	VMOVUPS Z0, (R8)
	ADDQ $64, R8
	ADDQ $32, R10
	SUBQ $16, R12
	JNZ chunk

	VZEROUPPER
	RET
