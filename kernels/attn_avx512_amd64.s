// AVX-512 kernels for AttendCausal: four query rows at a time, each with
// exactly the per-element arithmetic of DotRows and AxpyRows (see
// rows_avx512_amd64.s), so the batched causal pass reproduces AttendRow.

#include "textflag.h"
#include "rows_avx512_amd64.h"

// Lane indices 0, 4, 8, 12: where DOT4X512 leaves its four dot products.
DATA permidx<>+0(SB)/4, $0
DATA permidx<>+4(SB)/4, $4
DATA permidx<>+8(SB)/4, $8
DATA permidx<>+12(SB)/4, $12
GLOBL permidx<>(SB), RODATA|NOPTR, $64

// func dotRowsQ4AVX512(dst *float32, dstStride int, q *float32, qStride int, k *float32, n, d, kStride int, scale float32)
//
// For j < n and a < 4: dst[a·dstStride + j] = scale·Dot(q[a·qStride:][:d], k[j·kStride:][:d]),
// with Dot's accumulators and reduction tree (the product q·k is exact, so
// the operand order of each FMA does not matter).
TEXT ·dotRowsQ4AVX512(SB), NOSPLIT, $0-68
	VMOVUPS permidx<>(SB), Z29
	MOVQ dst+0(FP), R8
	MOVQ dstStride+8(FP), R15
	SHLQ $2, R15
	MOVQ k+32(FP), R9
	MOVQ n+40(FP), R10
	MOVQ d+48(FP), R14
	MOVQ kStride+56(FP), DX
	SHLQ $2, DX
	MOVQ qStride+24(FP), R11
	SHLQ $2, R11
	LEAQ (R11)(R11*1), R12
	LEAQ (R12)(R11*1), R13
	VBROADCASTSS scale+64(FP), Z30
	MOVQ R14, CX
	ANDQ $15, CX
	TAILMASK
	TESTQ R10, R10
	JZ q4done

q4loop:
	MOVQ R9, SI
	MOVQ q+16(FP), DI
	MOVQ R14, CX
	DOT4X512
	VMOVSS X0, (R8)
	VEXTRACTPS $1, X0, (R8)(R15*1)
	LEAQ (R8)(R15*2), AX
	VEXTRACTPS $2, X0, (AX)
	VEXTRACTPS $3, X0, (AX)(R15*1)
	ADDQ $4, R8
	ADDQ DX, R9
	DECQ R10
	JNZ q4loop

q4done:
	VZEROUPPER
	RET

// func axpyRowsQ4AVX512(out *float32, outStride int, p *float32, pStride int, v *float32, n, d, vStride int)
//
// For a < 4 and j = 0..n-1 in order: out[a·outStride:][:d] += p[a·pStride+j]·v[j·vStride:][:d],
// one FMA per element and step, as Axpy does; each V row is loaded once for
// the four queries. Accumulators: query a in Z4a..Z4a+3; p broadcasts in
// Z16-Z19; V in Z20-Z23.
TEXT ·axpyRowsQ4AVX512(SB), NOSPLIT, $0-64
	MOVQ out+0(FP), DI
	MOVQ outStride+8(FP), R11
	SHLQ $2, R11
	LEAQ (R11)(R11*1), R12
	LEAQ (R12)(R11*1), R13
	MOVQ pStride+24(FP), R14
	SHLQ $2, R14
	LEAQ (R14)(R14*2), R15
	MOVQ v+32(FP), R9
	MOVQ n+40(FP), R10
	MOVQ d+48(FP), CX
	MOVQ vStride+56(FP), DX
	SHLQ $2, DX
	TESTQ R10, R10
	JZ a4done

a4b64:
	CMPQ CX, $64
	JLT a4c16
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS 128(DI), Z2
	VMOVUPS 192(DI), Z3
	VMOVUPS (DI)(R11*1), Z4
	VMOVUPS 64(DI)(R11*1), Z5
	VMOVUPS 128(DI)(R11*1), Z6
	VMOVUPS 192(DI)(R11*1), Z7
	VMOVUPS (DI)(R12*1), Z8
	VMOVUPS 64(DI)(R12*1), Z9
	VMOVUPS 128(DI)(R12*1), Z10
	VMOVUPS 192(DI)(R12*1), Z11
	VMOVUPS (DI)(R13*1), Z12
	VMOVUPS 64(DI)(R13*1), Z13
	VMOVUPS 128(DI)(R13*1), Z14
	VMOVUPS 192(DI)(R13*1), Z15
	MOVQ p+16(FP), R8
	MOVQ R9, SI
	MOVQ R10, BX

