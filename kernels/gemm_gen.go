//go:build ignore

// Command gemm_gen writes the float32 GEMM micro-kernels in Go assembly:
// gemm_kern_amd64.s and the matching declarations in gemm_kern_amd64.go.
//
// A micro-kernel computes one mr×nr tile of C from a packed A panel (kc
// steps of mr floats) and a packed B panel (kc steps of nr floats):
//
//	acc[i][j] = fma(a[p][i], b[p][j], acc[i][j])   for p = 0 .. kc-1
//	C[i][j]   = acc[i][j]            (flags == 0)
//	C[i][j]   = C[i][j] + acc[i][j]  (flags != 0)
//
// One variant is generated per row count mr = 1 .. MR. Every variant runs the
// same FMA chain for each element, so a row's bits never depend on how many
// rows shared its tile: that is what makes the GEMM batch invariant.
//
// Run it with `go run gemm_gen.go` in this directory (go generate does).
package main

import (
	"bytes"
	"fmt"
	"log"
	"os"
)

// Tile shapes. The AVX-512 tile is mr512 rows × nv512 zmm vectors of 16
// floats; the AVX2 tile is mr256 rows × nv256 ymm vectors of 8 floats.
// Changing them needs matching constants in gemm_amd64.go.
const (
	mr512 = 14
	nv512 = 2
	mr256 = 6
	nv256 = 2
)

type asm struct{ bytes.Buffer }

func (w *asm) f(format string, args ...any) { fmt.Fprintf(&w.Buffer, format+"\n", args...) }

