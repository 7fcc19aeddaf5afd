package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTuneTable: the tuned algorithms' table round-trips; a damaged
// checksum, another card's header, a line of the wrong width or a flag
// that is not 0 or 1 make it unreadable (so the shapes are timed again);
// two handles' saves merge.
func TestTuneTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "blas-tune-x.txt")
	const header = tuneMagic + " on a card"
	k1 := gemmKey{true, false, 3072, 256, 1024, 1024, 1024, 3072, 256, 256, 256, 256, false, false}
	k2 := gemmKey{false, true, 1024, 33, 2048, 1024, 2048, 1024, 16, 256, 8, 4, true, false}
	e1 := tuneEntry{heuristicUS: 14.25, bestUS: 4.5, cands: 23, split: 4, id: 66}
	e2 := tuneEntry{heuristicUS: 3, bestUS: 3, cands: 2, split: 1, id: 7}
	for i := range e1.algo {
		e1.algo[i], e2.algo[i] = byte(i), byte(255-i)
	}
	a := &tuneTable{path: path, header: header, algos: map[gemmKey]tuneEntry{k1: e1}}
	if err := a.save(); err != nil {
		t.Fatal(err)
	}
	// Another handle with another shape: the file holds both.
	b := &tuneTable{path: path, header: header, algos: map[gemmKey]tuneEntry{k2: e2}}
	if err := b.save(); err != nil {
		t.Fatal(err)
	}
	got := readTuneTable(path, header)
	if len(got) != 2 || got[k1] != e1 || got[k2] != e2 {
		t.Fatalf("read back %+v, want the two entries", got)
	}
	if got := readTuneTable(path, tuneMagic+" on another card"); len(got) != 0 {
		t.Errorf("another card's table gave %d entries", len(got))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	damaged := bytes.Replace(data, []byte(" 14.250 "), []byte(" 14.251 "), 1)
	if bytes.Equal(damaged, data) {
		t.Fatal("the heuristic's time is not in the file")
	}
	if _, err := parseTuneTable(damaged, header); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("a changed time: %v, want a checksum mismatch", err)
	}
	if _, err := parseTuneTable(data[:len(data)-20], header); err == nil {
		t.Error("a cut checksum passed")
	}
	// Lines that do not parse, behind a right checksum.
	for _, c := range []struct{ line, want string }{
		{formatTuneLine(k1, e1) + " 9", "21 fields"},
		{strings.Replace(formatTuneLine(k1, e1), "1 0 3072", "2 0 3072", 1), "want 0 or 1"},
		{strings.Replace(formatTuneLine(k1, e1), " 3072 256 ", " -3072 256 ", 1), "field 3"},
		{strings.Replace(formatTuneLine(k1, e1), "000102", "0001", 1), "algorithm"},
	} {
		body := header + "\n" + tuneColumns + "\n" + c.line + "\n"
		if _, err := parseTuneTable(withSum(body), header); err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want line 3 and %q", c.line, err, c.want)
		}
	}
}

// withSum appends a table's checksum line to body.
func withSum(body string) []byte {
	sum := sha256.Sum256([]byte(body))
	return []byte(body + "sum " + hex.EncodeToString(sum[:]) + "\n")
}

