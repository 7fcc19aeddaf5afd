// AVX-512 row kernels. Every loop walks its slice in a fixed pattern that
// depends only on the length: 64-element blocks into four accumulators, then
// whole 16-element chunks, then one masked chunk. Masked loads never fault on
// the lanes they skip, so no kernel looks at the alignment of its pointers.

#include "textflag.h"
#include "rows_avx512_amd64.h"

// Lane indices 0, 4, 8, 12: where DOT4X512 leaves its four dot products.
DATA permidx<>+0(SB)/4, $0
DATA permidx<>+4(SB)/4, $4
DATA permidx<>+8(SB)/4, $8
DATA permidx<>+12(SB)/4, $12
GLOBL permidx<>(SB), RODATA|NOPTR, $64


// Constants of the float32 exp, broadcast into Z16-Z26 by EXPCONST512.
DATA expk<>+0(SB)/4, $0x3fb8aa3b  // log2(e)
DATA expk<>+4(SB)/4, $0xbf317218  // -ln2 high part (float32(ln 2))
DATA expk<>+8(SB)/4, $0x3102e308  // -ln2 low part
DATA expk<>+12(SB)/4, $0x3ab6a496 // c6
DATA expk<>+16(SB)/4, $0x3c0921cd // c5
DATA expk<>+20(SB)/4, $0x3d2aaa72 // c4
DATA expk<>+24(SB)/4, $0x3e2aaa3a // c3
DATA expk<>+28(SB)/4, $0x3f000000 // 0.5
DATA expk<>+32(SB)/4, $0x3f800000 // 1.0
DATA expk<>+36(SB)/4, $0xc2d00000 // -104: below it exp rounds to 0
DATA expk<>+40(SB)/4, $0x42b20000 // 89: above it exp overflows
DATA expk<>+44(SB)/4, $0x80000000 // sign bit
GLOBL expk<>(SB), RODATA|NOPTR, $48

#define EXPCONST512 \
	VBROADCASTSS expk<>+0(SB), Z16; \
	VBROADCASTSS expk<>+4(SB), Z17; \
	VBROADCASTSS expk<>+8(SB), Z18; \
	VBROADCASTSS expk<>+12(SB), Z19; \
	VBROADCASTSS expk<>+16(SB), Z20; \
	VBROADCASTSS expk<>+20(SB), Z21; \
	VBROADCASTSS expk<>+24(SB), Z22; \
	VBROADCASTSS expk<>+28(SB), Z23; \
	VBROADCASTSS expk<>+32(SB), Z24; \
	VBROADCASTSS expk<>+36(SB), Z25; \
	VBROADCASTSS expk<>+40(SB), Z26

// EXP512 replaces X by exp(X), lane by lane, using temporaries K and P.
// x is clamped to [-104, 89] (the max/min operand order keeps NaN), then
// k = round(x·log2e), r = x - k·ln2 in two Cody-Waite steps (exact with FMA),
// exp(r) by a degree-6 polynomial with 1 + r + r²/2 leading terms, and the
// result p·2^k by VSCALEFPS, which rounds once and handles overflow to +Inf
// and gradual underflow to subnormals and zero.
#define EXP512(X, K, P) \
	VMAXPS X, Z25, X; \
	VMINPS X, Z26, X; \
	VMULPS Z16, X, K; \
	VRNDSCALEPS $0, K, K; \
	VFMADD231PS Z17, K, X; \
	VFMADD231PS Z18, K, X; \
	VMOVAPS Z19, P; \
	VFMADD213PS Z20, X, P; \
	VFMADD213PS Z21, X, P; \
	VFMADD213PS Z22, X, P; \
	VFMADD213PS Z23, X, P; \
	VFMADD213PS Z24, X, P; \
	VFMADD213PS Z24, X, P; \
	VSCALEFPS K, P, X

