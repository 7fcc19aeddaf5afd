package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// runPartsConcurrently computes g's parts on two goroutines, the second
// taking them from the end, so that parts run out of order and at once.
func runPartsConcurrently(g *GemmParts) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	lo, hi := 0, g.Len()
	take := func(fromEnd bool) (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if lo >= hi {
			return 0, false
		}
		if fromEnd {
			hi--
			return hi, true
		}
		lo++
		return lo - 1, true
	}
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s GemmScratch
			for {
				i, ok := take(w == 1)
				if !ok {
					return
				}
				g.Run(i, &s)
			}
		}()
	}
	wg.Wait()
}

func requireSameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d = %v, want %v (bit for bit)", what, i, got[i], want[i])
		}
	}
}

// TestGemmPartsMatchesWholeCalls checks that a product computed part by
// part, out of order and concurrently, gives the bits of the single call,
// for every precision, split and accumulate flag, with edges in m, n and k.
func TestGemmPartsMatchesWholeCalls(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	shapes := [][3]int{{1, 1, 1}, {5, 33, 7}, {28, 64, 128}, {29, 100, 257}, {256, 256, 128}, {300, 520, 300}, {14, 32, 2}}
	for _, sh := range shapes {
		m, n, k := sh[0], sh[1], sh[2]
		a, w := randMat(r, m*k), randMat(r, n*k)
		c0 := randMat(r, m*n)
		pb := PackB(true, n, k, w, k)
		bb := PackBF16BFloat32(w, n, k, k)
		eb := PackE4M3B(w, n, k, k)
		for _, acc := range []bool{false, true} {
			want := map[string][]float32{}
			for _, name := range []string{"f32", "bf16", "e4m3"} {
				c := append([]float32(nil), c0...)
				switch name {
				case "f32":
					GemmPacked(m, a, k, pb, c, n, acc)
				case "bf16":
					GemmBF16F32A(m, a, k, bb, c, n, acc)
				case "e4m3":
					GemmE4M3F32A(m, a, k, eb, c, n, acc)
				}
				want[name] = c
			}
			for _, workers := range []int{1, 2, 3, 8} {
				for _, name := range []string{"f32", "bf16", "e4m3"} {
					var g GemmParts
					c := append([]float32(nil), c0...)
					switch name {
					case "f32":
						g.Packed(m, a, k, pb, c, n, acc, workers)
					case "bf16":
						g.BF16F32A(m, a, k, bb, c, n, acc, workers)
					case "e4m3":
						g.E4M3F32A(m, a, k, eb, c, n, acc, workers)
					}
					if g.Len() < 1 {
						t.Fatalf("%s %v: no parts", name, sh)
					}
					if workers == 1 {
						var s GemmScratch
						g.RunAll(&s)
					} else {
						runPartsConcurrently(&g)
					}
					requireSameBits(t, fmt.Sprintf("%s m=%d n=%d k=%d acc=%v workers=%d (%d parts)", name, m, n, k, acc, workers, g.Len()), c, want[name])
				}
			}
		}
	}
}

// TestGemmPartsSplits checks that a large product asked for several
// workers is cut into several parts (or the parts would not share the
// work), and that one worker gets a single part.
func TestGemmPartsSplits(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	m, n, k := 256, 512, 256
	a, w, c := randMat(r, m*k), randMat(r, n*k), make([]float32, m*n)
	var g GemmParts
	g.Packed(m, a, k, PackB(true, n, k, w, k), c, n, false, 2)
	if g.Len() < 4 {
		t.Fatalf("float32: %d parts for 2 workers", g.Len())
	}
	g.Packed(m, a, k, PackB(true, n, k, w, k), c, n, false, 1)
	if g.Len() != 1 {
		t.Fatalf("float32: %d parts for 1 worker", g.Len())
	}
	g.BF16F32A(m, a, k, PackBF16BFloat32(w, n, k, k), c, n, false, 2)
	if g.Len() < 4 {
		t.Fatalf("bf16: %d parts for 2 workers", g.Len())
	}
}

// TestGemmPartsEmpty checks the trivial products: nothing to run, and C
// cleared when k is 0 without accumulation.
func TestGemmPartsEmpty(t *testing.T) {
	c := []float32{1, 2, 3, 4}
	var g GemmParts
	g.Packed(2, nil, 0, PackB(true, 2, 0, nil, 0), c, 2, false, 2)
	if g.Len() != 0 || c[0] != 0 || c[3] != 0 {
		t.Fatalf("k = 0: %d parts, c = %v", g.Len(), c)
	}
	c = []float32{1, 2, 3, 4}
	g.BF16F32A(2, nil, 0, PackBF16BFloat32(nil, 2, 0, 0), c, 2, true, 2)
	if g.Len() != 0 || c[0] != 1 {
		t.Fatalf("bf16 k = 0 accumulate: %d parts, c = %v", g.Len(), c)
	}
	g.Packed(0, nil, 4, PackB(true, 2, 4, make([]float32, 8), 4), nil, 2, false, 2)
	if g.Len() != 0 {
		t.Fatalf("m = 0: %d parts", g.Len())
	}
}

// TestGemmPartsNoAllocs: setting up and running parts allocates nothing
// once the scratch has grown (the rollout engine's decode step relies on it).
func TestGemmPartsNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(7, 8))
	m, n, k := 100, 96, 64
	a, w, c := randMat(r, m*k), randMat(r, n*k), make([]float32, m*n)
	pb, bb, eb := PackB(true, n, k, w, k), PackBF16BFloat32(w, n, k, k), PackE4M3B(w, n, k, k)
	var g GemmParts
	var s GemmScratch
	run := func() {
		g.Packed(m, a, k, pb, c, n, false, 2)
		g.RunAll(&s)
		g.BF16F32A(m, a, k, bb, c, n, false, 2)
		g.RunAll(&s)
		g.E4M3F32A(m, a, k, eb, c, n, false, 2)
		g.RunAll(&s)
	}
	run()
	if allocs := testing.AllocsPerRun(20, run); allocs != 0 {
		t.Fatalf("%v allocations per run", allocs)
	}
}
