// Macros shared by the AVX-512 assembly files (rows_avx512_amd64.s and
// attn_avx512_amd64.s). A file using DOT4X512 must define permidx<>: int32
// lanes 0, 4, 8, 12 (64 bytes).

// TAILMASK sets K1 to the low CX bits (CX < 16), using AX.
#define TAILMASK \
	MOVL $1, AX; \
	SHLL CX, AX; \
	DECL AX; \
	KMOVW AX, K1

// DOT512 leaves Σ a[i]·b[i] for the CX floats at SI and DI in X0 (lane 0),
// advancing SI and DI. Uses AX, BX, CX, Z0-Z7, K1. Chunk c of each 64-block
// goes to accumulator c; leftover whole chunks go to Z0, the masked chunk to
// Z1; then (Z0+Z1)+(Z2+Z3) and a fixed halving tree over the 16 lanes.
#define DOT512 \
	VXORPS Z0, Z0, Z0; \
	VXORPS Z1, Z1, Z1; \
	VXORPS Z2, Z2, Z2; \
	VXORPS Z3, Z3, Z3; \
	MOVQ CX, BX; \
	SHRQ $6, BX; \
	JZ dot16; \
dot64: \
	VMOVUPS (SI), Z4; \
	VMOVUPS 64(SI), Z5; \
	VMOVUPS 128(SI), Z6; \
	VMOVUPS 192(SI), Z7; \
	VFMADD231PS (DI), Z4, Z0; \
	VFMADD231PS 64(DI), Z5, Z1; \
	VFMADD231PS 128(DI), Z6, Z2; \
	VFMADD231PS 192(DI), Z7, Z3; \
	ADDQ $256, SI; \
	ADDQ $256, DI; \
	DECQ BX; \
	JNZ dot64; \
dot16: \
	MOVQ CX, BX; \
	ANDQ $63, BX; \
	SHRQ $4, BX; \
	JZ dotmask; \
dot16loop: \
	VMOVUPS (SI), Z4; \
	VFMADD231PS (DI), Z4, Z0; \
	ADDQ $64, SI; \
	ADDQ $64, DI; \
	DECQ BX; \
	JNZ dot16loop; \
dotmask: \
	ANDQ $15, CX; \
	JZ dotreduce; \
	TAILMASK; \
	VMOVUPS.Z (SI), K1, Z4; \
	VMOVUPS.Z (DI), K1, Z5; \
	VFMADD231PS Z5, Z4, Z1; \
dotreduce: \
	VADDPS Z1, Z0, Z0; \
	VADDPS Z3, Z2, Z2; \
	VADDPS Z2, Z0, Z0; \
	VEXTRACTF64X4 $1, Z0, Y1; \
	VADDPS Y1, Y0, Y0; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS X1, X0, X0; \
	VMOVHLPS X0, X0, X1; \
	VADDPS X1, X0, X0; \
	VMOVSHDUP X0, X1; \
	VADDSS X1, X0, X0

// DOT4X512 computes the dot products of the CX floats at SI with the four
// rows at DI, DI+R11, DI+R12, DI+R13 with exactly the arithmetic of DOT512
// for each row: the same accumulator for every chunk (row r uses Z4r..Z4r+3)
// and the same halving tree, done for the four rows at once by shuffles that
// pair the same lanes. Leaves the four results in Z0 lanes 0-3, times Z30.
// K1 must hold the tail mask of CX&15. Uses AX, BX, CX, Z0-Z20, Z29.
#define DOT4X512 \
	VXORPS Z0, Z0, Z0; \
	VXORPS Z1, Z1, Z1; \
	VXORPS Z2, Z2, Z2; \
	VXORPS Z3, Z3, Z3; \
	VXORPS Z4, Z4, Z4; \
	VXORPS Z5, Z5, Z5; \
	VXORPS Z6, Z6, Z6; \
	VXORPS Z7, Z7, Z7; \
	VXORPS Z8, Z8, Z8; \
	VXORPS Z9, Z9, Z9; \
	VXORPS Z10, Z10, Z10; \
	VXORPS Z11, Z11, Z11; \
	VXORPS Z12, Z12, Z12; \
	VXORPS Z13, Z13, Z13; \
	VXORPS Z14, Z14, Z14; \
	VXORPS Z15, Z15, Z15; \
	MOVQ CX, BX; \
	SHRQ $6, BX; \
	JZ d4c16; \
