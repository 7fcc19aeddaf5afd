package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

func arenaHash(m *Model) string {
	h := sha256.New()
	var b [4]byte
	for _, v := range m.Arena {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestDetLog(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	xs := []float64{1, 0.5, 2, math.Sqrt2 / 2, 1e-300, 5e-324, 0.999999999, 1.0000001, math.MaxFloat64}
	for range 100000 {
		xs = append(xs, math.Ldexp(r.Float64()+0.5, r.IntN(200)-100))
	}
	for _, x := range xs {
		got, want := detLog(x), math.Log(x)
		if x < 1e-300 { // math.Log on amd64 is wrong for subnormals: scale first
			want = math.Log(math.Ldexp(x, 200)) - 200*math.Ln2
		}
		if math.Abs(got-want) > 4e-16*math.Max(1, math.Abs(want)) {
			t.Fatalf("detLog(%g) = %.17g, math.Log = %.17g", x, got, want)
		}
	}
	if detLog(1) != 0 {
		t.Errorf("detLog(1) = %g", detLog(1))
	}
}

// TestNormalSamples checks the moments of fillNormal: mean 0, variance
// std², and the normal's kurtosis 3 (a uniform would give 1.8).
func TestNormalSamples(t *testing.T) {
	const n = 400000
	x := make([]float32, n)
	fillNormal(x, 2, rand.New(rand.NewPCG(1, 1)))
	var m1, m2, m4 float64
	for _, v := range x {
		m1 += float64(v)
	}
	m1 /= n
	for _, v := range x {
		d := float64(v) - m1
		m2 += d * d
		m4 += d * d * d * d
	}
	m2 /= n
	m4 /= n
	if math.Abs(m1) > 0.02 || math.Abs(m2-4) > 0.04 || math.Abs(m4/(m2*m2)-3) > 0.05 {
		t.Errorf("mean %g, variance %g (want 4), kurtosis %g (want 3)", m1, m2, m4/(m2*m2))
	}
	within := 0
	for _, v := range x {
		if math.Abs(float64(v)) < 2 {
			within++
		}
	}
	if f := float64(within) / n; math.Abs(f-0.682689) > 0.003 {
		t.Errorf("fraction within one std = %g, want 0.6827", f)
	}
}

func TestInit(t *testing.T) {
	cfg, err := Preset("tiny-moe", 300)
	if err != nil {
		t.Fatal(err)
	}
	a := New(cfg)
	Init(a, 42)
	// Same seed, different core counts: bitwise equal.
	old := runtime.GOMAXPROCS(1)
	b := New(cfg)
	Init(b, 42)
	runtime.GOMAXPROCS(old)
	if arenaHash(a) != arenaHash(b) {
		t.Fatal("Init depends on GOMAXPROCS")
	}
	c := New(cfg)
	Init(c, 43)
	if arenaHash(a) == arenaHash(c) {
		t.Fatal("seeds 42 and 43 give the same model")
	}
	// A parameter's values depend on the seed and its name, not on the
	// vocabulary.
	cfg2 := cfg
	cfg2.VocabSize = 500
	d := New(cfg2)
	Init(d, 42)
	if arenaHash(&Model{Arena: a.Layers[2].Q.Data}) != arenaHash(&Model{Arena: d.Layers[2].Q.Data}) {
		t.Error("layer weights changed with the vocabulary size")
	}

	stats := func(x []float32) (mean, std float64) {
		for _, v := range x {
			mean += float64(v)
		}
		mean /= float64(len(x))
		for _, v := range x {
			std += (float64(v) - mean) * (float64(v) - mean)
		}
		return mean, math.Sqrt(std / float64(len(x)))
	}
	outStd := 0.02 / math.Sqrt(2*4)
	check := func(name string, x []float32, want float64) {
		t.Helper()
		mean, std := stats(x)
		if math.Abs(mean) > 4*want/math.Sqrt(float64(len(x))) || math.Abs(std-want) > 0.05*want {
			t.Errorf("%s: mean %g std %g, want std %g", name, mean, std, want)
		}
	}
	check("embed", a.Embed.Data, 0.02)
	check("q_proj", a.Layers[0].Q.Data, 0.02)
	check("router", a.Layers[1].Router.Data, 0.02)
	check("o_proj", a.Layers[0].O.Data, outStd)
	check("expert down_proj", a.Layers[3].Experts[5].Down.Data, outStd)
	check("expert up_proj", a.Layers[3].Experts[5].Up.Data, 0.02)
	for _, p := range []*Param{a.Norm, a.Layers[0].InputNorm, a.Layers[1].PostAttnNorm, a.Layers[2].QNorm, a.Layers[3].KNorm} {
		for _, v := range p.Data {
			if v != 1 {
				t.Fatalf("%s: %g, want 1", p.Name, v)
			}
		}
	}
	// Different parameters and different blocks get different streams.
	if a.Layers[0].Q.Data[0] == a.Layers[0].K.Data[0] || a.Layers[0].Experts[0].Gate.Data[0] == a.Layers[0].Experts[1].Gate.Data[0] {
		t.Error("parameters share a random stream")
	}
}

// TestInitGolden pins the exact bits Init produces, so a change of
// platform, Go version or code that alters them is caught.
func TestInitGolden(t *testing.T) {
	cfg, err := Preset("tiny-dense", 64)
	if err != nil {
		t.Fatal(err)
	}
	m := New(cfg)
	Init(m, 1)
	const want = "5be1eba253e28da7dffffcad5978bbc4e70af8f6e03f311459fe4efa2933f2dc"
	if got := arenaHash(m); got != want {
		t.Errorf("Init(tiny-dense, vocab 64, seed 1) hash = %s, want %s", got, want)
	}
}
