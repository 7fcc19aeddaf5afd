// The emulator's CUDA driver: the part of the driver API keel calls
// (kernels/cuda/driver.go), on the CPU. Device memory is host memory, one
// mapping per allocation with a page that faults right after it and its
// bytes set to 0xff (NaN as floats) so that a read past the end crashes
// and a read of memory never written shows; every copy is checked against
// the allocations. Kernels are the shared objects the emulator's NVRTC
// builds; cuLaunchKernel runs them through keel_emu_launch
// (keel_cuda_emu.h), synchronously.
//
// Settings (environment): KEEL_CUDA_EMU_MEMORY, the device's memory in
// MiB (default 4096); KEEL_CUDA_EMU_ARCH, its compute capability (default
// 90); KEEL_CUDA_EMU_TRACE=1 prints every launch and allocation to
// stderr; KEEL_CUDA_EMU_PROFILE=1 prints each kernel's launches and time
// when the context is released; KEEL_CUDA_EMU_KEEP=1 keeps the modules'
// files in /tmp, so that gdb and perf see the kernels' symbols.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#define API extern "C" __attribute__((visibility("default")))

typedef int CUresult;
enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  NOT_INITIALIZED = 3,
  INVALID_IMAGE = 200,
  INVALID_HANDLE = 400,
  NOT_FOUND = 500,
  LAUNCH_FAILED = 719,
  NOT_SUPPORTED = 801,
  STREAM_CAPTURE_UNSUPPORTED = 900,
  STREAM_CAPTURE_INVALIDATED = 901,
};