a4b64loop:
	VBROADCASTSS (R8), Z16
	VBROADCASTSS (R8)(R14*1), Z17
	VBROADCASTSS (R8)(R14*2), Z18
	VBROADCASTSS (R8)(R15*1), Z19
	VMOVUPS (SI), Z20
	VMOVUPS 64(SI), Z21
	VMOVUPS 128(SI), Z22
	VMOVUPS 192(SI), Z23
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z23, Z16, Z3
	VFMADD231PS Z20, Z17, Z4
	VFMADD231PS Z21, Z17, Z5
	VFMADD231PS Z22, Z17, Z6
	VFMADD231PS Z23, Z17, Z7
	VFMADD231PS Z20, Z18, Z8
	VFMADD231PS Z21, Z18, Z9
	VFMADD231PS Z22, Z18, Z10
	VFMADD231PS Z23, Z18, Z11
	VFMADD231PS Z20, Z19, Z12
	VFMADD231PS Z21, Z19, Z13
	VFMADD231PS Z22, Z19, Z14
	VFMADD231PS Z23, Z19, Z15
	ADDQ $4, R8
	ADDQ DX, SI
	DECQ BX
	JNZ a4b64loop
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VMOVUPS Z4, (DI)(R11*1)
	VMOVUPS Z5, 64(DI)(R11*1)
	VMOVUPS Z6, 128(DI)(R11*1)
	VMOVUPS Z7, 192(DI)(R11*1)
	VMOVUPS Z8, (DI)(R12*1)
	VMOVUPS Z9, 64(DI)(R12*1)
	VMOVUPS Z10, 128(DI)(R12*1)
	VMOVUPS Z11, 192(DI)(R12*1)
	VMOVUPS Z12, (DI)(R13*1)
	VMOVUPS Z13, 64(DI)(R13*1)
	VMOVUPS Z14, 128(DI)(R13*1)
	VMOVUPS Z15, 192(DI)(R13*1)
	ADDQ $256, DI
	ADDQ $256, R9
	SUBQ $64, CX
	JMP a4b64

a4c16:
	CMPQ CX, $16
	JLT a4mask
	VMOVUPS (DI), Z0
	VMOVUPS (DI)(R11*1), Z4
	VMOVUPS (DI)(R12*1), Z8
	VMOVUPS (DI)(R13*1), Z12
	MOVQ p+16(FP), R8
	MOVQ R9, SI
	MOVQ R10, BX

a4c16loop:
	VBROADCASTSS (R8), Z16
	VBROADCASTSS (R8)(R14*1), Z17
	VBROADCASTSS (R8)(R14*2), Z18
	VBROADCASTSS (R8)(R15*1), Z19
	VMOVUPS (SI), Z20
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z20, Z17, Z4
	VFMADD231PS Z20, Z18, Z8
	VFMADD231PS Z20, Z19, Z12
	ADDQ $4, R8
	ADDQ DX, SI
	DECQ BX
	JNZ a4c16loop
	VMOVUPS Z0, (DI)
	VMOVUPS Z4, (DI)(R11*1)
	VMOVUPS Z8, (DI)(R12*1)
	VMOVUPS Z12, (DI)(R13*1)
	ADDQ $64, DI
	ADDQ $64, R9
	SUBQ $16, CX
	JMP a4c16

a4mask:
	TESTQ CX, CX
	JZ a4done
	TAILMASK
	VMOVUPS.Z (DI), K1, Z0
	VMOVUPS.Z (DI)(R11*1), K1, Z4
	VMOVUPS.Z (DI)(R12*1), K1, Z8
	VMOVUPS.Z (DI)(R13*1), K1, Z12
	MOVQ p+16(FP), R8
	MOVQ R9, SI
	MOVQ R10, BX

a4maskloop:
	VBROADCASTSS (R8), Z16
	VBROADCASTSS (R8)(R14*1), Z17
	VBROADCASTSS (R8)(R14*2), Z18
	VBROADCASTSS (R8)(R15*1), Z19
	VMOVUPS.Z (SI), K1, Z20
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z20, Z17, Z4
	VFMADD231PS Z20, Z18, Z8
	VFMADD231PS Z20, Z19, Z12
	ADDQ $4, R8
	ADDQ DX, SI
	DECQ BX
	JNZ a4maskloop
	VMOVUPS Z0, K1, (DI)
	VMOVUPS Z4, K1, (DI)(R11*1)
	VMOVUPS Z8, K1, (DI)(R12*1)
	VMOVUPS Z12, K1, (DI)(R13*1)

a4done:
	VZEROUPPER
	RET