// TestDeviceBlasTuneTable: with KEEL_BLAS_TUNE=1 the candidates include
// the splits of k of an algorithm that can split it (on the emulator:
// its three algorithms and the second's two splits at k = 512, whose
// parts are at least 128 deep); the fastest is written to the table on
// disk, and the next handle takes it from there without timing and
// computes the same bits; a damaged table, or an algorithm in it that
// cublasLtMatmulAlgoCheck refuses, is timed again; a split algorithm
// from the table runs with its workspace.
func TestDeviceBlasTuneTable(t *testing.T) {
	t.Setenv("KEEL_BLAS_TUNE", "1")
	dir := t.TempDir()
	const M, N, K = 33, 48, 512
	r := rand.New(rand.NewPCG(15, 4))
	xf, wf := randF32(r, M*K, 1), randF32(r, N*K, 1)
	want, bound := gemmRef(make([]float32, M*N), roundBF16(xf), roundBF16(wf), M, N, K, K, 1, 1, K, N, false)
	// run opens a device whose cuBLASLt keeps its table in dir, computes
	// Y = X·Wᵀ there and returns the handle, its one plan and Y.
	run := func() (*Blas, gemmKey, *gemmPlan, []float32) {
		g := newGPU(t)
		blas, err := g.d.Blas()
		if err != nil {
			t.Fatal(err)
		}
		blas.tableDir = dir
		x, w, y := bf16Buf(g, xf), bf16Buf(g, wf), g.poisoned(M*N)
		if err := blas.GemmBF16(true, false, N, M, K, w, K, x, K, y, N, false); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		got := g.f32(y, M*N)
		withinBound(t, "the product", got, want, bound)
		if len(blas.plans) != 1 {
			t.Fatalf("%d plans, want 1", len(blas.plans))
		}
		for k, p := range blas.plans {
			return blas, k, p, got
		}
		panic("unreachable")
	}
	table := func() (string, map[gemmKey]tuneEntry) {
		files, _ := filepath.Glob(filepath.Join(dir, "blas-tune-*.txt"))
		if len(files) != 1 {
			t.Fatalf("%d tables in the cache folder, want 1", len(files))
		}
		data, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		return files[0], readTuneTable(files[0], strings.SplitN(string(data), "\n", 2)[0])
	}

	b1, key, p1, y1 := run()
	if b1.tuned != 1 || b1.loaded != 0 {
		t.Fatalf("first handle: %d timed, %d from the table, want 1 and 0", b1.tuned, b1.loaded)
	}
	emulated := b1.dev.Emulated
	path, entries := table()
	e, ok := entries[key]
	if !ok || !bytes.Equal(e.algo[:], p1.algo[:algoBytes]) || !(e.bestUS <= e.heuristicUS) {
		t.Fatalf("the table holds %+v for the product, want its algorithm and best <= heuristic", e)
	}
	if emulated && e.cands != 5 {
		t.Errorf("%d candidates timed, want 5 (3 algorithms, 2 splits)", e.cands)
	}

	b2, _, p2, y2 := run()
	// The algorithm itself (the result's other fields are the heuristic's
	// or the check's, which need not agree).
	if same := bytes.Equal(p2.algo[:algoBytes], p1.algo[:algoBytes]); b2.tuned != 0 || b2.loaded != 1 || !same {
		t.Fatalf("second handle: %d timed, %d from the table, same algorithm %v; want 0, 1, true", b2.tuned, b2.loaded, same)
	}
	for i := range y1 {
		if y1[i] != y2[i] {
			t.Fatalf("Y[%d] = %g from the table's algorithm, %g when timed", i, y2[i], y1[i])
		}
	}

	// A damaged table: timed again, and rewritten whole.
	data, _ := os.ReadFile(path)
	data[len(data)/2] ^= 1
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if b3, _, _, _ := run(); b3.tuned != 1 || b3.loaded != 0 {
		t.Fatalf("after damage: %d timed, %d from the table, want 1 and 0", b3.tuned, b3.loaded)
	}
	if _, entries := table(); len(entries) != 1 {
		t.Fatalf("the rewritten table has %d entries, want 1", len(entries))
	}
	if !emulated {
		return
	}
	// The emulator's algorithms are "keel-emu", a number, a split, a
	// reduction scheme (tools/cudaemu/cublaslt.cc).
	put := func(id, split, scheme byte) {
		var a [algoBytes]byte
		copy(a[:], "keel-emu")
		a[8], a[9], a[10] = id, split, scheme
		tt := &tuneTable{path: path, header: b1.table.header, algos: map[gemmKey]tuneEntry{key: {algo: a, cands: 1}}}
		os.Remove(path)
		if err := tt.save(); err != nil {
			t.Fatal(err)
		}
	}
	put(1, 4, reduceComputeType) // a split of four: runs with its workspace
	b4, _, p4, _ := run()
	if b4.tuned != 0 || b4.loaded != 1 || p4.algo[9] != 4 || binary.LittleEndian.Uint64(p4.algo[64:]) != M*N*4*4 {
		t.Fatalf("a split algorithm from the table: %d timed, %d loaded, split %d, workspace %d", b4.tuned, b4.loaded, p4.algo[9], binary.LittleEndian.Uint64(p4.algo[64:]))
	}
	put(0, 4, reduceComputeType) // a split the first algorithm cannot make: the check refuses it
	b5, _, p5, _ := run()
	if b5.tuned != 1 || b5.loaded != 0 || (p5.algo[8] == 0 && p5.algo[9] == 4) {
		t.Fatalf("a refused algorithm from the table: %d timed, %d loaded, algorithm %d split %d", b5.tuned, b5.loaded, p5.algo[8], p5.algo[9])
	}
	if _, entries := table(); entries[key].algo[8] == 0 && entries[key].algo[9] == 4 {
		t.Error("the refused algorithm stayed in the table")
	}
}