namespace {

struct Alloc {
  void* map;
  size_t map_bytes, bytes;
};

// intact says whether the bytes of a's mapping around its buffer p (the
// slack before it, and after it up to the fault page) still hold the 0xff
// they were given: a kernel or copy that wrote out of bounds changed them.
bool intact(uint64_t p, const Alloc& a) {
  const unsigned char* m = (const unsigned char*)a.map;
  const unsigned char* b = (const unsigned char*)p;
  const unsigned char* end = m + a.map_bytes - 4096;
  for (const unsigned char* q = m; q < b; q++)
    if (*q != 0xff) return false;
  for (const unsigned char* q = b + a.bytes; q < end; q++)
    if (*q != 0xff) return false;
  return true;
}

std::mutex mu;
std::map<uint64_t, Alloc> allocs;  // by device address
uint64_t used;
bool inited;

bool check_every_launch() {
  static int c = -1;
  if (c < 0) c = getenv("KEEL_CUDA_EMU_CHECK") && strcmp(getenv("KEEL_CUDA_EMU_CHECK"), "1") == 0;
  return c;
}

bool trace() {
  static int t = -1;
  if (t < 0) t = getenv("KEEL_CUDA_EMU_TRACE") && strcmp(getenv("KEEL_CUDA_EMU_TRACE"), "1") == 0;
  return t;
}

// total_memory is read once: free memory must not move under a run.
uint64_t total_memory() {
  static const uint64_t total = [] {
    const char* s = getenv("KEEL_CUDA_EMU_MEMORY");
    long mib = s ? atol(s) : 0;
    return (uint64_t)(mib > 0 ? mib : 4096) << 20;
  }();
  return total;
}

int arch() {
  const char* s = getenv("KEEL_CUDA_EMU_ARCH");
  int a = s ? atoi(s) : 0;
  return a >= 50 && a <= 200 ? a : 90;
}

void complain(const char* what, const std::string& msg) { fprintf(stderr, "keel CUDA emulator: %s: %s\n", what, msg.c_str()); }

// within says whether [p, p+n) lies inside one allocation (mu held).
bool within(uint64_t p, uint64_t n) {
  auto it = allocs.upper_bound(p);
  if (it == allocs.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second.bytes && p + n >= p;
}

std::string hex(uint64_t p) {
  char b[32];
  snprintf(b, sizeof b, "0x%llx", (unsigned long long)p);
  return b;
}

bool check_range(const char* what, uint64_t p, uint64_t n) {
  if (n == 0) return true;
  std::lock_guard<std::mutex> l(mu);
  if (within(p, n)) return true;
  complain(what, std::to_string(n) + " bytes at " + hex(p) + " are not inside one allocation");
  return false;
}

struct Module {
  void* handle;
  int (*launch)(void (*)(void**), void**, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, char*,
                int);
};

struct Function {
  Module* mod;
  void (*thunk)(void**);
  int bounds;
  std::string name;
  // pack copies a launch's parameter values into 8-byte slots (for a
  // graph, which runs after the caller's parameter memory is gone) and
  // returns how many; null for a module built before graphs were emulated.
  int (*pack)(void**, uint64_t*, int);
  // max_shared is the most dynamic shared memory a launch may ask for:
  // 48 KiB, or what cuFuncSetAttribute allowed, as on a GPU.
  unsigned max_shared = 48 * 1024;
};

// A Node is one step of a graph: a kernel launch with its parameters'
// values, or a step recorded by the emulator's cuBLASLt (run(ctx)).
struct Node {
  Function* f = nullptr;
  unsigned grid[3], block[3], shared = 0;
  std::vector<uint64_t> params;
  int (*run)(void*) = nullptr;
  void* ctx = nullptr;
  void (*free)(void*) = nullptr;
};

// A graph's nodes are shared by the graph and its instantiations.
struct Nodes {
  std::vector<Node> nodes;
  ~Nodes() {
    for (auto& n : nodes)
      if (n.free) n.free(n.ctx);
  }
};
struct Graph {
  std::shared_ptr<Nodes> nodes;
};

// A Stream runs its work at once, as the default stream does, except
// while it records a graph (cuStreamBeginCapture): then launches and
// products on it are recorded instead.
struct Stream {
  Graph* capture = nullptr;
  bool invalidated = false;  // its recording met a cuCtxSynchronize
};
std::mutex stream_mu;
std::set<Stream*> streams;

// stream_of checks a stream handle: 0 (the default stream) gives null.
bool stream_of(uintptr_t h, Stream** s) {
  *s = nullptr;
  if (!h) return true;
  std::lock_guard<std::mutex> l(stream_mu);
  if (!streams.count((Stream*)h)) return false;
  *s = (Stream*)h;
  return true;
}

double now_ms() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Per-kernel launch counts and times, printed at exit when
// KEEL_CUDA_EMU_PROFILE=1: where an emulated test spends its time.
struct Prof {
  long launches = 0;
  double ms = 0;
};
std::map<std::string, Prof> prof;
std::mutex prof_mu;

bool profiling() {
  static int p = -1;
  if (p < 0) p = getenv("KEEL_CUDA_EMU_PROFILE") && strcmp(getenv("KEEL_CUDA_EMU_PROFILE"), "1") == 0;
  return p;
}

void print_profile() {
  std::lock_guard<std::mutex> l(prof_mu);
  double total = 0;
  for (auto& [k, v] : prof) total += v.ms;
  fprintf(stderr, "keel CUDA emulator: %.0f ms in kernels\n", total);
  for (auto& [k, v] : prof) fprintf(stderr, "  %-24s %8ld launches %10.1f ms\n", k.c_str(), v.launches, v.ms);
  prof.clear();
}

struct Event {
  double ms;
};

}  // namespace

// keel_emu_check_range lets the emulator's cuBLASLt check its operands.
API int keel_emu_check_range(const char* what, uint64_t p, uint64_t n) { return check_range(what, p, n); }

API CUresult cuInit(unsigned flags) {
  if (flags != 0) return INVALID_VALUE;
  inited = true;
  return OK;
}
API CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return OK;
}
API CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return OK;
}
API CUresult cuDeviceGet(int* dev, int ordinal) {
  if (ordinal != 0) return INVALID_VALUE;
  *dev = 0;
  return OK;
}
API CUresult cuDeviceGetName(char* name, int n, int dev) {
  if (dev != 0 || n <= 0) return INVALID_VALUE;
  snprintf(name, n, "keel CUDA emulator (CPU)");
  return OK;
}
// shared_optin is the most shared memory a block may opt in to on the
// emulated compute capability, as the GPUs of each give it.
int shared_optin() {
  switch (arch()) {
    case 80:
    case 87:
      return 163 * 1024;
    case 86:
    case 89:
      return 99 * 1024;
    case 90:
      return 227 * 1024;
  }
  return arch() >= 90 ? 227 * 1024 : arch() >= 70 ? 64 * 1024 : 48 * 1024;
}
API CUresult cuDeviceGetAttribute(int* v, int attr, int dev) {
  if (dev != 0) return INVALID_VALUE;
  switch (attr) {
    case 97:  // max shared memory per block, opted in
      *v = shared_optin();
      return OK;
    case 16:  // multiprocessors
      *v = 4;
      return OK;
    case 75:
      *v = arch() / 10;
      return OK;
    case 76:
      *v = arch() % 10;
      return OK;
  }
  complain("cuDeviceGetAttribute", "attribute " + std::to_string(attr) + " is not emulated");
  return INVALID_VALUE;
}
API CUresult cuDeviceTotalMem_v2(size_t* bytes, int dev) {
  if (dev != 0) return INVALID_VALUE;
  *bytes = total_memory();
  return OK;
}
API CUresult cuDevicePrimaryCtxRetain(uintptr_t* ctx, int dev) {
  if (dev != 0) return INVALID_VALUE;
  *ctx = 1;
  return OK;
}
// Releasing the context prints the profile (a Go program does not run
// atexit handlers).
API CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  if (profiling()) print_profile();
  return dev == 0 ? OK : INVALID_VALUE;
}
API CUresult cuCtxSetCurrent(uintptr_t ctx) { return ctx == 1 ? OK : INVALID_HANDLE; }
// cuCtxSynchronize refuses, as the driver does, while any stream of the
// context records a graph, whichever thread asks, and that recording is
// lost (cuStreamEndCapture then fails).
API CUresult cuCtxSynchronize() {
  std::lock_guard<std::mutex> l(stream_mu);
  bool recording = false;
  for (Stream* st : streams)
    if (st->capture) recording = st->invalidated = true;
  if (recording) {
    complain("cuCtxSynchronize", "while a stream records a graph: the recording is invalidated");
    return STREAM_CAPTURE_UNSUPPORTED;
  }
  return OK;
}

