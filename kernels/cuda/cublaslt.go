package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// CublasLt is NVIDIA's matrix-product library, loaded from a shared
// library: the bf16 mode's products (bf16 inputs, float32 accumulation and
// output) go through it, everything else through keel's own kernels.
type CublasLt struct {
	// Path is the file (or soname) that was loaded.
	Path string
	// Version is cublasLtGetVersion's: major*10000 + minor*100 + patch.
	Version int

	getVersion    func() uintptr
	create        func(h *uintptr) int32
	destroy       func(h uintptr) int32
	descCreate    func(d *uintptr, compute int32, scale int32) int32
	descDestroy   func(d uintptr) int32
	descSetAttr   func(d uintptr, attr int32, buf unsafe.Pointer, size uintptr) int32
	layoutCreate  func(l *uintptr, typ int32, rows, cols uint64, ld int64) int32
	layoutDestroy func(l uintptr) int32
	prefCreate    func(p *uintptr) int32
	prefDestroy   func(p uintptr) int32
	prefSetAttr   func(p uintptr, attr int32, buf unsafe.Pointer, size uintptr) int32
	heuristic     func(h, desc, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) int32
	matmul        func(h, desc uintptr, alpha unsafe.Pointer, a uint64, adesc uintptr, b uint64, bdesc uintptr, beta unsafe.Pointer, c uint64, cdesc uintptr, d uint64, ddesc uintptr, algo unsafe.Pointer, ws uint64, wsSize uintptr, stream uintptr) int32
	statusString  func(s int32) string

	// An algorithm's capabilities and configuration, and the check of a
	// configured one (KEEL_BLAS_TUNE's splits of k and its table on
	// disk); nil where the library lacks them.
	capGet    func(algo unsafe.Pointer, attr int32, buf unsafe.Pointer, size uintptr, written *uintptr) int32
	configGet func(algo unsafe.Pointer, attr int32, buf unsafe.Pointer, size uintptr, written *uintptr) int32
	configSet func(algo unsafe.Pointer, attr int32, buf unsafe.Pointer, size uintptr) int32
	algoCheck func(h, desc, a, b, c, d uintptr, algo, result unsafe.Pointer) int32
}

var (
	cublasOnce sync.Once
	cublasLib  *CublasLt
	cublasErr  error
)

// LoadCublasLt loads cuBLASLt once per process (searched for as NVRTC
// is). It needs no GPU to load.
func LoadCublasLt() (*CublasLt, error) {
	cublasOnce.Do(func() { cublasLib, cublasErr = loadCublasLt(searchDirs(os.Getenv)) })
	return cublasLib, cublasErr
}

func loadCublasLt(dirs []string) (*CublasLt, error) {
	h, path, err := load(libCublasLt, dirs)
	if err != nil {
		return nil, err
	}
	c := &CublasLt{Path: path}
	for _, s := range []struct {
		fn   any
		name string
	}{
		{&c.getVersion, "cublasLtGetVersion"},
		{&c.create, "cublasLtCreate"},
		{&c.destroy, "cublasLtDestroy"},
		{&c.descCreate, "cublasLtMatmulDescCreate"},
		{&c.descDestroy, "cublasLtMatmulDescDestroy"},
		{&c.descSetAttr, "cublasLtMatmulDescSetAttribute"},
		{&c.layoutCreate, "cublasLtMatrixLayoutCreate"},
		{&c.layoutDestroy, "cublasLtMatrixLayoutDestroy"},
		{&c.prefCreate, "cublasLtMatmulPreferenceCreate"},
		{&c.prefDestroy, "cublasLtMatmulPreferenceDestroy"},
		{&c.prefSetAttr, "cublasLtMatmulPreferenceSetAttribute"},
		{&c.heuristic, "cublasLtMatmulAlgoGetHeuristic"},
		{&c.matmul, "cublasLtMatmul"},
	} {
		if err := register(s.fn, h, s.name); err != nil {
			return nil, fmt.Errorf("cuda: %s: %w", path, err)
		}
	}
	// Configurable algorithms (CUDA 10.1 and later): all four or none.
	if register(&c.capGet, h, "cublasLtMatmulAlgoCapGetAttribute") != nil ||
		register(&c.configGet, h, "cublasLtMatmulAlgoConfigGetAttribute") != nil ||
		register(&c.configSet, h, "cublasLtMatmulAlgoConfigSetAttribute") != nil ||
		register(&c.algoCheck, h, "cublasLtMatmulAlgoCheck") != nil {
		c.capGet, c.configGet, c.configSet, c.algoCheck = nil, nil, nil, nil
	}
	// The status's text (CUDA 11.4 and later); a number otherwise.
	if register(&c.statusString, h, "cublasLtGetStatusString") != nil {
		c.statusString = func(s int32) string { return fmt.Sprintf("status %d", s) }
	}
	c.Version = int(c.getVersion())
	return c, nil
}

