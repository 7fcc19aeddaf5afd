// AVX2+FMA row kernels: the same walks as the AVX-512 file with 8 lanes:
// 32-element blocks into four accumulators, whole 8-element chunks, then one
// chunk through VMASKMOVPS, which never faults on the lanes it skips.

#include "textflag.h"

// Constants of the float32 exp, each repeated in 8 lanes.
// 0: log2(e)
DATA expk2<>+0(SB)/8, $0x3fb8aa3b3fb8aa3b
DATA expk2<>+8(SB)/8, $0x3fb8aa3b3fb8aa3b
DATA expk2<>+16(SB)/8, $0x3fb8aa3b3fb8aa3b
DATA expk2<>+24(SB)/8, $0x3fb8aa3b3fb8aa3b
// 32: -ln2 high
DATA expk2<>+32(SB)/8, $0xbf317218bf317218
DATA expk2<>+40(SB)/8, $0xbf317218bf317218
DATA expk2<>+48(SB)/8, $0xbf317218bf317218
DATA expk2<>+56(SB)/8, $0xbf317218bf317218
// 64: -ln2 low
DATA expk2<>+64(SB)/8, $0x3102e3083102e308
DATA expk2<>+72(SB)/8, $0x3102e3083102e308
DATA expk2<>+80(SB)/8, $0x3102e3083102e308
DATA expk2<>+88(SB)/8, $0x3102e3083102e308
// 96: c6
DATA expk2<>+96(SB)/8, $0x3ab6a4963ab6a496
DATA expk2<>+104(SB)/8, $0x3ab6a4963ab6a496
DATA expk2<>+112(SB)/8, $0x3ab6a4963ab6a496
DATA expk2<>+120(SB)/8, $0x3ab6a4963ab6a496
// 128: c5
DATA expk2<>+128(SB)/8, $0x3c0921cd3c0921cd
DATA expk2<>+136(SB)/8, $0x3c0921cd3c0921cd
DATA expk2<>+144(SB)/8, $0x3c0921cd3c0921cd
DATA expk2<>+152(SB)/8, $0x3c0921cd3c0921cd
// 160: c4
DATA expk2<>+160(SB)/8, $0x3d2aaa723d2aaa72
DATA expk2<>+168(SB)/8, $0x3d2aaa723d2aaa72
DATA expk2<>+176(SB)/8, $0x3d2aaa723d2aaa72
DATA expk2<>+184(SB)/8, $0x3d2aaa723d2aaa72
// 192: c3
DATA expk2<>+192(SB)/8, $0x3e2aaa3a3e2aaa3a
DATA expk2<>+200(SB)/8, $0x3e2aaa3a3e2aaa3a
DATA expk2<>+208(SB)/8, $0x3e2aaa3a3e2aaa3a
DATA expk2<>+216(SB)/8, $0x3e2aaa3a3e2aaa3a
// 224: 0.5
DATA expk2<>+224(SB)/8, $0x3f0000003f000000
DATA expk2<>+232(SB)/8, $0x3f0000003f000000
DATA expk2<>+240(SB)/8, $0x3f0000003f000000
DATA expk2<>+248(SB)/8, $0x3f0000003f000000
// 256: 1.0
DATA expk2<>+256(SB)/8, $0x3f8000003f800000
DATA expk2<>+264(SB)/8, $0x3f8000003f800000
DATA expk2<>+272(SB)/8, $0x3f8000003f800000
DATA expk2<>+280(SB)/8, $0x3f8000003f800000
// 288: -104
DATA expk2<>+288(SB)/8, $0xc2d00000c2d00000
DATA expk2<>+296(SB)/8, $0xc2d00000c2d00000
DATA expk2<>+304(SB)/8, $0xc2d00000c2d00000
DATA expk2<>+312(SB)/8, $0xc2d00000c2d00000
// 320: 89
DATA expk2<>+320(SB)/8, $0x42b2000042b20000
DATA expk2<>+328(SB)/8, $0x42b2000042b20000
DATA expk2<>+336(SB)/8, $0x42b2000042b20000
DATA expk2<>+344(SB)/8, $0x42b2000042b20000
// 352: exponent bias 127 (int32)
DATA expk2<>+352(SB)/8, $0x0000007f0000007f
DATA expk2<>+360(SB)/8, $0x0000007f0000007f
DATA expk2<>+368(SB)/8, $0x0000007f0000007f
DATA expk2<>+376(SB)/8, $0x0000007f0000007f
// 384: sign bit
DATA expk2<>+384(SB)/8, $0x8000000080000000
DATA expk2<>+392(SB)/8, $0x8000000080000000
DATA expk2<>+400(SB)/8, $0x8000000080000000
DATA expk2<>+408(SB)/8, $0x8000000080000000
GLOBL expk2<>(SB), RODATA|NOPTR, $416