// kernel emits one micro-kernel. vec is "Z" or "Y", vbytes the vector width
// in bytes, mr the rows, nv the vectors per row. A strided kernel reads A
// unpacked: step p's mr values are contiguous at a + p·lda (the layout of a
// transposed, row-major A), so Aᵀ·B needs no packing of A; its arithmetic
// is the same as the packed kernel's.
func kernel(w *asm, name, vec string, vbytes, mr, nv int, strided bool) {
	nr := nv * vbytes / 4
	nacc := mr * nv
	bReg := func(v int) string { return fmt.Sprintf("%s%d", vec, nacc+v) }
	// Two broadcast registers, alternated, when there is room.
	nregs := 32
	if vec == "Y" {
		nregs = 16
	}
	nb := nregs - nacc - nv
	if nb > 2 {
		nb = 2
	}
	if nb < 1 {
		log.Fatalf("%s: tile %dx%d does not fit the registers", name, mr, nv)
	}
	aReg := func(i int) string { return fmt.Sprintf("%s%d", vec, nacc+nv+i%nb) }
	acc := func(i, v int) string { return fmt.Sprintf("%s%d", vec, i*nv+v) }

	argOff := 0 // where b, c, ldc and flags sit beyond the packed layout
	if strided {
		argOff = 8
		w.f("// func %s(k int, a *float32, lda int, b, c *float32, ldc, flags int)", name)
		w.f("TEXT ·%s(SB), NOSPLIT, $0-56", name)
		w.f("\tMOVQ lda+16(FP), R10")
		w.f("\tSHLQ $2, R10")
	} else {
		w.f("// func %s(k int, a, b, c *float32, ldc, flags int)", name)
		w.f("TEXT ·%s(SB), NOSPLIT, $0-48", name)
	}
	w.f("\tMOVQ k+0(FP), CX")
	w.f("\tMOVQ a+8(FP), AX")
	w.f("\tMOVQ b+%d(FP), BX", 16+argOff)
	w.f("\tMOVQ c+%d(FP), DI", 24+argOff)
	w.f("\tMOVQ ldc+%d(FP), DX", 32+argOff)
	w.f("\tSHLQ $2, DX")
	for i := 0; i < mr; i++ {
		for v := 0; v < nv; v++ {
			if vec == "Z" {
				w.f("\tVPXORD %s, %s, %s", acc(i, v), acc(i, v), acc(i, v))
			} else {
				w.f("\tVXORPS %s, %s, %s", acc(i, v), acc(i, v), acc(i, v))
			}
		}
	}
	// Prefetch the C tile: it is read or written at the end.
	w.f("\tMOVQ DI, R9")
	for i := 0; i < mr; i++ {
		w.f("\tPREFETCHT0 (R9)")
		if nr*4 > 64 {
			w.f("\tPREFETCHT0 %d(R9)", nr*4-4)
		}
		if i < mr-1 {
			w.f("\tADDQ DX, R9")
		}
	}
	const unroll = 4
	const gemmPrefetchK = 32
	step := func(p int) {
		boff := p * nr * 4
		aoff := p * mr * 4
		if strided {
			aoff = 0 // AX advances by lda after every step
		}
		for line := 0; line < nr*4; line += 64 {
			w.f("\tPREFETCHT0 %d(BX)", boff+line+nr*4*gemmPrefetchK)
		}
		for v := 0; v < nv; v++ {
			w.f("\tVMOVUPS %d(BX), %s", boff+v*vbytes, bReg(v))
		}
		for i := 0; i < mr; i++ {
			w.f("\tVBROADCASTSS %d(AX), %s", aoff+i*4, aReg(i))
			for v := 0; v < nv; v++ {
				w.f("\tVFMADD231PS %s, %s, %s", bReg(v), aReg(i), acc(i, v))
			}
		}
		if strided {
			w.f("\tADDQ R10, AX")
		}
	}
	aStep := func(n int) {
		if !strided {
			w.f("\tADDQ $%d, AX", n*mr*4)
		}
	}
	w.f("\tCMPQ CX, $%d", unroll)
	w.f("\tJLT %s_tail", name)
	w.f("%s_loop%d:", name, unroll)
	for p := 0; p < unroll; p++ {
		step(p)
	}
	aStep(unroll)
	w.f("\tADDQ $%d, BX", unroll*nr*4)
	w.f("\tSUBQ $%d, CX", unroll)
	w.f("\tCMPQ CX, $%d", unroll)
	w.f("\tJGE %s_loop%d", name, unroll)
	w.f("%s_tail:", name)
	w.f("\tTESTQ CX, CX")
	w.f("\tJZ %s_store", name)
	w.f("%s_loop1:", name)
	step(0)
	aStep(1)
	w.f("\tADDQ $%d, BX", nr*4)
	w.f("\tDECQ CX")
	w.f("\tJNZ %s_loop1", name)
	w.f("%s_store:", name)
	w.f("\tMOVQ flags+%d(FP), R8", 40+argOff)
	w.f("\tTESTQ R8, R8")
	w.f("\tJZ %s_overwrite", name)
	for i := 0; i < mr; i++ {
		for v := 0; v < nv; v++ {
			w.f("\tVADDPS %d(DI), %s, %s", v*vbytes, acc(i, v), acc(i, v))
			w.f("\tVMOVUPS %s, %d(DI)", acc(i, v), v*vbytes)
		}
		if i < mr-1 {
			w.f("\tADDQ DX, DI")
		}
	}
	w.f("\tVZEROUPPER")
	w.f("\tRET")
	w.f("%s_overwrite:", name)
	for i := 0; i < mr; i++ {
		for v := 0; v < nv; v++ {
			w.f("\tVMOVUPS %s, %d(DI)", acc(i, v), v*vbytes)
		}
		if i < mr-1 {
			w.f("\tADDQ DX, DI")
		}
	}
	w.f("\tVZEROUPPER")
	w.f("\tRET")
	w.f("")
}