API CUresult cuMemAlloc_v2(uint64_t* ptr, size_t bytes) {
  if (!inited) return NOT_INITIALIZED;
  if (bytes == 0) return INVALID_VALUE;
  std::lock_guard<std::mutex> l(mu);
  if (bytes > total_memory() - used || bytes > ((size_t)1 << 48)) return OUT_OF_MEMORY;
  const size_t page = 4096;
  size_t rounded = (bytes + 255) / 256 * 256;  // cuMemAlloc aligns to 256 bytes
  size_t body = (rounded + page - 1) / page * page;
  size_t map_bytes = body + page;
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  mprotect((char*)m + body, page, PROT_NONE);
  // The buffer ends where the fault page begins (give or take the
  // rounding to 256 bytes), so a kernel reading past it crashes; the bytes
  // around it are 0xff too, checked when it is freed (or after every
  // launch, with KEEL_CUDA_EMU_CHECK=1).
  char* p = (char*)m + (body - rounded);
  memset(m, 0xff, body);
  allocs[(uint64_t)p] = Alloc{m, map_bytes, bytes};
  used += bytes;
  *ptr = (uint64_t)p;
  if (trace()) fprintf(stderr, "emu: alloc %zu at %p\n", bytes, p);
  return OK;
}
API CUresult cuMemFree_v2(uint64_t ptr) {
  std::lock_guard<std::mutex> l(mu);
  auto it = allocs.find(ptr);
  if (it == allocs.end()) {
    complain("cuMemFree", hex(ptr) + " is not an allocation");
    return INVALID_VALUE;
  }
  if (!intact(ptr, it->second)) {  // memory corrupted: stop here, as a sanitizer would
    complain("cuMemFree", "the bytes around the allocation of " + std::to_string(it->second.bytes) + " at " +
                              hex(ptr) + " were written out of bounds (KEEL_CUDA_EMU_CHECK=1 finds the kernel)");
    abort();
  }
  munmap(it->second.map, it->second.map_bytes);
  used -= it->second.bytes;
  allocs.erase(it);
  return OK;
}
API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> l(mu);
  *total = total_memory();
  *free_bytes = *total - used;
  return OK;
}
API CUresult cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t n) {
  if (!check_range("cuMemcpyHtoD", dst, n)) return INVALID_VALUE;
  memcpy((void*)dst, src, n);
  return OK;
}
API CUresult cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t n) {
  if (!check_range("cuMemcpyDtoH", src, n)) return INVALID_VALUE;
  memcpy(dst, (const void*)src, n);
  return OK;
}
API CUresult cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n) {
  if (!check_range("cuMemcpyDtoD (destination)", dst, n) || !check_range("cuMemcpyDtoD (source)", src, n))
    return INVALID_VALUE;
  memmove((void*)dst, (const void*)src, n);
  return OK;
}
API CUresult cuMemsetD8_v2(uint64_t dst, unsigned char v, size_t n) {
  if (!check_range("cuMemsetD8", dst, n)) return INVALID_VALUE;
  memset((void*)dst, v, n);
  return OK;
}

