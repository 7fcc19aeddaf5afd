// The emulator's own tests: what it must compute, and what it must refuse.
// Each case builds a small kernel through the emulator's NVRTC, loads it
// through its driver and checks the result or the failure; the last
// checks that a write out of bounds stops the process. Built and run by
// test.sh before keel's device tests: selftest LIBDIR.
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

static int failures = 0;
#define CHECK(cond, ...)                   \
  do {                                     \
    if (!(cond)) {                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);        \
      fprintf(stderr, "\n");               \
      failures++;                          \
    }                                      \
  } while (0)

template <typename F>
static F sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) {
    fprintf(stderr, "missing %s\n", name);
    exit(2);
  }
  return (F)p;
}

static void* cuda;
static void* nvrtc;
static void* blas;

static int (*cuInit)(unsigned);
static int (*cuMemAlloc)(uint64_t*, size_t);
static int (*cuMemFree)(uint64_t);
static int (*cuHtoD)(uint64_t, const void*, size_t);
static int (*cuDtoH)(void*, uint64_t, size_t);
static int (*cuModuleLoadData)(uintptr_t*, const void*);
static int (*cuModuleGetFunction)(uintptr_t*, uintptr_t, const char*);
static int (*cuLaunchKernel)(uintptr_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, uintptr_t,
                             void**, void**);
static int (*cuFuncSetAttribute)(uintptr_t, int, int);

static const char* kPrelude = "typedef unsigned int u32;\n";

// module compiles src with the emulator's NVRTC and loads it.
static uintptr_t module(const std::string& src) {
  auto create = sym<int (*)(uintptr_t*, const char*, const char*, int, const char* const*, const char* const*)>(
      nvrtc, "nvrtcCreateProgram");
  auto compile = sym<int (*)(uintptr_t, int, const char* const*)>(nvrtc, "nvrtcCompileProgram");
  auto size = sym<int (*)(uintptr_t, size_t*)>(nvrtc, "nvrtcGetCUBINSize");
  auto get = sym<int (*)(uintptr_t, char*)>(nvrtc, "nvrtcGetCUBIN");
  auto logsize = sym<int (*)(uintptr_t, size_t*)>(nvrtc, "nvrtcGetProgramLogSize");
  auto getlog = sym<int (*)(uintptr_t, char*)>(nvrtc, "nvrtcGetProgramLog");
  uintptr_t prog;
  std::string full = std::string(kPrelude) + src;
  create(&prog, full.c_str(), "selftest.cu", 0, nullptr, nullptr);
  const char* opts[] = {"--gpu-architecture=sm_90", "-std=c++17", "--fmad=false"};
  if (compile(prog, 3, opts) != 0) {
    size_t n;
    logsize(prog, &n);
    std::string log(n, 0);
    getlog(prog, &log[0]);
    fprintf(stderr, "compile failed:\n%s\n", log.c_str());
    exit(2);
  }
  size_t n;
  size(prog, &n);
  std::vector<char> img(n);
  get(prog, img.data());
  uintptr_t mod;
  if (cuModuleLoadData(&mod, img.data()) != 0) exit(2);
  return mod;
}

static uintptr_t function(uintptr_t mod, const char* name) {
  uintptr_t f;
  if (cuModuleGetFunction(&f, mod, name) != 0) {
    fprintf(stderr, "no kernel %s\n", name);
    exit(2);
  }
  return f;
}

static uint64_t alloc(size_t bytes) {
  uint64_t p;
  if (cuMemAlloc(&p, bytes) != 0) exit(2);
  return p;
}

static int launch(uintptr_t f, unsigned grid, unsigned block, std::vector<void*> args) {
  return cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, 0, args.data(), nullptr);
}