// wideKernel emits a kernel for mr rows × np column panels (each nv vectors
// wide, panel q at b + q*pstride bytes). Small row counts give too few
// independent FMA chains to hide the FMA latency with one panel; spanning
// several panels adds chains without changing any element's arithmetic.
func wideKernel(w *asm, name, vec string, vbytes, mr, np, nv int) {
	nr := nv * vbytes / 4
	nacc := mr * np * nv
	acc := func(i, q, v int) string { return fmt.Sprintf("%s%d", vec, (i*np+q)*nv+v) }
	aReg := func(i int) string { return fmt.Sprintf("%s%d", vec, nacc+i) }
	bReg := func(t int) string { return fmt.Sprintf("%s%d", vec, nacc+mr+t%2) }
	nregs := 32
	if vec == "Y" {
		nregs = 16
	}
	if nacc+mr+2 > nregs {
		log.Fatalf("%s: does not fit the registers", name)
	}
	w.f("// func %s(k int, a, b *float32, pstride int, c *float32, ldc, flags int)", name)
	w.f("TEXT ·%s(SB), NOSPLIT, $0-56", name)
	w.f("\tMOVQ k+0(FP), CX")
	w.f("\tMOVQ a+8(FP), AX")
	w.f("\tMOVQ b+16(FP), BX")
	w.f("\tMOVQ pstride+24(FP), SI")
	w.f("\tSHLQ $2, SI")
	w.f("\tMOVQ c+32(FP), DI")
	w.f("\tMOVQ ldc+40(FP), DX")
	w.f("\tSHLQ $2, DX")
	for i := 0; i < nacc; i++ {
		r := fmt.Sprintf("%s%d", vec, i)
		if vec == "Z" {
			w.f("\tVPXORD %s, %s, %s", r, r, r)
		} else {
			w.f("\tVXORPS %s, %s, %s", r, r, r)
		}
	}
	// R10..R12 point at panels 1..3.
	pr := []string{"BX", "R10", "R11", "R12"}
	for q := 1; q < np; q++ {
		w.f("\tLEAQ (%s)(SI*1), %s", pr[q-1], pr[q])
	}
	w.f("\tTESTQ CX, CX")
	w.f("\tJZ %s_store", name)
	w.f("%s_loop:", name)
	for i := 0; i < mr; i++ {
		w.f("\tVBROADCASTSS %d(AX), %s", i*4, aReg(i))
	}
	t := 0
	for q := 0; q < np; q++ {
		for v := 0; v < nv; v++ {
			w.f("\tVMOVUPS %d(%s), %s", v*vbytes, pr[q], bReg(t))
			for i := 0; i < mr; i++ {
				w.f("\tVFMADD231PS %s, %s, %s", bReg(t), aReg(i), acc(i, q, v))
			}
			t++
		}
	}
	w.f("\tADDQ $%d, AX", mr*4)
	for q := 0; q < np; q++ {
		w.f("\tADDQ $%d, %s", nr*4, pr[q])
	}
	w.f("\tDECQ CX")
	w.f("\tJNZ %s_loop", name)
	w.f("%s_store:", name)
	w.f("\tMOVQ flags+48(FP), R8")
	for i := 0; i < mr; i++ {
		for q := 0; q < np; q++ {
			for v := 0; v < nv; v++ {
				off := q*nr*4 + v*vbytes
				w.f("\tTESTQ R8, R8")
				w.f("\tJZ %s_st%d_%d_%d", name, i, q, v)
				w.f("\tVADDPS %d(DI), %s, %s", off, acc(i, q, v), acc(i, q, v))
				w.f("%s_st%d_%d_%d:", name, i, q, v)
				w.f("\tVMOVUPS %s, %d(DI)", acc(i, q, v), off)
			}
		}
		if i < mr-1 {
			w.f("\tADDQ DX, DI")
		}
	}
	w.f("\tVZEROUPPER")
	w.f("\tRET")
	w.f("")
}