// An image is "KEELEMU1", its length (8 bytes, little endian), then the
// bytes of the shared object the emulator's NVRTC built.
API CUresult cuModuleLoadData(uintptr_t* mod, const void* image) {
  const char* p = (const char*)image;
  if (memcmp(p, "KEELEMU1", 8) != 0) {
    complain("cuModuleLoadData", "not an image from the emulator's NVRTC");
    return INVALID_IMAGE;
  }
  uint64_t n;
  memcpy(&n, p + 8, 8);
  char path[] = "/tmp/keel-emu-module-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return INVALID_IMAGE;
  bool ok = write(fd, p + 16, n) == (ssize_t)n;
  close(fd);
  void* h = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  const char* keep = getenv("KEEL_CUDA_EMU_KEEP");  // leave the file for gdb and perf
  if (!keep || strcmp(keep, "1") != 0) unlink(path);
  else fprintf(stderr, "keel CUDA emulator: module kept at %s\n", path);
  if (!h) {
    complain("cuModuleLoadData", dlerror());
    return INVALID_IMAGE;
  }
  Module* m = new Module{h, nullptr};
  *(void**)&m->launch = dlsym(h, "keel_emu_launch");
  if (!m->launch) {
    delete m;
    return INVALID_IMAGE;
  }
  *mod = (uintptr_t)m;
  return OK;
}
// cuModuleUnload keeps the shared object loaded: its thread-local state
// may still be held by threads, and the memory is small.
API CUresult cuModuleUnload(uintptr_t mod) { return mod ? OK : INVALID_HANDLE; }
API CUresult cuModuleGetFunction(uintptr_t* fn, uintptr_t mod, const char* name) {
  Module* m = (Module*)mod;
  if (!m) return INVALID_HANDLE;
  std::string thunk = std::string("keel_emu_thunk_") + name, bounds = std::string("keel_emu_bounds_") + name;
  void* t = dlsym(m->handle, thunk.c_str());
  const int* b = (const int*)dlsym(m->handle, bounds.c_str());
  if (!t || !b) return NOT_FOUND;
  Function* f = new Function{m, nullptr, *b, name, nullptr, 48 * 1024};
  *(void**)&f->thunk = t;
  *(void**)&f->pack = dlsym(m->handle, (std::string("keel_emu_pack_") + name).c_str());
  *fn = (uintptr_t)f;
  return OK;
}
API CUresult cuFuncSetAttribute(uintptr_t fn, int attr, int v) {
  if (!fn) return INVALID_HANDLE;
  if (attr == 8 && v >= 0 && v <= shared_optin()) {  // max dynamic shared memory
    ((Function*)fn)->max_shared = (unsigned)v;
    return OK;
  }
  complain("cuFuncSetAttribute", "attribute " + std::to_string(attr) + " = " + std::to_string(v) + " is not emulated");
  return INVALID_VALUE;
}
// run_launch runs one kernel launch (of cuLaunchKernel, or a graph's).
CUresult run_launch(Function* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                    unsigned shared, void** params) {
  if (trace())
    fprintf(stderr, "emu: launch %s grid %u,%u,%u block %u,%u,%u shared %u\n", f->name.c_str(), gx, gy, gz, bx, by, bz,
            shared);
  char err[600];
  const double t0 = profiling() ? now_ms() : 0;
  if (f->mod->launch(f->thunk, params, gx, gy, gz, bx, by, bz, shared, err, sizeof err) != 0) {
    complain(f->name.c_str(), err);
    return LAUNCH_FAILED;
  }
  if (check_every_launch()) {
    std::lock_guard<std::mutex> l(mu);
    for (auto& [p, a] : allocs)
      if (!intact(p, a)) {
        complain(f->name.c_str(), "wrote around the allocation of " + std::to_string(a.bytes) + " at " + hex(p));
        return LAUNCH_FAILED;
      }
  }
  if (profiling()) {
    std::lock_guard<std::mutex> l(prof_mu);
    Prof& p = prof[f->name];
    p.launches++;
    p.ms += now_ms() - t0;
  }
  return OK;
}