// Lane masks: the 8 lanes loaded from masktab2<>+32-4r select r elements.
DATA masktab2<>+0(SB)/8, $0xffffffffffffffff
DATA masktab2<>+8(SB)/8, $0xffffffffffffffff
DATA masktab2<>+16(SB)/8, $0xffffffffffffffff
DATA masktab2<>+24(SB)/8, $0xffffffffffffffff
DATA masktab2<>+32(SB)/8, $0
DATA masktab2<>+40(SB)/8, $0
DATA masktab2<>+48(SB)/8, $0
DATA masktab2<>+56(SB)/8, $0
GLOBL masktab2<>(SB), RODATA|NOPTR, $64

// TAILMASK2 loads into Y15 the mask of the low CX lanes (CX < 8), using AX
// and DX.
#define TAILMASK2 \
	MOVQ CX, DX; \
	SHLQ $2, DX; \
	LEAQ masktab2<>+32(SB), AX; \
	SUBQ DX, AX; \
	VMOVUPS (AX), Y15

// EXP2 replaces X by exp(X) with temporaries K, P, T: the same steps as
// EXP512, with p·2^k formed as (p·2^(k>>1))·2^(k-(k>>1)); the first product
// is exact, so the result is rounded once, exactly like VSCALEFPS.
#define EXP2(X, K, P, T) \
	VMOVUPS expk2<>+288(SB), K; \
	VMAXPS X, K, X; \
	VMOVUPS expk2<>+320(SB), K; \
	VMINPS X, K, X; \
	VMULPS expk2<>+0(SB), X, K; \
	VROUNDPS $0, K, K; \
	VFMADD231PS expk2<>+32(SB), K, X; \
	VFMADD231PS expk2<>+64(SB), K, X; \
	VMOVUPS expk2<>+96(SB), P; \
	VFMADD213PS expk2<>+128(SB), X, P; \
	VFMADD213PS expk2<>+160(SB), X, P; \
	VFMADD213PS expk2<>+192(SB), X, P; \
	VFMADD213PS expk2<>+224(SB), X, P; \
	VFMADD213PS expk2<>+256(SB), X, P; \
	VFMADD213PS expk2<>+256(SB), X, P; \
	VCVTPS2DQ K, K; \
	VPSRAD $1, K, T; \
	VPSUBD T, K, K; \
	VPADDD expk2<>+352(SB), T, T; \
	VPSLLD $23, T, T; \
	VMULPS T, P, P; \
	VPADDD expk2<>+352(SB), K, K; \
	VPSLLD $23, K, K; \
	VMULPS K, P, X

// DOT2 leaves Σ a[i]·b[i] for the CX floats at SI and DI in X0 (lane 0),
// advancing SI and DI. Uses AX, BX, CX, DX, Y0-Y7, Y15. Chunk c of each
// 32-block goes to accumulator c; leftover whole chunks go to Y0, the masked
// chunk to Y1; then (Y0+Y1)+(Y2+Y3) and a fixed halving tree over 8 lanes.
#define DOT2 \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	MOVQ CX, BX; \
	SHRQ $5, BX; \
	JZ dot8; \
dot32: \
	VMOVUPS (SI), Y4; \
	VMOVUPS 32(SI), Y5; \
	VMOVUPS 64(SI), Y6; \
	VMOVUPS 96(SI), Y7; \
	VFMADD231PS (DI), Y4, Y0; \
	VFMADD231PS 32(DI), Y5, Y1; \
	VFMADD231PS 64(DI), Y6, Y2; \
	VFMADD231PS 96(DI), Y7, Y3; \
	ADDQ $128, SI; \
	ADDQ $128, DI; \
	DECQ BX; \
	JNZ dot32; \
dot8: \
	MOVQ CX, BX; \
	ANDQ $31, BX; \
	SHRQ $3, BX; \
	JZ dotmask; \
dot8loop: \
	VMOVUPS (SI), Y4; \
	VFMADD231PS (DI), Y4, Y0; \
	ADDQ $32, SI; \
	ADDQ $32, DI; \
	DECQ BX; \
	JNZ dot8loop; \
