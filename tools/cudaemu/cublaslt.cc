// The emulator's cuBLASLt: the matmul keel asks for (kernels/cuda/
// cublaslt.go), D = alpha·op(A)·op(B) + beta·C over column-major layouts,
// bf16 A and B, float32 C and D (or bf16 C and D: the float32 result
// rounded to bf16), float32 compute and scale, computed in float64 and
// rounded once; or float8 e4m3 A and B, under the library's own rules for
// them: A transposed and B not ("TN"), leading dimensions of 16-byte
// multiples, 16-byte aligned operands, a device of sm_89 or later
// (KEEL_CUDA_EMU_ARCH). Everything else (other types, orders, epilogues,
// batched layouts) is refused with CUBLAS_STATUS_NOT_SUPPORTED and a
// message, so that keel cannot come to depend on something the emulator
// does not check. The shapes are checked as the library does: op(A) is
// m×k, op(B) k×n, C and D m×n, each leading dimension at least its rows,
// and every operand inside one device allocation.
//
// Its algorithms are configurable as the library's are (capabilities,
// configuration, cublasLtMatmulAlgoCheck): the second of the three splits
// k (CUBLASLT_ALGO_CONFIG_SPLITK_NUM) with a reduction in place or in the
// compute type, the latter's partial sums in the workspace, which
// cublasLtMatmul then requires. A split product rounds each part to
// float32 and adds the parts in order, so its bits differ from the
// unsplit product's, as a real split-K kernel's do.
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#define API extern "C" __attribute__((visibility("default")))

enum {
  SUCCESS = 0,
  NOT_INITIALIZED = 1,
  INVALID_VALUE = 7,
  EXECUTION_FAILED = 13,
  NOT_SUPPORTED = 15,
};
enum { R_32F = 0, R_16BF = 14, R_8F_E4M3 = 28, COMPUTE_32F = 68 };