// func dotAVX512(a, b *float32, n int) float32
TEXT ·dotAVX512(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	DOT512
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotRowsAVX512(dst, q, k *float32, n, d, stride int, scale float32)
TEXT ·dotRowsAVX512(SB), NOSPLIT, $0-52
	MOVQ dst+0(FP), R8
	MOVQ k+16(FP), R9
	MOVQ n+24(FP), R10
	MOVQ d+32(FP), R14
	MOVQ stride+40(FP), R11
	SHLQ $2, R11
	LEAQ (R11)(R11*1), R12
	LEAQ (R12)(R11*1), R13
	VBROADCASTSS scale+48(FP), Z30
	VMOVUPS permidx<>(SB), Z29
	MOVQ R14, CX
	ANDQ $15, CX
	TAILMASK
	CMPQ R10, $4
	JLT rows1

rows4:
	MOVQ q+8(FP), SI
	MOVQ R9, DI
	MOVQ R14, CX
	DOT4X512
	VMOVUPS X0, (R8)
	ADDQ $16, R8
	LEAQ (R9)(R11*4), R9
	SUBQ $4, R10
	CMPQ R10, $4
	JGE rows4

rows1:
	VMOVSS scale+48(FP), X15
	TESTQ R10, R10
	JZ rowsdone

rowsloop:
	MOVQ q+8(FP), SI
	MOVQ R9, DI
	MOVQ R14, CX
	DOT512
	VMULSS X0, X15, X0
	VMOVSS X0, (R8)
	ADDQ $4, R8
	ADDQ R11, R9
	DECQ R10
	JNZ rowsloop

rowsdone:
	VZEROUPPER
	RET

// func axpyAVX512(alpha float32, x, y *float32, n int)
TEXT ·axpyAVX512(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Z31
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX
	MOVQ CX, BX
	SHRQ $6, BX
	JZ axpy16

axpy64:
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS 128(DI), Z2
	VMOVUPS 192(DI), Z3
	VFMADD231PS (SI), Z31, Z0
	VFMADD231PS 64(SI), Z31, Z1
	VFMADD231PS 128(SI), Z31, Z2
	VFMADD231PS 192(SI), Z31, Z3
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	ADDQ $256, SI
	ADDQ $256, DI
	DECQ BX
	JNZ axpy64

axpy16:
	MOVQ CX, BX
	ANDQ $63, BX
	SHRQ $4, BX
	JZ axpymask

axpy16loop:
	VMOVUPS (DI), Z0
	VFMADD231PS (SI), Z31, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ BX
	JNZ axpy16loop

axpymask:
	ANDQ $15, CX
	JZ axpydone
	TAILMASK
	VMOVUPS.Z (SI), K1, Z4
	VMOVUPS.Z (DI), K1, Z0
	VFMADD231PS Z4, Z31, Z0
	VMOVUPS Z0, K1, (DI)

axpydone:
	VZEROUPPER
	RET

// AXPYROWS512 runs out[c] = fma(p[j], v[j][c], out[c]) for j = 0..n-1 over
// one block of NREG·16 columns held in Z0.. registers. DI: out block,
// R9: v block, R8: p, R10: n, R11: row stride in bytes. Uses BX, DX, SI.
#define AXPYROWSBEGIN \
	MOVQ R9, SI; \
	MOVQ R8, DX; \
	MOVQ R10, BX

#define AXPYROWSSTEP \
	ADDQ $4, DX; \
	ADDQ R11, SI; \
	DECQ BX

// func axpyRowsAVX512(out, p, v *float32, n, d, stride int)
TEXT ·axpyRowsAVX512(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ p+8(FP), R8
	MOVQ v+16(FP), R9
	MOVQ n+24(FP), R10
	MOVQ d+32(FP), CX
	MOVQ stride+40(FP), R11
	SHLQ $2, R11
	TESTQ R10, R10
	JZ arowsdone

arows128:
	CMPQ CX, $128
	JLT arows64
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS 128(DI), Z2
	VMOVUPS 192(DI), Z3
	VMOVUPS 256(DI), Z4
	VMOVUPS 320(DI), Z5
	VMOVUPS 384(DI), Z6
	VMOVUPS 448(DI), Z7
	AXPYROWSBEGIN

arows128loop:
	VBROADCASTSS (DX), Z31
	VFMADD231PS (SI), Z31, Z0
	VFMADD231PS 64(SI), Z31, Z1
	VFMADD231PS 128(SI), Z31, Z2
	VFMADD231PS 192(SI), Z31, Z3
	VFMADD231PS 256(SI), Z31, Z4
	VFMADD231PS 320(SI), Z31, Z5
	VFMADD231PS 384(SI), Z31, Z6
	VFMADD231PS 448(SI), Z31, Z7
	AXPYROWSSTEP
	JNZ arows128loop
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VMOVUPS Z4, 256(DI)
	VMOVUPS Z5, 320(DI)
	VMOVUPS Z6, 384(DI)
	VMOVUPS Z7, 448(DI)
	ADDQ $512, DI
	ADDQ $512, R9
	SUBQ $128, CX
	JMP arows128

arows64:
	CMPQ CX, $64
	JLT arows32
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS 128(DI), Z2
	VMOVUPS 192(DI), Z3
	AXPYROWSBEGIN

arows64loop:
	VBROADCASTSS (DX), Z31
	VFMADD231PS (SI), Z31, Z0
	VFMADD231PS 64(SI), Z31, Z1
	VFMADD231PS 128(SI), Z31, Z2
	VFMADD231PS 192(SI), Z31, Z3
	AXPYROWSSTEP
	JNZ arows64loop
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	ADDQ $256, DI
	ADDQ $256, R9
	SUBQ $64, CX

arows32:
	CMPQ CX, $32
	JLT arows16
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	AXPYROWSBEGIN

arows32loop:
	VBROADCASTSS (DX), Z31
	VFMADD231PS (SI), Z31, Z0
	VFMADD231PS 64(SI), Z31, Z1
	AXPYROWSSTEP
	JNZ arows32loop
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	ADDQ $128, DI
	ADDQ $128, R9
	SUBQ $32, CX

arows16:
	CMPQ CX, $16
	JLT arowsmask
	VMOVUPS (DI), Z0
	AXPYROWSBEGIN

arows16loop:
	VBROADCASTSS (DX), Z31
	VFMADD231PS (SI), Z31, Z0
	AXPYROWSSTEP
	JNZ arows16loop
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	ADDQ $64, R9
	SUBQ $16, CX

arowsmask:
	TESTQ CX, CX
	JZ arowsdone
	TAILMASK
	VMOVUPS.Z (DI), K1, Z0
	AXPYROWSBEGIN

arowsmaskloop:
	VBROADCASTSS (DX), Z31
	VMOVUPS.Z (SI), K1, Z4
	VFMADD231PS Z4, Z31, Z0
	AXPYROWSSTEP
	JNZ arowsmaskloop
	VMOVUPS Z0, K1, (DI)

arowsdone:
	VZEROUPPER
	RET

// func maxAVX512(x *float32, n int) float32
TEXT ·maxAVX512(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS (SI), Z0
	VMOVAPS Z0, Z1
	VMOVAPS Z0, Z2
	VMOVAPS Z0, Z3
	MOVQ CX, BX
	SHRQ $6, BX
	JZ max16

max64:
	VMAXPS (SI), Z0, Z0
	VMAXPS 64(SI), Z1, Z1
	VMAXPS 128(SI), Z2, Z2
	VMAXPS 192(SI), Z3, Z3
	ADDQ $256, SI
	DECQ BX
	JNZ max64

max16:
	MOVQ CX, BX
	ANDQ $63, BX
	SHRQ $4, BX
	JZ maxmask

max16loop:
	VMAXPS (SI), Z0, Z0
	ADDQ $64, SI
	DECQ BX
	JNZ max16loop

maxmask:
	ANDQ $15, CX
	JZ maxreduce
	TAILMASK
	VMOVUPS.Z (SI), K1, Z4
	VMAXPS Z4, Z1, K1, Z1

maxreduce:
	VMAXPS Z1, Z0, Z0
	VMAXPS Z3, Z2, Z2
	VMAXPS Z2, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VMOVHLPS X0, X0, X1
	VMAXPS X1, X0, X0
	VMOVSHDUP X0, X1
	VMAXSS X1, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// EXPSUMCVT512 adds the 16 floats of Z0 as float64 into ACCLO (lanes 0-7)
// and ACCHI (lanes 8-15), using Z6/Z7.
#define EXPSUMCVT512(ACCLO, ACCHI) \
	VCVTPS2PD Y0, Z6; \
	VADDPD Z6, ACCLO, ACCLO; \
	VEXTRACTF64X4 $1, Z0, Y7; \
	VCVTPS2PD Y7, Z7; \
	VADDPD Z7, ACCHI, ACCHI

// func expSumAVX512(dst, x *float32, n int, shift float32) float64
//
// Blocks of 64: four exp vectors E0..E3 are summed in float32 as
// (E0+E1)+(E2+E3) and that vector is added in float64 to Z8 (lanes 0-7) and
// Z9 (lanes 8-15); whole leftover chunks and the masked chunk go to Z10/Z11
// in float64 directly. Then (Z8+Z10)+(Z9+Z11) and a halving tree.
TEXT ·expSumAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS shift+24(FP), Z27
	EXPCONST512
	VXORPD Z8, Z8, Z8
	VXORPD Z9, Z9, Z9
	VXORPD Z10, Z10, Z10
	VXORPD Z11, Z11, Z11
	MOVQ CX, BX
	SHRQ $6, BX
	JZ expsum16

expsum64:
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z3
	VMOVUPS 128(SI), Z6
	VMOVUPS 192(SI), Z13
	VSUBPS Z27, Z0, Z0
	VSUBPS Z27, Z3, Z3
	VSUBPS Z27, Z6, Z6
	VSUBPS Z27, Z13, Z13
	EXP512(Z0, Z1, Z2)
	EXP512(Z3, Z4, Z5)
	EXP512(Z6, Z7, Z12)
	EXP512(Z13, Z14, Z15)
	TESTQ DI, DI
	JZ expsum64nostore
	VMOVUPS Z0, (DI)
	VMOVUPS Z3, 64(DI)
	VMOVUPS Z6, 128(DI)
	VMOVUPS Z13, 192(DI)
	ADDQ $256, DI

expsum64nostore:
	VADDPS Z3, Z0, Z0
	VADDPS Z13, Z6, Z6
	VADDPS Z6, Z0, Z0
	EXPSUMCVT512(Z8, Z9)
	ADDQ $256, SI
	DECQ BX
	JNZ expsum64

expsum16:
	MOVQ CX, BX
	ANDQ $63, BX
	SHRQ $4, BX
	JZ expsummask

expsum16loop:
	VMOVUPS (SI), Z0
	VSUBPS Z27, Z0, Z0
	EXP512(Z0, Z1, Z2)
	TESTQ DI, DI
	JZ expsum16nostore
	VMOVUPS Z0, (DI)
	ADDQ $64, DI

expsum16nostore:
	EXPSUMCVT512(Z10, Z11)
	ADDQ $64, SI
	DECQ BX
	JNZ expsum16loop

expsummask:
	ANDQ $15, CX
	JZ expsumreduce
	TAILMASK
	VMOVUPS.Z (SI), K1, Z0
	VSUBPS Z27, Z0, Z0
	EXP512(Z0, Z1, Z2)
	VMOVAPS.Z Z0, K1, Z0
	TESTQ DI, DI
	JZ expsummasknostore
	VMOVUPS Z0, K1, (DI)

expsummasknostore:
	EXPSUMCVT512(Z10, Z11)

expsumreduce:
	VADDPD Z10, Z8, Z8
	VADDPD Z11, Z9, Z9
	VADDPD Z9, Z8, Z8
	VEXTRACTF64X4 $1, Z8, Y9
	VADDPD Y9, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPD X9, X8, X8
	VUNPCKHPD X8, X8, X9
	VADDSD X9, X8, X8
	VMOVSD X8, ret+32(FP)
	VZEROUPPER
	RET

// MAPLOOP512 applies OP (which maps Z0, the input at SI, and Z1, the input at
// R8, to Z0, using the constants in Z16-Z28) to the CX floats at SI, writing
// them at DI. LOOP, MASK and DONE name the labels it defines.
#define MAPLOOP512(OP, LOOP, MASK, DONE) \
	MOVQ CX, BX; \
	SHRQ $4, BX; \
	JZ MASK; \
LOOP: \
	VMOVUPS (SI), Z0; \
	VMOVUPS (R8), Z1; \
	OP; \
	VMOVUPS Z0, (DI); \
	ADDQ $64, SI; \
	ADDQ $64, R8; \
	ADDQ $64, DI; \
	DECQ BX; \
	JNZ LOOP; \
MASK: \
	ANDQ $15, CX; \
	JZ DONE; \
	TAILMASK; \
	VMOVUPS.Z (SI), K1, Z0; \
	VMOVUPS.Z (R8), K1, Z1; \
	OP; \
	VMOVUPS Z0, K1, (DI); \
DONE: \
	VZEROUPPER

#define SCALEOP VMULPS Z27, Z0, Z0
#define ADDOP VADDPS Z27, Z0, Z0
#define RMSOP VMULPS Z27, Z0, Z0; VMULPS Z1, Z0, Z0

// SWIGLUOP: Z0 = (g / (1 + exp(-g))) · up with g in Z0 and up in Z1.
#define SWIGLUOP \
	VXORPS Z28, Z0, Z2; \
	EXP512(Z2, Z3, Z4); \
	VADDPS Z24, Z2, Z2; \
	VDIVPS Z2, Z0, Z0; \
	VMULPS Z1, Z0, Z0

// func scaleAVX512(dst, x *float32, n int, c float32)
TEXT ·scaleAVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Z27
	MOVQ SI, R8
	MAPLOOP512(SCALEOP, scaleloop, scalemask, scaledone)
	RET

// func addAVX512(dst, x *float32, n int, c float32)
TEXT ·addAVX512(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Z27
	MOVQ SI, R8
	MAPLOOP512(ADDOP, addloop, addmask, adddone)
	RET

// func rmsApplyAVX512(dst, x, w *float32, n int, inv float32)
TEXT ·rmsApplyAVX512(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), R8
	MOVQ n+24(FP), CX
	VBROADCASTSS inv+32(FP), Z27
	MAPLOOP512(RMSOP, rmsloop, rmsmask, rmsdone)
	RET

// func swigluAVX512(dst, gate, up *float32, n int)
TEXT ·swigluAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), R8
	MOVQ n+24(FP), CX
	EXPCONST512
	VBROADCASTSS expk<>+44(SB), Z28
	MAPLOOP512(SWIGLUOP, swigluloop, swiglumask, swigludone)
	RET

// SWIGLUBACKOP: from gate Z0, up Z1 and dy Z2, with s = 1/(1+exp(-g)):
// Z5 = (dy·up)·(s·(1 + g·(1−s))) (dgate) and Z6 = dy·(g·s) (dup), the
// operations of the portable SwiGLUBackward one by one, without fusing.
#define SWIGLUBACKOP \
	VXORPS Z28, Z0, Z3; \
	EXP512(Z3, Z4, Z5); \
	VADDPS Z24, Z3, Z3; \
	VDIVPS Z3, Z24, Z3; \
	VSUBPS Z3, Z24, Z4; \
	VMULPS Z4, Z0, Z4; \
	VADDPS Z24, Z4, Z4; \
	VMULPS Z4, Z3, Z4; \
	VMULPS Z1, Z2, Z5; \
	VMULPS Z4, Z5, Z5; \
	VMULPS Z3, Z0, Z6; \
	VMULPS Z6, Z2, Z6

// func swigluBackAVX512(dgate, dup, gate, up, dy *float32, n int)
TEXT ·swigluBackAVX512(SB), NOSPLIT, $0-48
	MOVQ dgate+0(FP), DI
	MOVQ dup+8(FP), R10
	MOVQ gate+16(FP), SI
	MOVQ up+24(FP), R8
	MOVQ dy+32(FP), R9
	MOVQ n+40(FP), CX
	EXPCONST512
	VBROADCASTSS expk<>+44(SB), Z28
	MOVQ CX, BX
	SHRQ $4, BX
	JZ swbmask

swbloop:
	VMOVUPS (SI), Z0
	VMOVUPS (R8), Z1
	VMOVUPS (R9), Z2
	SWIGLUBACKOP
	VMOVUPS Z5, (DI)
	VMOVUPS Z6, (R10)
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R9
	ADDQ $64, DI
	ADDQ $64, R10
	DECQ BX
	JNZ swbloop

swbmask:
	ANDQ $15, CX
	JZ swbdone
	TAILMASK
	VMOVUPS.Z (SI), K1, Z0
	VMOVUPS.Z (R8), K1, Z1
	VMOVUPS.Z (R9), K1, Z2
	SWIGLUBACKOP
	VMOVUPS Z5, K1, (DI)
	VMOVUPS Z6, K1, (R10)

swbdone:
	VZEROUPPER
	RET

// RMSDOTOP adds (dy·w)·x, from the eight floats of dy, w and x in Y0-Y2
// widened to float64, to the accumulator ACC with one fused multiply-add.
#define RMSDOTOP(ACC) \
	VCVTPS2PD Y0, Z0; \
	VCVTPS2PD Y1, Z1; \
	VCVTPS2PD Y2, Z2; \
	VMULPD Z1, Z0, Z0; \
	VFMADD231PD Z2, Z0, ACC

// func rmsBackDotAVX512(dy, w, x *float32, n int) float64
// Σ dy·w·x in float64: 16-element blocks into Z4 (first eight) and Z5
// (last eight), one leftover 8-element chunk into Z4, the masked rest into
// Z5, then Z4+Z5 and a halving tree over the eight lanes.
TEXT ·rmsBackDotAVX512(SB), NOSPLIT, $0-40
	MOVQ dy+0(FP), R9
	MOVQ w+8(FP), R8
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	VXORPD Z4, Z4, Z4
	VXORPD Z5, Z5, Z5
	MOVQ CX, BX
	SHRQ $4, BX
	JZ rdchunk

rdloop:
	VMOVUPS 0(R9), Y0
	VMOVUPS 0(R8), Y1
	VMOVUPS 0(SI), Y2
	RMSDOTOP(Z4)
	VMOVUPS 32(R9), Y0
	VMOVUPS 32(R8), Y1
	VMOVUPS 32(SI), Y2
	RMSDOTOP(Z5)
	ADDQ $64, R9
	ADDQ $64, R8
	ADDQ $64, SI
	DECQ BX
	JNZ rdloop

rdchunk:
	ANDQ $15, CX
	CMPQ CX, $8
	JLT rdmask
	VMOVUPS 0(R9), Y0
	VMOVUPS 0(R8), Y1
	VMOVUPS 0(SI), Y2
	RMSDOTOP(Z4)
	ADDQ $32, R9
	ADDQ $32, R8
	ADDQ $32, SI
	SUBQ $8, CX

rdmask:
	TESTQ CX, CX
	JZ rdsum
	TAILMASK
	VMOVUPS.Z (R9), K1, Y0
	VMOVUPS.Z (R8), K1, Y1
	VMOVUPS.Z (SI), K1, Y2
	RMSDOTOP(Z5)

rdsum:
	VADDPD Z5, Z4, Z4
	VEXTRACTF64X4 $1, Z4, Y1
	VADDPD Y1, Y4, Y4
	VEXTRACTF64X2 $1, Y4, X1
	VADDPD X1, X4, X4
	VPERMILPD $1, X4, X1
	VADDSD X1, X4, X4
	MOVSD X4, ret+32(FP)
	VZEROUPPER
	RET

// RMSBACKOP: from dy Z0, x Z1, w Z2 and dw Z3, with inv in Z27 and c in
// Z26: Z3 = dw + dy·(x·inv) and Z5 = inv·(dy·w) − x·c, without fusing.
#define RMSBACKOP \
	VMULPS Z27, Z1, Z4; \
	VMULPS Z4, Z0, Z4; \
	VADDPS Z4, Z3, Z3; \
	VMULPS Z2, Z0, Z5; \
	VMULPS Z27, Z5, Z5; \
	VMULPS Z26, Z1, Z6; \
	VSUBPS Z6, Z5, Z5

// func rmsBackApplyAVX512(dx, dw, dy, x, w *float32, n int, inv, c float32)
TEXT ·rmsBackApplyAVX512(SB), NOSPLIT, $0-56
	MOVQ dx+0(FP), DI
	MOVQ dw+8(FP), R10
	MOVQ dy+16(FP), R9
	MOVQ x+24(FP), SI
	MOVQ w+32(FP), R8
	MOVQ n+40(FP), CX
	VBROADCASTSS inv+48(FP), Z27
	VBROADCASTSS c+52(FP), Z26
	MOVQ CX, BX
	SHRQ $4, BX
	JZ rbmask

rbloop:
	VMOVUPS (R9), Z0
	VMOVUPS (SI), Z1
	VMOVUPS (R8), Z2
	VMOVUPS (R10), Z3
	RMSBACKOP
	VMOVUPS Z3, (R10)
	VMOVUPS Z5, (DI)
	ADDQ $64, R9
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R10
	ADDQ $64, DI
	DECQ BX
	JNZ rbloop

rbmask:
	ANDQ $15, CX
	JZ rbdone
	TAILMASK
	VMOVUPS.Z (R9), K1, Z0
	VMOVUPS.Z (SI), K1, Z1
	VMOVUPS.Z (R8), K1, Z2
	VMOVUPS.Z (R10), K1, Z3
	RMSBACKOP
	VMOVUPS Z3, K1, (R10)
	VMOVUPS Z5, K1, (DI)

rbdone:
	VZEROUPPER
	RET

// ROPEOP rotates one chunk: a (first half) in Z0, b (second half) in Z1,
// cos in Z2, sin in Z3: Z0 = a·cos − b·sin, Z1 = b·cos + a·sin, every
// product rounded (no fused multiply-add), as the portable RoPE.
#define ROPEOP \
	VMULPS Z2, Z0, Z4; \
	VMULPS Z3, Z1, Z5; \
	VMULPS Z2, Z1, Z6; \
	VMULPS Z3, Z0, Z7; \
	VSUBPS Z5, Z4, Z0; \
	VADDPS Z7, Z6, Z1

// func ropeAVX512(x, cos, sin *float32, h, heads int)
// Rotates heads consecutive head vectors of 2h floats at x in place.
TEXT ·ropeAVX512(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ h+24(FP), R9
	MOVQ heads+32(FP), R11
	MOVQ R9, CX
	ANDQ $15, CX
	TAILMASK
	MOVQ R9, R12
	SHLQ $2, R12

ropehead:
	TESTQ R11, R11
	JZ ropedone
	MOVQ SI, DI
	LEAQ (SI)(R12*1), R8
	MOVQ cos+8(FP), DX
	MOVQ sin+16(FP), BX
	MOVQ R9, R10
	SHRQ $4, R10
	JZ ropemask

roploop:
	VMOVUPS (DI), Z0
	VMOVUPS (R8), Z1
	VMOVUPS (DX), Z2
	VMOVUPS (BX), Z3
	ROPEOP
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, (R8)
	ADDQ $64, DI
	ADDQ $64, R8
	ADDQ $64, DX
	ADDQ $64, BX
	DECQ R10
	JNZ roploop

ropemask:
	TESTQ CX, CX
	JZ ropenext
	VMOVUPS.Z (DI), K1, Z0
	VMOVUPS.Z (R8), K1, Z1
	VMOVUPS.Z (DX), K1, Z2
	VMOVUPS.Z (BX), K1, Z3
	ROPEOP
	VMOVUPS Z0, K1, (DI)
	VMOVUPS Z1, K1, (R8)

ropenext:
	LEAQ (SI)(R12*2), SI
	DECQ R11
	JMP ropehead

ropedone:
	VZEROUPPER
	RET
