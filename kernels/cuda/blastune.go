package cuda

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/keel-rl/keel/internal/atomicfile"
)

// With KEEL_BLAS_TUNE=1 plans time cuBLASLt's candidate algorithms for
// their shape the first time a product of that shape runs outside a
// graph's recording, and keep the fastest (as TensorRT-LLM's autotuning
// does). cuBLASLt's heuristic ranks them by a model of the card, which for
// the small products of a decoding step may be far off: a 256 × 3072 ×
// 1024 bf16 product took 14 µs on an H200 (112 TFLOP/s), about 3× what
// its reads and its arithmetic need, and its time hardly changed with the
// output's size (a 1024 × 256 × 1024 product took as long in the decoding
// profile), as when a few large tiles, each with the whole of k to walk,
// leave most multiprocessors idle. So the candidates are the heuristic's
// tuneAlgos and, for each that can split k, its splits into parts of at
// least minSplitDepth (splitCounts), reduced in float32 (cuBLASLt's
// COMPUTE_TYPE scheme: the partial sums in the workspace, added in a fixed
// order, so a split product repeats its bits); at most tuneMaxCands.
//
// The choices are kept on disk (tuneTable), per card, driver and cuBLASLt
// version, beside the kernel cache: a later run takes them without timing,
// so bf16 runs on one machine repeat bit for bit once a shape has been
// timed there. Two machines, or a run before and after the table exists,
// may pick different algorithms for a shape, which round differently:
// the heuristic's choice is the same everywhere on a card, which is why
// tuning stays off by default until a GPU session has measured what it
// gains. Under KEEL_CUDA_PROFILE a shape's first product is charged its
// timing.
//
// Products are timed up to tuneMaxFLOPs, with an output of at most
// tuneMaxBytes (the scratch output timing allocates), and at most
// tuneMaxPlans of them per handle (shapes that keep changing, such as an
// MoE layer's experts grouped on the host, stop costing time after that).
// Until session 25 only products of at most 16 GFLOP were (a 256-row
// decoding step's are 1.6-5.4 GFLOP), on the belief that training's ran
// near the card's speed with the heuristic's choice. Most do (530-670
// TFLOP/s in the H200's training profile of session 24), but not all:
// the Qwen3-0.6B shape's q product (2048 × 16384 × 1024, Aᵀ·B) took
// 436 µs, 158 TFLOP/s, and its o product (1024 × 16384 × 2048) 343 µs,
// 200 TFLOP/s, where k's and v's (1024 × 16384 × 1024) took 65 µs and
// down's (1024 × 16384 × 3072) 195 µs: together about 14 ms of a 247 ms
// step at 8 × 2048 tokens. A training product takes tenths of a
// millisecond, so its 48 candidates are timed in tens of milliseconds,
// once per shape and card (the LM head's 2.5 GB outputs stay out).
const (
	tuneAlgos     = 16
	tuneMaxCands  = 48
	minSplitDepth = 128
	tuneMaxFLOPs  = 1e12
	tuneMaxBytes  = 256 << 20
	tuneMaxPlans  = 512
)

// splitCounts are the splits of k tried for an algorithm that can split.
var splitCounts = []uint32{2, 4, 8, 16}

// cuBLASLt's algorithm capabilities and configuration (cublasLt.h).
const (
	capSplitK         = 0 // CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, int32
	capReductionMask  = 1 // CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, uint32
	configID          = 0 // CUBLASLT_ALGO_CONFIG_ID, int32
	configSplitK      = 2 // CUBLASLT_ALGO_CONFIG_SPLITK_NUM, uint32
	configReduction   = 3 // CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32
	reduceComputeType = 2 // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
)

// tunable says whether a product of key's shape is timed.
func tunable(key gemmKey) bool {
	return scratchBytes(key) <= tuneMaxBytes && 2*float64(key.m)*float64(key.n)*float64(key.k) <= tuneMaxFLOPs
}

// scratchBytes is the size of the output a timing writes.
func scratchBytes(key gemmKey) int64 {
	elt := int64(4)
	if key.out16 {
		elt = 2
	}
	return int64(key.ldc)*int64(key.n-1)*elt + int64(key.m)*elt
}