dotmask: \
	ANDQ $7, CX; \
	JZ dotreduce; \
	TAILMASK2; \
	VMASKMOVPS (SI), Y15, Y4; \
	VMASKMOVPS (DI), Y15, Y5; \
	VFMADD231PS Y5, Y4, Y1; \
dotreduce: \
	VADDPS Y1, Y0, Y0; \
	VADDPS Y3, Y2, Y2; \
	VADDPS Y2, Y0, Y0; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS X1, X0, X0; \
	VMOVHLPS X0, X0, X1; \
	VADDPS X1, X0, X0; \
	VMOVSHDUP X0, X1; \
	VADDSS X1, X0, X0

// func dotAVX2(a, b *float32, n int) float32
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	DOT2
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotRowsAVX2(dst, q, k *float32, n, d, stride int, scale float32)
TEXT ·dotRowsAVX2(SB), NOSPLIT, $0-52
	MOVQ dst+0(FP), R8
	MOVQ k+16(FP), R9
	MOVQ n+24(FP), R10
	MOVQ stride+40(FP), R11
	SHLQ $2, R11
	VMOVSS scale+48(FP), X14
	TESTQ R10, R10
	JZ rowsdone

rowsloop:
	MOVQ q+8(FP), SI
	MOVQ R9, DI
	MOVQ d+32(FP), CX
	DOT2
	VMULSS X0, X14, X0
	VMOVSS X0, (R8)
	ADDQ $4, R8
	ADDQ R11, R9
	DECQ R10
	JNZ rowsloop

rowsdone:
	VZEROUPPER
	RET

// func axpyAVX2(alpha float32, x, y *float32, n int)
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Y14
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX
	MOVQ CX, BX
	SHRQ $5, BX
	JZ axpy8

axpy32:
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VFMADD231PS (SI), Y14, Y0
	VFMADD231PS 32(SI), Y14, Y1
	VFMADD231PS 64(SI), Y14, Y2
	VFMADD231PS 96(SI), Y14, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	DECQ BX
	JNZ axpy32

axpy8:
	MOVQ CX, BX
	ANDQ $31, BX
	SHRQ $3, BX
	JZ axpymask

axpy8loop:
	VMOVUPS (DI), Y0
	VFMADD231PS (SI), Y14, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ BX
	JNZ axpy8loop

axpymask:
	ANDQ $7, CX
	JZ axpydone
	TAILMASK2
	VMASKMOVPS (SI), Y15, Y4
	VMASKMOVPS (DI), Y15, Y0
	VFMADD231PS Y4, Y14, Y0
	VMASKMOVPS Y0, Y15, (DI)

axpydone:
	VZEROUPPER
	RET

#define AXPYROWSBEGIN \
	MOVQ R9, SI; \
	MOVQ R8, DX; \
	MOVQ R10, BX

#define AXPYROWSSTEP \
	ADDQ $4, DX; \
	ADDQ R11, SI; \
	DECQ BX

// func axpyRowsAVX2(out, p, v *float32, n, d, stride int)
TEXT ·axpyRowsAVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ p+8(FP), R8
	MOVQ v+16(FP), R9
	MOVQ n+24(FP), R10
	MOVQ d+32(FP), CX
	MOVQ stride+40(FP), R11
	SHLQ $2, R11
	TESTQ R10, R10
	JZ arowsdone

arows64:
	CMPQ CX, $64
	JLT arows32
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 128(DI), Y4
	VMOVUPS 160(DI), Y5
	VMOVUPS 192(DI), Y6
	VMOVUPS 224(DI), Y7
	AXPYROWSBEGIN

arows64loop:
	VBROADCASTSS (DX), Y14
	VFMADD231PS (SI), Y14, Y0
	VFMADD231PS 32(SI), Y14, Y1
	VFMADD231PS 64(SI), Y14, Y2
	VFMADD231PS 96(SI), Y14, Y3
	VFMADD231PS 128(SI), Y14, Y4
	VFMADD231PS 160(SI), Y14, Y5
	VFMADD231PS 192(SI), Y14, Y6
	VFMADD231PS 224(SI), Y14, Y7
	AXPYROWSSTEP
	JNZ arows64loop
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 128(DI)
	VMOVUPS Y5, 160(DI)
	VMOVUPS Y6, 192(DI)
	VMOVUPS Y7, 224(DI)
	ADDQ $256, DI
	ADDQ $256, R9
	SUBQ $64, CX
	JMP arows64

arows32:
	CMPQ CX, $32
	JLT arows16
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	AXPYROWSBEGIN