static const char* kKernels = R"(
// Each block sums its 256 values: warp butterflies, then warp 0 sums the
// warp sums from shared memory.
extern "C" __global__ void __launch_bounds__(256) block_sums(float* out, const float* in) {
  __shared__ float s[8];
  float v = in[blockIdx.x * 256 + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < 8 ? s[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}

// Lane 0 waits at __syncthreads while the others shuffle: undefined.
extern "C" __global__ void divergent(float* out) {
  float v = threadIdx.x;
  if (threadIdx.x == 0) __syncthreads();
  else v += __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

// The upper half of the warp exits before the shuffle: undefined.
extern "C" __global__ void exited(float* out) {
  if (threadIdx.x >= 16) return;
  float v = threadIdx.x;
  v += __shfl_xor_sync(0xffffffffu, v, 16);
  out[threadIdx.x] = v;
}

// Half the warp at __syncwarp, half at a shuffle: not lock step.
extern "C" __global__ void mixed(float* out) {
  float v = threadIdx.x;
  if (threadIdx.x < 16) __syncwarp();
  else v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

// A shuffle over half the warp: legal CUDA the emulator does not model.
extern "C" __global__ void half(float* out) {
  float v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffu, v, 1);
  out[threadIdx.x] = v;
}

// xor 8 within groups of 4 lanes: CUDA lets a lane read an earlier group
// and gives it its own value for a later one.
extern "C" __global__ void narrow(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 8, 4) + 100.f * __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1, 4);
}

// Warp 1 writes shared memory that warp 0 reads, with no barrier between.
extern "C" __global__ void racy(u32* out) {
  __shared__ u32 s;
  if (threadIdx.x == 32) s = 7;
  if (threadIdx.x == 0) *out = s;
}

// Writes one element past n.
extern "C" __global__ void overrun(float* out, int n) {
  if (threadIdx.x <= n) out[threadIdx.x] = 1.f;
}

// Reverses the block's values through n floats of dynamic shared memory
// (the launch's bytes), poisoned before each block: out gets the poison
// where a thread reads past what the block wrote.
extern "C" __global__ void dyn_reverse(float* out, const float* in, int n) {
  float* s = (float*)keel_emu::dyn_shared;
  if (threadIdx.x < n) s[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}
)";

static void test_dynamic_shared(uintptr_t mod) {
  const int blocks = 2, threads = 64;
  std::vector<float> in(blocks * threads), out(blocks * threads);
  for (size_t i = 0; i < in.size(); i++) in[i] = (float)i;
  uint64_t din = alloc(in.size() * 4), dout = alloc(out.size() * 4);
  cuHtoD(din, in.data(), in.size() * 4);
  uintptr_t f = function(mod, "dyn_reverse");
  int n = threads;
  std::vector<void*> args = {&dout, &din, &n};
  CHECK(cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, threads * 4, 0, args.data(), nullptr) == 0, "dyn_reverse failed");
  cuDtoH(out.data(), dout, out.size() * 4);
  for (int b = 0; b < blocks; b++)
    for (int i = 0; i < threads; i++)
      CHECK(out[b * threads + i] == in[b * threads + threads - 1 - i], "dynamic shared memory: block %d thread %d got %g",
            b, i, out[b * threads + i]);
  // The second block's first half reads the poison the first left none of.
  n = threads / 2;
  CHECK(cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, threads * 4, 0, args.data(), nullptr) == 0, "dyn_reverse failed");
  cuDtoH(out.data(), dout, out.size() * 4);
  CHECK(isnan(out[threads]), "dynamic shared memory not poisoned before a block: %g", out[threads]);
  // Above 48 KiB only after cuFuncSetAttribute, as on a GPU.
  CHECK(cuLaunchKernel(f, 1, 1, 1, threads, 1, 1, 64 << 10, 0, args.data(), nullptr) != 0,
        "64 KiB of dynamic shared memory without cuFuncSetAttribute launched");
  CHECK(cuFuncSetAttribute(f, 8, 64 << 10) == 0, "cuFuncSetAttribute(64 KiB) failed");
  CHECK(cuLaunchKernel(f, 1, 1, 1, threads, 1, 1, 64 << 10, 0, args.data(), nullptr) == 0,
        "64 KiB of dynamic shared memory after cuFuncSetAttribute failed");
  cuMemFree(din);
  cuMemFree(dout);
}