// candidatesLocked returns the algorithms to time for a plan, res the
// heuristic's results (res[0] p's algorithm until then): those whose state
// is success, and the splits of k of those that can split it, checked by
// cublasLtMatmulAlgoCheck against the workspace. A shape in the table on
// disk that still passes the check takes its algorithm from there and has
// none. Inside Device.do, b.mu held.
func (b *Blas) candidatesLocked(key gemmKey, p *gemmPlan, res [][heuristicResultBytes]byte) [][heuristicResultBytes]byte {
	lt := b.lt
	if t := b.tableLocked(); t != nil {
		if e, ok := t.algos[key]; ok {
			var algo [heuristicResultBytes]byte
			copy(algo[:], e.algo[:])
			if b.checkAlgo(p, &algo) {
				p.algo = algo
				b.loaded++
				return nil
			}
			delete(t.algos, key) // a library that no longer takes it: timed again
			if t.dropped == nil {
				t.dropped = map[gemmKey]bool{}
			}
			t.dropped[key] = true
		}
	}
	if b.tries >= tuneMaxPlans { // no more timing in this handle
		return nil
	}
	cands := [][heuristicResultBytes]byte{res[0]}
	for _, r := range res[1:] {
		// The result's state (after the algorithm and its workspace
		// size): only those cuBLASLt says succeed are candidates.
		if binary.LittleEndian.Uint32(r[72:]) == 0 {
			cands = append(cands, r)
		}
	}
	if lt.capGet != nil {
		heuristic := len(cands)
		for i := 0; i < heuristic && len(cands) < tuneMaxCands; i++ {
			cands = b.appendSplits(cands, key, p, cands[i])
		}
	}
	if len(cands) > tuneMaxCands {
		cands = cands[:tuneMaxCands]
	}
	if len(cands) < 2 {
		return nil
	}
	return cands
}

// appendSplits appends to cands the splits of k of algorithm r that pass
// cublasLtMatmulAlgoCheck, when r can split k and does not already.
func (b *Blas) appendSplits(cands [][heuristicResultBytes]byte, key gemmKey, p *gemmPlan, r [heuristicResultBytes]byte) [][heuristicResultBytes]byte {
	lt := b.lt
	var splits int32
	var mask, cur uint32
	var n uintptr
	if lt.capGet(unsafe.Pointer(&r[0]), capSplitK, unsafe.Pointer(&splits), 4, &n) != 0 || splits == 0 ||
		lt.capGet(unsafe.Pointer(&r[0]), capReductionMask, unsafe.Pointer(&mask), 4, &n) != 0 || mask&reduceComputeType == 0 ||
		lt.configGet(unsafe.Pointer(&r[0]), configSplitK, unsafe.Pointer(&cur), 4, &n) != 0 || cur > 1 {
		return cands
	}
	for _, s := range splitCounts {
		if key.k/int(s) < minSplitDepth || len(cands) >= tuneMaxCands {
			break
		}
		v := r
		scheme := uint32(reduceComputeType)
		if lt.configSet(unsafe.Pointer(&v[0]), configSplitK, unsafe.Pointer(&s), 4) != 0 ||
			lt.configSet(unsafe.Pointer(&v[0]), configReduction, unsafe.Pointer(&scheme), 4) != 0 {
			return cands
		}
		if b.checkAlgo(p, &v) {
			cands = append(cands, v)
		}
	}
	return cands
}

// checkAlgo says whether cuBLASLt runs p's product with algo within the
// handle's workspace, and writes the workspace it needs into algo's
// result fields (cublasLtMatmulAlgoCheck).
func (b *Blas) checkAlgo(p *gemmPlan, algo *[heuristicResultBytes]byte) bool {
	if b.lt.algoCheck == nil {
		return false
	}
	var res [heuristicResultBytes]byte
	if b.lt.algoCheck(b.h, p.desc, p.a, p.b, p.c, p.c, unsafe.Pointer(&algo[0]), unsafe.Pointer(&res[0])) != 0 ||
		binary.LittleEndian.Uint32(res[72:]) != 0 || binary.LittleEndian.Uint64(res[64:]) > uint64(b.ws.Size) {
		return false
	}
	copy(algo[64:], res[64:])
	return true
}