API CUresult cuLaunchKernel(uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shared, uintptr_t stream, void** params, void** extra) {
  Function* f = (Function*)fn;
  if (!f) return INVALID_HANDLE;
  Stream* st;
  if (!stream_of(stream, &st)) {
    complain(f->name.c_str(), "launch on an unknown stream");
    return INVALID_HANDLE;
  }
  if (extra) {
    complain(f->name.c_str(), "launch with extra parameters: not emulated");
    return NOT_SUPPORTED;
  }
  if (shared > f->max_shared) {
    complain(f->name.c_str(), std::to_string(shared) + " bytes of dynamic shared memory, above the kernel's " +
                                  std::to_string(f->max_shared) + " (cuFuncSetAttribute raises it)");
    return INVALID_VALUE;
  }
  const unsigned long threads = (unsigned long)bx * by * bz;
  if (gx == 0 || gy == 0 || gz == 0 || gy > 65535 || gz > 65535 || bz > 64 || threads > (unsigned long)f->bounds) {
    complain(f->name.c_str(), "grid " + std::to_string(gx) + "×" + std::to_string(gy) + "×" + std::to_string(gz) +
                                  ", block of " + std::to_string(threads) + " threads (the kernel allows " +
                                  std::to_string(f->bounds) + ")");
    return INVALID_VALUE;
  }
  if (st && st->capture) {
    if (!f->pack) {
      complain(f->name.c_str(), "recorded into a graph from a module built without parameter packing (clear the cache)");
      return NOT_SUPPORTED;
    }
    Node n;
    n.f = f;
    n.grid[0] = gx, n.grid[1] = gy, n.grid[2] = gz;
    n.block[0] = bx, n.block[1] = by, n.block[2] = bz;
    n.shared = shared;
    n.params.resize(64);
    int np = f->pack(params, n.params.data(), 64);
    if (np < 0) {
      complain(f->name.c_str(), "more than 64 parameters to record");
      return NOT_SUPPORTED;
    }
    n.params.resize(np);
    std::lock_guard<std::mutex> l(stream_mu);
    st->capture->nodes->nodes.push_back(std::move(n));
    return OK;
  }
  return run_launch(f, gx, gy, gz, bx, by, bz, shared, params);
}