static void test_block_sums(uintptr_t mod) {
  const int blocks = 3;
  std::vector<float> in(blocks * 256), out(blocks);
  for (size_t i = 0; i < in.size(); i++) in[i] = (float)(i % 17) - 8.f;
  uint64_t din = alloc(in.size() * 4), dout = alloc(blocks * 4);
  cuHtoD(din, in.data(), in.size() * 4);
  CHECK(launch(function(mod, "block_sums"), blocks, 256, {&dout, &din}) == 0, "block_sums launch failed");
  cuDtoH(out.data(), dout, blocks * 4);
  for (int b = 0; b < blocks; b++) {
    double want = 0;
    for (int i = 0; i < 256; i++) want += in[b * 256 + i];
    CHECK(out[b] == (float)want, "block %d sums to %g, want %g", b, out[b], want);
  }
  CHECK(launch(function(mod, "block_sums"), 1, 512, {&dout, &din}) != 0, "a block above __launch_bounds__ launched");
  cuMemFree(din);
  cuMemFree(dout);
}

static void test_undefined(uintptr_t mod) {
  uint64_t d = alloc(32 * 4);
  CHECK(launch(function(mod, "divergent"), 1, 32, {&d}) != 0, "a warp at two kinds of barrier was not refused");
  CHECK(launch(function(mod, "exited"), 1, 32, {&d}) != 0, "a shuffle from exited lanes was not refused");
  CHECK(launch(function(mod, "mixed"), 1, 32, {&d}) != 0, "lanes at __syncwarp and at a shuffle were not refused");
  CHECK(launch(function(mod, "half"), 1, 32, {&d}) != 0, "a partial-mask shuffle was not refused");
  CHECK(launch(function(mod, "narrow"), 1, 32, {&d}) == 0, "narrow launch failed");
  float out[32];
  cuDtoH(out, d, sizeof out);
  for (int i = 0; i < 32; i++) {
    const int src = (i ^ 8) >= (i & ~3) + 4 ? i : i ^ 8;
    const float want = (float)src + 100.f * (float)(i ^ 1);
    CHECK(out[i] == want, "width-4 shuffles: lane %d got %g, want %g", i, out[i], want);
  }
  cuMemFree(d);
}

static void test_race_shows(uintptr_t mod) {
  // In the default order warp 0 runs first and reads the poisoned shared
  // memory; in reverse order warp 1 has written 7 by then. Either way the
  // missing barrier shows in one of the two orders.
  const char* order = getenv("KEEL_CUDA_EMU_ORDER");
  const uint32_t want = order && strcmp(order, "reverse") == 0 ? 7 : 0xffffffffu;
  uint64_t d = alloc(4);
  CHECK(launch(function(mod, "racy"), 1, 64, {&d}) == 0, "racy launch failed");
  uint32_t got = 0;
  cuDtoH(&got, d, 4);
  CHECK(got == want, "racy read %#x, want %#x", got, want);
  cuMemFree(d);
}

static void test_overrun_stops(uintptr_t mod) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 100;  // 101 writes into 100 floats: into the rounding slack
    uint64_t d = alloc(n * 4);
    launch(function(mod, "overrun"), 1, 128, {&d, &n});
    cuMemFree(d);  // must abort
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "a write out of bounds did not stop the process (status %#x)",
        status);
}

static uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float widen(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void test_cublaslt() {
  auto create = sym<int (*)(uintptr_t*)>(blas, "cublasLtCreate");
  auto desc = sym<int (*)(uintptr_t*, int, int)>(blas, "cublasLtMatmulDescCreate");
  auto setattr = sym<int (*)(uintptr_t, int, const void*, size_t)>(blas, "cublasLtMatmulDescSetAttribute");
  auto layout = sym<int (*)(uintptr_t*, int, uint64_t, uint64_t, int64_t)>(blas, "cublasLtMatrixLayoutCreate");
  auto pref = sym<int (*)(uintptr_t*)>(blas, "cublasLtMatmulPreferenceCreate");
  auto heur = sym<int (*)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, int, void*, int*)>(
      blas, "cublasLtMatmulAlgoGetHeuristic");
  auto matmul = sym<int (*)(uintptr_t, uintptr_t, const float*, uint64_t, uintptr_t, uint64_t, uintptr_t, const float*,
                            uint64_t, uintptr_t, uint64_t, uintptr_t, const void*, uint64_t, size_t, uintptr_t)>(
      blas, "cublasLtMatmul");
  // D[m×n] = A^T B + C with A stored k×m (lda 5), B k×n (ldb 4), column-major.
  const int m = 3, n = 2, k = 4, lda = 5, ldb = 4, ldc = 3;
  std::vector<uint16_t> A(lda * m), B(ldb * n);
  std::vector<float> C(ldc * n), D(ldc * n);
  for (int i = 0; i < lda * m; i++) A[i] = bf16(0.25f * (i % 7) - 0.5f);
  for (int i = 0; i < ldb * n; i++) B[i] = bf16(0.5f * (i % 5) - 1.f);
  for (int i = 0; i < ldc * n; i++) C[i] = (float)i;
  uint64_t dA = alloc(A.size() * 2), dB = alloc(B.size() * 2), dC = alloc(C.size() * 4);
  cuHtoD(dA, A.data(), A.size() * 2);
  cuHtoD(dB, B.data(), B.size() * 2);
  cuHtoD(dC, C.data(), C.size() * 4);
  uintptr_t h, d, la, lb, lc, p;
  create(&h);
  desc(&d, 68, 0);
  int t = 1;
  setattr(d, 3, &t, 4);
  layout(&la, 14, k, m, lda);
  layout(&lb, 14, k, n, ldb);
  layout(&lc, 0, m, n, ldc);
  pref(&p);
  char algo[96];
  int got = 0;
  CHECK(heur(h, d, la, lb, lc, lc, p, 1, algo, &got) == 0 && got == 1, "no algorithm for a TN product");
  float one = 1;
  CHECK(matmul(h, d, &one, dA, la, dB, lb, &one, dC, lc, dC, lc, algo, 0, 0, 0) == 0, "matmul failed");
  cuDtoH(D.data(), dC, D.size() * 4);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double want = C[i + j * ldc];
      for (int q = 0; q < k; q++) want += (double)widen(A[q + i * lda]) * widen(B[q + j * ldb]);
      CHECK(D[i + j * ldc] == (float)want, "D[%d,%d] = %g, want %g", i, j, D[i + j * ldc], want);
    }
  // The second algorithm split in two, its parts reduced in the compute
  // type: the check asks for their workspace, the product refuses less,
  // and with it gives the same sums (every partial sum here is exact).
  auto cap = sym<int (*)(const void*, int, void*, size_t, size_t*)>(blas, "cublasLtMatmulAlgoCapGetAttribute");
  auto cfgset = sym<int (*)(void*, int, const void*, size_t)>(blas, "cublasLtMatmulAlgoConfigSetAttribute");
  auto check = sym<int (*)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, const void*, void*)>(
      blas, "cublasLtMatmulAlgoCheck");
  char algos[3][96], res[96];
  CHECK(heur(h, d, la, lb, lc, lc, p, 3, algos, &got) == 0 && got == 3, "three algorithms asked for, %d given", got);
  int32_t splits = -1, none = -1;
  size_t wrote = 0;
  CHECK(cap(algos[1], 0, &splits, 4, &wrote) == 0 && splits == 1 && wrote == 4, "the second algorithm splits no k");
  CHECK(cap(algos[0], 0, &none, 4, &wrote) == 0 && none == 0, "the first algorithm splits k");
  uint32_t two = 2, compute = 2;
  CHECK(cfgset(algos[1], 2, &two, 4) == 0 && cfgset(algos[1], 3, &compute, 4) == 0, "split-K not configured");
  CHECK(cfgset(algos[0], 2, &two, 4) == 0 && check(h, d, la, lb, lc, lc, algos[0], res) != 0,
        "a split of k passed the check on an algorithm without one");
  size_t need = 0;
  CHECK(check(h, d, la, lb, lc, lc, algos[1], res) == 0, "the split algorithm failed its check");
  memcpy(&need, res + 64, 8);
  CHECK(need == (size_t)m * n * 4 * 2, "the split needs %zu bytes of workspace, want %d", need, m * n * 8);
  cuHtoD(dC, C.data(), C.size() * 4);
  CHECK(matmul(h, d, &one, dA, la, dB, lb, &one, dC, lc, dC, lc, algos[1], 0, 0, 0) != 0,
        "a split product ran without its workspace");
  uint64_t ws = alloc(need);
  CHECK(matmul(h, d, &one, dA, la, dB, lb, &one, dC, lc, dC, lc, algos[1], ws, need, 0) == 0, "the split product failed");
  std::vector<float> D2(ldc * n);
  cuDtoH(D2.data(), dC, D2.size() * 4);
  for (int i = 0; i < ldc * n; i++) CHECK(D2[i] == D[i], "split D[%d] = %g, want %g", i, D2[i], D[i]);
  // op(A) is now k×m against B's k rows: refused.
  t = 0;
  setattr(d, 3, &t, 4);
  CHECK(heur(h, d, la, lb, lc, lc, p, 1, algo, &got) != 0, "a product of mismatched shapes was accepted");
  // A leading dimension below the rows: refused.
  uintptr_t bad;
  CHECK(layout(&bad, 14, k, m, k - 1) != 0, "a leading dimension below the rows was accepted");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: selftest LIBDIR\n");
    return 2;
  }
  std::string dir = argv[1];
  cuda = dlopen((dir + "/libcuda.so.1").c_str(), RTLD_NOW | RTLD_GLOBAL);
  nvrtc = dlopen((dir + "/libnvrtc.so.13").c_str(), RTLD_NOW);
  blas = dlopen((dir + "/libcublasLt.so.13").c_str(), RTLD_NOW);
  if (!cuda || !nvrtc || !blas) {
    fprintf(stderr, "cannot load the emulator from %s: %s\n", dir.c_str(), dlerror());
    return 2;
  }
  cuInit = sym<decltype(cuInit)>(cuda, "cuInit");
  cuMemAlloc = sym<decltype(cuMemAlloc)>(cuda, "cuMemAlloc_v2");
  cuMemFree = sym<decltype(cuMemFree)>(cuda, "cuMemFree_v2");
  cuHtoD = sym<decltype(cuHtoD)>(cuda, "cuMemcpyHtoD_v2");
  cuDtoH = sym<decltype(cuDtoH)>(cuda, "cuMemcpyDtoH_v2");
  cuModuleLoadData = sym<decltype(cuModuleLoadData)>(cuda, "cuModuleLoadData");
  cuModuleGetFunction = sym<decltype(cuModuleGetFunction)>(cuda, "cuModuleGetFunction");
  cuLaunchKernel = sym<decltype(cuLaunchKernel)>(cuda, "cuLaunchKernel");
  cuFuncSetAttribute = sym<decltype(cuFuncSetAttribute)>(cuda, "cuFuncSetAttribute");
  cuInit(0);
  uintptr_t mod = module(kKernels);
  test_block_sums(mod);
  test_undefined(mod);
  test_race_shows(mod);
  test_overrun_stops(mod);
  test_dynamic_shared(mod);
  test_cublaslt();
  if (failures) {
    fprintf(stderr, "emulator self-test: %d failures\n", failures);
    return 1;
  }
  printf("emulator self-test: ok\n");
  return 0;
}