namespace {

struct Desc {
  int compute, scale, transa = 0, transb = 0;
};
struct Layout {
  int type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Pref {
  uint64_t workspace = 0;
};

int refuse(const std::string& what) {
  fprintf(stderr, "keel CUDA emulator: cuBLASLt: %s\n", what.c_str());
  return NOT_SUPPORTED;
}

int invalid(const std::string& what) {
  fprintf(stderr, "keel CUDA emulator: cuBLASLt: %s\n", what.c_str());
  return INVALID_VALUE;
}

// in_allocation asks the emulator's driver whether an operand lies in one
// allocation.
bool in_allocation(const char* what, uint64_t p, const Layout* l) {
  typedef int (*check_fn)(const char*, uint64_t, uint64_t);
  static check_fn check = (check_fn)dlsym(RTLD_DEFAULT, "keel_emu_check_range");
  if (!check) {  // the emulator's driver is not loaded: the operands cannot be checked
    fprintf(stderr, "keel CUDA emulator: cuBLASLt without the emulator's driver\n");
    return false;
  }
  uint64_t elem = l->type == R_16BF ? 2 : l->type == R_8F_E4M3 ? 1 : 4;
  return check(what, p, ((l->cols - 1) * (uint64_t)l->ld + l->rows) * elem);
}

// shapes checks a product's descriptors and returns m, n, k.
int shapes(const Desc* d, const Layout* a, const Layout* b, const Layout* c, const Layout* dd, uint64_t* m, uint64_t* n,
           uint64_t* k) {
  if (!d || !a || !b || !c || !dd) return invalid("a null descriptor");
  if (d->compute != COMPUTE_32F || d->scale != R_32F)
    return refuse("compute type " + std::to_string(d->compute) + ", scale type " + std::to_string(d->scale) +
                  " (emulated: CUBLAS_COMPUTE_32F with CUDA_R_32F scale)");
  const bool fp8 = a->type == R_8F_E4M3 && b->type == R_8F_E4M3;
  if ((!fp8 && (a->type != R_16BF || b->type != R_16BF)) || (c->type != R_32F && c->type != R_16BF) ||
      dd->type != c->type)
    return refuse("types A " + std::to_string(a->type) + ", B " + std::to_string(b->type) + ", C " +
                  std::to_string(c->type) + ", D " + std::to_string(dd->type) +
                  " (emulated: bf16 or e4m3 for both A and B, and f32 or bf16 for both C and D)");
  if (fp8) {
    const char* arch = getenv("KEEL_CUDA_EMU_ARCH");
    if (arch && atoi(arch) < 89) return refuse("a float8 product on sm_" + std::string(arch) + " (from sm_89)");
    if (!d->transa || d->transb) return refuse("a float8 product not in the TN layout (A transposed, B not)");
    const int64_t cbytes = c->type == R_16BF ? 2 : 4;
    if (a->ld % 16 || b->ld % 16 || (c->ld * cbytes) % 16)
      return refuse("a float8 product with leading dimensions " + std::to_string(a->ld) + ", " +
                    std::to_string(b->ld) + " and " + std::to_string(c->ld) + " (16-byte multiples)");
  }
  if (c->rows != dd->rows || c->cols != dd->cols || c->ld != dd->ld) return refuse("C and D with different layouts");
  *m = dd->rows;
  *n = dd->cols;
  *k = d->transa ? a->rows : a->cols;
  const uint64_t am = d->transa ? a->cols : a->rows;
  const uint64_t bk = d->transb ? b->cols : b->rows, bn = d->transb ? b->rows : b->cols;
  if (am != *m || bk != *k || bn != *n)
    return invalid("op(A) is " + std::to_string(am) + "×" + std::to_string(*k) + ", op(B) " + std::to_string(bk) +
                   "×" + std::to_string(bn) + ", D " + std::to_string(*m) + "×" + std::to_string(*n));
  return SUCCESS;
}

// e4m3 widens a float8 e4m3 value: 4 exponent bits (bias 7), 3 mantissa
// bits, subnormals, S.1111.111 the NaN, no infinities.
float e4m3(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  float f;
  if (e == 15 && m == 7)
    f = NAN;
  else if (e == 0)
    f = ldexpf((float)m, -9);
  else
    f = ldexpf(1.f + m / 8.f, e - 7);
  return s ? -f : f;
}

float bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// to_bf16 rounds to nearest, ties to even (keel's f32_to_bf16); a NaN
// stays a NaN.
uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

}  // namespace

API size_t cublasLtGetVersion() { return 130000; }
API const char* cublasLtGetStatusString(int s) {
  switch (s) {
    case SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
API int cublasLtCreate(uintptr_t* h) {
  *h = 1;
  return SUCCESS;
}
API int cublasLtDestroy(uintptr_t h) { return h == 1 ? SUCCESS : NOT_INITIALIZED; }
API int cublasLtMatmulDescCreate(uintptr_t* d, int compute, int scale) {
  *d = (uintptr_t) new Desc{compute, scale};
  return SUCCESS;
}
API int cublasLtMatmulDescDestroy(uintptr_t d) {
  delete (Desc*)d;
  return SUCCESS;
}
API int cublasLtMatmulDescSetAttribute(uintptr_t d, int attr, const void* buf, size_t size) {
  Desc* desc = (Desc*)d;
  if (!desc || size != 4) return invalid("descriptor attribute of " + std::to_string(size) + " bytes");
  int32_t v;
  memcpy(&v, buf, 4);
  if (v != 0 && v != 1) return refuse("transpose operation " + std::to_string(v) + " (emulated: N and T)");
  switch (attr) {
    case 3: desc->transa = v; return SUCCESS;
    case 4: desc->transb = v; return SUCCESS;
  }
  return refuse("matmul descriptor attribute " + std::to_string(attr));
}
API int cublasLtMatrixLayoutCreate(uintptr_t* l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (rows == 0 || cols == 0 || ld < (int64_t)rows)
    return invalid("layout " + std::to_string(rows) + "×" + std::to_string(cols) + " with leading dimension " +
                   std::to_string(ld));
  *l = (uintptr_t) new Layout{type, rows, cols, ld};
  return SUCCESS;
}
API int cublasLtMatrixLayoutDestroy(uintptr_t l) {
  delete (Layout*)l;
  return SUCCESS;
}
API int cublasLtMatmulPreferenceCreate(uintptr_t* p) {
  *p = (uintptr_t) new Pref{};
  return SUCCESS;
}
API int cublasLtMatmulPreferenceDestroy(uintptr_t p) {
  delete (Pref*)p;
  return SUCCESS;
}
API int cublasLtMatmulPreferenceSetAttribute(uintptr_t p, int attr, const void* buf, size_t size) {
  Pref* pref = (Pref*)p;
  if (attr == 1 && size == 8) {
    memcpy(&pref->workspace, buf, 8);
    return SUCCESS;
  }
  if (attr >= 5 && attr <= 8 && size == 4) {  // minimum alignments of A, B, C, D
    uint32_t a;
    memcpy(&a, buf, 4);
    return a && !(a & (a - 1)) ? SUCCESS : invalid("alignment " + std::to_string(a));
  }
  return refuse("preference attribute " + std::to_string(attr) + " of " + std::to_string(size) + " bytes");
}

// A heuristic result is 96 bytes: the algorithm (64), the workspace it
// needs (8), its state (4), waves (4), reserved (16). The emulator offers
// up to three algorithms, "keel-emu" then their number: the first two
// compute the product alike, the third is refused by cublasLtMatmul (as a
// real candidate may be for operands it cannot take), so that keel's
// timing of the candidates runs here and must pass over one that fails.
API int cublasLtMatmulAlgoGetHeuristic(uintptr_t h, uintptr_t d, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t dd,
                                       uintptr_t pref, int requested, void* results, int* returned) {
  if (h != 1 || !pref || requested < 1) return invalid("heuristic arguments");
  uint64_t m, n, k;
  int s = shapes((Desc*)d, (Layout*)a, (Layout*)b, (Layout*)c, (Layout*)dd, &m, &n, &k);
  if (s != SUCCESS) return s;
  const int count = requested < 3 ? requested : 3;
  for (int i = 0; i < count; i++) {
    char* r = (char*)results + 96 * i;
    memset(r, 0, 96);
    memcpy(r, "keel-emu", 8);
    r[8] = (char)i;
  }
  *returned = count;
  return SUCCESS;
}

namespace {

// An algorithm is "keel-emu", its number (byte 8), its split of k (byte
// 9; 0 or 1: none) and its reduction scheme (byte 10).
enum { ALGO_ID = 8, ALGO_SPLIT = 9, ALGO_REDUCTION = 10 };
enum { REDUCE_NONE = 0, REDUCE_INPLACE = 1, REDUCE_COMPUTE = 2 };

bool emu_algo(const void* algo) { return algo && memcmp(algo, "keel-emu", 8) == 0; }

int split_of(const void* algo) {
  const int s = ((const uint8_t*)algo)[ALGO_SPLIT];
  return s < 1 ? 1 : s;
}

// algo_check validates an algorithm for a product of m×n×k with a D of
// elem-byte elements and returns the workspace it needs.
int algo_check(const void* algo, uint64_t m, uint64_t n, uint64_t k, size_t* workspace) {
  const int id = ((const uint8_t*)algo)[ALGO_ID];
  if (!emu_algo(algo) || id > 2) return invalid("an algorithm not from the heuristic");
  if (id == 2) return NOT_SUPPORTED;  // the candidate that fails
  const int split = split_of(algo), scheme = ((const uint8_t*)algo)[ALGO_REDUCTION];
  *workspace = 0;
  if (split == 1) return scheme == REDUCE_NONE ? SUCCESS : invalid("a reduction scheme without a split of k");
  if (id != 1) return invalid("a split of k on an algorithm that has none");
  if ((uint64_t)split > k)
    return invalid("k = " + std::to_string(k) + " split " + std::to_string(split) + " ways");
  if (scheme == REDUCE_COMPUTE)
    *workspace = m * n * 4 * (uint64_t)split;
  else if (scheme == REDUCE_INPLACE)
    *workspace = 4096;  // the counters that order the parts
  else
    return invalid("a split of k with reduction scheme " + std::to_string(scheme));
  return SUCCESS;
}

}  // namespace

// Capabilities: split-K (CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, 0) on the
// second algorithm only, and its reduction schemes (..._MASK, 1).
API int cublasLtMatmulAlgoCapGetAttribute(const void* algo, int attr, void* buf, size_t size, size_t* written) {
  if (!emu_algo(algo)) return invalid("an algorithm not from the heuristic");
  const bool second = ((const char*)algo)[ALGO_ID] == 1;
  int32_t v;
  switch (attr) {
    case 0: v = second; break;
    case 1: v = second ? REDUCE_INPLACE | REDUCE_COMPUTE : 0; break;
    default: return refuse("algorithm capability " + std::to_string(attr));
  }
  if (written) *written = 4;
  if (size < 4) return invalid("a capability of 4 bytes into " + std::to_string(size));
  memcpy(buf, &v, 4);
  return SUCCESS;
}

// Configuration: the algorithm's number (CUBLASLT_ALGO_CONFIG_ID, 0; read
// only), its split of k (2) and reduction scheme (3).
API int cublasLtMatmulAlgoConfigGetAttribute(const void* algo, int attr, void* buf, size_t size, size_t* written) {
  if (!emu_algo(algo)) return invalid("an algorithm not from the heuristic");
  int32_t v;
  switch (attr) {
    case 0: v = ((const char*)algo)[ALGO_ID]; break;
    case 2: v = split_of(algo); break;
    case 3: v = ((const uint8_t*)algo)[ALGO_REDUCTION]; break;
    default: return refuse("algorithm configuration " + std::to_string(attr));
  }
  if (written) *written = 4;
  if (size < 4) return invalid("a configuration of 4 bytes into " + std::to_string(size));
  memcpy(buf, &v, 4);
  return SUCCESS;
}

API int cublasLtMatmulAlgoConfigSetAttribute(void* algo, int attr, const void* buf, size_t size) {
  if (!emu_algo(algo)) return invalid("an algorithm not from the heuristic");
  if (size != 4) return invalid("a configuration of " + std::to_string(size) + " bytes");
  uint32_t v;
  memcpy(&v, buf, 4);
  switch (attr) {
    case 2:
      if (v < 1 || v > 255) return invalid("a split of k " + std::to_string(v) + " ways");
      ((uint8_t*)algo)[ALGO_SPLIT] = (uint8_t)v;
      return SUCCESS;
    case 3:
      if (v != REDUCE_NONE && v != REDUCE_INPLACE && v != REDUCE_COMPUTE)
        return refuse("reduction scheme " + std::to_string(v));
      ((uint8_t*)algo)[ALGO_REDUCTION] = (uint8_t)v;
      return SUCCESS;
  }
  return refuse("algorithm configuration " + std::to_string(attr));
}

// cublasLtMatmulAlgoCheck says whether an algorithm runs a product and
// the workspace it needs, in a heuristic result.
API int cublasLtMatmulAlgoCheck(uintptr_t h, uintptr_t d, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t dd,
                                const void* algo, void* result) {
  if (h != 1 || !result) return invalid("check arguments");
  uint64_t m, n, k;
  int s = shapes((Desc*)d, (Layout*)a, (Layout*)b, (Layout*)c, (Layout*)dd, &m, &n, &k);
  if (s != SUCCESS) return s;
  size_t ws;
  if ((s = algo_check(algo, m, n, k, &ws)) != SUCCESS) return s;
  char r[96];
  memset(r, 0, 96);
  memcpy(r, algo, 64);
  memcpy(r + 64, &ws, 8);
  const float waves = 1;
  memcpy(r + 76, &waves, 4);
  memcpy(result, r, 96);
  return SUCCESS;
}

namespace {

// Product is one cublasLtMatmul's arguments, copied: a product recorded
// into a graph runs after its descriptors may have been destroyed.
struct Product {
  Desc desc;
  Layout la, lb, lc;
  float alpha, beta;
  uint64_t A, B, C, D;
  int split;
};

int run(const Product& p);

// run_recorded is a recorded product's graph node (keel_emu_capture_node).
int run_recorded(void* ctx) { return run(*(const Product*)ctx) == SUCCESS ? 0 : -1; }
void free_recorded(void* ctx) { delete (Product*)ctx; }

}  // namespace

// cublasLtMatmul computes the product now, or, on a stream that is
// recording a graph (the emulator's driver says which), records it into
// the graph with its arguments' values.
API int cublasLtMatmul(uintptr_t h, uintptr_t d, const float* alpha, uint64_t A, uintptr_t ad, uint64_t B, uintptr_t bd,
                       const float* beta, uint64_t C, uintptr_t cd, uint64_t D, uintptr_t dd, const void* algo,
                       uint64_t ws, size_t ws_size, uintptr_t stream) {
  if (h != 1) return invalid("handle");
  uint64_t m, n, k;
  const Desc* desc = (const Desc*)d;
  const Layout *la = (const Layout*)ad, *lb = (const Layout*)bd, *lc = (const Layout*)cd;
  int s = shapes(desc, la, lb, lc, (const Layout*)dd, &m, &n, &k);
  if (s != SUCCESS) return s;
  size_t need;
  if ((s = algo_check(algo, m, n, k, &need)) != SUCCESS) return s;
  if (ws_size < need)
    return invalid("a workspace of " + std::to_string(ws_size) + " bytes, the algorithm needs " + std::to_string(need));
  if (need && !ws) return invalid("no workspace");
  Product p{*desc, *la, *lb, *lc, *alpha, *beta, A, B, C, D, split_of(algo)};
  if (stream) {
    typedef int (*node_fn)(uintptr_t, int (*)(void*), void*, void (*)(void*));
    static node_fn node = (node_fn)dlsym(RTLD_DEFAULT, "keel_emu_capture_node");
    if (!node) return invalid("a stream without the emulator's driver");
    Product* c = new Product(p);
    int r = node(stream, run_recorded, c, free_recorded);
    if (r < 0) {
      delete c;
      return invalid("an unknown stream");
    }
    if (r == 1) return SUCCESS;  // recorded
    delete c;
  }
  return run(p);
}

namespace {

// run checks a product's operands against the device's allocations and
// computes it.
int run(const Product& pr) {
  const Desc* desc = &pr.desc;
  const Layout *la = &pr.la, *lb = &pr.lb, *lc = &pr.lc;
  const uint64_t m = lc->rows, n = lc->cols, k = desc->transa ? la->rows : la->cols;
  const uint64_t A = pr.A, B = pr.B, C = pr.C, D = pr.D;
  if (!in_allocation("cuBLASLt A", A, la) || !in_allocation("cuBLASLt B", B, lb) ||
      !in_allocation("cuBLASLt C", C, lc) || !in_allocation("cuBLASLt D", D, lc))
    return invalid("an operand outside the device's allocations");
  if (la->type == R_8F_E4M3 && ((A | B | C | D) & 15))
    return refuse("a float8 product's operand not 16-byte aligned");
  // elem widens operand x's element i.
  auto elem = [](const Layout* l, uint64_t x, uint64_t i) {
    return l->type == R_8F_E4M3 ? e4m3(((const uint8_t*)x)[i]) : bf16(((const uint16_t*)x)[i]);
  };
  const bool c16 = lc->type == R_16BF;  // C and D bf16: D the float32 result rounded once
  const float* cm = (const float*)C;
  float* dm = (float*)D;
  // Rows of op(A) and columns of op(B), widened once, each contiguous in k.
  std::vector<float> ar(m * k), bc(n * k);
  for (uint64_t i = 0; i < m; i++)
    for (uint64_t p = 0; p < k; p++) ar[i * k + p] = elem(la, A, desc->transa ? p + i * la->ld : i + p * la->ld);
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t p = 0; p < k; p++) bc[j * k + p] = elem(lb, B, desc->transb ? j + p * lb->ld : p + j * lb->ld);
  const double al = pr.alpha, be = pr.beta;
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t i = 0; i < m; i++) {
      const float* x = &ar[i * k];
      const float* y = &bc[j * k];
      double acc = 0;
      if (pr.split > 1) {  // each part rounded to float32, the parts added in order
        float sum = 0;
        for (int part = 0; part < pr.split; part++) {
          double a = 0;
          for (uint64_t p = k * part / pr.split; p < k * (part + 1) / pr.split; p++) a += (double)x[p] * y[p];
          sum += (float)a;
        }
        acc = sum;
      } else {
        for (uint64_t p = 0; p < k; p++) acc += (double)x[p] * y[p];
      }
      double v = al * acc;
      const uint64_t at = i + j * lc->ld;
      if (be != 0) v += be * (c16 ? bf16(((const uint16_t*)C)[at]) : cm[at]);
      if (c16)
        ((uint16_t*)D)[at] = to_bf16((float)v);
      else
        dm[at] = (float)v;
    }
  return SUCCESS;
}

}  // namespace

// keel_cuda_emulator marks the library as the emulator's (kernels/cuda reads it).
API const int keel_cuda_emulator = 1;