// keel_emu_capture_node records a step of the emulator's cuBLASLt into
// the graph stream is recording: 1 if it did (the graph owns ctx then), 0
// if stream is not recording (the caller runs the step now), -1 for an
// unknown stream.
API int keel_emu_capture_node(uintptr_t stream, int (*run)(void*), void* ctx, void (*free)(void*)) {
  Stream* st;
  if (!stream_of(stream, &st)) return -1;
  std::lock_guard<std::mutex> l(stream_mu);
  if (!st || !st->capture) return 0;
  Node n;
  n.run = run, n.ctx = ctx, n.free = free;
  st->capture->nodes->nodes.push_back(std::move(n));
  return 1;
}

API CUresult cuStreamCreate(uintptr_t* s, unsigned flags) {
  (void)flags;
  Stream* st = new Stream;
  std::lock_guard<std::mutex> l(stream_mu);
  streams.insert(st);
  *s = (uintptr_t)st;
  return OK;
}
API CUresult cuStreamDestroy_v2(uintptr_t s) {
  std::lock_guard<std::mutex> l(stream_mu);
  if (!streams.erase((Stream*)s)) return INVALID_HANDLE;
  delete (Stream*)s;
  return OK;
}
// The emulator runs work as it is issued: a wait has nothing to wait for.
API CUresult cuStreamWaitEvent(uintptr_t s, uintptr_t ev, unsigned flags) {
  Stream* st;
  if (!ev || flags || !stream_of(s, &st)) return INVALID_HANDLE;
  if (st && st->capture) {
    complain("cuStreamWaitEvent", "on a stream recording a graph: not emulated");
    return NOT_SUPPORTED;
  }
  return OK;
}
API CUresult cuStreamBeginCapture_v2(uintptr_t s, int mode) {
  (void)mode;
  Stream* st;
  if (!s || !stream_of(s, &st)) return INVALID_HANDLE;
  std::lock_guard<std::mutex> l(stream_mu);
  if (st->capture) {
    complain("cuStreamBeginCapture", "the stream is already recording");
    return STREAM_CAPTURE_UNSUPPORTED;
  }
  st->capture = new Graph{std::make_shared<Nodes>()};
  return OK;
}
API CUresult cuStreamEndCapture(uintptr_t s, uintptr_t* g) {
  Stream* st;
  if (!s || !stream_of(s, &st)) return INVALID_HANDLE;
  std::lock_guard<std::mutex> l(stream_mu);
  if (!st->capture) return STREAM_CAPTURE_UNSUPPORTED;
  *g = (uintptr_t)st->capture;
  st->capture = nullptr;
  if (st->invalidated) {
    st->invalidated = false;
    delete (Graph*)*g;
    *g = 0;
    return STREAM_CAPTURE_INVALIDATED;
  }
  return OK;
}
API CUresult cuGraphInstantiateWithFlags(uintptr_t* exec, uintptr_t g, unsigned long long flags) {
  if (!g) return INVALID_HANDLE;
  if (flags) return NOT_SUPPORTED;
  *exec = (uintptr_t) new Graph{((Graph*)g)->nodes};
  return OK;
}
API CUresult cuGraphDestroy(uintptr_t g) {
  if (!g) return INVALID_HANDLE;
  delete (Graph*)g;
  return OK;
}
API CUresult cuGraphExecDestroy(uintptr_t exec) {
  if (!exec) return INVALID_HANDLE;
  delete (Graph*)exec;
  return OK;
}
// cuGraphLaunch runs the recorded steps in order, each with the values
// its parameters had when recorded.
API CUresult cuGraphLaunch(uintptr_t exec, uintptr_t s) {
  Stream* st;
  if (!exec || !stream_of(s, &st)) return INVALID_HANDLE;
  if (st && st->capture) {
    complain("cuGraphLaunch", "into a stream recording a graph: not emulated");
    return NOT_SUPPORTED;
  }
  for (Node& n : ((Graph*)exec)->nodes->nodes) {
    if (n.run) {
      if (n.run(n.ctx) != 0) return LAUNCH_FAILED;
      continue;
    }
    std::vector<void*> ptrs(n.params.size());
    for (size_t i = 0; i < ptrs.size(); i++) ptrs[i] = &n.params[i];
    CUresult r =
        run_launch(n.f, n.grid[0], n.grid[1], n.grid[2], n.block[0], n.block[1], n.block[2], n.shared, ptrs.data());
    if (r != OK) return r;
  }
  return OK;
}

