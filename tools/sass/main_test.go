package main

import "testing"

// A disassembly in nvdisasm's layout: two kernels, the second with a
// loop (a label and a predicated branch back to it), a forward branch,
// NOPs and modifiers.
const sample = `//--------------------- .text.k_b --------------------------
	.section	.text.k_b,"ax",@progbits
.text.k_b:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   MOV R2, RZ ;
.L_x_1:
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0030*/               @P0 BRA ` + "`" + `(.L_x_2) ;
        /*0040*/                   FFMA.FTZ R2, R2, R3, R2 ;
.L_x_2:
        /*0050*/                   NOP ;
        /*0060*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0070*/              @!P1 BRA ` + "`" + `(.L_x_1) ;
        /*0080*/                   EXIT ;
//--------------------- .text.k_a --------------------------
.text.k_a:
        /*0000*/                   EXIT ;
`

func TestParse(t *testing.T) {
	fs := parse([]byte(sample))
	if len(fs) != 2 || fs[0].name != "k_a" || fs[1].name != "k_b" {
		t.Fatalf("functions %+v, want k_a and k_b in order", fs)
	}
	a, b := fs[0], fs[1]
	if a.total != 1 || a.counts["EXIT"] != 1 || len(a.loops) != 0 {
		t.Errorf("k_a: %d instructions %v, loops %v; want one EXIT, no loop", a.total, a.counts, a.loops)
	}
	// NOP is not counted; FFMA.FTZ counts as FFMA; the predicated branch
	// back to .L_x_1 is the one loop, from the HMMA (the third
	// instruction) to itself (the seventh).
	want := map[string]int{"LDC": 1, "MOV": 1, "HMMA": 1, "BRA": 2, "FFMA": 1, "IADD3": 1, "EXIT": 1}
	if b.total != 8 {
		t.Errorf("k_b: %d instructions, want 8", b.total)
	}
	for op, n := range want {
		if b.counts[op] != n {
			t.Errorf("k_b: %s %d, want %d (%v)", op, b.counts[op], n, b.counts)
		}
	}
	if len(b.loops) != 1 || b.loops[0] != [3]int{2, 6, 1} {
		t.Errorf("k_b loops %v, want [[2 6 1]]: one loop, instructions 2..6, label 1", b.loops)
	}
}