func main() {
	var s, g asm
	s.f("// Code generated by gemm_gen.go; DO NOT EDIT.")
	s.f("")
	s.f("//go:build amd64 && !purego")
	s.f("")
	s.f("#include \"textflag.h\"")
	s.f("")
	g.f("// Code generated by gemm_gen.go; DO NOT EDIT.")
	g.f("")
	g.f("//go:build amd64 && !purego")
	g.f("")
	g.f("package kernels")
	g.f("")
	g.f("const (")
	g.f("\tgemmMR512 = %d", mr512)
	g.f("\tgemmNR512 = %d", nv512*16)
	g.f("\tgemmMR256 = %d", mr256)
	g.f("\tgemmNR256 = %d", nv256*8)
	g.f(")")
	g.f("")
	for mr := 1; mr <= mr512; mr++ {
		name := fmt.Sprintf("gemmKern512x%d", mr)
		kernel(&s, name, "Z", 64, mr, nv512, false)
		g.f("//go:noescape")
		g.f("func %s(k int, a, b, c *float32, ldc, flags int)", name)
		g.f("")
	}
	for mr := 1; mr <= mr256; mr++ {
		name := fmt.Sprintf("gemmKern256x%d", mr)
		kernel(&s, name, "Y", 32, mr, nv256, false)
		g.f("//go:noescape")
		g.f("func %s(k int, a, b, c *float32, ldc, flags int)", name)
		g.f("")
	}
	kernel(&s, "gemmKern512x14s", "Z", 64, mr512, nv512, true)
	g.f("// gemmKern512x14s is gemmKern512x14 reading A unpacked with row stride lda")
	g.f("// (op(A) = Aᵀ of a row-major A): the same arithmetic, no packing.")
	g.f("//")
	g.f("//go:noescape")
	g.f("func gemmKern512x14s(k int, a *float32, lda int, b, c *float32, ldc, flags int)")
	g.f("")
	kernel(&s, "gemmKern256x6s", "Y", 32, mr256, nv256, true)
	g.f("// gemmKern256x6s is gemmKern256x6 reading A unpacked with row stride lda.")
	g.f("//")
	g.f("//go:noescape")
	g.f("func gemmKern256x6s(k int, a *float32, lda int, b, c *float32, ldc, flags int)")
	g.f("")
	wides := func(prefix, vec string, vbytes, nv int, nps []int) {
		g.f("var %s = [...]gemmWide{{},", prefix)
		for mr := 1; mr < len(nps); mr++ {
			name := fmt.Sprintf("%sx%dx%d", prefix, mr, nps[mr])
			wideKernel(&s, name, vec, vbytes, mr, nps[mr], nv)
			g.f("\t{%d, %s},", nps[mr], name)
		}
		g.f("}")
		g.f("")
		for mr := 1; mr < len(nps); mr++ {
			g.f("//go:noescape")
			g.f("func %sx%dx%d(k int, a, b *float32, pstride int, c *float32, ldc, flags int)", prefix, mr, nps[mr])
			g.f("")
		}
	}
	wides("gemmWide512", "Z", 64, nv512, []int{0, 4, 2, 2})
	wides("gemmWide256", "Y", 32, nv256, []int{0, 4, 2})
	g.f("var gemmKerns512 = [...]gemmMicro{nil,")
	for mr := 1; mr <= mr512; mr++ {
		g.f("\tgemmKern512x%d,", mr)
	}
	g.f("}")
	g.f("")
	g.f("var gemmKerns256 = [...]gemmMicro{nil,")
	for mr := 1; mr <= mr256; mr++ {
		g.f("\tgemmKern256x%d,", mr)
	}
	g.f("}")
	packT512(&s)
	g.f("")
	g.f("// gemmPackT512 writes the transpose of a rows×cols block of src (row")
	g.f("// stride lds) to dst (row stride ldd): dst[c*ldd+r] = src[r*lds+c]. Only")
	g.f("// the lanes in mask are stored; rows ≥ rows read as zero. rows ≤ 16.")
	g.f("//")
	g.f("//go:noescape")
	g.f("func gemmPackT512(rows, cols int, src *float32, lds int, dst *float32, ldd, mask int)")
	if err := os.WriteFile("gemm_kern_amd64.s", s.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("gemm_kern_amd64.go", g.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
}

// packT512 emits gemmPackT512: a 16×16 AVX-512 transpose applied along the
// columns of a block of up to 16 rows.
func packT512(w *asm) {
	z := func(i int) string { return fmt.Sprintf("Z%d", i) }
	w.f("// func gemmPackT512(rows, cols int, src *float32, lds int, dst *float32, ldd, mask int)")
	w.f("TEXT ·gemmPackT512(SB), NOSPLIT, $0-56")
	w.f("\tMOVQ rows+0(FP), R8")
	w.f("\tMOVQ cols+8(FP), R9")
	w.f("\tMOVQ src+16(FP), SI")
	w.f("\tMOVQ lds+24(FP), R10")
	w.f("\tSHLQ $2, R10")
	w.f("\tMOVQ dst+32(FP), DI")
	w.f("\tMOVQ ldd+40(FP), R11")
	w.f("\tSHLQ $2, R11")
	w.f("\tMOVQ mask+48(FP), AX")
	w.f("\tKMOVW AX, K1")
	w.f("packT_loop:")
	w.f("\tTESTQ R9, R9")
	w.f("\tJLE packT_done")
	w.f("\tMOVQ R9, CX")
	w.f("\tCMPQ CX, $16")
	w.f("\tJLE packT_cols")
	w.f("\tMOVQ $16, CX")
	w.f("packT_cols:")
	w.f("\tMOVL $1, AX")
	w.f("\tSHLL CX, AX")
	w.f("\tDECL AX")
	w.f("\tKMOVW AX, K2")
	w.f("\tMOVQ SI, R12")
	for r := 0; r < 16; r++ {
		w.f("\tCMPQ R8, $%d", r)
		w.f("\tJLE packT_z%d", r)
		w.f("\tVMOVUPS.Z (R12), K2, %s", z(r))
		w.f("\tADDQ R10, R12")
		w.f("\tJMP packT_n%d", r)
		w.f("packT_z%d:", r)
		w.f("\tVPXORD %s, %s, %s", z(r), z(r), z(r))
		w.f("packT_n%d:", r)
	}
	for q := 0; q < 8; q++ {
		w.f("\tVUNPCKLPS %s, %s, %s", z(2*q+1), z(2*q), z(16+2*q))
		w.f("\tVUNPCKHPS %s, %s, %s", z(2*q+1), z(2*q), z(17+2*q))
	}
	for g := 0; g < 4; g++ {
		w.f("\tVUNPCKLPD %s, %s, %s", z(18+4*g), z(16+4*g), z(4*g))
		w.f("\tVUNPCKHPD %s, %s, %s", z(18+4*g), z(16+4*g), z(4*g+1))
		w.f("\tVUNPCKLPD %s, %s, %s", z(19+4*g), z(17+4*g), z(4*g+2))
		w.f("\tVUNPCKHPD %s, %s, %s", z(19+4*g), z(17+4*g), z(4*g+3))
	}
	for q := 0; q < 4; q++ {
		w.f("\tVSHUFF32X4 $0x44, %s, %s, %s", z(4+q), z(q), z(16+4*q))
		w.f("\tVSHUFF32X4 $0xEE, %s, %s, %s", z(4+q), z(q), z(17+4*q))
		w.f("\tVSHUFF32X4 $0x44, %s, %s, %s", z(12+q), z(8+q), z(18+4*q))
		w.f("\tVSHUFF32X4 $0xEE, %s, %s, %s", z(12+q), z(8+q), z(19+4*q))
	}
	for q := 0; q < 4; q++ {
		w.f("\tVSHUFF32X4 $0x88, %s, %s, %s", z(18+4*q), z(16+4*q), z(q))
		w.f("\tVSHUFF32X4 $0xDD, %s, %s, %s", z(18+4*q), z(16+4*q), z(4+q))
		w.f("\tVSHUFF32X4 $0x88, %s, %s, %s", z(19+4*q), z(17+4*q), z(8+q))
		w.f("\tVSHUFF32X4 $0xDD, %s, %s, %s", z(19+4*q), z(17+4*q), z(12+q))
	}
	w.f("\tMOVQ DI, R12")
	for c := 0; c < 16; c++ {
		w.f("\tVMOVUPS %s, K1, (R12)", z(c))
		if c < 15 {
			w.f("\tCMPQ CX, $%d", c+1)
			w.f("\tJLE packT_next")
			w.f("\tADDQ R11, R12")
		}
	}
	w.f("packT_next:")
	w.f("\tADDQ $64, SI")
	w.f("\tMOVQ R11, AX")
	w.f("\tSHLQ $4, AX")
	w.f("\tADDQ AX, DI")
	w.f("\tSUBQ $16, R9")
	w.f("\tJMP packT_loop")
	w.f("packT_done:")
	w.f("\tVZEROUPPER")
	w.f("\tRET")
	w.f("")
}