// VersionString is the version as "major.minor.patch".
func (c *CublasLt) VersionString() string {
	return fmt.Sprintf("%d.%d.%d", c.Version/10000, c.Version/100%100, c.Version%100)
}

// cuBLAS and CUDA enumerations keel uses.
const (
	blasComputeF32   = 68 // CUBLAS_COMPUTE_32F
	dataF32          = 0  // CUDA_R_32F
	dataBF16         = 14 // CUDA_R_16BF
	dataE4M3         = 28 // CUDA_R_8F_E4M3
	blasNotSupported = 15 // CUBLAS_STATUS_NOT_SUPPORTED
	descTransA       = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	descTransB       = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	prefMaxWorkspace = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	prefMinAlignA    = 5  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES (B, C, D follow)
	// heuristicResultBytes is sizeof(cublasLtMatmulHeuristicResult_t):
	// the algorithm (8 uint64), workspaceSize, state, wavesCount, 4 ints.
	heuristicResultBytes = 64 + 8 + 4 + 4 + 16
)

// BlasWorkspaceBytes is the workspace each device's cuBLASLt handle gets.
const BlasWorkspaceBytes = 32 << 20

// Blas is one device's cuBLASLt handle, workspace and plans (a descriptor
// set and an algorithm per product shape). Safe for concurrent use.
type Blas struct {
	lt  *CublasLt
	dev *Device
	h   uintptr
	ws  Buffer

	mu     sync.Mutex // held from finding a plan until its product is issued
	plans  map[gemmKey]*gemmPlan
	calls  int64      // products issued (under mu): what the tests count
	tune   bool       // time the candidate algorithms (KEEL_BLAS_TUNE=1)
	tuned  int64      // plans whose candidates were timed (under mu)
	tries  int64      // timings begun, which tuneMaxPlans bounds (under mu)
	loaded int64      // plans whose algorithm came from the table on disk (under mu)
	table  *tuneTable // the tuned algorithms on disk, read at the first tuned plan (under mu)
	// tableDir is the table's folder: the kernel cache's ("" for none).
	tableDir string
}

type gemmKey struct {
	transA, transB bool
	m, n, k        int
	lda, ldb, ldc  int
	// The operands' alignments in bytes (at most 256): an algorithm
	// chosen for aligned pointers may not run on others, so they are part
	// of the plan.
	alignA, alignB, alignC uint32
	alignAdd               uint32 // the addend's, where it is not C (gemmBF16's add)
	out16                  bool   // C (and D) bf16, not float32
	fp8                    bool   // A and B float8 e4m3, not bf16 (GemmFP8)
}

// maxPlans bounds the cached plans: an MoE step's experts see many token
// counts, each a shape of its own.
const maxPlans = 4096

// alignment is the largest power of two up to 256 dividing p.
func alignment(p uint64) uint32 {
	a := uint32(1)
	for a < 256 && p%uint64(2*a) == 0 {
		a *= 2
	}
	return a
}

type gemmPlan struct {
	desc, a, b, c uintptr
	algo          [heuristicResultBytes]byte   // the algorithm the products run
	cands         [][heuristicResultBytes]byte // the candidates, until timed (tuneLocked)
}

// Products returns how many products b has issued: what a step's launch
// count is checked by.
func (b *Blas) Products() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

// Blas returns the device's cuBLASLt handle, made at first use.
func (d *Device) Blas() (*Blas, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.blas != nil {
		return d.blas, nil
	}
	lt, err := LoadCublasLt()
	if err != nil {
		return nil, err
	}
	b := &Blas{lt: lt, dev: d, plans: map[gemmKey]*gemmPlan{}, tune: os.Getenv("KEEL_BLAS_TUNE") == "1"}
	if d.cache != nil {
		b.tableDir = d.cache.Dir
	}
	if b.ws, err = d.Alloc(BlasWorkspaceBytes); err != nil {
		return nil, err
	}
	if err := d.do(func() error { return b.check(lt.create(&b.h), "cublasLtCreate") }); err != nil {
		d.Free(b.ws)
		return nil, err
	}
	d.blas = b
	return b, nil
}

func (b *Blas) check(s int32, what string) error {
	if s == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s: cuBLASLt status %d (%s)", what, s, b.lt.statusString(s))
}

// close releases the handle and the plans (Device.Close calls it).
func (b *Blas) close() {
	b.closePlans()
	b.lt.destroy(b.h)
}

// closePlans destroys every cached plan's descriptors.
func (b *Blas) closePlans() {
	for k, p := range b.plans {
		b.lt.layoutDestroy(p.a)
		b.lt.layoutDestroy(p.b)
		b.lt.layoutDestroy(p.c)
		b.lt.descDestroy(p.desc)
		delete(b.plans, k)
	}
}