// tuneLocked times p's candidate algorithms on the product's own operands
// A and B, into a scratch output (the product's own may accumulate or be
// read by the work before it), makes the fastest p's algorithm and keeps
// it in the table on disk; b.mu is held and the product is on the default
// stream. While any goroutine records a graph it leaves p for a later
// product: timing ends with a context synchronisation (freeing the
// scratch), which a recording forbids. A candidate that fails is passed
// over; if timing itself fails, the heuristic's first stays.
func (b *Blas) tuneLocked(key gemmKey, p *gemmPlan, A, B Buffer, alpha, beta *float32) {
	if b.tries >= tuneMaxPlans {
		p.cands = nil
		return
	}
	if !recording.TryRLock() {
		return
	}
	// Held until the scratch is freed: a recording cannot start in
	// between. The scratch is freed through the driver, not Device.Free,
	// which would take the read lock again (and wait behind a recording
	// that is waiting for this one: Go's RWMutex lets no new reader in
	// then, and that recording's products wait for b.mu).
	defer recording.RUnlock()
	cands := p.cands
	p.cands = nil
	b.tries++
	d := b.dev
	out, err := d.Alloc(scratchBytes(key))
	if err != nil {
		return
	}
	best, times := b.fastest(p, cands, A, B, out, alpha, beta)
	d.do(func() error {
		// Free out once the timing's products are done with it; a
		// context that cannot synchronise has failed, and its next call
		// says so.
		if err := d.drv.check(d.drv.ctxSynchronize(), "cuCtxSynchronize"); err != nil {
			return err
		}
		return d.drv.check(d.drv.memFree(out.Ptr), "cuMemFree")
	})
	if best < 0 {
		return
	}
	p.algo = cands[best]
	b.tuned++
	if t := b.tableLocked(); t != nil {
		e := tuneEntry{heuristicUS: 1000 * times[0], bestUS: 1000 * times[best], cands: len(cands)}
		copy(e.algo[:], p.algo[:algoBytes])
		e.split, e.id = b.algoConfig(&p.algo)
		t.algos[key] = e
		t.save() // a table that cannot be written costs a later run the timing, nothing else
	}
}

// algoConfig returns an algorithm's split of k and its number, 0 where
// cuBLASLt does not say.
func (b *Blas) algoConfig(algo *[heuristicResultBytes]byte) (split uint32, id int32) {
	if b.lt.configGet == nil {
		return 0, 0
	}
	var n uintptr
	if b.lt.configGet(unsafe.Pointer(&algo[0]), configSplitK, unsafe.Pointer(&split), 4, &n) != 0 {
		split = 0
	}
	if b.lt.configGet(unsafe.Pointer(&algo[0]), configID, unsafe.Pointer(&id), 4, &n) != 0 {
		id = 0
	}
	return split, id
}

