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