// GemmBF16 computes, in cuBLAS's column-major terms,
// C[m×n] = op(A)·op(B) + (acc ? C : 0), A and B bf16, C float32, with
// float32 accumulation: op(A) is A (k columns of m, ld lda) or its
// transpose (transA), likewise B. On the default stream, without waiting
// (but for a new shape's timing, with KEEL_BLAS_TUNE=1).
func (b *Blas) GemmBF16(transA, transB bool, m, n, k int, A Buffer, lda int, B Buffer, ldb int, C Buffer, ldc int, acc bool) error {
	return b.gemm(0, b.ws, transA, transB, m, n, k, A, lda, B, ldb, C, ldc, acc, Buffer{}, false, false)
}

// ErrNoFP8 says cuBLASLt has no float8 product for a shape on this device
// (a card before sm_89, a leading dimension not a multiple of 16, a
// cuBLASLt without float8): the caller emulates it (QuantLinear).
var ErrNoFP8 = errors.New("cuda: cuBLASLt runs no float8 product here")

// GemmFP8 computes, in cuBLAS's column-major terms, C[m×n] = Aᵀ·B with A
// (k×m, ld lda) and B (k×n, ld ldb) float8 e4m3 and C float32, with
// float32 accumulation (cuBLASLt's default, not its fast accumulation),
// unit scales: the tensor cores' float8 product, which takes only this
// "TN" layout. An error wrapping ErrNoFP8 says the device or library has
// none for the shape. On the default stream, without waiting (but for a
// new shape's timing, with KEEL_BLAS_TUNE=1).
func (b *Blas) GemmFP8(m, n, k int, A Buffer, lda int, B Buffer, ldb int, C Buffer, ldc int) error {
	return b.gemm(0, b.ws, true, false, m, n, k, A, lda, B, ldb, C, ldc, false, Buffer{}, false, true)
}

// gemm is GemmBF16 (or with fp8 GemmFP8) on stream (0: the default
// stream) with the workspace ws: work on a stream of its own
// (Ops.Capture's) may run beside the default stream's, so it must not
// share the handle's. With an addend (add.Ptr != 0, acc false) it computes
// C = op(A)·op(B) + add, add laid out as C: a residual added in the
// product's epilogue. With out16, C is bf16: the float32 sums rounded once
// as they are stored (no addend, no accumulation).
func (b *Blas) gemm(stream uintptr, ws Buffer, transA, transB bool, m, n, k int, A Buffer, lda int, B Buffer, ldb int, C Buffer, ldc int, acc bool, add Buffer, out16, fp8 bool) error {
	if m <= 0 || n <= 0 || k <= 0 {
		return nil
	}
	if fp8 && (!transA || transB || acc || add.Ptr != 0 || out16) {
		return fmt.Errorf("cuda: a float8 product is Aᵀ·B into float32, nothing added")
	}
	if fp8 && b.dev.Arch < 89 {
		return fmt.Errorf("%w: sm_%d (float8 tensor cores from sm_89)", ErrNoFP8, b.dev.Arch)
	}
	if out16 && (acc || add.Ptr != 0) {
		return fmt.Errorf("cuda: a bf16 product with a bf16 output accumulates nothing")
	}
	in := C // cuBLASLt's C, the addend; C here is its D
	if add.Ptr != 0 {
		if acc {
			return fmt.Errorf("cuda: a bf16 product both accumulating and with an addend")
		}
		in, acc = add, true
	}
	key := gemmKey{transA, transB, m, n, k, lda, ldb, ldc, alignment(A.Ptr), alignment(B.Ptr), alignment(C.Ptr), alignment(in.Ptr), out16, fp8}
	alpha, beta := new(float32), new(float32)
	*alpha = 1
	if acc {
		*beta = 1
	}
	// The plan is found and used under b.mu: another goroutine's product
	// (the trainer's beside an async rollout's) may otherwise evict and
	// destroy it in between (closePlans).
	matmul := func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		p, err := b.planLocked(key)
		if err != nil {
			return err
		}
		if p.cands != nil && stream == 0 {
			b.tuneLocked(key, p, A, B, alpha, beta)
		}
		b.calls++
		st := b.lt.matmul(b.h, p.desc, unsafe.Pointer(alpha), A.Ptr, p.a, B.Ptr, p.b, unsafe.Pointer(beta),
			in.Ptr, p.c, C.Ptr, p.c, unsafe.Pointer(&p.algo[0]), ws.Ptr, uintptr(ws.Size), stream)
		err = b.check(st, fmt.Sprintf("cublasLtMatmul(%d×%d×%d)", m, n, k))
		if fp8 && st == blasNotSupported {
			return fmt.Errorf("%w: %v", ErrNoFP8, err)
		}
		return err
	}
	err := b.dev.do(func() error {
		if b.dev.prof != nil && stream == 0 {
			kind := "bf16"
			if fp8 {
				kind = "fp8"
			}
			return b.dev.prof.time(b.dev, fmt.Sprintf("cublasLt %s %d×%d×%d %s%s align %d/%d/%d", kind, m, n, k,
				opName(transA), opName(transB), alignment(A.Ptr), alignment(B.Ptr), alignment(C.Ptr)), matmul)
		}
		return matmul()
	})
	runtime.KeepAlive(alpha)
	runtime.KeepAlive(beta)
	return err
}

