//go:build amd64 && !purego

#include "textflag.h"

// func prefetchLines(p unsafe.Pointer, lines int)
TEXT ·prefetchLines(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ lines+8(FP), CX
	TESTQ CX, CX
	JLE pfdone
pfloop:
	PREFETCHT0 (SI)
	ADDQ $64, SI
	DECQ CX
	JNZ pfloop
pfdone:
	RET