arows32loop:
	VBROADCASTSS (DX), Y14
	VFMADD231PS (SI), Y14, Y0
	VFMADD231PS 32(SI), Y14, Y1
	VFMADD231PS 64(SI), Y14, Y2
	VFMADD231PS 96(SI), Y14, Y3
	AXPYROWSSTEP
	JNZ arows32loop
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, R9
	SUBQ $32, CX

arows16:
	CMPQ CX, $16
	JLT arows8
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	AXPYROWSBEGIN

arows16loop:
	VBROADCASTSS (DX), Y14
	VFMADD231PS (SI), Y14, Y0
	VFMADD231PS 32(SI), Y14, Y1
	AXPYROWSSTEP
	JNZ arows16loop
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, DI
	ADDQ $64, R9
	SUBQ $16, CX

arows8:
	CMPQ CX, $8
	JLT arowsmask
	VMOVUPS (DI), Y0
	AXPYROWSBEGIN

arows8loop:
	VBROADCASTSS (DX), Y14
	VFMADD231PS (SI), Y14, Y0
	AXPYROWSSTEP
	JNZ arows8loop
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, R9
	SUBQ $8, CX

arowsmask:
	TESTQ CX, CX
	JZ arowsdone
	TAILMASK2
	VMASKMOVPS (DI), Y15, Y0
	AXPYROWSBEGIN

arowsmaskloop:
	VBROADCASTSS (DX), Y14
	VMASKMOVPS (SI), Y15, Y4
	VFMADD231PS Y4, Y14, Y0
	AXPYROWSSTEP
	JNZ arowsmaskloop
	VMASKMOVPS Y0, Y15, (DI)

arowsdone:
	VZEROUPPER
	RET

// func maxAVX2(x *float32, n int) float32
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS (SI), Y0
	VMOVAPS Y0, Y1
	VMOVAPS Y0, Y2
	VMOVAPS Y0, Y3
	MOVQ CX, BX
	SHRQ $5, BX
	JZ max8

max32:
	VMAXPS (SI), Y0, Y0
	VMAXPS 32(SI), Y1, Y1
	VMAXPS 64(SI), Y2, Y2
	VMAXPS 96(SI), Y3, Y3
	ADDQ $128, SI
	DECQ BX
	JNZ max32

max8:
	MOVQ CX, BX
	ANDQ $31, BX
	SHRQ $3, BX
	JZ maxmask

max8loop:
	VMAXPS (SI), Y0, Y0
	ADDQ $32, SI
	DECQ BX
	JNZ max8loop

maxmask:
	ANDQ $7, CX
	JZ maxreduce
	TAILMASK2
	VMASKMOVPS (SI), Y15, Y4
	VBLENDVPS Y15, Y4, Y1, Y4
	VMAXPS Y4, Y1, Y1

maxreduce:
	VMAXPS Y1, Y0, Y0
	VMAXPS Y3, Y2, Y2
	VMAXPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VMOVHLPS X0, X0, X1
	VMAXPS X1, X0, X0
	VMOVSHDUP X0, X1
	VMAXSS X1, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// EXPSUMCVT2 adds the 8 floats of X (XX: its low half) as float64 into ACCLO
// (lanes 0-3) and ACCHI (lanes 4-7), using T (TX: its low half).
#define EXPSUMCVT2(X, XX, T, TX, ACCLO, ACCHI) \
	VCVTPS2PD XX, T; \
	VADDPD T, ACCLO, ACCLO; \
	VEXTRACTF128 $1, X, TX; \
	VCVTPS2PD TX, T; \
	VADDPD T, ACCHI, ACCHI

// func expSumAVX2(dst, x *float32, n int, shift float32) float64
//
// Blocks of 16: two exp vectors are added in float32 and that sum is added
// in float64 to Y8 (lanes 0-3) and Y9 (lanes 4-7); a leftover whole chunk
// goes to Y8/Y9 and the masked chunk to Y10/Y11 in float64 directly. Then
// (Y8+Y10)+(Y9+Y11) and a halving tree.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS shift+24(FP), Y12
	VXORPD Y8, Y8, Y8
	VXORPD Y9, Y9, Y9
	VXORPD Y10, Y10, Y10
	VXORPD Y11, Y11, Y11
	MOVQ CX, BX
	SHRQ $4, BX
	JZ expsum8