d4b64: \
	VMOVUPS (SI), Z16; \
	VMOVUPS 64(SI), Z17; \
	VMOVUPS 128(SI), Z18; \
	VMOVUPS 192(SI), Z19; \
	VFMADD231PS (DI), Z16, Z0; \
	VFMADD231PS 64(DI), Z17, Z1; \
	VFMADD231PS 128(DI), Z18, Z2; \
	VFMADD231PS 192(DI), Z19, Z3; \
	VFMADD231PS (DI)(R11*1), Z16, Z4; \
	VFMADD231PS 64(DI)(R11*1), Z17, Z5; \
	VFMADD231PS 128(DI)(R11*1), Z18, Z6; \
	VFMADD231PS 192(DI)(R11*1), Z19, Z7; \
	VFMADD231PS (DI)(R12*1), Z16, Z8; \
	VFMADD231PS 64(DI)(R12*1), Z17, Z9; \
	VFMADD231PS 128(DI)(R12*1), Z18, Z10; \
	VFMADD231PS 192(DI)(R12*1), Z19, Z11; \
	VFMADD231PS (DI)(R13*1), Z16, Z12; \
	VFMADD231PS 64(DI)(R13*1), Z17, Z13; \
	VFMADD231PS 128(DI)(R13*1), Z18, Z14; \
	VFMADD231PS 192(DI)(R13*1), Z19, Z15; \
	ADDQ $256, SI; \
	ADDQ $256, DI; \
	DECQ BX; \
	JNZ d4b64; \
d4c16: \
	MOVQ CX, BX; \
	ANDQ $63, BX; \
	SHRQ $4, BX; \
	JZ d4mask; \
d4c16loop: \
	VMOVUPS (SI), Z16; \
	VFMADD231PS (DI), Z16, Z0; \
	VFMADD231PS (DI)(R11*1), Z16, Z4; \
	VFMADD231PS (DI)(R12*1), Z16, Z8; \
	VFMADD231PS (DI)(R13*1), Z16, Z12; \
	ADDQ $64, SI; \
	ADDQ $64, DI; \
	DECQ BX; \
	JNZ d4c16loop; \
d4mask: \
	ANDQ $15, CX; \
	JZ d4sum; \
	VMOVUPS.Z (SI), K1, Z16; \
	VMOVUPS.Z (DI), K1, Z17; \
	VMOVUPS.Z (DI)(R11*1), K1, Z18; \
	VMOVUPS.Z (DI)(R12*1), K1, Z19; \
	VMOVUPS.Z (DI)(R13*1), K1, Z20; \
	VFMADD231PS Z17, Z16, Z1; \
	VFMADD231PS Z18, Z16, Z5; \
	VFMADD231PS Z19, Z16, Z9; \
	VFMADD231PS Z20, Z16, Z13; \
d4sum: \
	VADDPS Z1, Z0, Z0; \
	VADDPS Z3, Z2, Z2; \
	VADDPS Z2, Z0, Z0; \
	VADDPS Z5, Z4, Z4; \
	VADDPS Z7, Z6, Z6; \
	VADDPS Z6, Z4, Z4; \
	VADDPS Z9, Z8, Z8; \
	VADDPS Z11, Z10, Z10; \
	VADDPS Z10, Z8, Z8; \
	VADDPS Z13, Z12, Z12; \
	VADDPS Z15, Z14, Z14; \
	VADDPS Z14, Z12, Z12; \
	VSHUFF64X2 $0x44, Z4, Z0, Z1; \
	VSHUFF64X2 $0xEE, Z4, Z0, Z3; \
	VADDPS Z3, Z1, Z1; \
	VSHUFF64X2 $0x44, Z12, Z8, Z2; \
	VSHUFF64X2 $0xEE, Z12, Z8, Z3; \
	VADDPS Z3, Z2, Z2; \
	VSHUFF64X2 $0x88, Z2, Z1, Z0; \
	VSHUFF64X2 $0xDD, Z2, Z1, Z3; \
	VADDPS Z3, Z0, Z0; \
	VPERMILPS $0x4E, Z0, Z1; \
	VADDPS Z1, Z0, Z0; \
	VMOVSHDUP Z0, Z1; \
	VADDPS Z1, Z0, Z0; \
	VPERMPS Z0, Z29, Z0; \
	VMULPS Z30, Z0, Z0