API CUresult cuEventCreate(uintptr_t* ev, unsigned flags) {
  (void)flags;
  *ev = (uintptr_t) new Event{0};
  return OK;
}
API CUresult cuEventRecord(uintptr_t ev, uintptr_t stream) {
  Stream* st;
  if (!ev || !stream_of(stream, &st)) return INVALID_HANDLE;
  if (st && st->capture) {
    complain("cuEventRecord", "on a stream recording a graph: not emulated");
    return NOT_SUPPORTED;
  }
  ((Event*)ev)->ms = now_ms();
  return OK;
}
API CUresult cuEventSynchronize(uintptr_t ev) { return ev ? OK : INVALID_HANDLE; }
API CUresult cuEventElapsedTime(float* ms, uintptr_t start, uintptr_t end) {
  if (!start || !end) return INVALID_HANDLE;
  *ms = (float)(((Event*)end)->ms - ((Event*)start)->ms);
  return OK;
}
API CUresult cuEventDestroy_v2(uintptr_t ev) {
  delete (Event*)ev;
  return OK;
}

static const char* names(int r, bool name) {
  switch (r) {
    case OK: return name ? "CUDA_SUCCESS" : "no error";
    case INVALID_VALUE: return name ? "CUDA_ERROR_INVALID_VALUE" : "invalid argument";
    case OUT_OF_MEMORY: return name ? "CUDA_ERROR_OUT_OF_MEMORY" : "out of memory";
    case NOT_INITIALIZED: return name ? "CUDA_ERROR_NOT_INITIALIZED" : "initialization error";
    case INVALID_IMAGE: return name ? "CUDA_ERROR_INVALID_IMAGE" : "device kernel image is invalid";
    case INVALID_HANDLE: return name ? "CUDA_ERROR_INVALID_HANDLE" : "invalid resource handle";
    case NOT_FOUND: return name ? "CUDA_ERROR_NOT_FOUND" : "named symbol not found";
    case LAUNCH_FAILED: return name ? "CUDA_ERROR_LAUNCH_FAILED" : "unspecified launch failure (see the emulator's message on stderr)";
    case NOT_SUPPORTED: return name ? "CUDA_ERROR_NOT_SUPPORTED" : "operation not supported by the emulator";
    case STREAM_CAPTURE_UNSUPPORTED:
      return name ? "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" : "operation not permitted when stream is capturing";
    case STREAM_CAPTURE_INVALIDATED:
      return name ? "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED" : "operation failed due to a previous error during capture";
  }
  return nullptr;
}
API CUresult cuGetErrorName(int r, const char** s) {
  *s = names(r, true);
  return *s ? OK : INVALID_VALUE;
}
API CUresult cuGetErrorString(int r, const char** s) {
  *s = names(r, false);
  return *s ? OK : INVALID_VALUE;
}

// keel_cuda_emulator marks the library as the emulator's (kernels/cuda reads it).
API const int keel_cuda_emulator = 1;