// fastest returns the index of the candidate that ran p's product into
// out fastest (-1 if timing failed) and each candidate's milliseconds a
// product (+Inf for one that failed).
func (b *Blas) fastest(p *gemmPlan, cands [][heuristicResultBytes]byte, A, B, out Buffer, alpha, beta *float32) (int, []float64) {
	d := b.dev
	if d.do(func() error { return d.drv.check(d.drv.memsetD8(out.Ptr, 0, uint64(out.Size)), "cuMemsetD8") }) != nil {
		return -1, nil
	}
	t, err := d.NewTimer()
	if err != nil {
		return -1, nil
	}
	defer t.Close()
	run := func(algo *[heuristicResultBytes]byte) bool {
		var st int32
		d.do(func() error {
			st = b.lt.matmul(b.h, p.desc, unsafe.Pointer(alpha), A.Ptr, p.a, B.Ptr, p.b, unsafe.Pointer(beta),
				out.Ptr, p.c, out.Ptr, p.c, unsafe.Pointer(&algo[0]), b.ws.Ptr, uintptr(b.ws.Size), 0)
			return nil
		})
		return st == 0
	}
	best, times := -1, make([]float64, len(cands))
	for i := range cands {
		times[i] = math.Inf(1)
		run(&cands[i]) // the first run loads the algorithm's kernels
		// Doubling the runs until they take 0.1 ms of device time (one
		// run on the emulator, whose products take milliseconds), at
		// most 8.
		for reps := 1; reps <= 8; reps *= 2 {
			if t.Start() != nil {
				return -1, nil
			}
			ok := true
			for range reps {
				ok = ok && run(&cands[i])
			}
			ms, err := t.Stop()
			if err != nil {
				return -1, nil
			}
			if !ok { // a candidate that fails is not one
				break
			}
			if ms >= 0.1 || reps == 8 {
				times[i] = ms / float64(reps)
				if best < 0 || times[i] < times[best] {
					best = i
				}
				break
			}
		}
	}
	return best, times
}

// algoBytes is the size of cublasLtMatmulAlgo_t, which cuBLASLt documents
// as trivially serialisable for use with the same library version.
const algoBytes = 64

// tuneTable is KEEL_BLAS_TUNE's choices on disk: for each product shape
// timed on this card, driver and cuBLASLt, the fastest algorithm, with
// the heuristic's first algorithm's time and the best's (what a GPU
// session reads to see what tuning gained). A file a line a shape, ending
// with a checksum; it is written atomically, merged with what another
// handle or process wrote meanwhile. A damaged or foreign file counts as
// empty (its shapes are timed again and it is overwritten), as a damaged
// kernel cache entry is recompiled.
type tuneTable struct {
	path, header string
	algos        map[gemmKey]tuneEntry
	dropped      map[gemmKey]bool // entries the check refused: not merged back from the file
}

type tuneEntry struct {
	algo                [algoBytes]byte
	heuristicUS, bestUS float64
	cands               int
	split               uint32 // the algorithm's split of k (1: none; 0: not known)
	id                  int32  // cuBLASLt's number of the algorithm
}

const tuneMagic = "keel-blas-tune 1"

// tuneFileMu orders the writes of this process's handles (the trainer's
// and the rollout's devices) to one table.
var tuneFileMu sync.Mutex

// tableLocked returns the handle's table, loaded at first use; nil where
// there is no cache folder (tuning then lasts one process). b.mu is held.
func (b *Blas) tableLocked() *tuneTable {
	if b.table != nil || b.tableDir == "" {
		return b.table
	}
	d := b.dev
	header := fmt.Sprintf("%s on %s, cuBLASLt %s", tuneMagic, d, b.lt.VersionString())
	sum := sha256.Sum256([]byte(header))
	path := filepath.Join(b.tableDir, "blas-tune-"+hex.EncodeToString(sum[:8])+".txt")
	b.table = &tuneTable{path: path, header: header, algos: readTuneTable(path, header)}
	return b.table
}

// readTuneTable returns the entries of the table at path, none where it is
// missing, damaged or written for another header.
func readTuneTable(path, header string) map[gemmKey]tuneEntry {
	algos := map[gemmKey]tuneEntry{}
	data, err := os.ReadFile(path)
	if err != nil {
		return algos
	}
	parsed, err := parseTuneTable(data, header)
	if err != nil {
		return algos
	}
	return parsed
}

// parseTuneTable parses a table written for header.
func parseTuneTable(data []byte, header string) (map[gemmKey]tuneEntry, error) {
	i := bytes.LastIndex(data, []byte("\nsum "))
	if i < 0 {
		return nil, fmt.Errorf("no checksum")
	}
	body := data[:i+1]
	sum := sha256.Sum256(body)
	if strings.TrimSpace(string(data[i+5:])) != hex.EncodeToString(sum[:]) {
		return nil, fmt.Errorf("checksum mismatch")
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 4096), 1<<20)
	if !sc.Scan() || sc.Text() != header {
		return nil, fmt.Errorf("another card, driver or library")
	}
	algos := map[gemmKey]tuneEntry{}
	for line := 2; sc.Scan(); line++ {
		text := sc.Text()
		if strings.HasPrefix(text, "#") {
			continue
		}
		key, e, err := parseTuneLine(text)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		algos[key] = e
	}
	return algos, sc.Err()
}

