package kernels

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestGemmBatchMatchesGemm: every product of a batch has Gemm's bits, with
// one and two threads, for few tasks (split products) and many (whole
// products per thread), transposes, accumulation, k = 0 and empty tasks.
func TestGemmBatchMatchesGemm(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	shapes := [][3]int{{300, 96, 260}, {1, 40, 33}, {37, 300, 17}, {0, 5, 5}, {9, 0, 12}, {64, 64, 0}, {150, 600, 70}}
	for _, ntask := range []int{1, 3, 4, 12} {
		var tasks []GemmTask
		var want [][]float32
		for i := 0; i < ntask; i++ {
			sh := shapes[(i*5+ntask)%len(shapes)]
			m, n, k := sh[0], sh[1], sh[2]
			ta, tb := i%2 == 1, i%3 != 0
			lda, ldb, ldc := k+1, n+2, n+3
			if ta {
				lda = m + 1
			}
			if tb {
				ldb = k + 2
			}
			aRows, bRows := m, k
			if ta {
				aRows = k
			}
			if tb {
				bRows = n
			}
			a, b, c := fill(aRows*lda+1), fill(bRows*ldb+1), fill(m*ldc+1)
			acc := i%4 == 2
			w := append([]float32(nil), c...)
			Gemm(ta, tb, m, n, k, a, lda, b, ldb, w, ldc, acc)
			want = append(want, w)
			task := GemmTask{TransA: ta, TransB: tb, M: m, N: n, K: k, A: a, LDA: lda, B: b, LDB: ldb, C: c, LDC: ldc, Accumulate: acc}
			if i%5 == 4 && !ta {
				// Every fifth task runs on a prepacked B.
				task.PB = PackB(tb, n, k, b, ldb)
				task.B, task.N = nil, 0
			}
			tasks = append(tasks, task)
		}
		for _, procs := range []int{1, 2} {
			saved := make([][]float32, len(tasks))
			for i := range tasks {
				saved[i] = append([]float32(nil), tasks[i].C...)
			}
			prev := runtime.GOMAXPROCS(procs)
			GemmBatch(tasks)
			runtime.GOMAXPROCS(prev)
			for i := range tasks {
				for j := range want[i] {
					if tasks[i].C[j] != want[i][j] {
						t.Fatalf("%d tasks, GOMAXPROCS %d: task %d element %d = %v, Gemm gives %v", ntask, procs, i, j, tasks[i].C[j], want[i][j])
					}
				}
				copy(tasks[i].C, saved[i])
			}
		}
	}
}

func TestGemmBatchNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	tasks := make([]GemmTask, 8)
	for i := range tasks {
		tasks[i] = GemmTask{M: 64, N: 64, K: 64, A: make([]float32, 64*64), LDA: 64, B: make([]float32, 64*64), LDB: 64, C: make([]float32, 64*64), LDC: 64}
	}
	GemmBatch(tasks)
	if a := testing.AllocsPerRun(20, func() { GemmBatch(tasks) }); a != 0 {
		t.Errorf("GemmBatch allocates %v times per call", a)
	}
}

// TestGemmBF16BatchMatchesCalls: every product of a bf16 batch has the bits
// of its single call, bf16 and e4m3, split or whole, one or two threads.
func TestGemmBF16BatchMatchesCalls(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	for _, ntask := range []int{2, 9} {
		var tasks []BF16Task
		var want [][]float32
		for i := 0; i < ntask; i++ {
			m, n, k := 1+r.IntN(70), 1+r.IntN(90), 1+r.IntN(130)
			e4 := i%2 == 1
			w := fill(n * k)
			var pb *PackedBF16B
			if e4 {
				pb = PackE4M3B(w, n, k, k)
			} else {
				pb = PackBF16BFloat32(w, n, k, k)
			}
			a, c := fill(m*k), fill(m*n)
			ref := append([]float32(nil), c...)
			if e4 {
				GemmE4M3F32A(m, a, k, pb, ref, n, i%3 == 0)
			} else {
				GemmBF16F32A(m, a, k, pb, ref, n, i%3 == 0)
			}
			want = append(want, ref)
			tasks = append(tasks, BF16Task{M: m, A: a, LDA: k, B: pb, C: c, LDC: n, Accumulate: i%3 == 0, E4M3: e4})
		}
		for _, procs := range []int{1, 2} {
			saved := make([][]float32, len(tasks))
			for i := range tasks {
				saved[i] = append([]float32(nil), tasks[i].C...)
			}
			prev := runtime.GOMAXPROCS(procs)
			GemmBF16Batch(tasks)
			runtime.GOMAXPROCS(prev)
			for i := range tasks {
				for j := range want[i] {
					if tasks[i].C[j] != want[i][j] {
						t.Fatalf("%d tasks, GOMAXPROCS %d: task %d element %d = %v, single call %v", ntask, procs, i, j, tasks[i].C[j], want[i][j])
					}
				}
				copy(tasks[i].C, saved[i])
			}
		}
	}
}
