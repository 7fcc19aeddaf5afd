//go:build amd64 && !purego

#include "textflag.h"

// func gemmPackC512(rows, cols int, src *float32, lds int, dst *float32, ldd int)
//
// Copies rows rows of cols floats (cols ≤ 32) from src (row stride lds) to dst
// (row stride ldd ≤ 32), zero-filling lanes cols .. ldd-1.
TEXT ·gemmPackC512(SB), NOSPLIT, $0-48
	MOVQ rows+0(FP), R8
	MOVQ cols+8(FP), CX
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), R10
	SHLQ $2, R10
	MOVQ dst+32(FP), DI
	MOVQ ldd+40(FP), R11
	MOVQ $1, AX
	SHLQ CX, AX
	DECQ AX
	KMOVW AX, K1
	SHRQ $16, AX
	KMOVW AX, K2
	MOVQ R11, CX
	MOVQ $1, AX
	SHLQ CX, AX
	DECQ AX
	KMOVW AX, K3
	SHRQ $16, AX
	KMOVW AX, K4
	SHLQ $2, R11
	TESTQ R8, R8
	JLE packC_done

packC_loop:
	VMOVUPS.Z (SI), K1, Z0
	VMOVUPS.Z 64(SI), K2, Z1
	VMOVUPS Z0, K3, (DI)
	VMOVUPS Z1, K4, 64(DI)
	ADDQ R10, SI
	ADDQ R11, DI
	DECQ R8
	JNZ packC_loop

packC_done:
	VZEROUPPER
	RET
