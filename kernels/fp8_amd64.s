#include "textflag.h"

// func absMaxBitsAVX512(x *float32, n int) uint32
// Returns max over i of bits(x[i]) & 0x7fffffff, n a multiple of 16. For
// non-negative floats the integer order is the float order, and any NaN
// beats every number, so a NaN in x shows up in the result.
TEXT ·absMaxBitsAVX512(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $4, CX
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z1
	VPXORD Z0, Z0, Z0
	TESTQ CX, CX
	JEQ  amdone
amloop:
	VPANDD (SI), Z1, Z2
	VPMAXUD Z2, Z0, Z0
	ADDQ $64, SI
	DECQ CX
	JNZ  amloop
amdone:
	VEXTRACTI64X4 $1, Z0, Y2
	VPMAXUD Y2, Y0, Y0
	VEXTRACTI128 $1, Y0, X2
	VPMAXUD X2, X0, X0
	VPSHUFD $0x4e, X0, X2
	VPMAXUD X2, X0, X0
	VPSHUFD $0xb1, X0, X2
	VPMAXUD X2, X0, X0
	VMOVD X0, AX
	MOVL AX, ret+16(FP)
	VZEROUPPER
	RET

// func quantE4M3AVX512(dst *BF16, src *float32, n int, s float32)
// dst[i] = BF16 of RoundE4M3(src[i] / s) for n a multiple of 16, with the
// same bit operations as RoundE4M3 and bf16FromBits.
TEXT ·quantE4M3AVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JEQ  qdone
	VBROADCASTSS s+24(FP), Z20
	MOVL $0x7fffffff, AX
	VPBROADCASTD AX, Z21 // abs mask
	MOVL $0x80000000, AX
	VPBROADCASTD AX, Z22 // sign mask
	MOVL $1, AX
	VPBROADCASTD AX, Z23
	MOVL $0x7ffff, AX
	VPBROADCASTD AX, Z24
	MOVL $0xfff00000, AX
	VPBROADCASTD AX, Z25
	MOVL $0x46800000, AX // 2^14
	VPBROADCASTD AX, Z26
	MOVL $0x3c800000, AX // 2^-6
	VPBROADCASTD AX, Z27
	MOVL $0x43e00000, AX // 448
	VPBROADCASTD AX, Z28
	MOVL $0x7f800000, AX // +Inf
	VPBROADCASTD AX, Z29
	MOVL $0x00400000, AX // quiet-NaN bit
	VPBROADCASTD AX, Z30
qloop:
	VMOVUPS (SI), Z0
	VDIVPS Z20, Z0, Z0
	VPANDD Z21, Z0, Z1 // a = |x/s|
	VPANDD Z22, Z0, Z2 // sign
	// normal: (a + 0x7ffff + ((a>>20)&1)) &^ 0xfffff
	VPSRLD $20, Z1, Z3
	VPANDD Z23, Z3, Z3
	VPADDD Z24, Z3, Z3
	VPADDD Z1, Z3, Z3
	VPANDD Z25, Z3, Z3
	// subnormal: (a + 2^14) - 2^14 where a < 2^-6
	VADDPS Z26, Z1, Z4
	VSUBPS Z26, Z4, Z4
	VPCMPUD $1, Z27, Z1, K1
	VMOVDQA32 Z4, K1, Z3
	// saturate at 448 (Inf too); NaN kept, made quiet
	VPCMPUD $5, Z28, Z1, K2
	VMOVDQA32 Z28, K2, Z3
	VPCMPUD $6, Z29, Z1, K3
	VPORD Z30, Z1, K3, Z3
	VPORD Z2, Z3, Z3
	VPSRLD $16, Z3, Z3
	VPMOVDW Z3, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  qloop
qdone:
	VZEROUPPER
	RET