expsum16:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y4
	VSUBPS Y12, Y0, Y0
	VSUBPS Y12, Y4, Y4
	EXP2(Y0, Y1, Y2, Y3)
	EXP2(Y4, Y5, Y6, Y7)
	TESTQ DI, DI
	JZ expsum16nostore
	VMOVUPS Y0, (DI)
	VMOVUPS Y4, 32(DI)
	ADDQ $64, DI

expsum16nostore:
	VADDPS Y4, Y0, Y0
	EXPSUMCVT2(Y0, X0, Y1, X1, Y8, Y9)
	ADDQ $64, SI
	DECQ BX
	JNZ expsum16

expsum8:
	TESTQ $8, CX
	JZ expsummask
	VMOVUPS (SI), Y0
	VSUBPS Y12, Y0, Y0
	EXP2(Y0, Y1, Y2, Y3)
	TESTQ DI, DI
	JZ expsum8nostore
	VMOVUPS Y0, (DI)
	ADDQ $32, DI

expsum8nostore:
	EXPSUMCVT2(Y0, X0, Y1, X1, Y8, Y9)
	ADDQ $32, SI

expsummask:
	ANDQ $7, CX
	JZ expsumreduce
	TAILMASK2
	VMASKMOVPS (SI), Y15, Y0
	VSUBPS Y12, Y0, Y0
	EXP2(Y0, Y1, Y2, Y3)
	VANDPS Y15, Y0, Y0
	TESTQ DI, DI
	JZ expsummasknostore
	VMASKMOVPS Y0, Y15, (DI)

expsummasknostore:
	EXPSUMCVT2(Y0, X0, Y1, X1, Y10, Y11)

expsumreduce:
	VADDPD Y10, Y8, Y8
	VADDPD Y11, Y9, Y9
	VADDPD Y9, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPD X9, X8, X8
	VUNPCKHPD X8, X8, X9
	VADDSD X9, X8, X8
	VMOVSD X8, ret+32(FP)
	VZEROUPPER
	RET

// MAPLOOP2 applies OP (which maps Y0, the input at SI, and Y1, the input at
// R8, to Y0, using the constant in Y13) to the CX floats at SI, writing them
// at DI. LOOP, MASK and DONE name the labels it defines.
#define MAPLOOP2(OP, LOOP, MASK, DONE) \
	MOVQ CX, BX; \
	SHRQ $3, BX; \
	JZ MASK; \
LOOP: \
	VMOVUPS (SI), Y0; \
	VMOVUPS (R8), Y1; \
	OP; \
	VMOVUPS Y0, (DI); \
	ADDQ $32, SI; \
	ADDQ $32, R8; \
	ADDQ $32, DI; \
	DECQ BX; \
	JNZ LOOP; \
MASK: \
	ANDQ $7, CX; \
	JZ DONE; \
	TAILMASK2; \
	VMASKMOVPS (SI), Y15, Y0; \
	VMASKMOVPS (R8), Y15, Y1; \
	OP; \
	VMASKMOVPS Y0, Y15, (DI); \
DONE: \
	VZEROUPPER

#define SCALEOP2 VMULPS Y13, Y0, Y0
#define ADDOP2 VADDPS Y13, Y0, Y0
#define RMSOP2 VMULPS Y13, Y0, Y0; VMULPS Y1, Y0, Y0

#define SWIGLUOP2 \
	VXORPS expk2<>+384(SB), Y0, Y2; \
	EXP2(Y2, Y3, Y4, Y5); \
	VADDPS expk2<>+256(SB), Y2, Y2; \
	VDIVPS Y2, Y0, Y0; \
	VMULPS Y1, Y0, Y0

// func scaleAVX2(dst, x *float32, n int, c float32)
TEXT ·scaleAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Y13
	MOVQ SI, R8
	MAPLOOP2(SCALEOP2, scaleloop, scalemask, scaledone)
	RET

// func addAVX2(dst, x *float32, n int, c float32)
TEXT ·addAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Y13
	MOVQ SI, R8
	MAPLOOP2(ADDOP2, addloop, addmask, adddone)
	RET

// func rmsApplyAVX2(dst, x, w *float32, n int, inv float32)
TEXT ·rmsApplyAVX2(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), R8
	MOVQ n+24(FP), CX
	VBROADCASTSS inv+32(FP), Y13
	MAPLOOP2(RMSOP2, rmsloop, rmsmask, rmsdone)
	RET

// func swigluAVX2(dst, gate, up *float32, n int)
TEXT ·swigluAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), R8
	MOVQ n+24(FP), CX
	MAPLOOP2(SWIGLUOP2, swigluloop, swiglumask, swigludone)
	RET