// opName is "T" for a transposed operand, "N" otherwise (cuBLAS's names).
func opName(t bool) string {
	if t {
		return "T"
	}
	return "N"
}

// planLocked returns (making once) the descriptors and algorithm of a
// shape; b.mu is held.
func (b *Blas) planLocked(key gemmKey) (*gemmPlan, error) {
	if p, ok := b.plans[key]; ok {
		return p, nil
	}
	if len(b.plans) >= maxPlans {
		b.dev.do(func() error {
			b.closePlans()
			return nil
		})
	}
	p := &gemmPlan{}
	lt := b.lt
	op := func(t bool) int32 {
		if t {
			return 1 // CUBLAS_OP_T
		}
		return 0
	}
	dims := func(t bool, rows, cols int) (uint64, uint64) {
		if t {
			return uint64(cols), uint64(rows)
		}
		return uint64(rows), uint64(cols)
	}
	err := b.dev.do(func() error {
		if err := b.check(lt.descCreate(&p.desc, blasComputeF32, dataF32), "cublasLtMatmulDescCreate"); err != nil {
			return err
		}
		ta, tb := op(key.transA), op(key.transB)
		if err := b.check(lt.descSetAttr(p.desc, descTransA, unsafe.Pointer(&ta), 4), "set TRANSA"); err != nil {
			return err
		}
		if err := b.check(lt.descSetAttr(p.desc, descTransB, unsafe.Pointer(&tb), 4), "set TRANSB"); err != nil {
			return err
		}
		ar, ac := dims(key.transA, key.m, key.k)
		br, bc := dims(key.transB, key.k, key.n)
		ab := int32(dataBF16)
		if key.fp8 {
			ab = dataE4M3
		}
		if err := b.check(lt.layoutCreate(&p.a, ab, ar, ac, int64(key.lda)), "layout A"); err != nil {
			return err
		}
		if err := b.check(lt.layoutCreate(&p.b, ab, br, bc, int64(key.ldb)), "layout B"); err != nil {
			return err
		}
		ct := int32(dataF32)
		if key.out16 {
			ct = dataBF16
		}
		if err := b.check(lt.layoutCreate(&p.c, ct, uint64(key.m), uint64(key.n), int64(key.ldc)), "layout C"); err != nil {
			return err
		}
		var pref uintptr
		if err := b.check(lt.prefCreate(&pref), "cublasLtMatmulPreferenceCreate"); err != nil {
			return err
		}
		defer lt.prefDestroy(pref)
		ws := uint64(b.ws.Size)
		if err := b.check(lt.prefSetAttr(pref, prefMaxWorkspace, unsafe.Pointer(&ws), 8), "set workspace"); err != nil {
			return err
		}
		for i, a := range []uint32{key.alignA, key.alignB, key.alignAdd, key.alignC} {
			if err := b.check(lt.prefSetAttr(pref, prefMinAlignA+int32(i), unsafe.Pointer(&a), 4), "set alignment"); err != nil {
				return err
			}
		}
		want := int32(1)
		tune := b.tune && tunable(key)
		if tune && b.tries < tuneMaxPlans {
			want = tuneAlgos
		}
		res := make([][heuristicResultBytes]byte, want)
		var n int32
		if err := b.check(lt.heuristic(b.h, p.desc, p.a, p.b, p.c, p.c, pref, want, unsafe.Pointer(&res[0][0]), &n), "cublasLtMatmulAlgoGetHeuristic"); err != nil {
			return err
		}
		if n < 1 {
			return fmt.Errorf("cuda: cuBLASLt has no algorithm for a %d×%d×%d product", key.m, key.n, key.k)
		}
		p.algo = res[0]
		if tune {
			p.cands = b.candidatesLocked(key, p, res[:n])
		}
		return nil
	})
	if err != nil {
		for _, d := range []uintptr{p.a, p.b, p.c} {
			if d != 0 {
				lt.layoutDestroy(d)
			}
		}
		if p.desc != 0 {
			lt.descDestroy(p.desc)
		}
		if key.fp8 {
			return nil, fmt.Errorf("%w: %v", ErrNoFP8, err)
		}
		return nil, err
	}
	b.plans[key] = p
	return p, nil
}
