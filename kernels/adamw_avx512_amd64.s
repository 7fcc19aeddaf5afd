// AVX-512 optimiser kernels: the AdamW update and the float64 sum of
// squares of the global gradient norm.

#include "textflag.h"
#include "rows_avx512_amd64.h"

// ADAMWOP updates one chunk: p in Z0, g in Z1, m in Z2, v in Z3, with the
// constants of adamwAVX512 in Z20-Z28; Z4-Z6 are temporaries.
#define ADAMWOP \
	VMULPS Z20, Z1, Z1; \
	VMULPS Z21, Z0, Z0; \
	VMULPS Z22, Z2, Z2; \
	VFMADD231PS Z23, Z1, Z2; \
	VMULPS Z1, Z1, Z4; \
	VMULPS Z24, Z3, Z3; \
	VFMADD231PS Z25, Z4, Z3; \
	VSQRTPS Z3, Z5; \
	VFMADD213PS Z28, Z27, Z5; \
	VDIVPS Z5, Z2, Z6; \
	VFNMADD231PS Z26, Z6, Z0

// func adamwAVX512(p, grad, m, v *float32, n int, c *[9]float32)
// c: gradScale, decay, β1, 1−β1, β2, 1−β2, stepSize, 1/sqrt(bc2), eps.
TEXT ·adamwAVX512(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ c+40(FP), DX
	VBROADCASTSS 0(DX), Z20
	VBROADCASTSS 4(DX), Z21
	VBROADCASTSS 8(DX), Z22
	VBROADCASTSS 12(DX), Z23
	VBROADCASTSS 16(DX), Z24
	VBROADCASTSS 20(DX), Z25
	VBROADCASTSS 24(DX), Z26
	VBROADCASTSS 28(DX), Z27
	VBROADCASTSS 32(DX), Z28
	MOVQ CX, BX
	SHRQ $4, BX
	JZ adamwmask

adamwloop:
	VMOVUPS (DI), Z0
	VMOVUPS (SI), Z1
	VMOVUPS (R8), Z2
	VMOVUPS (R9), Z3
	ADAMWOP
	VMOVUPS Z0, (DI)
	VMOVUPS Z2, (R8)
	VMOVUPS Z3, (R9)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R9
	DECQ BX
	JNZ adamwloop

adamwmask:
	ANDQ $15, CX
	JZ adamwdone
	TAILMASK
	VMOVUPS.Z (DI), K1, Z0
	VMOVUPS.Z (SI), K1, Z1
	VMOVUPS.Z (R8), K1, Z2
	VMOVUPS.Z (R9), K1, Z3
	ADAMWOP
	VMOVUPS Z0, K1, (DI)
	VMOVUPS Z2, K1, (R8)
	VMOVUPS Z3, K1, (R9)

adamwdone:
	VZEROUPPER
	RET

// func sumSquaresAVX512(x *float32, n int) float64
// 32-element blocks go to four accumulators of eight float64 lanes (Z4-Z7),
// leftover 8-element chunks and the masked last one to Z4; then
// (Z4+Z5)+(Z6+Z7) and a halving tree over the eight lanes.
TEXT ·sumSquaresAVX512(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VXORPD Z4, Z4, Z4
	VXORPD Z5, Z5, Z5
	VXORPD Z6, Z6, Z6
	VXORPD Z7, Z7, Z7
	MOVQ CX, BX
	SHRQ $5, BX
	JZ sqchunks

sqloop:
	VCVTPS2PD 0(SI), Z0
	VCVTPS2PD 32(SI), Z1
	VCVTPS2PD 64(SI), Z2
	VCVTPS2PD 96(SI), Z3
	VFMADD231PD Z0, Z0, Z4
	VFMADD231PD Z1, Z1, Z5
	VFMADD231PD Z2, Z2, Z6
	VFMADD231PD Z3, Z3, Z7
	ADDQ $128, SI
	DECQ BX
	JNZ sqloop

sqchunks:
	ANDQ $31, CX
	MOVQ CX, BX
	SHRQ $3, BX
	JZ sqmask

sqchunkloop:
	VCVTPS2PD 0(SI), Z0
	VFMADD231PD Z0, Z0, Z4
	ADDQ $32, SI
	DECQ BX
	JNZ sqchunkloop

sqmask:
	ANDQ $7, CX
	JZ sqsum
	TAILMASK
	VMOVUPS.Z (SI), K1, Y0
	VCVTPS2PD Y0, Z0
	VFMADD231PD Z0, Z0, Z4

sqsum:
	VADDPD Z5, Z4, Z4
	VADDPD Z7, Z6, Z6
	VADDPD Z6, Z4, Z4
	VEXTRACTF64X4 $1, Z4, Y1
	VADDPD Y1, Y4, Y4
	VEXTRACTF64X2 $1, Y4, X1
	VADDPD X1, X4, X4
	VPERMILPD $1, X4, X1
	VADDSD X1, X4, X4
	MOVSD X4, ret+16(FP)
	VZEROUPPER
	RET