// tuneColumns names a table line's fields.
const tuneColumns = "# transA transB m n k lda ldb ldc alignA alignB alignC alignAdd out16 fp8 algorithm heuristic_us best_us candidates splitK algo_id"

func formatTuneLine(k gemmKey, e tuneEntry) string {
	b := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	return fmt.Sprintf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %s %.3f %.3f %d %d %d",
		b(k.transA), b(k.transB), k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.alignA, k.alignB, k.alignC, k.alignAdd,
		b(k.out16), b(k.fp8), hex.EncodeToString(e.algo[:]), e.heuristicUS, e.bestUS, e.cands, e.split, e.id)
}

func parseTuneLine(text string) (gemmKey, tuneEntry, error) {
	var k gemmKey
	var e tuneEntry
	f := strings.Fields(text)
	if len(f) != 20 {
		return k, e, fmt.Errorf("%d fields, want 20", len(f))
	}
	ints := make([]int64, 14)
	for i := range ints {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || v < 0 || v > math.MaxInt32 {
			return k, e, fmt.Errorf("field %d: %q", i+1, f[i])
		}
		ints[i] = v
	}
	for _, i := range []int{0, 1, 12, 13} {
		if ints[i] > 1 {
			return k, e, fmt.Errorf("field %d: %d, want 0 or 1", i+1, ints[i])
		}
	}
	k = gemmKey{ints[0] == 1, ints[1] == 1, int(ints[2]), int(ints[3]), int(ints[4]), int(ints[5]), int(ints[6]), int(ints[7]),
		uint32(ints[8]), uint32(ints[9]), uint32(ints[10]), uint32(ints[11]), ints[12] == 1, ints[13] == 1}
	algo, err := hex.DecodeString(f[14])
	if err != nil || len(algo) != algoBytes {
		return k, e, fmt.Errorf("algorithm %q", f[14])
	}
	copy(e.algo[:], algo)
	if e.heuristicUS, err = strconv.ParseFloat(f[15], 64); err != nil {
		return k, e, fmt.Errorf("heuristic time %q", f[15])
	}
	if e.bestUS, err = strconv.ParseFloat(f[16], 64); err != nil {
		return k, e, fmt.Errorf("best time %q", f[16])
	}
	var c, s, id int64
	if c, err = strconv.ParseInt(f[17], 10, 32); err == nil {
		if s, err = strconv.ParseInt(f[18], 10, 32); err == nil {
			id, err = strconv.ParseInt(f[19], 10, 32)
		}
	}
	if err != nil {
		return k, e, fmt.Errorf("candidates, split or algorithm number: %v", err)
	}
	e.cands, e.split, e.id = int(c), uint32(s), int32(id)
	return k, e, nil
}

// save writes the table, merged with the file's entries for shapes it
// does not have.
func (t *tuneTable) save() error {
	tuneFileMu.Lock()
	defer tuneFileMu.Unlock()
	for k, e := range readTuneTable(t.path, t.header) {
		if _, ok := t.algos[k]; !ok && !t.dropped[k] {
			t.algos[k] = e
		}
	}
	lines := make([]string, 0, len(t.algos))
	for k, e := range t.algos {
		lines = append(lines, formatTuneLine(k, e))
	}
	slices.Sort(lines)
	if err := os.MkdirAll(filepath.Dir(t.path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(t.path, func(w io.Writer) error {
		var body bytes.Buffer
		fmt.Fprintln(&body, t.header)
		fmt.Fprintln(&body, tuneColumns)
		for _, l := range lines {
			fmt.Fprintln(&body, l)
		}
		sum := sha256.Sum256(body.Bytes())
		if _, err := w.Write(body.Bytes()); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "sum %s\n", hex.EncodeToString(sum[:]))
		return err
	})
}
